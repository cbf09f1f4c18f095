"""`falcon-ray demo --hold` as a newcomer runs it, inspected from other processes with no
flags: `queues`, `health`, the dashboard's HTTP API, the notebooks, `queues --watch`, the read API, then
Ctrl-C. One demo process serves the whole module (the tests run in file order and the
last one stops it); every wait is bounded and the demo's process group is killed at the
end whatever happened.

The demo's discovery record goes to the default per-user location: ``XDG_RUNTIME_DIR``
points at a directory of this module's own, so a demo someone runs on the same machine
is neither found nor disturbed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.harness import api_contract as contract

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from falcon_ray.cli import main; main()"]
START_TIMEOUT = 240  # a loaded 2-core machine: Ray with its dashboard can take a minute
STRIP = ("RAY_ADDRESS", "RAY_AUTH_MODE", "FALCON_RAY_ADDRESS", "FALCON_NAMESPACE", "FALCON_DB_URL", "FALCON_RUNTIME_DIR")


def _line(name: str, run_s: float, topology: str = "2x2", actor: str = "newcomer") -> str:
    spec = {"tpu_type": "v6e", "topology": topology, "image": "us-docker.pkg.dev/p/r/img:1",
            "command": ["python", "run.py"], "env": {"FALCON_SIM_RUN_SECONDS": str(run_s)}}  # fmt: skip
    return json.dumps({"name": name, "actor": actor, "submit_at": 0, "abort_at": None, "spec": spec}) + "\n"


class Demo:
    def __init__(self, tmp: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.args = list(args)
        self.runtime = tmp / "runtime"
        self.runtime.mkdir(mode=0o700)
        self.env = {k: v for k, v in os.environ.items() if k not in STRIP} | (env or {})
        self.env["XDG_RUNTIME_DIR"] = str(self.runtime)
        self.env["RAY_DEDUP_LOGS"] = "0"
        self.out_path, self.err_path = tmp / "demo.out", tmp / "demo.err"
        self.proc: subprocess.Popen | None = None
        self.record: dict = {}
        self.store = None

    def start(self) -> None:
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                CLI + ["demo", "--hold", "--tasks", "-", "--json", "--shutdown-timeout", "90", *self.args],
                stdin=subprocess.PIPE, stdout=out, stderr=err, env=self.env, cwd=ROOT,
                text=True, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        records = self.runtime / "falcon-ray"
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"demo exited {self.proc.returncode}: {self.err()[-3000:]}"
            found = sorted(records.glob("demo-*.json")) if records.is_dir() else []
            if found and "reading tasks from stdin" in self.err():
                self.record = json.loads(found[0].read_text())
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"demo not up after {START_TIMEOUT}s: {self.err()[-3000:]}")
        from falcon_ray import dbref
        from falcon_ray.store import Store

        self.store = Store(dbref.resolve(self.record["db_url"]))  # a file: reference when it has a password

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def feed(self, text: str) -> None:
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout, env=self.env, cwd=ROOT)

    def wait_err(self, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.err():
            assert self.proc.poll() is None, f"demo exited {self.proc.returncode}: {self.err()[-3000:]}"
            assert time.monotonic() < deadline, f"{needle!r} not in the demo's stderr: {self.err()[-3000:]}"
            time.sleep(0.3)

    def wait_task(self, name: str, pred, timeout: float = 120):
        deadline = time.monotonic() + timeout
        while True:
            found = [t for t in self.store.recent_tasks(200) if t.name == name]
            if found and pred(found[0]):
                return found[0]
            assert self.proc.poll() is None, f"demo exited {self.proc.returncode}: {self.err()[-3000:]}"
            assert time.monotonic() < deadline, f"task {name}: {found and (found[0].status, found[0].reason, found[0].message)}"
            time.sleep(0.3)

    def kill(self) -> None:
        if self.store is not None:
            self.store.dispose()
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the demo, its Ray and the actors' workers
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass


API_TOKEN = "demo-api-token-0123456789"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo-inspect")
    token, config = tmp / "api-token", tmp / "settings.yaml"
    token.write_text(API_TOKEN + "\n")
    config.write_text(f"api_token_file: {token}\n")  # the demo's profile, and a token for the read API
    d = Demo(tmp, args=("--config", str(config)))
    try:
        d.start()
        yield d
    finally:
        d.kill()


@pytest.mark.timeout(400)
def test_tasks_from_stdin_and_a_bad_line_does_not_kill_the_demo(demo):
    r = demo.record
    assert r["namespace"] == "falcon", r
    for key in ("ray_address", "dashboard_url", "metrics_url", "db_url", "api"):
        assert r.get(key), (key, r)
    err = demo.err()
    for needle in ("dashboard", r["dashboard_url"], r["ray_address"], "namespace    falcon", r["metrics_url"], r["db_url"],
                   f"api          {r['api']}", "falcon-ray queues --watch"):  # fmt: skip
        assert needle in err, (needle, err[-3000:])
    demo.feed("this is not json\n")
    demo.feed('{"actor": "x"}\n')
    demo.feed(_line("hold-long", 900))  # runs until the demo is stopped
    demo.feed(_line("hold-quick", 0.5, topology="2x4"))
    demo.wait_err("stdin:1: not JSON")
    demo.wait_err("stdin:2: each line needs at least 'actor' and 'spec'")
    demo.wait_task("hold-quick", lambda t: t.status == "Succeeded")
    demo.wait_task("hold-long", lambda t: t.status == "Running")
    # the operator's own submission, on the database the demo printed
    p = demo.cli("submit", "--db", r["db_url"], "--actor", "operator", "--name", "by-hand", "--tpu-type", "v6e",
                 "--topology", "2x2", "--image", "img:1", "--env", "FALCON_SIM_RUN_SECONDS=0.5", "--", "python", "x.py")  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    demo.wait_task("by-hand", lambda t: t.status == "Succeeded")
    assert "task" in demo.err() and "by-hand" in demo.err(), "the demo prints the progress of tasks it did not submit"


@pytest.mark.timeout(300)
def test_queues_and_health_find_the_demo_with_no_flags(demo):
    p = demo.cli("queues", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    snaps = json.loads(p.stdout)
    running = {t["name"] for q in snaps for t in q.get("running", [])}
    assert "hold-long" in running, snaps
    assert any(q["queue"].startswith("queue/") and q.get("leases") for q in snaps), snaps

    p = demo.cli("health", "--json")
    report = json.loads(p.stdout or "{}")
    assert p.returncode == 0 and report.get("healthy"), (report, p.stderr[-3000:])
    actors = set(report["actors"])
    assert "poller" in actors and any(a.startswith("cluster/") for a in actors) and any(a.startswith("queue/") for a in actors), actors
    assert report["database"]["ok"] and report["leader"]["held"], report


def _token_header(env: dict) -> dict:
    """The demo's Ray token as the dashboard wants it: RAY_AUTH_TOKEN when the demo was
    started with one (make test hands its own to every process), else the file a local
    Ray 2.60 writes."""
    token = env.get("RAY_AUTH_TOKEN")
    path = Path.home() / ".ray" / "auth_token"
    if not token and path.exists():
        token = path.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.mark.timeout(120)
def test_dashboard_lists_every_falcon_actor_by_name_with_its_repr(demo):
    url = demo.record["dashboard_url"].rstrip("/") + "/api/v0/actors?detail=1&limit=1000"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=_token_header(demo.env)), timeout=20) as resp:
                rows = json.load(resp)["data"]["result"]["result"]
        except OSError as e:  # the dashboard still starting its modules
            rows, last = [], e
        mine = {a["name"]: a for a in rows if a.get("ray_namespace") == "falcon" and a.get("state") == "ALIVE"}
        if "poller" in mine and any(n.startswith("queue/") for n in mine):
            break
        assert time.monotonic() < deadline, (rows or last)
        time.sleep(2)
    assert any(n.startswith("cluster/") for n in mine), sorted(mine)
    classes = {"poller": "PollerActor", "cluster/": "ClusterActor", "queue/": "QueueActor"}
    for name, a in mine.items():
        cls = next(c for prefix, c in classes.items() if name.startswith(prefix))
        assert a["class_name"] == cls, a
        assert (a.get("repr_name") or "").startswith(cls + "("), f"{name}: repr {a.get('repr_name')!r}"


def _outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif out.output_type in ("display_data", "execute_result"):
                parts.extend(str(v) for k, v in out.data.items() if k.startswith("text/"))
    return "\n".join(parts)


@pytest.mark.timeout(400)
def test_the_three_notebooks_run_against_the_demo_with_no_settings(demo, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    for k in STRIP:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(demo.runtime))
    monkeypatch.setenv("RAY_DEDUP_LOGS", "0")
    texts = {}
    for name in ("queues.ipynb", "fleet.ipynb", "task.ipynb"):
        nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
        texts[name] = _outputs_text(nb)
    assert "hold-long" in texts["queues.ipynb"] and "namespace falcon" in texts["queues.ipynb"], texts["queues.ipynb"][-2000:]
    assert "edge-a" in texts["fleet.ipynb"] and "Succeeded" in texts["fleet.ipynb"], texts["fleet.ipynb"][-2000:]
    assert "by-hand" in texts["task.ipynb"], texts["task.ipynb"][-2000:]  # the newest task


@pytest.mark.timeout(180)
def test_queues_watch_redraws_and_ends_cleanly_on_ctrl_c(demo):
    proc = subprocess.Popen(
        CLI + ["queues", "--watch", "--interval", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=demo.env, cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while sum(l.startswith("falcon-ray queues  namespace falcon") for l in list(lines)) < 2:
            assert proc.poll() is None, (proc.returncode, "".join(lines)[-2000:], proc.stderr.read()[-2000:])
            assert time.monotonic() < deadline, "".join(lines)[-2000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    reader.join(10)
    text = "".join(lines)
    assert "=" * 78 in text, "frames on a non-terminal are separated"
    assert "hold-long" in text and "RUN" in text and "POOL" in text, text[-2000:]
    assert "Traceback" not in proc.stderr.read()


@pytest.mark.timeout(400)
def test_the_read_api_of_the_demo_keeps_its_contract(demo):
    """The API the record names: probes open, /v1 behind the token of the settings' file,
    404 and 422 as JSON, tasks as the upper layer follows them, a large queue paged. The
    queue's tasks are aborted at the end (the upper layer's abort), so the demo stops as before."""
    base = demo.record["api"]
    contract.check_probes_open(base)
    contract.check_token(base, API_TOKEN)
    contract.check_bad_input(base, API_TOKEN)
    contract.check_openapi(base)
    long = demo.wait_task("hold-long", lambda t: t.status == "Running")
    body = contract.task(base, API_TOKEN, long.id)
    assert (body["status"], body["topology"], body["position"]) == ("Running", "2x2", None), body
    assert body["cluster"] == demo.store.get_cluster(long.cluster_id).name
    done = demo.wait_task("by-hand", lambda t: t.status == "Succeeded")
    assert contract.task(base, API_TOKEN, done.id)["status"] == "Succeeded"

    spec = {"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["python", "run.py"],
            "env": {"FALCON_SIM_RUN_SECONDS": "900"}, "supply_mode": "reservation"}  # fmt: skip
    ids = [demo.store.submit_task(f"api{i % 5}", spec, name=f"api-queue-{i}") for i in range(40)]
    try:
        q = contract.check_large_queue(base, API_TOKEN, at_least=12)
        w = contract.task(base, API_TOKEN, q["waiting"][-1]["id"])
        assert w["reason"] == "Waiting" and w["position"] == q["waiting"][-1]["position"] and w["ahead"] == w["position"] - 1
        clusters = contract.check_clusters(base, API_TOKEN, {"edge-a", "edge-b"})
        assert clusters["edge-a"]["reservation"] is not None and clusters["edge-b"]["reservation"] is None, clusters
    finally:
        for tid in ids:
            demo.store.request_abort(tid)
    for tid in ids:
        demo.wait_task(f"api-queue-{ids.index(tid)}", lambda t: t.terminal, timeout=180)


@pytest.mark.timeout(300)
def test_ctrl_c_ends_the_demo_with_no_falcon_pool_left(demo):
    os.killpg(demo.proc.pid, signal.SIGINT)  # Ctrl-C in the demo's terminal: its whole process group
    try:
        code = demo.proc.wait(200)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"demo still running 200s after Ctrl-C: {demo.err()[-3000:]}") from None
    err = demo.err()
    assert code == 0, err[-3000:]
    assert "stopping: aborting live tasks" in err and "Traceback" not in err, err[-3000:]
    report = json.loads(demo.out_path.read_text())
    alive = [p["name"] for c in report["fleet"]["clusters"].values() for p in c["node_pools"]
             if p["name"].startswith("falcon-") and p.get("deleted_at") is None]  # fmt: skip
    assert alive == [], alive
    created = [p for c in report["fleet"]["clusters"].values() for p in c["node_pools"] if p["name"].startswith("falcon-")]
    assert created, "the demo did create pools"
    by_name = {t["name"]: t for t in report["tasks"]}
    assert by_name["hold-long"]["status"] == "Aborted" and by_name["by-hand"]["status"] == "Succeeded", by_name
    assert report["done"] is True
    records = list((demo.runtime / "falcon-ray").glob("demo-*.json"))
    assert records == [], "the demo removes its discovery record when it stops"
