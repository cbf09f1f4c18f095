"""Leader fencing end to end: two controllers on two Ray clusters, one MariaDB, one fleet.

Production runs the controller as ``falcon-ray run`` joined to its own Ray cluster; its
actors are detached and outlive the process. Here controller A leads on Ray cluster A,
controller B waits for the lease on Ray cluster B, both with the same settings against
one MariaDB database and one simulated fleet (served in this process). A's process is
killed with SIGKILL while its tasks are running, waiting and being aborted; its actors
live on in Ray cluster A. B takes the lease (the epoch grows) and must finish everything,
while A's actors lose every write, stop their loops, say they are fenced and, one lease
TTL after the take-over at the latest, call neither GKE nor Kubernetes:

- the event log (each row carries its writer's epoch) has no step of epoch 1 after B
  took the lease, and every task live then ends with a step of epoch 2;
- the fleet's record of its callers (the installation and epoch every Falcon request
  names) has no request of epoch 1 later than one TTL after the take-over;
- no Job was created twice, no abort overwritten, no Falcon pool left.

Both Ray clusters run as ``ray start --head --block`` in process groups of their own,
on free ports, and are killed (with every process they started) whatever happens; the
test session's own Ray is not touched.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from falcon_ray import lifecycle as lc
from falcon_ray.render import POOL_NAME_PREFIX, job_name
from falcon_ray.sim.server import SimFleet
from falcon_ray.store import Store
from falcon_ray.store.migrate import upgrade
from tests.harness.db import fresh_mysql_database
from tests.harness.e2e import make_fleet, spec
from tests.harness.ray_head import RayHead

pytestmark = pytest.mark.mysql

ROOT = Path(__file__).resolve().parents[2]
TTL_S = 4.0
NAMESPACE = "falcon"  # both controllers use the same settings, as two deployments of one config would
# every Ray process of this test: no token file, no inherited address
ENV = {**{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "FALCON_RAY_ADDRESS")}, "RAY_AUTH_MODE": "disabled"}

# Joins a Ray cluster as a second driver and prints its Falcon actors' snapshots, twice,
# two seconds apart (a loop that still runs shows more steps the second time).
PROBE = """
import json, sys, time, ray
from actors import names
ray.init(address=sys.argv[1], namespace=sys.argv[2], log_to_driver=False, configure_logging=False)
found = names.list_falcon_actors(sys.argv[2])
def snaps():
    return {n: ray.get(names.lookup(n, sys.argv[2]).snapshot.remote(), timeout=10) for n in found}
first = snaps()
time.sleep(2.0)
print(json.dumps({"actors": found, "snaps": [first, snaps()]}, default=str))
"""


def _controller(label: str, address: str, db_url: str, config: Path, root: Path) -> tuple[subprocess.Popen, Path]:
    log = root / f"run-{label}.log"
    cmd = [sys.executable, "-c", "from falcon_ray.cli import main; main()", "run", "--ray-address", address, "--db", db_url, "--config", str(config)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=ROOT, start_new_session=True)
    return proc, log


def _wall(at: dt.datetime) -> float:
    """A naive UTC timestamp of the database as Unix seconds (the sim's clock)."""
    return at.replace(tzinfo=dt.UTC).timestamp()


def _wait(what: str, pred, timeout: float, logs: list[Path], procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p, log in procs:
            assert p.poll() is None, f"{log.name} exited while waiting for {what}:\n{log.read_text()[-3000:]}"
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-2500:]}" for log in logs if log.exists())
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{tails}")


# a guard against a hang, not a limit on speed: at least the sum of the bounds its phases
# assert themselves (two Ray heads up, restarts included: RayHead.wait_ready's 180 s; then
# 60 + 60 + 4 x TTL_S + 30 + 60 + 60 + 90 s), which a loaded 2-core machine can need whole
# while Ray heads time out and restart (240 s cut a run off while controller B was finishing)
@pytest.mark.timeout(600)
def test_a_killed_controllers_actors_are_fenced_and_the_second_controller_finishes_every_task():
    root = Path(tempfile.mkdtemp(prefix="fr-"))
    heads = {label: RayHead(label, root, env=ENV) for label in ("a", "b")}
    procs: dict[str, subprocess.Popen] = {}
    passed = False
    sim = SimFleet(make_fleet(with_b=False, seed=12))
    ep = sim.start()
    try:
        with fresh_mysql_database() as db_url:
            for h in heads.values():
                h.start()
            upgrade(db_url, with_jobs_table=True)
            store = Store(db_url)
            c = sim.config.clusters[0]
            store.add_cluster(c.name, c.project, c.location, c.tpu_type, gcs_bucket=c.gcs_bucket, default_reservation="res-a")
            settings = yaml.safe_load((ROOT / "falcon_ray" / "devtools" / "demo" / "settings.yaml").read_text())
            settings.update(
                namespace=NAMESPACE,
                gke_endpoint=ep["gke"],
                compute_endpoint=ep["compute"],
                metadata_host=ep["metadata"],
                kubernetes_scheme="http",
                health_port=0,
                leader_ttl_s=TTL_S,
            )
            config = root / "config.yaml"
            config.write_text(yaml.safe_dump(settings))
            addr = {label: h.wait_ready() for label, h in heads.items()}
            procs["a"], log_a = _controller("a", addr["a"], db_url, config, root)
            logs = [log_a, root / "run-b.log", *(h.log for h in heads.values())]
            _wait("controller A to lead", lambda: store.leader(), 60, logs, [(procs["a"], log_a)])
            assert store.leader()["epoch"] == 1
            procs["b"], log_b = _controller("b", addr["b"], db_url, config, root)

            # under A: two long tasks run, one of them to be aborted after the take-over;
            # a short one runs and finishes; more are queued behind them
            long_ = [store.submit_task("alice", spec("2x2", 25), name=f"long-{i}") for i in range(2)]
            short = store.submit_task("bob", spec("2x2", 1), name="short")
            _wait(
                "the long tasks to run under A",
                lambda: all(store.get_task(t).phase == lc.RUNNING for t in long_),
                60,
                logs,
                [(procs["a"], log_a), (procs["b"], log_b)],
            )
            assert store.leader()["epoch"] == 1, "B waits while A holds the lease"
            queued = [store.submit_task("carol", spec("2x2", 2), name=f"queued-{i}") for i in range(2)]
            time.sleep(0.5)

            procs["a"].send_signal(signal.SIGKILL)  # the process dies; its detached actors live on
            procs["a"].wait(timeout=10)
            killed_at = time.time()
            aborted_early = store.submit_task("dave", spec("2x2", 30), name="aborted-before-take-over")
            store.request_abort(queued[1])

            def taken():
                lease = store.leader()
                return lease if lease and lease["epoch"] == 2 else None

            lease = _wait("controller B to take the lease", taken, 4 * TTL_S + 30, logs, [(procs["b"], log_b)])
            taken_at = lease["renewed_at"]  # polled every 0.2 s: the take-over itself, not a renewal
            assert _wall(taken_at) > killed_at, "B took the lease only after A's process died and its lease ran out"
            store.request_abort(long_[1])
            store.request_abort(aborted_early)
            late = store.submit_task("erin", spec("2x2", 1), name="after-take-over")
            live_at_take_over = [t.id for t in store.get_tasks([*long_, short, *queued, aborted_early]) if not t.terminal]

            # A's actors, still alive in Ray cluster A: fenced, their loops stopped
            probe = subprocess.Popen(
                [sys.executable, "-c", PROBE, addr["a"], NAMESPACE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT, text=True
            )
            health = subprocess.run(
                [sys.executable, "-c", "from falcon_ray.cli import main; main()", "health", "--ray-address", addr["a"], "--namespace", NAMESPACE, "--db", db_url, "--json"],
                capture_output=True, env=ENV, cwd=ROOT, text=True, timeout=60,
            )  # fmt: skip
            out, err = probe.communicate(timeout=60)
            assert probe.returncode == 0, err[-3000:]
            seen = json.loads(out)
            assert {"poller", "cluster/edge-a", "queue/edge-a/2x2"} <= set(seen["actors"]), seen["actors"]
            first, second = seen["snaps"]
            for name in seen["actors"]:
                assert first[name]["epoch"] == 1 and "epoch 2" in first[name]["fenced"], (name, first[name])
            assert second["poller"]["polls"] == first["poller"]["polls"]
            assert second["queue/edge-a/2x2"]["ticks"] == first["queue/edge-a/2x2"]["ticks"]
            loops = ("watch", "operations", "orphans", "gauges")
            assert [second["cluster/edge-a"]["loops"][n]["steps"] for n in loops] == [first["cluster/edge-a"]["loops"][n]["steps"] for n in loops]
            assert health.returncode == 1, health.stdout + health.stderr[-2000:]
            report = json.loads(health.stdout)
            assert report["leader"]["epoch"] == 2
            assert all("epoch 2" in report["actors"][n].get("fenced", "") for n in seen["actors"]), report["actors"]

            # B finishes every task
            ids = [*long_, short, *queued, aborted_early, late]
            _wait(
                "every task to end under B and no Falcon pool left",
                lambda: all(t.terminal for t in store.get_tasks(ids)) and not _pools_alive(sim.stats()),
                90,
                logs,
                [(procs["b"], log_b)],
            )
            tasks = {t.id: t for t in store.get_tasks(ids)}
            assert {t: tasks[t].status for t in (long_[1], queued[1], aborted_early)} == dict.fromkeys((long_[1], queued[1], aborted_early), "Aborted"), (
                "no abort overwritten"
            )
            assert {t: tasks[t].status for t in (long_[0], short, queued[0], late)} == dict.fromkeys((long_[0], short, queued[0], late), "Succeeded")

            # the writes: nothing of epoch 1 after the take-over; B ended every task live then
            for tid in ids:
                events = store.events(tid)
                stale = [(e.status, e.reason, e.at) for e in events if e.epoch == 1 and e.at >= taken_at]
                assert stale == [], f"task {tid}: written under epoch 1 after the take-over at {taken_at}: {stale}"
                assert all(e.epoch in (None, 1, 2) for e in events)
                phases = [lc.phase_of(e.status, e.reason) for e in events]
                for a, b in zip(phases, phases[1:], strict=False):
                    assert a == b or lc.allowed(a, b), f"task {tid}: {a} -> {b} is not in the lifecycle table"
                if tid in live_at_take_over:
                    assert events[-1].epoch == 2, (tid, [(e.status, e.reason, e.epoch) for e in events])
            assert any(e.epoch == 1 for e in store.events(long_[0])), "A's actors did write before the take-over"

            # the calls: per the fleet's record of its callers
            stats = sim.stats()
            callers = [(int(m.group(1)), c) for ua, c in stats["callers"].items() if (m := re.match(r"falcon-ray/\S+ epoch/(\d+)", ua))]
            old = [c for e, c in callers if e == 1]
            new = [c for e, c in callers if e == 2]
            assert old and new, stats["callers"].keys()
            assert max(c["last_at"] for c in old) <= _wall(taken_at) + TTL_S, (
                f"epoch 1 called the fleet {max(c['last_at'] for c in old) - _wall(taken_at):.2f}s after the take-over"
            )
            assert sum(c["apis"].get("kubernetes/edge-a", 0) for c in new) > 0 and sum(c["changes"] for c in new) > 0
            creates = {j["name"]: j["creates"] for cl in stats["clusters"].values() for j in cl["jobs"]}
            assert all(n == 1 for n in creates.values()), creates
            for tid in (long_[0], short, queued[0], late, long_[1]):
                assert creates.get(job_name(tid)) == 1, (tid, creates)

            procs["b"].send_signal(signal.SIGTERM)
            assert procs["b"].wait(timeout=60) == 0, log_b.read_text()[-3000:]
            assert store.leader() is None
            store.dispose()
            passed = True
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for h in heads.values():
            h.stop()
        sim.stop()
        if passed:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"controller and Ray logs kept in {root}", file=sys.stderr)


def _pools_alive(stats: dict) -> list[str]:
    return [
        p["name"]
        for cl in stats["clusters"].values()
        for p in cl["node_pools"]
        if p["name"].startswith(POOL_NAME_PREFIX) and p["status"] != "DELETED"
    ]
