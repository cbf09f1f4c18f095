"""The cost benchmark (issue 11): `falcon-ray bench` / `make bench`; nothing here asserts a speed.

Contract
--------
``run_bench(db, size)`` returns one JSON-able document with every figure of the issue
(``size``: ``full``, ``quick`` with 100/1,000 tasks, or ``smoke``, the smallest runs that
still produce every figure, for the test that checks the document's shape: its figures are
too noisy to compare);
``render(doc)`` prints it as a table. Each figure says how it was measured (``how``):

- ``lifecycle`` (part ``e2e``): statements per task, end to end (``DemoRun``: the real actors on a
  local Ray against ``falcon_ray.sim``): a run of n1 and then a run of n2 one-host tasks
  on one reservation, each run from submit until every task is Succeeded and no Falcon
  pool is left; the figure is the marginal (S(n2) - S(n1)) / (n2 - n1). S is what every
  Store of the controller sent (statements + COMMIT + ROLLBACK, which is what MariaDB's
  ``Questions`` counts; pings are not statements), counted by ``StatementFiles``, an
  observer (``falcon_ray.store.observe_statements``) that the bench installs in the driver
  and, through Ray's worker setup hook, in every actor process; on MySQL the
  server's global ``Questions`` over the same windows is given too, net of the bench's
  own reads (a shared server adds other clients' statements to it).
- ``lifecycle_mixed`` (``--part lifecycle-mixed``): statements per task on a mixed
  workload, end to end the same way: two clusters of one TPU type (edge-a with a
  reservation of 8 hosts and flex-start capacity, edge-b with flex-start only), tasks of
  2x2 and 2x4 in turn, one in four on the reservation and the others flex-start, 1 s
  runs, inserted by the upper layer one every ``MIXED_GAP_S`` (the poller finds them at
  its polls), every fifth aborted once it holds its queue's slot or runs; the marginal
  between a run of n1 and one of n2 tasks. Beside it, where the statements go: per
  statement kind, per role (the actor that sent it: queue, cluster, poller; supervisor
  is the driver's Store) and per ``Store`` method (the method named with each counted
  statement), and the Falcon node pools the fleet created per task.
- ``idle``: the same controller with nothing to do: statements/s of the poller, of each
  queue (with 1 queue and with every one-host topology's queue created) and the rest.
- ``actors_rss_mb``: every actor's resident memory at the end of the end-to-end run.
- ``handover`` / ``messages``: without Ray: the real ``QueueReconciler`` on the real
  Store (the ``--db`` database) behind a port that answers like a fleet with zero pod
  start. One task Running on a one-host pool, N Waiting; the running task is aborted;
  the figure is the controller time (sum of the queue's steps) until the next task is
  Running, p50 over a few hand-overs, and the message rows/statements written per hand-over.
  The steps' sum includes the positions written at the end of the step that made the next
  task Running (every Waiting task's position changes); ``to_running_p50_ms`` is the
  controller time until the Running write itself.
- ``intake``: without Ray: the real ``IntakePoller`` taking N Pending tasks to Waiting.
- ``scale``: without Ray: 13 clusters x 8 topologies = 104 ``QueueReconciler`` in this
  process over N waiting tasks; each queue's step time (p50/p99) and this process's RSS.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.model import (
    ClusterView,
    JobPhase,
    JobView,
    OpKind,
    OpState,
    OpView,
    PoolStatus,
    PoolView,
    ReservationView,
)
from falcon_ray.render import LABEL_TASK_ID
from falcon_ray.store import Store, observe_statements
from falcon_ray.store import tables as t
from falcon_ray.store.core import tls_connect_args
from falcon_ray.store.migrate import upgrade

ONE_HOST = "2x2"
TOPOLOGIES = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
SIZES = {
    "full": dict(lifecycle=(10, 40), mixed=(10, 40), mixed_warmup=4, idle_s=15, handover=(100, 1000, 10000), reps=3, intake=10000, scale=10000, scale_steps=5),
    "quick": dict(lifecycle=(3, 8), mixed=(4, 12), mixed_warmup=4, idle_s=6, handover=(100, 1000), reps=3, intake=1000, scale=1000, scale_steps=3),
    # every part once, at its smallest: the mixed run of 6 holds an abort (every fifth task)
    "smoke": dict(lifecycle=(1, 3), mixed=(2, 6), mixed_warmup=2, idle_s=2, handover=(100, 1000), reps=1, intake=200, scale=208, scale_steps=2),
}


def _rss_mb(pid: int | None = None) -> float | None:
    try:
        with open(f"/proc/{pid or 'self'}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


# ---- databases -------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_db(db: str | None) -> Iterator[str]:
    """A fresh empty database: a SQLite file, or a new database on the MySQL server of ``db``."""
    if not db or db.startswith("sqlite"):
        with tempfile.TemporaryDirectory(prefix="falcon-bench-") as d:
            yield f"sqlite:///{d}/bench.db"
        return
    server = sa.engine.make_url(db).set(database=None)
    name = f"falcon_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    eng = sa.create_engine(server, poolclass=sa.pool.NullPool, connect_args=tls_connect_args(server))
    with eng.begin() as c:
        c.execute(sa.text(f"CREATE DATABASE {name} CHARACTER SET utf8mb4"))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with eng.begin() as c:
            c.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
        eng.dispose()


def _questions(url: str) -> int | None:
    if url.startswith("sqlite"):
        return None
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args=tls_connect_args(url))
    try:
        with eng.connect() as c:
            return int(c.execute(sa.text("SHOW GLOBAL STATUS LIKE 'Questions'")).first()[1])
    finally:
        eng.dispose()


# ---- a port that answers like a fleet with zero pod start ---------------------------------


class FleetPort:
    """``actors.port.Port`` without Ray or HTTP: a pool asked for is RUNNING with its nodes
    Ready at the next look, a Job submitted has every pod ready, deletes are immediate."""

    def __init__(self, hosts: int = 1, reservation_hosts: int = 1) -> None:
        self.hosts = hosts
        self.reservation_hosts = reservation_hosts  # one slice: one task runs, the rest wait
        self.pools: dict[str, PoolView] = {}
        self.ops: dict[str, OpView] = {}
        self.jobs: dict[int, JobView] = {}
        self.calls = 0

    def observe(self, cluster: str, queue_label: str, pool_names: list[str], want_reservation: bool) -> ClusterView:
        self.calls += 1
        return ClusterView(
            pools={n: self.pools[n] for n in pool_names if n in self.pools},
            ops={n: self.ops[n] for n in pool_names if n in self.ops},
            jobs=dict(self.jobs),
            reservation=ReservationView(self.reservation_hosts, min(self.reservation_hosts, len(self.pools) * self.hosts))
            if want_reservation
            else None,
        )

    def claim_reservation(self, cluster: str, name: str, hosts: int) -> bool:
        """The ledger of a fleet whose pools have their nodes at once: what its pools hold."""
        return name in self.pools or len(self.pools) * self.hosts + hosts <= self.reservation_hosts

    def ensure_pool(self, cluster: str, name: str, request: dict[str, Any], operation: str | None = None) -> str:
        self.pools[name] = PoolView(name, PoolStatus.RUNNING, self.hosts, self.hosts)
        self.ops[name] = OpView(OpKind.CREATE, OpState.DONE, operation=operation or f"op-{name}")
        return OpState.DONE

    def delete_pool(self, cluster: str, name: str) -> str:
        self.pools.pop(name, None)
        self.ops[name] = OpView(OpKind.DELETE, OpState.DONE)
        return OpState.DONE

    def submit_job(self, cluster: str, manifest: dict[str, Any], service: dict[str, Any] | None) -> dict[str, Any]:
        md = manifest["metadata"]
        tid = int(md["labels"][LABEL_TASK_ID])
        uid = f"uid-{tid}"
        self.jobs[tid] = JobView(tid, md["name"], md["namespace"], uid, JobPhase.RUNNING, self.hosts, self.hosts, self.hosts)
        return {"uid": uid, "created": True}

    def delete_job(self, cluster: str, namespace: str, name: str) -> bool:
        for tid, j in list(self.jobs.items()):
            if j.name == name:
                del self.jobs[tid]
        return True

    def hint(self, cluster: str, topology: str, create: bool = True) -> None:
        pass


def _spec(topology: str = ONE_HOST, run_s: float | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"tpu_type": "v6e", "topology": topology, "image": "us-docker.pkg.dev/p/r/img:1", "command": ["run"]}
    if run_s is not None:
        s["env"] = {"FALCON_SIM_RUN_SECONDS": str(run_s)}
    return s


def _bulk_pending(store: Store, n: int, topologies: tuple[str, ...] = (ONE_HOST,), actors: int = 7) -> None:
    """n Pending rows exactly as the upper layer writes them (one multi-row insert per 1,000)."""
    now = store.clock()
    rows = [
        dict(
            name=f"t{i}",
            actor=f"actor-{i % actors}",
            spec=json.dumps(_spec(topologies[i % len(topologies)]), sort_keys=True),
            status="Pending",
            reason="",
            message="",
            created_at=now + dt.timedelta(milliseconds=i),
            updated_at=now,
        )
        for i in range(n)
    ]
    with store.engine.begin() as c:
        for i in range(0, n, 1000):
            c.execute(t.jobs.insert(), rows[i : i + 1000])


def _settings(**kw: Any):
    from falcon_ray.devtools.demo import demo_settings

    return demo_settings(health_port=0, **kw)


def _intake_all(poller, store: Store) -> float:
    t0 = time.perf_counter()
    while True:
        counts = poller.poll_once()
        if not counts["new"]:
            break
    return time.perf_counter() - t0


# ---- Ray-free figures ---------------------------------------------------------------------------


def bench_intake(db: str | None, n: int) -> dict[str, Any]:
    from actors.poller import IntakePoller

    with fresh_db(db) as url:
        upgrade(url, with_jobs_table=True)
        store = Store(url)
        for i in range(3):
            store.add_cluster(f"edge-{i}", "p", "us-east5-b", "v6e", "logs", f"res-{i}")
        _bulk_pending(store, n)
        poller = IntakePoller(_settings(), store, FleetPort())
        s0 = store.statements
        seconds = _intake_all(poller, store)
        left = sum(1 for x in store.live_tasks() if x.phase == lc.NEW)
        out = {"tasks": n, "seconds": round(seconds, 2), "per_s": round(n / seconds), "statements": store.statements - s0, "left_pending": left}
        store.dispose()
    return out


def _running_queue(url: str, waiting: int, topology: str = ONE_HOST):
    """One queue with one task Running on a one-host pool and ``waiting`` tasks Waiting behind it."""
    from actors.poller import IntakePoller
    from actors.queue import QueueReconciler

    upgrade(url, with_jobs_table=True)
    store = Store(url)
    store.add_cluster("edge-a", "proj-a", "us-east5-b", "v6e", "logs-a", "res-a")
    settings = _settings()
    port = FleetPort()
    poller = IntakePoller(settings, store, port)
    first = store.submit_task("first", _spec(topology), name="first")
    poller.poll_once()
    queue = QueueReconciler("edge-a", topology, settings, store, port)
    for _ in range(20):
        queue.step()
        if store.get_task(first).phase == lc.RUNNING:
            break
    assert store.get_task(first).phase == lc.RUNNING, store.get_task(first)
    _bulk_pending(store, waiting)
    _intake_all(poller, store)
    queue.step()  # the positions are written once
    return store, queue, port, first


def _running_id(store: Store, queue) -> int | None:
    st = queue.last_state
    for x in st.tasks if st else ():
        if x.phase == lc.RUNNING:
            return x.id
    return None


class _MessageCounter:
    def __init__(self, store: Store) -> None:
        self.rows = self.calls = 0
        inner = store.refresh_messages

        def counted(updates):
            self.calls += 1
            self.rows += len(updates)
            return inner(updates)

        store.refresh_messages = counted  # type: ignore[method-assign]


def bench_handover(db: str | None, waiting: int, reps: int) -> dict[str, Any]:
    with fresh_db(db) as url:
        store, queue, port, running = _running_queue(url, waiting)
        msgs = _MessageCounter(store)
        times, to_running, steps, stmts = [], [], [], []
        ran: list[float] = []  # perf_counter() when a Running move is written
        inner = store.transition

        def timed(task_id, expect, to, message, *a, **kw):
            won = inner(task_id, expect, to, message, *a, **kw)
            if won and to == lc.RUNNING:
                ran.append(time.perf_counter())
            return won

        store.transition = timed  # type: ignore[method-assign]
        for _ in range(reps):
            store.request_abort(running)
            s0 = store.statements
            elapsed, n = 0.0, 0
            nxt = None
            ran.clear()
            until_running = None
            while n < 50:
                t0 = time.perf_counter()
                queue.step()
                elapsed += time.perf_counter() - t0
                if ran and until_running is None:
                    until_running = elapsed - (time.perf_counter() - ran[0])
                n += 1
                nxt = _running_id(store, queue)
                if nxt is not None and nxt != running and store.get_task(running).terminal:
                    break
            # the step that saw it Running may not be the one that wrote it: re-check the row
            assert nxt is not None and store.get_task(nxt).phase == lc.RUNNING
            times.append(elapsed)
            to_running.append(until_running if until_running is not None else elapsed)
            steps.append(n)
            stmts.append(store.statements - s0)
            running = nxt
        out = {
            "waiting": waiting,
            "p50_ms": round(statistics.median(times) * 1000, 1),
            "max_ms": round(max(times) * 1000, 1),
            "to_running_p50_ms": round(statistics.median(to_running) * 1000, 1),
            "steps": steps,
            "statements_per_handover": round(statistics.median(stmts), 1),
            "message_rows_per_handover": round(msgs.rows / reps, 1),
            "message_statements_per_handover": round(msgs.calls / reps, 2),
        }
        store.dispose()
    return out


def _idle_steps(queue, steps: int) -> None:
    """``steps`` steps as the queue's Ticker would space them: they follow each other at
    once here, so a step that comes ``queue_full_read_s`` or more after the last full read
    (in the simulated time of ``interval()`` per step) makes the full read (and the
    registry read) that such a wait brings."""
    since_full = 0.0  # the first look was a full read
    for _ in range(steps):
        since_full += queue.interval()
        if since_full >= queue.s.queue_full_read_s:
            queue.full_read_at = queue.clusters_at = -float("inf")
            since_full = 0.0
        queue.step()


def bench_idle_queues(db: str | None, counts: tuple[int, ...] = (1, 104), seconds: float = 5.0) -> dict[str, Any]:
    """Empty queues and the poller, each stepped at its own interval (demo settings) for
    ``seconds`` of simulated time: statements/s = statements per step / interval, the
    full reads the waits bring counted (``_idle_steps``)."""
    from actors.poller import IntakePoller
    from actors.queue import QueueReconciler

    out: dict[str, Any] = {"how": "IntakePoller and empty QueueReconcilers on the Store, no Ray; demo intervals; the full reads the waits between steps bring are counted"}
    with fresh_db(db) as url:
        upgrade(url, with_jobs_table=True)
        store = Store(url)
        for i in range(13):
            store.add_cluster(f"edge-{i:02d}", "p", "us-east5-b", "v6e", "logs", f"res-{i}")
        settings = _settings()
        poller = IntakePoller(settings, store, FleetPort())
        poller.poll_once()
        s0 = store.statements
        for _ in range(10):
            poller.poll_once()
        out["poller_per_s"] = round((store.statements - s0) / 10 / poller.interval(), 2)
        for n in counts:
            qs = [
                QueueReconciler(f"edge-{i % 13:02d}", TOPOLOGIES[(i // 13) % 8], settings, store, FleetPort())
                for i in range(n)
            ]
            for q in qs:
                q.step()  # the first look
            s0, per_s = store.statements, 0.0
            for q in qs:
                before = store.statements
                _idle_steps(q, 8)
                per_s += (store.statements - before) / 8 / q.interval()
            out[f"{n}_queues"] = {"per_queue_per_s": round(per_s / n, 3), "all_queues_per_s": round(per_s, 2)}
        store.dispose()
    return out


def bench_scale(db: str | None, n: int, steps: int, clusters: int = 13) -> dict[str, Any]:
    from actors.poller import IntakePoller
    from actors.queue import QueueReconciler

    rss0 = _rss_mb()
    with fresh_db(db) as url:
        upgrade(url, with_jobs_table=True)
        store = Store(url)
        for i in range(clusters):
            store.add_cluster(f"edge-{i:02d}", "p", "us-east5-b", "v6e", "logs", f"res-{i}")
        settings = _settings()
        port = FleetPort()
        _bulk_pending(store, n, TOPOLOGIES)
        t_intake = _intake_all(IntakePoller(settings, store, port), store)
        # one Store for the 104 queues of this one process: in a deployment each QueueActor
        # has its own (two connections: reads and one-statement writes, transactions), which
        # 104 in one process would take past a default MySQL's max_connections (151)
        shared = Store(url)
        queues = [
            QueueReconciler(f"edge-{i:02d}", topo, settings, shared, FleetPort(hosts=1))
            for i in range(clusters)
            for topo in TOPOLOGIES
        ]
        durations: list[float] = []
        first: list[float] = []
        for k in range(steps):
            for q in queues:
                t0 = time.perf_counter()
                q.step()
                (first if k == 0 else durations).append(time.perf_counter() - t0)
        waiting = sum(1 for x in store.live_tasks() if x.phase == lc.WAITING)
        out = {
            "queues": len(queues),
            "tasks": n,
            "waiting_after": waiting,
            "intake_s": round(t_intake, 1),
            "first_step_p99_ms": round(_pct(first, 0.99) * 1000, 1),
            "step_p50_ms": round(_pct(durations, 0.5) * 1000, 1),
            "step_p99_ms": round(_pct(durations, 0.99) * 1000, 1),
            "step_max_ms": round(max(durations) * 1000, 1) if durations else 0,
            "process_rss_mb": _rss_mb(),
            "process_rss_before_mb": rss0,
        }
        shared.dispose()
        store.dispose()
    return out


# ---- end to end (Ray + sim) ----------------------------------------------------------------------


def _fleet():
    from falcon_ray.sim.fleet import FAST_TIMINGS, FleetConfig

    timings = dict(FAST_TIMINGS)
    edge = {
        "name": "edge-a",
        "project": "proj-a",
        "location": "us-east5-b",
        "tpu_type": "v6e",
        "gcs_bucket": "logs-a",
        "reservation": {"name": "res-a", "count": 4},
        "chips": 64,
        "timings": timings,
    }
    return FleetConfig(seed=1, clusters=[edge])


# ---- statement counts across the controller's processes ---------------------------------------

COUNTS_ENV = "FALCON_BENCH_COUNTS"  # the counts directory, given to Ray's workers in the runtime_env
COUNTS_WRITE_S = 0.5  # the per-method file is rewritten this often
_counts_dir = ""  # the directory of the part running now


class StatementFiles:
    """This process's Store statements, in files of ``directory`` the bench adds up:
    ``<pid>.cnt``, the running total, rewritten at each statement (an actor that is
    killed, a retired queue, keeps its count), and ``<pid>.json``, the counts by
    ``"method KIND"``, rewritten every ``COUNTS_WRITE_S`` by a thread. Stores whose id
    is in ``skip`` (the bench's own, the upper layer's) are not counted."""

    def __init__(self, directory: str) -> None:
        base = os.path.join(directory, str(os.getpid()))
        self.fd = os.open(base + ".cnt", os.O_WRONLY | os.O_CREAT, 0o644)
        self.json_path = base + ".json"
        self.skip: set[int] = set()
        self.total = 0
        self.by: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        threading.Thread(target=self._flush_loop, name="bench-counts", daemon=True).start()

    def __call__(self, store, method: str, kind: str) -> None:
        if id(store) in self.skip:
            return
        with self.lock:
            self.total += 1
            key = f"{method} {kind}"
            self.by[key] = self.by.get(key, 0) + 1
            os.pwrite(self.fd, b"%20d\n" % self.total, 0)

    def flush(self) -> None:
        with self.lock:
            counts = dict(self.by)
        tmp = f"{self.json_path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(counts, f)
            os.replace(tmp, self.json_path)
        except OSError:  # the bench that reads these files has ended and removed their directory
            self.stopped.set()

    def _flush_loop(self) -> None:
        while not self.stopped.wait(COUNTS_WRITE_S):
            self.flush()

    def close(self) -> None:
        self.stopped.set()
        self.flush()
        os.close(self.fd)


def count_in_worker() -> None:
    """Ray's worker setup hook of the bench's runs: count this worker's Store statements
    into the directory the runtime_env names."""
    directory = os.environ.get(COUNTS_ENV, "")
    if directory:
        observe_statements(StatementFiles(directory))


@contextlib.contextmanager
def _counting() -> Iterator[StatementFiles]:
    """Start Ray (as ``DemoRun`` would) with every worker counting its Store statements,
    and count the driver's too, into a fresh directory, for one part of the bench."""
    import ray

    from falcon_ray.devtools.demo import init_ray

    global _counts_dir
    directory = tempfile.mkdtemp(prefix="falcon-bench-counts-")
    here = StatementFiles(directory)
    stop = observe_statements(here)
    hook = "falcon_ray.devtools.bench.count_in_worker"
    env = {"env_vars": {COUNTS_ENV: directory}, "worker_process_setup_hook": hook}
    init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False, runtime_env=env)
    _counts_dir = directory
    try:
        yield here
    finally:
        stop()
        here.close()
        _counts_dir = ""
        if ray.is_initialized():
            ray.shutdown()


def _counts() -> dict[int, int]:
    """Statements per process, from the count files (killed actors included)."""
    out: dict[int, int] = {}
    for f in os.listdir(_counts_dir) if _counts_dir else ():
        if not f.endswith(".cnt"):
            continue
        try:
            with open(os.path.join(_counts_dir, f)) as fh:
                out[int(f[: -len(".cnt")])] = int(fh.read().strip() or 0)
        except (OSError, ValueError):
            continue
    return out


def _driver_statements(run) -> int:
    return sum(_counts().values())


def _actor_pids(run) -> dict[int, str]:
    """pid -> actor name of this run's live actors (from Ray's actor table; no dashboard)."""
    import ray._private.state as ray_state

    from actors import names

    mine = set(names.list_falcon_actors(run.settings.namespace))
    out = {}
    for a in ray_state.actors().values():
        if a.get("State") == "ALIVE" and a.get("Name") in mine and a.get("Pid"):
            out[int(a["Pid"])] = a["Name"]
    return out


def _actor_rss(run) -> dict[str, float | None]:
    out: dict[str, float | None] = {name: _rss_mb(pid) for pid, name in _actor_pids(run).items()}
    out["driver (supervisor, sim, bench)"] = _rss_mb()
    return out


def _run_batch(run, n: int, timeout: float) -> dict[str, Any]:
    s0, q0, b0, t0 = _driver_statements(run), _questions(run.db_url), run.store.statements, time.monotonic()
    ids = [run.submit(f"actor-{i % 3}", _spec(ONE_HOST, run_s=0.2), f"b{n}-{i}") for i in range(n)]
    ok = run.wait(lambda: all(x.terminal for x in run.store.get_tasks(ids)) and not run.falcon_pools_alive(), timeout)
    run.wait(lambda: all(l.state == "Deleted" for l in run.store.leases(live_only=False)), 30)
    q1 = _questions(run.db_url)
    out = {
        "tasks": n,
        "done": ok,
        "succeeded": sum(1 for x in run.store.get_tasks(ids) if x.status == "Succeeded"),
        "wall_s": round(time.monotonic() - t0, 1),
        "statements": _driver_statements(run) - s0,
    }
    if not ok:
        out["stuck"] = sorted({f"{x.id} {x.status}/{x.reason}: {x.message}" for x in run.store.get_tasks(ids) if not x.terminal})
        out["pools_alive"] = run.falcon_pools_alive()
    if q0 is not None and q1 is not None:
        out["questions"] = q1 - q0 - (run.store.statements - b0) - 2
    return out


# ---- the mixed workload ------------------------------------------------------------------------


MIXED_TOPOLOGIES = ("2x2", "2x4")
MIXED_RUN_S = 1.0
MIXED_GAP_S = 0.3  # between two submits: about two new tasks per poll, mostly a pool created and deleted per task
MIXED_ABORT_EVERY = 5  # every fifth task is aborted once it holds its queue's slot or runs


def _mixed_fleet():
    """Two clusters of the same TPU type: edge-a with a reservation (8 hosts) and flex-start
    capacity, edge-b with flex-start capacity only."""
    from falcon_ray.sim.fleet import FAST_TIMINGS, FleetConfig

    def cluster(name: str, reservation: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "name": name,
            "project": f"proj-{name[-1]}",
            "location": "us-east5-b",
            "tpu_type": "v6e",
            "gcs_bucket": f"logs-{name[-1]}",
            "reservation": reservation,
            "chips": 64,
            "timings": dict(FAST_TIMINGS),
        }

    return FleetConfig(seed=1, clusters=[cluster("edge-a", {"name": "res-a", "count": 8}), cluster("edge-b", None)])


def _mixed_spec(i: int) -> dict[str, Any]:
    """Task i of the mixed workload: 2x2 and 2x4 in turn; one task in four on the
    reservation, the others flex-start (placed on either cluster by the poller)."""
    s = _spec(MIXED_TOPOLOGIES[i % 2], run_s=MIXED_RUN_S)
    s["supply_mode"] = "reservation" if i % 4 == 3 else "flex-start"
    return s


def _breakdowns() -> dict[int, dict[str, int]]:
    """Per process: statements by ``"Store.method KIND"``, from the breakdown files."""
    out: dict[int, dict[str, int]] = {}
    for f in os.listdir(_counts_dir) if _counts_dir else ():
        if not f.endswith(".json"):
            continue
        try:
            with open(os.path.join(_counts_dir, f)) as fh:
                out[int(f[: -len(".json")])] = {k: int(n) for k, n in json.load(fh).items()}
        except (OSError, ValueError):
            continue
    return out


def _role(name: str) -> str:
    return name.split("/", 1)[0] if "/" in name else name


class _Tally:
    """Statements by role (queue, cluster, poller, supervisor), by kind and by Store method,
    between two readings of the breakdown files (a process that ended keeps its file)."""

    def __init__(self, run) -> None:
        self.run = run
        self.roles: dict[int, str] = {}

    def read(self) -> dict[tuple[str, str, str], int]:
        import ray._private.state as ray_state

        for a in ray_state.actors().values():  # retired (dead) actors too: their files stay
            if a.get("Pid") and a.get("Name"):
                self.roles[int(a["Pid"])] = _role(a["Name"])
        self.roles[os.getpid()] = "supervisor"
        out: dict[tuple[str, str, str], int] = {}
        for pid, counts in _breakdowns().items():
            role = self.roles.get(pid, "other")
            for key, n in counts.items():
                method, _, kind = key.rpartition(" ")
                k = (role, method, kind)
                out[k] = out.get(k, 0) + n
        return out

    @staticmethod
    def diff(a: dict, b: dict) -> dict[tuple[str, str, str], int]:
        return {k: n - a.get(k, 0) for k, n in b.items() if n - a.get(k, 0)}


def _group(d: dict[tuple[str, str, str], int], key) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, n in d.items():
        g = key(k)
        out[g] = out.get(g, 0) + n
    return dict(sorted(out.items(), key=lambda x: -x[1]))


def _falcon_pools_created(run) -> int:
    stats = run.sim.stats()
    return sum(1 for c in stats["clusters"].values() for p in c["node_pools"] if p["name"].startswith("falcon-"))


def _run_mixed(run, tally: _Tally, n: int, timeout: float) -> dict[str, Any]:
    b0, s0, q0, own0, p0 = tally.read(), _driver_statements(run), _questions(run.db_url), run.store.statements, _falcon_pools_created(run)
    t0 = time.monotonic()
    ids: list[int] = []
    to_abort: set[int] = set()

    def aborts() -> list:
        tasks = run.store.get_tasks(ids)
        for x in tasks:  # aborted once it holds something: its pool is being made, or it runs
            if x.id in to_abort and not x.terminal and (x.status == "Running" or x.reason not in ("", "Waiting")):
                to_abort.discard(x.id)
                run.store.request_abort(x.id)  # the upper layer: the poller sees it at its next poll
        return tasks

    for i in range(n):  # the upper layer's insert alone: the poller finds the rows at its next poll
        ids.append(run.store.submit_task(f"actor-{i % 3}", _mixed_spec(i), name=f"m{n}-{i}"))
        if i % MIXED_ABORT_EVERY == MIXED_ABORT_EVERY - 1:
            to_abort.add(ids[-1])
        time.sleep(MIXED_GAP_S)
        if i % 3 == 2:
            aborts()
    ok = run.wait(lambda: all(x.terminal for x in aborts()) and not run.falcon_pools_alive(), timeout)
    run.wait(lambda: all(l.state == "Deleted" for l in run.store.leases(live_only=False)), 30)
    time.sleep(1)  # the breakdown files are rewritten every COUNTS_WRITE_S
    q1 = _questions(run.db_url)
    tasks = run.store.get_tasks(ids)
    out: dict[str, Any] = {
        "tasks": n,
        "done": ok,
        "outcomes": {st: sum(1 for x in tasks if x.status == st) for st in sorted({x.status for x in tasks})},
        "pools_created": _falcon_pools_created(run) - p0,
        "wall_s": round(time.monotonic() - t0, 1),
        "statements": _driver_statements(run) - s0,
        "by": tally.diff(b0, tally.read()),
    }
    if not ok:
        out["stuck"] = sorted({f"{x.id} {x.status}/{x.reason}: {x.message}" for x in tasks if not x.terminal})
        out["pools_alive"] = run.falcon_pools_alive()
    if q0 is not None and q1 is not None:
        out["questions"] = q1 - q0 - (run.store.statements - own0) - 2
    return out


def bench_lifecycle_mixed(db: str | None, sizes: tuple[int, int], warmup: int = 4) -> dict[str, Any]:
    """Statements per task on the mixed workload (``_mixed_fleet``, ``_mixed_spec``): the
    marginal between a run of n1 and a run of n2 tasks, with where they go."""
    from falcon_ray.devtools.demo import DemoRun

    with fresh_db(db) as url, _counting() as here:
        run = DemoRun(_mixed_fleet(), _settings(), url).start()
        here.skip.add(id(run.store))  # the upper layer's inserts and aborts, the bench's reads
        try:
            tally = _Tally(run)
            warm = [run.submit("warmup", _mixed_spec(i), f"warmup-{i}") for i in range(warmup)]
            if not run.wait(lambda: all(x.terminal for x in run.store.get_tasks(warm)) and not run.falcon_pools_alive(), 120):
                raise RuntimeError(f"warm-up tasks did not finish: {run.store.get_tasks(warm)}")
            time.sleep(1)
            a, b = (_run_mixed(run, tally, n, 120 + 6 * n) for n in sizes)
        finally:
            run.stop()
    span = b["tasks"] - a["tasks"]
    marginal = {k: (n - a["by"].get(k, 0)) / span for k, n in b["by"].items()}

    def per_task(key) -> dict[str, float]:
        return {k: round(v, 2) for k, v in _group(marginal, key).items() if abs(v) >= 0.05}

    for r in (a, b):
        r["by_kind"] = _group(r.pop("by"), lambda k: k[2])
    out: dict[str, Any] = {
        "how": (
            "DemoRun (Ray actors + falcon_ray.sim over HTTP), two clusters (edge-a: reservation of 8 hosts and flex-start, "
            f"edge-b: flex-start), 2x2 and 2x4 in turn, one task in four on the reservation, {MIXED_RUN_S:g} s runs, "
            f"a submit every {MIXED_GAP_S:g} s, every {MIXED_ABORT_EVERY}th task aborted once it acquires or runs; marginal between "
            "the two runs; the breakdown from "
            "each Store's per-method counts (role = the actor that sent it, supervisor = the driver's Store)"
        ),
        "runs": [a, b],
        "statements_per_task": round((b["statements"] - a["statements"]) / span, 1),
        "by_kind": per_task(lambda k: k[2]),
        "by_role": per_task(lambda k: k[0]),
        "by_method": per_task(lambda k: f"{k[0]} {k[1]} {k[2]}"),
        "pools_per_task": round((b["pools_created"] - a["pools_created"]) / span, 2),
    }
    if "questions" in a and "questions" in b:
        out["server_questions_per_task"] = round((b["questions"] - a["questions"]) / span, 1)
    return out


def bench_end_to_end(db: str | None, sizes: tuple[int, int], idle_s: float) -> dict[str, Any]:
    from falcon_ray.devtools.demo import DemoRun

    with fresh_db(db) as url, _counting() as here:
        run = DemoRun(_fleet(), _settings(), url).start()
        here.skip.add(id(run.store))  # the upper layer's inserts, the bench's reads
        try:
            warm = run.submit("warmup", _spec(ONE_HOST, run_s=0.2), "warmup")
            if not run.wait(lambda: run.store.get_task(warm).terminal and not run.falcon_pools_alive(), 90):
                raise RuntimeError(f"warm-up task did not finish: {run.store.get_task(warm)}")
            time.sleep(1)
            batches = [_run_batch(run, n, 120 + 4 * n) for n in sizes]
            (a, b) = batches
            life = {
                "how": "DemoRun (Ray actors + falcon_ray.sim over HTTP), one reservation, one-host tasks; marginal between the two runs",
                "runs": batches,
                "statements_per_task": round((b["statements"] - a["statements"]) / (b["tasks"] - a["tasks"]), 1),
            }
            if "questions" in a and "questions" in b:
                life["server_questions_per_task"] = round((b["questions"] - a["questions"]) / (b["tasks"] - a["tasks"]), 1)
            idle = {"how": "per-process Store counters (statements + COMMIT + ROLLBACK) over a quiet window with nothing live (queues retired), demo intervals (poll 0.5 s, registry 1 s)"}
            time.sleep(3)  # the supervisor retires the queue that has nothing live
            idle["nothing_live"] = _idle_rates(run, idle_s)
            rss = _actor_rss(run)
        finally:
            run.stop()
    return {"lifecycle": life, "idle": idle, "actors_rss_mb": rss}


def _idle_rates(run, seconds: float) -> dict[str, Any]:
    pids = _actor_pids(run)
    c0, t0, q0, b0 = _counts(), time.monotonic(), _questions(run.db_url), run.store.statements
    time.sleep(seconds)
    c1, el, q1 = _counts(), time.monotonic() - t0, _questions(run.db_url)
    rate = {pid: round((n - c0.get(pid, 0)) / el, 2) for pid, n in c1.items()}
    named = {pids.get(pid, "driver (supervisor)" if pid == os.getpid() else f"pid {pid}"): r for pid, r in rate.items()}
    queues = {k: v for k, v in named.items() if k.startswith("queue/")}
    out = {
        "poller_per_s": named.get("poller", 0.0),
        "queues": len(queues),
        "per_queue_per_s": queues,
        "clusters_per_s": round(sum(v for k, v in named.items() if k.startswith("cluster/")), 2),
        "supervisor_per_s": named.get("driver (supervisor)", 0.0),
        "total_per_s": round(sum(rate.values()), 2),
    }
    if q0 is not None and q1 is not None:
        out["server_questions_per_s"] = round((q1 - q0 - 2 - (run.store.statements - b0)) / el, 2)
    return out


# ---- the document --------------------------------------------------------------------------------


PARTS = ("intake", "handover", "idle", "scale", "e2e", "lifecycle-mixed")


def run_bench(db: str | None = None, size_name: str = "full", parts: tuple[str, ...] = ()) -> dict[str, Any]:
    size = SIZES[size_name]
    doc: dict[str, Any] = {
        "size": size_name,
        "db": "sqlite" if not db or db.startswith("sqlite") else sa.engine.make_url(db).get_backend_name(),
        "machine": {"cpus": os.cpu_count()},
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    want = set(parts) or set(PARTS)
    t0 = time.monotonic()
    if "intake" in want:
        doc["intake"] = dict(bench_intake(db, size["intake"]), how="IntakePoller on the Store, no Ray")
    if "handover" in want:
        ho = [bench_handover(db, n, size["reps"]) for n in size["handover"]]
        by = {h["waiting"]: h for h in ho}
        doc["handover"] = {
            "how": "QueueReconciler on the Store with a zero-pod-start port, no Ray; controller time of the queue's steps",
            "runs": ho,
            "ratio_largest_to_100": round(ho[-1]["p50_ms"] / max(by[100]["p50_ms"], 0.001), 2),
            "to_running_ratio_largest_to_100": round(ho[-1]["to_running_p50_ms"] / max(by[100]["to_running_p50_ms"], 0.001), 2),
        }
        doc["messages"] = {
            "how": "the hand-overs above: Message rows and batched statements written per hand-over",
            "rows_per_dispatch": {h["waiting"]: h["message_rows_per_handover"] for h in ho},
            "statements_per_dispatch": {h["waiting"]: h["message_statements_per_handover"] for h in ho},
            "ratio_rows_1000_to_100": round(by[1000]["message_rows_per_handover"] / max(by[100]["message_rows_per_handover"], 0.001), 2),
            "ratio_statements_1000_to_100": round(
                by[1000]["message_statements_per_handover"] / max(by[100]["message_statements_per_handover"], 0.001), 2
            ),
        }
    if "idle" in want:
        doc["idle_queues"] = bench_idle_queues(db)
    if "scale" in want:
        doc["scale"] = dict(bench_scale(db, size["scale"], size["scale_steps"]), how="104 QueueReconcilers in one process sharing one Store (a deployment gives each QueueActor its own), no Ray")
    if "e2e" in want:
        doc.update(bench_end_to_end(db, size["lifecycle"], size["idle_s"]))
    if "lifecycle-mixed" in want:
        doc["lifecycle_mixed"] = bench_lifecycle_mixed(db, size["mixed"], size["mixed_warmup"])
    doc["bench_seconds"] = round(time.monotonic() - t0, 1)
    return doc


def render(doc: dict[str, Any]) -> str:
    lines = [f"falcon-ray bench ({doc['size']}, {doc['db']}, {doc['machine']['cpus']} cpus)"]

    def row(k: str, v: Any) -> None:
        lines.append(f"  {k:<48} {v}")

    if "lifecycle" in doc:
        lines.append("lifecycle, one queue (end to end: one reservation, one-host tasks)")
        row("statements per task (driver count)", doc["lifecycle"]["statements_per_task"])
        if "server_questions_per_task" in doc["lifecycle"]:
            row("server Questions per task (shared server)", doc["lifecycle"]["server_questions_per_task"])
    if "lifecycle_mixed" in doc:
        m = doc["lifecycle_mixed"]
        lines.append("lifecycle, mixed workload (end to end: two clusters, flex-start and reservation, 2x2 and 2x4, aborts)")
        row("statements per task (driver count)", m["statements_per_task"])
        if "server_questions_per_task" in m:
            row("server Questions per task (shared server)", m["server_questions_per_task"])
        row("pools created per task", m["pools_per_task"])
        row("per task by kind", ", ".join(f"{k} {v}" for k, v in m["by_kind"].items()))
        row("per task by actor", ", ".join(f"{k} {v}" for k, v in m["by_role"].items()))
        lines.append("  per task by actor, Store method and kind (>= 0.05)")
        for k, v in m["by_method"].items():
            lines.append(f"    {k:<56} {v}")
    if "idle" in doc:
        i = doc["idle"]["nothing_live"]
        lines.append("idle, end to end, nothing live")
        row("poller / clusters / supervisor / total stmts/s", f"{i['poller_per_s']} / {i['clusters_per_s']} / {i['supervisor_per_s']} / {i['total_per_s']}")
    if "idle_queues" in doc:
        i = doc["idle_queues"]
        lines.append("idle queues (no Ray)")
        row("poller stmts/s", i["poller_per_s"])
        for k, v in i.items():
            if k.endswith("_queues"):
                row(f"{k}: per queue / all stmts/s", f"{v['per_queue_per_s']} / {v['all_queues_per_s']}")
    if "handover" in doc:
        lines.append("hand-over (no Ray)")
        for h in doc["handover"]["runs"]:
            row(f"{h['waiting']} waiting: p50 ms (steps) / to Running", f"{h['p50_ms']} ({h['steps']}) / {h.get('to_running_p50_ms')}")
        row("ratio largest / 100", doc["handover"]["ratio_largest_to_100"])
        m = doc["messages"]
        row("message rows per dispatch", m["rows_per_dispatch"])
        row("message statements per dispatch", m["statements_per_dispatch"])
    if "intake" in doc:
        i = doc["intake"]
        lines.append("intake (no Ray)")
        row(f"{i['tasks']} Pending -> Waiting, seconds", i["seconds"])
    if "scale" in doc:
        s = doc["scale"]
        lines.append("scale (no Ray)")
        row(f"{s['queues']} queues, {s['tasks']} tasks: step p50 / p99 ms", f"{s['step_p50_ms']} / {s['step_p99_ms']}")
        row("process RSS MB", s["process_rss_mb"])
    if "actors_rss_mb" in doc:
        row("actors RSS MB", ", ".join(f"{k}={v}" for k, v in doc["actors_rss_mb"].items()))
    row("bench seconds", doc.get("bench_seconds"))
    return "\n".join(lines)


__all__ = ["FleetPort", "PARTS", "run_bench", "render", "fresh_db"]
