"""The embedded default: a whole Falcon-Ray on one machine, and the scenario harness.

Contract
--------
``DemoRun`` starts, in this process, the simulated fleet, a database (a fresh
SQLite file unless a URL is given, migrated with the reference ``jobs`` table), a
local Ray (unless one is already initialised), registers the fleet's clusters with
their registry status, and runs the controller through the same ``Supervisor``
that ``falcon-ray run`` uses. It then plays tasks as the upper layer would
(``submit`` / ``abort`` write the rows directly) and reports each task with its
event log and the fleet's own accounting. ``falcon-ray demo`` and the scenario
tests both drive this class; nothing in it is a shortcut the real controller
would not take: the actors talk to the fleet over HTTP through the real clients.

Times in a tasks file count from the moment the controller is up and polling.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from falcon_ray import dbref
from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings, load_settings
from falcon_ray.store import Store
from falcon_ray.store.migrate import upgrade

if TYPE_CHECKING:  # the fleet's module loads with the demo's run, not at import
    from falcon_ray.sim.fleet import FleetConfig

log = logging.getLogger("falcon.demo")


def _pkg_file(name: str) -> str:
    return str(resources.files("falcon_ray.devtools.demo").joinpath(name))


def demo_settings(config: str | None = None, **overrides: Any) -> Settings:
    """The demo profile (seconds instead of minutes), then ``config``, then overrides."""
    data = yaml.safe_load(Path(_pkg_file("settings.yaml")).read_text())
    if config:
        data.update(yaml.safe_load(Path(config).read_text()) or {})
    data.update({k: v for k, v in overrides.items() if v is not None})
    return load_settings(None, **data)


def parse_task_line(line: str, where: str) -> dict[str, Any]:
    """One line of a tasks file (or of ``--tasks -``): a JSON object with at least
    ``actor`` and ``spec``; ``submit_at`` / ``abort_at`` are seconds or null. Raises
    ValueError with ``where`` (``file:line``) and what is wrong."""
    try:
        item = json.loads(line)
    except ValueError as e:
        raise ValueError(f"{where}: not JSON: {e}") from None
    if not isinstance(item, dict) or "actor" not in item or "spec" not in item:
        raise ValueError(f"{where}: each line needs at least 'actor' and 'spec'")
    if not isinstance(item["actor"], str) or not item["actor"].strip():
        raise ValueError(f"{where}: 'actor' must be a non-empty string")
    if not isinstance(item["spec"], dict | str):
        raise ValueError(f"{where}: 'spec' must be a JSON object (or a JSON string)")
    if not isinstance(item.get("name", ""), str):
        raise ValueError(f"{where}: 'name' must be a string")
    for key in ("submit_at", "abort_at"):
        v = item.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or v < 0):
            raise ValueError(f"{where}: '{key}' must be a number of seconds >= 0, or null")
    return item


def load_tasks(path: str | None) -> list[dict[str, Any]]:
    text = Path(path or _pkg_file("sample_tasks.jsonl")).read_text()
    tasks = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        tasks.append(parse_task_line(line, f"{path or 'sample tasks'}:{n}"))
    return tasks


def register_clusters(store: Store, fleet: FleetConfig) -> None:
    """Register every cluster of the fleet file in ``store`` (one already there is kept)."""
    existing = {c.name for c in store.list_clusters()}
    for c in fleet.clusters:
        if c.name not in existing:
            store.add_cluster(
                c.name, c.project, c.location, c.tpu_type, gcs_bucket=c.gcs_bucket or "",
                default_reservation=c.reservation.name if c.reservation else "", status=c.status,
            )


def iso_ms(t: dt.datetime | None) -> str | None:
    if t is None:
        return None
    return t.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


RAY_START_TRIES = 3  # Ray waits 30 s (fixed) for a new node's raylet; a loaded machine may need longer


def init_ray(**kwargs: Any) -> None:
    """``ray.init(**kwargs)``, started again (after a shutdown) when a new local node timed
    out during its start-up: Ray gives the raylet a fixed 30 s, which a machine busy
    starting other Ray workers can overrun. Any other failure is raised at once."""
    import ray

    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as e:
            if "timed out during startup" not in str(e) or attempt == RAY_START_TRIES:
                raise
            log.warning("Ray's node timed out during start-up (try %d of %d); starting it again", attempt, RAY_START_TRIES)
            ray.shutdown()


class DemoRun:
    """One controller + one simulated fleet + one database, for a demo or a test."""

    def __init__(
        self,
        fleet: Any = None,
        settings: Settings | None = None,
        db_url: str | None = None,
        ray_address: str | None = None,
        namespace: str | None = None,
        dashboard: bool = False,
        controller_db_url: str | None = None,
        api: bool = False,
    ) -> None:
        """``namespace``: the Ray namespace to claim (``falcon-ray demo`` passes ``falcon``):
        used unless a controller already runs there (actors in the Ray this run joins, or
        another live demo's discovery record), then ``<namespace>-demo-<pid>``; the choice
        and why are in ``namespace_note``. Without it the settings' namespace is kept,
        except the default ``falcon``, which becomes a private ``falcon-demo-<hex>``: the
        tests share one Ray and stay isolated that way. ``dashboard``: start the local Ray
        with its dashboard and a metrics export port (``falcon-ray demo``).
        ``controller_db_url``: the same database by another way for the controller (its
        supervisor and actors), e.g. through a proxy the chaos soak cuts; the run's own
        store (the upper layer: submits, aborts, reads) keeps ``db_url``. ``api``: serve
        /healthz, /readyz and the read API /v1 (``falcon_ray.health.serve``) on 127.0.0.1,
        on the settings' ``health_port`` or, when it is 0, a free port (``api_url``)."""
        from falcon_ray.sim.fleet import FleetConfig, load_fleet

        self.fleet_config = fleet if isinstance(fleet, FleetConfig) else load_fleet(fleet)
        base = settings or demo_settings()
        if base.namespace == "falcon":
            base = base.model_copy(update={"namespace": f"falcon-demo-{uuid.uuid4().hex[:8]}"})
        self._tmp = None
        if db_url is None:
            self._tmp = tempfile.mkdtemp(prefix="falcon-demo-")
            db_url = f"sqlite:///{os.path.join(self._tmp, 'falcon.db')}"
        self.db_url = db_url
        self.controller_db_url = controller_db_url or db_url
        # what the actors are given: the URL itself, or a 0600 file when it carries a
        # password (falcon_ray.dbref: a password never crosses Ray)
        self._secret_dir: str | None = None
        self._refs: dict[str, str] = {}
        self.controller_db_ref = self._local_ref(self.controller_db_url)
        self.ray_address = ray_address
        self.namespace_request = namespace
        self.namespace_note = ""
        self.dashboard = dashboard
        self.api = api
        self.api_server = None
        self.api_url: str | None = None
        self.ray_info: dict[str, Any] = {}
        self.base_settings = base
        self.settings: Settings | None = None
        self.sim = None
        self.store: Store | None = None
        self.supervisor = None
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.t0: float | None = None
        self.ids: list[int] = []
        self._saved_metadata: str | None = None

    def _local_ref(self, url: str) -> str:
        """``dbref.for_local_actors`` once per URL, its files in one directory that ``stop`` removes."""
        if url not in self._refs:
            if self._secret_dir is None and dbref.carries_password(url):
                self._secret_dir = tempfile.mkdtemp(prefix="falcon-db-")  # mode 0700
            self._refs[url] = dbref.for_local_actors(url, self._secret_dir)
        return self._refs[url]

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> DemoRun:
        import ray

        from actors.supervisor import Supervisor
        from falcon_ray.sim.auth import use_sim_metadata
        from falcon_ray.sim.server import SimFleet

        self.sim = SimFleet(self.fleet_config)
        ep = self.sim.start()
        self.settings = self.base_settings.model_copy(
            update={
                "gke_endpoint": ep["gke"],
                "compute_endpoint": ep["compute"],
                "metadata_host": ep["metadata"],
                "kubernetes_scheme": "http",
            }
        )
        self._saved_metadata = os.environ.get("GCE_METADATA_HOST")
        use_sim_metadata(ep["metadata"])  # google.auth.default() in this process: the sim's tokens
        upgrade(self.db_url, with_jobs_table=True)
        self.store = Store(self.db_url)
        register_clusters(self.store, self.fleet_config)
        if not ray.is_initialized():
            extra: dict[str, Any] = {}
            if self.dashboard:
                extra = {"dashboard_host": "127.0.0.1", "_metrics_export_port": _free_port()}
            init_ray(
                address=self.ray_address,
                num_cpus=2,
                include_dashboard=self.dashboard,
                log_to_driver=False,
                configure_logging=False,
                **extra,
            )
        self.ray_info = _ray_info()
        if self.namespace_request:
            ns, self.namespace_note = choose_namespace(self.namespace_request)
            self.settings = self.settings.model_copy(update={"namespace": ns})
        self.supervisor = Supervisor(self.settings, self.controller_db_url, db_ref=self.controller_db_ref)
        if not self.supervisor.wait_for_lead(timeout=60):
            raise RuntimeError("could not take the leader lease")
        self.supervisor.start()
        ray.get(self.supervisor.known["poller"].ping.remote(), timeout=120)
        self._wait_connected(timeout=60)
        self.thread = threading.Thread(target=self.supervisor.run, args=(self.stop_event,), daemon=True)
        self.thread.start()
        if self.api:
            from falcon_ray import health

            self.api_server = health.serve(self.supervisor, self.settings.health_port, host="127.0.0.1")
            self.api_url = self.api_server.url
        self.t0 = time.monotonic()
        return self

    def _wait_connected(self, timeout: float) -> None:
        """Every ClusterActor has reached its cluster (or ``timeout`` passed): the play starts warm."""
        import ray

        deadline = time.monotonic() + timeout
        for name, h in list(self.supervisor.known.items()):
            if not name.startswith("cluster/"):
                continue
            while time.monotonic() < deadline and not ray.get(h.snapshot.remote(), timeout=30)["connected"]:
                time.sleep(0.1)

    def stop(self) -> None:
        self.stop_event.set()
        if self.api_server is not None:
            self.api_server.shutdown()
            self.api_server.server_close()
        if self.supervisor is not None:
            try:
                self.supervisor.shutdown(drain=False, kill=True)
            except Exception as e:
                log.warning("shutdown: %s", e)
        if self.thread is not None:
            self.thread.join(10)
        if self.sim is not None:
            self.sim.stop()
            if self._saved_metadata:
                from falcon_ray.sim.auth import use_sim_metadata

                use_sim_metadata(self._saved_metadata)  # give the process back its previous fleet
        if self.store is not None:
            self.store.dispose()
        if self._secret_dir is not None:
            shutil.rmtree(self._secret_dir, ignore_errors=True)

    def __enter__(self) -> DemoRun:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def wind_down(self, timeout: float, on_tick: Callable[[], None] | None = None) -> bool:
        """The clean end of a demo: abort every live task of the database (the upper
        layer's abort, so the controller deletes the Jobs and the pools itself), then wait,
        at most ``timeout`` seconds, until every task is terminal and no Falcon pool is left."""
        assert self.store is not None
        self.track_all()
        for t in self.store.live_tasks():
            if t.status != lc.Status.ABORTING:
                self.store.request_abort(t.id)
        self.poke()
        return self.wait_done(timeout, on_tick)

    def track_all(self) -> None:
        """Report on every task of the database, not only those this run submitted
        (``falcon-ray submit --db`` against a held demo)."""
        assert self.store is not None
        known = set(self.ids)
        self.ids.extend(sorted(t.id for t in self.store.recent_tasks(100_000) if t.id not in known))

    def discovery_record(self) -> dict[str, Any]:
        """What ``falcon_ray.discovery`` writes for this run: how to reach it."""
        assert self.settings is not None
        return {
            "namespace": self.settings.namespace,
            "ray_address": self.ray_info.get("address"),
            "dashboard_url": self.ray_info.get("dashboard_url"),
            "metrics_url": self.ray_info.get("metrics_url"),
            "db_url": self._local_ref(self.db_url),
            "ray_auth_mode": os.environ.get("RAY_AUTH_MODE") or None,
            "holder": self.supervisor.holder if self.supervisor else None,
            "sim_stats": self.sim.endpoints.get("stats") if self.sim is not None else None,
            "api": self.api_url,
        }

    # ---- the upper layer ----------------------------------------------------------------------

    def submit(self, actor: str, spec: dict | str, name: str = "") -> int:
        assert self.store is not None
        timeout = spec.get("timeout_seconds") if isinstance(spec, dict) else None
        tid = self.store.submit_task(actor, spec, name=name, timeout_seconds=timeout if isinstance(timeout, int) else None)
        self.ids.append(tid)
        self.poke()
        return tid

    def abort(self, task_id: int) -> bool:
        assert self.store is not None
        ok = self.store.request_abort(task_id)
        self.poke()
        return ok

    def poke(self) -> None:
        if self.supervisor is not None and "poller" in self.supervisor.known:
            self.supervisor.known["poller"].poll_now.remote()

    def play(self, tasks: list[dict[str, Any]], on_tick: Callable[[], None] | None = None, timeout: float = 300) -> None:
        """Submit and abort on the tasks' schedule, then wait until everything is over."""
        assert self.t0 is not None
        t0 = time.monotonic()
        pending = sorted(enumerate(tasks), key=lambda x: float(x[1].get("submit_at") or 0))
        aborts: list[tuple[float, int]] = []
        while pending or aborts:
            now = time.monotonic() - t0
            while pending and float(pending[0][1].get("submit_at") or 0) <= now:
                _, item = pending.pop(0)
                tid = self.submit(item["actor"], item["spec"], name=item.get("name", ""))
                if item.get("abort_at") is not None:
                    aborts.append((float(item["abort_at"]), tid))
            for at, tid in list(aborts):
                if at <= now:
                    self.abort(tid)
                    aborts.remove((at, tid))
            if on_tick:
                on_tick()
            if time.monotonic() - t0 > timeout:
                return
            time.sleep(0.1)

    # ---- observation ------------------------------------------------------------------------------

    def tasks(self) -> list:
        assert self.store is not None
        return self.store.get_tasks(self.ids)

    def all_terminal(self) -> bool:
        return all(t.terminal for t in self.tasks())

    def falcon_pools_alive(self) -> list[str]:
        stats = self.sim.stats()
        return [
            p["name"]
            for c in stats["clusters"].values()
            for p in c["node_pools"]
            if p.get("deleted_at") is None and p["name"].startswith("falcon-")
        ]

    def wait(self, predicate: Callable[[], bool], timeout: float, on_tick: Callable[[], None] | None = None) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            if on_tick:
                on_tick()
            time.sleep(0.2)
        return predicate()

    def wait_done(self, timeout: float, on_tick: Callable[[], None] | None = None) -> bool:
        """Every task terminal and no Falcon pool left in the fleet."""
        return self.wait(lambda: self.all_terminal() and not self.falcon_pools_alive(), timeout, on_tick)

    def report(self) -> dict[str, Any]:
        assert self.store is not None
        clusters = {c.id: c.name for c in self.store.list_clusters()}
        out = []
        for t in self.tasks():
            out.append(
                {
                    "id": t.id,
                    "name": t.name,
                    "actor": t.actor,
                    "status": t.status,
                    "reason": t.reason,
                    "message": t.message,
                    "cluster": clusters.get(t.cluster_id or ""),
                    "node_pool": t.node_pool_name,
                    "created_at": iso_ms(t.created_at),
                    "dispatched_at": iso_ms(t.dispatched_at),
                    "finished_at": iso_ms(t.finished_at),
                    "events": [
                        {"at": iso_ms(e.at), "status": e.status, "reason": e.reason, "message": e.message}
                        for e in self.store.events(t.id)
                    ],
                }
            )
        return {"tasks": out, "fleet": self.sim.stats()}


class Schedule:
    """Tasks to submit (and abort) at their times; ``step`` does what is due. Times of
    an item count from the ``base`` it was added with (``time.monotonic()`` seconds)."""

    def __init__(self, run: DemoRun) -> None:
        self.run = run
        self.pending: list[tuple[float, int, dict[str, Any]]] = []
        self.aborts: list[tuple[float, int]] = []
        self._seq = 0

    def add(self, item: dict[str, Any], base: float) -> None:
        self._seq += 1
        self.pending.append((base + float(item.get("submit_at") or 0), self._seq, item))
        self.pending.sort(key=lambda x: (x[0], x[1]))

    def step(self, now: float | None = None) -> list[int]:
        now = time.monotonic() if now is None else now
        submitted = []
        while self.pending and self.pending[0][0] <= now:
            due, _, item = self.pending.pop(0)
            tid = self.run.submit(item["actor"], item["spec"], name=item.get("name", ""))
            submitted.append(tid)
            if item.get("abort_at") is not None:
                base = due - float(item.get("submit_at") or 0)
                self.aborts.append((base + float(item["abort_at"]), tid))
        for at, tid in list(self.aborts):
            if at <= now:
                self.run.abort(tid)
                self.aborts.remove((at, tid))
        return submitted

    def empty(self) -> bool:
        return not self.pending and not self.aborts

    def drop(self) -> int:
        """Forget what is not submitted yet (a demo being stopped); returns how many."""
        n = len(self.pending)
        self.pending.clear()
        self.aborts.clear()
        return n


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_info() -> dict[str, Any]:
    """Address, dashboard URL and metrics endpoint of the Ray this process is attached to."""
    import ray

    info: dict[str, Any] = {"address": ray.get_runtime_context().gcs_address}
    try:
        from ray._private.worker import global_worker

        node = global_worker.node
        url = getattr(node, "webui_url", None) or ""
        info["dashboard_url"] = (url if url.startswith("http") else f"http://{url}") if url else None
        port = getattr(node, "metrics_export_port", None)
        info["metrics_url"] = f"http://127.0.0.1:{port}/metrics" if port else None
    except Exception:  # attached to a Ray this process did not start: no node object
        info.setdefault("dashboard_url", None)
        info.setdefault("metrics_url", None)
    return info


def choose_namespace(wanted: str) -> tuple[str, str]:
    """``wanted`` unless a controller already runs there; then ``<wanted>-demo-<pid>``.
    Returns the namespace and, when it is not ``wanted``, why."""
    from actors import names
    from falcon_ray import discovery

    other = discovery.find(wanted)
    if other is not None and other.get("pid") != os.getpid():
        why = f"namespace {wanted!r} is taken by another demo (pid {other.get('pid')}, Ray {other.get('ray_address')})"
    else:
        try:
            taken = names.list_falcon_actors(wanted)
        except Exception:
            taken = []
        if not taken:
            return wanted, ""
        why = f"namespace {wanted!r} already has a controller in this Ray ({', '.join(taken[:3])}{', ...' if len(taken) > 3 else ''})"
    ns = f"{wanted}-demo-{os.getpid()}"
    return ns, f"{why}; this demo uses namespace {ns!r}"


def progress_printer(run: DemoRun, stream) -> Callable[[], None]:
    """A tick callback that prints one line per task whenever its status, reason or message changes."""
    seen: dict[int, tuple[str, str, str]] = {}

    def tick() -> None:
        for t in run.tasks():
            key = (t.status, t.reason, t.message)
            if seen.get(t.id) != key:
                seen[t.id] = key
                el = time.monotonic() - (run.t0 or time.monotonic())
                state = f"{t.status}/{t.reason}" if t.reason else t.status
                print(f"[{el:6.1f}s] task {t.id:<3} {t.actor:>6}: {t.name:<16} {state:<24} {t.message}", file=stream, flush=True)

    return tick


def summarize(report: dict[str, Any]) -> str:
    lines = ["", f"{'id':>3}  {'actor':<6} {'name':<16} {'status':<10} {'reason':<20} {'cluster':<8} message"]
    for t in report["tasks"]:
        lines.append(
            f"{t['id']:>3}  {t['actor']:<6} {t['name']:<16} {t['status']:<10} {t['reason']:<20} {t['cluster'] or '-':<8} {t['message'][:90]}"
        )
    pools = [
        p for c in report["fleet"]["clusters"].values() for p in c["node_pools"] if p["name"].startswith("falcon-")
    ]
    alive = [p["name"] for p in pools if p.get("deleted_at") is None]
    jobs = sum(j["creates"] for c in report["fleet"]["clusters"].values() for j in c["jobs"])
    lines.append("")
    lines.append(f"fleet: {len(pools)} node pool(s) created, {len(alive)} still alive, {jobs} Job create(s)")
    return "\n".join(lines)


TERMINAL_STATUSES = {s.value for s in lc.TERMINAL}
