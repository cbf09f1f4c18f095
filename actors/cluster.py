"""The ClusterActor's logic: one per edge cluster; the only holder of its GKE and Kubernetes clients.

Contract
--------
``ClusterGateway`` is a plain object (store, port, settings, clock, and optionally the
function that connects its clients, the random generator of its jitter and the factory of
its loops); the ClusterActor in ``actors.remote`` is its Ray shell. It observes and acts: the rules it applies (the reservation ledger, orphan pools, the
operation queue and what a failed operation does next, the connect backoff, the Job
cache) are the pure functions of ``falcon_ray.nodepools``, and a run's readiness is
``falcon_ray.faults.track_run``.
Hard state: none. Everything here is a cache of the cluster (node pools, nodes,
Jobs labelled ``managed-by=falcon``, reservation use) or of work in flight (the
node-pool operation queue). After a restart the caches refill from a full list and
the QueueActors re-request any create they still need; a create that meets 409
adopts the existing pool, a delete that meets 404 is done. So every method is
idempotent and may be retried.

- Clients: ``Adapters``, built by ``connect_to_gke`` (credentials from
  ``google.auth.default()`` only; the Kubernetes client built from the GKE endpoint and CA
  with a bearer token that refreshes itself) unless another ``connect`` was given.
- Node-pool operations on this cluster start in FIFO order and run side by side,
  ``pool_ops_at_once`` at most (GKE takes operations on distinct pools together, up to
  its per-cluster quota), never two on one pool; a refusal as concurrent while some of
  them run lowers that to as many as ran, for ``pool_ops_probe_s``
  (``nodepools.operations.at_once``), and the refused operation takes its turn again
  (by when it was asked for) when one of them ends, with no backoff timer. Other incompatible-operation, 429 and transient errors
  are retried with exponential backoff and jitter (``nodepools.operations``); a create refused for quota or
  stockout fails here (a stockout is waited out by its QueueActor, which asks again
  under a new name); a delete is retried until it succeeds, each failure counted so
  the QueueActor can report it.
- One Job watch (list, then watch from the list's resourceVersion, re-list on 410)
  keeps the Job cache and wakes the QueueActor of a Job's queue through the port when
  what its decisions read of the Job changed: an event that changes the Job's view, a
  re-list that finds it changed or gone (the first list, which makes the cache synced,
  wakes every queue it finds a Job of).
- Loops, each a ``Ticker`` unless another ``loops`` factory was given (guarded,
  timed, shown in ``snapshot()["loops"]``):
  connect-then-watch, ``pool_ops_at_once`` operation workers, the orphan scan, the gauges.
- The capacity ledger: this actor is the one writer of claims on the cluster's
  reservation. ``claim_reservation(pool, hosts)`` grants a claim only when
  ``count - inUseCount`` less what Falcon's own pools already claim covers it
  (``nodepools.ledger``); the claims are derived from the lease rows plus grants whose
  lease row is not written yet, so the ledger survives a restart and two queues never
  both take the last free slice. A claim reads the lease rows afresh;
  the view that ``observe`` hands to decisions reuses a read up to ``LEDGER_READ_TTL_S``
  old (a view a moment stale can only make a claim wait, never grant one).
- The reservation's machine type (``specificReservation.instanceProperties.machineType``)
  and the ledger's figures are written on the cluster row whenever they change (the
  reservation is read right after connecting), so the poller places a task only where
  the reservation can serve its shape and ``falcon-ray clusters list`` shows the ledger.
- The orphan scan deletes the pools ``nodepools.orphans`` finds (this installation's,
  managed by no live lease, held by no live task, older than the create-visibility
  grace); it also deletes Jobs whose task is over.

Fencing: the store carries the leader epoch the actor was started under. Before
every GKE or Kubernetes call that changes something (pool create/delete, Job
create/delete, the orphan scan) the gateway reads the lease (``_fence``); the loops
that only read (watch, pool list) use the check at most a fence period old. Once
fenced it stops every loop, closes the watch and refuses every call with ``Fenced``.

Blocking client calls run on the loops' threads and the actor's thread pool (a
threaded actor), never on an event loop.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from actors.port import Port
from actors.ticker import Loop, LoopFactory, Ticker
from falcon_ray import metrics, render
from falcon_ray.clock import SYSTEM, Clock
from falcon_ray.config import Settings
from falcon_ray.errors import CloudError, capacity_kind
from falcon_ray.faults import EvidenceRead, RunReadiness, track_run
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import (
    OP_IN_FLIGHT,
    Cluster,
    ClusterView,
    ErrorKind,
    JobPhase,
    JobView,
    OpKind,
    OpState,
    OpView,
    PoolView,
    ReservationError,
    ReservationView,
    RunEvidence,
    first_failure,
)
from falcon_ray.nodepools import connection, ledger, operations, orphans
from falcon_ray.nodepools import jobs as job_views
from falcon_ray.store import Fenced, Store
from falcon_ray.tpu import NODEPOOL_LABEL

log = logging.getLogger("falcon.cluster")

GAUGE_PERIOD_S = 10.0
LEDGER_READ_TTL_S = 1.0  # the lease rows behind the ledger's view are read at most this often
OP_IDLE_WAIT_S = 0.2
SLOW_CONNECT_S = 10.0  # a connect slower than this is logged as a warning, with its stages


@dataclass
class PoolOp:
    name: str
    kind: OpKind
    request: dict[str, Any] | None = None
    state: OpState = OpState.QUEUED
    attempts: int = 0
    error_kind: ErrorKind | None = None
    error: str = ""
    next_at: float = 0.0
    operation: str = ""  # GKE's operation name once the call was accepted (or recorded on the lease)
    queued_at: float = 0.0  # the gateway's clock.monotonic() when it was queued
    _view: tuple[tuple, OpView] | None = field(default=None, init=False, repr=False, compare=False)

    def view(self) -> OpView:
        """The operation as ``observe`` shows it: made again only when one of the fields it
        shows has changed since the last view (an ``OpView`` is frozen, so one is shared)."""
        shown = (self.kind, self.state, self.attempts, self.error_kind, self.error, self.operation)
        if self._view is None or self._view[0] != shown:
            self._view = (shown, OpView(*shown))
        return self._view[1]


@dataclass
class Adapters:
    """The clients of one connection to an edge cluster: what the gateway calls to observe
    and to act. The real ones are ``falcon_ray.gcp`` and ``falcon_ray.kube``; a simulator may
    hand in-process objects with the same methods and results.

    - ``gke``: the GKE calls on this cluster's node pools: ``list_node_pools``,
      ``create_node_pool`` (returns the operation name), ``delete_node_pool`` (the
      operation name, or None when the pool is gone), ``get_operation``; failures raise
      ``CloudError`` (409 as ALREADY_EXISTS, 404 as NOT_FOUND).
    - ``kube``: ``list_nodes``, ``create_job``, ``create_service``, ``delete_job``,
      ``delete_service``, ``job_failure_message``, ``run_evidence`` (``falcon_ray.kube.KubeApi``).
    - ``locations``: the zones of the cluster's nodes, as ``clusters.get`` reports them.
    - ``compute()``: builds the client of the reservation read (``reservation(project,
      zone, name)``), called once, at the first read.
    - ``resource_policies()``: builds the client of the workload-policy read (``get(project,
      region, name)``), called once, at the first TPU7x create that names a policy.
    - ``job_watcher(namespace, label_selector=, timeout_seconds=, clock=, rng=)``: a Job watch
      over ``kube`` (``falcon_ray.kube.JobWatcher``: ``step(on_job, on_resync, stopping)``
      returns the delay before the next step; ``close()``; ``reconnects``, ``relists``,
      ``last_event_at``, ``last_ok_at``).
    """

    gke: Any
    kube: Any
    locations: tuple[str, ...]
    compute: Callable[[], Any]
    resource_policies: Callable[[], Any]
    job_watcher: Callable[..., Any]


# (cluster row, settings, user agent, stage callback) -> the clients of one connection
Connect = Callable[[Cluster, Settings, str, Callable[[str], None]], Adapters]


# ---- the gateway's state, by part -------------------------------------------------------------


@dataclass
class Connection:
    """The clients of the last connect to the cluster, and how connecting goes. No client
    until the watch loop's first connect succeeds."""

    connect: Connect  # makes one connection (``connect_to_gke`` unless another was given)
    adapters: Adapters | None = None  # the clients of the last connect
    gke: Any = None
    kube: Any = None
    compute: Any = None  # built by the first reservation read (see _refresh_reservation)
    policy_api: Any = None  # built by the first workload-policy check
    watcher: Any = None  # the Job watch over ``kube``
    error: str = ""  # the last connect's failure; "" once connected
    error_since: dt.datetime | None = None  # the first failed connect since the last success
    failures: int = 0  # connects failed so far
    stage: str = "not started"  # what the connect in progress is doing, and since when
    stage_at: float = 0.0  # wall time
    timings: dict[str, float] = field(default_factory=dict)  # the last connect's seconds per stage
    watch_delay: float = 0.0  # before the watch loop's next step: the backoff, or the watch's own
    reported_reconnects: int = 0  # the watch's reconnects already counted in the metrics
    zones: tuple[str, ...] = ()  # the cluster's node zones, from clusters.get
    last_ok: dict[str, float | None] = field(default_factory=lambda: {"gke": None, "kubernetes": None, "compute": None})


@dataclass
class PoolCache:
    """The cluster's node pools as last listed, with the nodes registered in each."""

    pools: dict[str, PoolView] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)  # pool -> its resource labels
    first_seen: dict[str, float] = field(default_factory=dict)  # monotonic time of each pool's first listing
    listed_at: float = 0.0  # monotonic; 0: list again at the next observe
    synced: bool = False  # listed once
    refresh_lock: threading.Lock = field(default_factory=threading.Lock)  # one listing at a time


@dataclass
class JobCache:
    """Falcon's Jobs on the cluster as the watch reported them, and what is known of their
    runs for the queue's classification of a fault (``falcon_ray.faults``)."""

    jobs: dict[int, JobView] = field(default_factory=dict)  # task id -> its newest attempt's Job
    queue_label: dict[int, str] = field(default_factory=dict)  # task id -> the queue label of its Job
    synced: bool = False  # listed once
    failure_detail: dict[str, str] = field(default_factory=dict)  # Job uid -> its pods' own words
    # Job uid -> what was read of its pods and nodes when it failed or its pods stopped being ready
    evidence: dict[str, RunEvidence] = field(default_factory=dict)
    runs: dict[str, RunReadiness] = field(default_factory=dict)  # Job uid -> its run's readiness


@dataclass
class OperationQueue:
    """The node-pool operations: the newest per pool, and the FIFO the worker runs them from."""

    ops: dict[str, PoolOp] = field(default_factory=dict)
    fifo: deque[PoolOp] = field(default_factory=deque)
    running: dict[str, PoolOp] = field(default_factory=dict)  # pool -> the operation a worker runs now
    learned: operations.Concurrency = field(default_factory=operations.Concurrency)
    pool_topology: dict[str, str] = field(default_factory=dict)  # pool -> its queue's topology (from observe)


@dataclass
class ReservationState:
    """The reservation as last read, and the claims on it (``falcon_ray.nodepools.ledger``)."""

    reading: ReservationView | None = None
    error: ReservationError | None = None  # why the last read found none
    read_at: float = 0.0  # monotonic
    zone: str = ""  # where the reservation was found
    recorded: tuple[Any, ...] | None = None  # the figures last written on the cluster row
    claim_lock: threading.Lock = field(default_factory=threading.Lock)  # one claim weighed at a time
    rows: tuple[float, list | None] = (0.0, None)  # (read at, the lease rows behind the ledger)
    grants: dict[str, ledger.Grant] = field(default_factory=dict)  # pool -> its claim, until a lease row carries it
    # the registered nodes per pool as listed before the reservation was last read: GKE's
    # in_use counts at least these, so the ledger subtracts them and no node that in_use
    # does not count yet (``nodepools.ledger``'s contract)
    registered: dict[str, int] = field(default_factory=dict)


def connect_to_gke(cluster: Cluster, settings: Settings, user_agent: str, stage: Callable[[str], None]) -> Adapters:
    """The real clients: application default credentials, the cluster read from the GKE API,
    a Kubernetes client on its endpoint and CA with a bearer token that refreshes itself."""
    if settings.metadata_host:  # the simulated fleet's metadata server (configuration, not a branch)
        os.environ["GCE_METADATA_HOST"] = settings.metadata_host
        os.environ["GCE_METADATA_IP"] = settings.metadata_host
    stage("loading the GCP clients")
    import google.auth

    from falcon_ray.gcp import ComputeApi, GkeApi, ResourcePolicyApi
    from falcon_ray.kube import JobWatcher, KubeApi, api_client

    stage("getting credentials (application default credentials)")
    creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    stage("reading the cluster from the GKE API")
    rest = {"credentials": creds, "timeout": settings.api_retry_timeout_s, "user_agent": user_agent}
    gke = GkeApi(endpoint=settings.gke_endpoint, **rest)
    ep = gke.get_cluster(cluster.project, cluster.location, cluster.name)
    stage("building the Kubernetes client")
    client = api_client(ep.endpoint, ep.ca_certificate_pem, creds, scheme=settings.kubernetes_scheme, user_agent=user_agent)
    kube = KubeApi(client, retry_timeout=settings.api_retry_timeout_s)
    return Adapters(
        gke=gke,
        kube=kube,
        locations=tuple(ep.locations or ()),
        compute=lambda: ComputeApi(endpoint=settings.compute_endpoint, **rest),
        resource_policies=lambda: ResourcePolicyApi(endpoint=settings.compute_endpoint, **rest),
        job_watcher=lambda namespace, **kw: JobWatcher(kube, namespace, **kw),
    )


class ClusterGateway:
    """One edge cluster's clients, caches and node-pool operation queue (the module's contract).

    Its state comes in five parts: ``conn`` (``Connection``: the clients and how connecting
    goes), ``pool_cache`` (``PoolCache``), ``job_cache`` (``JobCache``), ``op_queue``
    (``OperationQueue``) and ``reservation`` (``ReservationState``); ``lock`` guards the
    caches and the operation queue. The read-only views (``gke``, ``watcher``,
    ``watch_delay``, ``view_listed_at``, ``pool_owner``, ``op_views``,
    ``next_operation_due``) show what a scheduler of the loops reads.

    ``connect``, when given, replaces the real clients (a simulator hands in-process ones):
    ``connect(cluster, settings, user_agent, stage)`` is called by every connect attempt,
    from the watch loop's thread, and returns the ``Adapters`` of one connection or raises
    (the attempt failed; the loop tries again with backoff). ``stage(text)`` names what the
    call is doing, for ``not_connected()`` and the connect timings. Without it the gateway
    connects to GKE (``connect_to_gke``).

    ``rng`` draws every jitter the gateway adds (the connect backoff, an operation's retry
    delay); without it, a new ``random.Random`` seeded from the ``random`` module's
    generator (so a process that seeds ``random`` replays the gateway's jitter too).

    ``loops``, when given, starts the gateway's periodic loops instead of ``Ticker``
    (a simulator runs them from its own scheduler). It is called once per loop, in the
    constructor, as ``Ticker`` is: ``loops(name, step, interval, log, start_after=,
    clock=)``; each call returns a started ``actors.ticker.Loop`` that calls ``step()`` at
    once (or after ``start_after`` seconds of ``clock``), then again after ``interval()``
    seconds (read after each step: it changes) or at once on ``wake()``, never two steps
    of one loop at a time, and a step that raises is logged and the loop goes on; ``stop()``
    ends it after the step in progress, ``join(timeout)`` says whether it has ended,
    ``status()`` is shown in ``snapshot()["loops"]``. The loops are kept in ``tickers`` by
    their role: ``watch`` (connect with backoff, then the Job watch; its interval is the
    delay the last step asked for), ``operations`` and ``operations-2`` ...
    ``operations-N`` for ``pool_ops_at_once`` N (each runs due node-pool operations, one
    at a time, while fewer than the cluster takes at once run; woken by a new operation
    and by a connect: ``op_loops``), ``orphans`` (the orphan scan, every
    ``orphan_scan_interval_s``, first after one period) and ``gauges`` (every
    ``GAUGE_PERIOD_S``, first after one period). Their steps block on GKE and Kubernetes
    calls: a scheduler without threads must let them.
    """

    def __init__(
        self,
        cluster_name: str,
        settings: Settings,
        store: Store,
        port: Port,
        clock: Clock = SYSTEM,
        connect: Connect | None = None,
        rng: random.Random | None = None,
        loops: LoopFactory | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.rng = rng if rng is not None else random.Random(random.getrandbits(64))
        self.name = cluster_name
        self.store = store
        self.port = port
        self.cluster = self.store.get_cluster(cluster_name)
        self.lock = threading.RLock()  # guards the caches and the operation queue
        self.stop = threading.Event()
        self.conn = Connection(connect or connect_to_gke, stage_at=clock.time())
        self.pool_cache = PoolCache()
        self.job_cache = JobCache()
        self.op_queue = OperationQueue()
        self.reservation = ReservationState()
        self.counters = {"orphans_found": 0, "orphans_deleted": 0, "jobs_collected": 0, "ops_retried": 0, "ops_failed": 0}
        self.tickers = self._start_loops(loops or Ticker)
        # the operation workers' loops ("operations", "operations-2", ...), the first one tickers["operations"]
        self.op_loops: list[Loop] = [t for role, t in self.tickers.items() if role.startswith("operations")]

    # ---- read-only views of the state (for what schedules the loops: the simulator) --------

    @property
    def gke(self) -> Any:
        return self.conn.gke

    @property
    def watcher(self) -> Any:
        return self.conn.watcher

    @property
    def watch_delay(self) -> float:
        return self.conn.watch_delay

    @property
    def view_listed_at(self) -> float:
        """When ``observe``'s cached view was last read (pools and reservation, the later of the two)."""
        return max(self.pool_cache.listed_at, self.reservation.read_at)

    def pool_owner(self, pool: str) -> str | None:
        """The topology of the queue that observed ``pool`` (None: not known)."""
        with self.lock:
            return self.op_queue.pool_topology.get(pool)

    def op_views(self, names: Iterable[str] = ()) -> dict[str, OpView]:
        """The operations of ``names`` and every queued one, as ``observe`` shows them. Read-only."""
        with self.lock:
            ops = self.op_queue.ops
            wanted = {op.name for op in self.op_queue.fifo}.union(names)
            return {n: ops[n].view() for n in wanted if n in ops}

    def next_operation_due(self) -> float | None:
        """When an operation loop can next start anything (monotonic): the earliest retry
        time of a queued operation whose pool has none running; None with none such, with
        as many running as the cluster takes at once (the worker that ends one takes the
        next) or not connected. Read-only."""
        if self.conn.gke is None:
            return None
        with self.lock:
            q = self.op_queue
            if len(q.running) >= self.ops_at_once():
                return None
            due = [op.next_at for op in q.fifo if op.state == OpState.QUEUED and q.ops.get(op.name) is op and op.name not in q.running]
        return min(due) if due else None

    def ops_at_once(self) -> int:
        """How many node-pool operations may run together now (``operations.at_once``)."""
        return operations.at_once(self.settings.pool_ops_at_once, self.op_queue.learned, self.clock.monotonic())

    def _start_loops(self, loop: LoopFactory) -> dict[str, Loop]:
        """Start the loops (the class's contract for ``loops``)."""
        name, clock = f"cluster {self.name}", self.clock
        period = self.settings.orphan_scan_interval_s
        loops = {"watch": loop(f"{name}: watch", self._watch_step, lambda: self.conn.watch_delay, log, clock=clock)}
        for i in range(1, self.settings.pool_ops_at_once + 1):
            role = "operations" if i == 1 else f"operations-{i}"
            loops[role] = loop(f"{name}: {role}", self._op_step, lambda: OP_IDLE_WAIT_S, log, clock=clock)
        loops["orphans"] = loop(f"{name}: orphans", self.orphan_scan, lambda: period, log, start_after=period, clock=clock)
        loops["gauges"] = loop(f"{name}: gauges", self._gauges, lambda: GAUGE_PERIOD_S, log, start_after=GAUGE_PERIOD_S, clock=clock)
        return loops

    def _wake_ops(self) -> None:
        for t in self.op_loops:
            t.wake()

    # ---- fencing ------------------------------------------------------------------

    def _fence(self, max_age_s: float = 0.0) -> None:
        """Raise ``Fenced`` (and stop every loop) when a newer controller holds the lease."""
        try:
            self.store.check_fence(max_age_s)
        except Fenced:
            if not self.stop.is_set():
                log.error("cluster %s: %s; stopping", self.name, self.store.fenced)
                self.shutdown()
            raise

    # ---- clients ------------------------------------------------------------------

    def _stage(self, stage: str) -> None:
        now = self.clock.time()
        if self.conn.stage != "not started":
            self.conn.timings[self.conn.stage] = round(now - self.conn.stage_at, 3)
        self.conn.stage, self.conn.stage_at = stage, now

    def not_connected(self) -> str:
        """Why there is no client yet, and since when: the last connect error, or the stage the
        first connect is in (a stage that lasts is the clue; the absolute time keeps the
        text steady while it lasts)."""
        if self.conn.error:
            return f"cannot connect to cluster {self.name} (attempt {self.conn.failures}): {self.conn.error}"
        since = time.strftime("%H:%M:%S UTC", time.gmtime(self.conn.stage_at))
        return f"cluster {self.name} not connected yet: {self.conn.stage} since {since}"

    def _connect(self) -> None:
        t0 = self.clock.time()
        self.conn.timings = {}
        ua = self._user_agent()
        adapters = self.conn.connect(self.cluster, self.settings, ua, self._stage)
        c = self.cluster
        self.conn.zones = adapters.locations or ((c.location,) if render.cluster_zone(c) else ())
        self.conn.last_ok["gke"] = self.clock.time()
        self.conn.kube = adapters.kube
        self.conn.adapters = adapters
        # Compute serves one read, the default reservation's: its client is built by the
        # first such read, so a cluster without a reservation never builds it
        self.conn.compute = None
        self.conn.policy_api = None
        self.conn.gke = adapters.gke
        self._stage("connected")
        took = self.clock.time() - t0
        (log.warning if took > SLOW_CONNECT_S else log.info)("cluster %s: connected in %.1fs %s", self.name, took, self.conn.timings)

    def _user_agent(self) -> str:
        """The product token of this controller's requests (which controller calls, in the audit logs)."""
        from falcon_ray.gcp import falcon_user_agent

        return falcon_user_agent(self.settings.installation, self.store.epoch)

    def _watch_step(self) -> None:
        """Connect (with backoff) until connected, then one round of the Job watch."""
        self._fence(self.settings.leader_ttl_s / 3)
        if self.conn.gke is None:
            try:
                self._connect()
            except Exception as e:  # keep trying: an unreachable cluster must not kill the actor
                self.conn.error = f"{self.conn.stage}: {type(e).__name__}: {e}"[:500]
                self.conn.error_since = self.conn.error_since or self.clock.now()
                self.conn.failures += 1
                self._stage(f"waiting to connect again (attempt {self.conn.failures} failed)")
                log.warning("cluster %s: connect failed: %s %s", self.name, self.conn.error, self.conn.timings)
                self.conn.watch_delay = connection.connect_retry_delay_s(self.conn.failures, self.rng.random())
                return
            self.conn.error, self.conn.error_since = "", None
            self._wake_ops()
            self.conn.watcher = self.conn.adapters.job_watcher(
                self.cluster.namespace,
                label_selector=render.installation_selector(self.settings.installation),
                timeout_seconds=self.settings.watch_timeout_s,
                clock=self.clock,
                rng=self.rng,
            )
            try:  # the poller places by what the reservation holds: read it now, not at the first task
                self._refresh_reservation()
            except Fenced:
                raise
            except Exception as e:
                log.warning("cluster %s: first reservation read failed: %s", self.name, e)
        self.conn.watch_delay = self.conn.watcher.step(self._on_job, self._on_resync, stopping=self.stop.is_set)

    # ---- Job watch -----------------------------------------------------------------

    def _job_view(self, obs) -> JobView | None:
        if obs.task_id is None:
            return None
        message = (self._failure_detail(obs) or obs.message) if obs.phase == JobPhase.FAILED else obs.message
        step = track_run(obs.phase, obs.ready, obs.expected, self.job_cache.runs.get(obs.uid, RunReadiness()), self.clock.now())
        if step.readiness != RunReadiness():
            self.job_cache.runs[obs.uid] = step.readiness
        if step.forget_evidence:
            self.job_cache.evidence.pop(obs.uid, None)
        evidence = None if step.evidence == EvidenceRead.NONE else self._evidence(obs, refresh=step.evidence == EvidenceRead.FRESH)
        return JobView(
            task_id=int(obs.task_id),
            name=obs.name,
            namespace=obs.namespace,
            uid=obs.uid or "",
            phase=obs.phase,
            active=obs.active,
            ready=obs.ready,
            expected=obs.expected,
            message=message or "",
            node_pool=obs.node_pool,
            attempt=obs.attempt,
            evidence=evidence,
            short_since=step.readiness.short_since,
            deleting=obs.deleting,
        )

    def _failure_detail(self, obs) -> str:
        """The failed Job's detail (its pods' own words), read once per Job; "" if none."""
        detail = self.job_cache.failure_detail.get(obs.uid)
        if detail is None:
            try:
                detail = self.conn.kube.job_failure_message(obs.namespace, obs.name)
            except Exception as e:
                detail = ""
                log.warning("cluster %s: failure detail of %s: %s", self.name, obs.name, e)
            if detail:
                self.job_cache.failure_detail[obs.uid] = detail
        return detail

    def _evidence(self, obs, refresh: bool) -> RunEvidence | None:
        """The pods and pool nodes of a Job's run (read once when it failed; at each event
        while its pods are short of ready), for the queue's classification of the fault."""
        if not refresh and obs.uid in self.job_cache.evidence:
            return self.job_cache.evidence[obs.uid]
        try:
            ev = self.conn.kube.run_evidence(obs.namespace, obs.name, obs.node_pool, obs.message)
        except Exception as e:  # the Job's own condition still tells the disruption rule from the exit-code one
            log.warning("cluster %s: pods and nodes of %s: %s", self.name, obs.name, e)
            return self.job_cache.evidence.get(obs.uid) or RunEvidence(condition=obs.message, nodes_listed=False)
        self.job_cache.evidence[obs.uid] = ev
        return ev

    def _on_job(self, obs) -> None:
        jv = self._job_view(obs)
        if jv is None:
            return
        self.conn.last_ok["kubernetes"] = self.clock.time()
        queue = (obs.labels or {}).get(render.LABEL_QUEUE, "")
        with self.lock:
            before = self.job_cache.jobs.get(jv.task_id)
            kept = job_views.kept_after_event(before, jv)
            if kept is None:
                self.job_cache.jobs.pop(jv.task_id, None)
            else:
                self.job_cache.jobs[jv.task_id] = kept
            if jv.phase == JobPhase.DELETED:
                for cache in (self.job_cache.failure_detail, self.job_cache.evidence, self.job_cache.runs):
                    cache.pop(jv.uid, None)
            if queue:
                self.job_cache.queue_label[jv.task_id] = queue
        if jv != before:  # an event that changes nothing a decision reads wakes nobody
            self._wake_queue(queue)

    def _on_resync(self, observations) -> None:
        views = {}
        queues = {}
        for obs in observations:
            jv = self._job_view(obs)
            if jv is not None and job_views.replaces(views.get(jv.task_id), jv):
                views[jv.task_id] = jv
                q = (obs.labels or {}).get(render.LABEL_QUEUE, "")
                if q:
                    queues[jv.task_id] = q
        uids = {obs.uid for obs in observations}
        with self.lock:
            before, was_synced = self.job_cache.jobs, self.job_cache.synced
            self.job_cache.jobs = views
            self.job_cache.queue_label.update(queues)
            self.job_cache.synced = True
            # a re-list that finds every Job as the events left it changes nothing a decision
            # reads: it wakes the queues of the Jobs it found changed or gone (all of them after
            # the first list, which makes the view synced); a gone Job's queue is its label's
            changed = views.keys() if not was_synced else {t for t in views.keys() | before.keys() if views.get(t) != before.get(t)}
            wake = sorted({self.job_cache.queue_label.get(t, "") for t in changed} - {""})
            for cache in (self.job_cache.failure_detail, self.job_cache.evidence, self.job_cache.runs):  # Jobs gone while the watch was down
                for uid in [u for u in cache if u not in uids]:
                    cache.pop(uid, None)
        self.conn.last_ok["kubernetes"] = self.clock.time()
        metrics.watch_relist(self.name)
        for q in wake:
            self._wake_queue(q)

    def _wake_queue(self, queue_label: str) -> None:
        """Hint the QueueActor behind a queue label (labels are ``<cluster>.<topology>``)."""
        if queue_label.startswith(self.name + "."):
            self.port.hint(self.name, queue_label[len(self.name) + 1 :], create=False)

    # ---- node pools: view --------------------------------------------------------------

    def _refresh_pools(self, force: bool = False) -> None:
        if self.conn.gke is None or self.conn.kube is None:
            return
        self._fence(self.settings.leader_ttl_s / 3)
        with self.pool_cache.refresh_lock:
            if not force and self.clock.monotonic() - self.pool_cache.listed_at < self.settings.pool_refresh_s:
                return
            c = self.cluster
            try:
                infos = self.conn.gke.list_node_pools(c.project, c.location, c.name)
                self.conn.last_ok["gke"] = self.clock.time()
                nodes = self.conn.kube.list_nodes(NODEPOOL_LABEL)
                self.conn.last_ok["kubernetes"] = self.clock.time()
            except Exception as e:
                log.warning("cluster %s: pool refresh failed: %s", self.name, e)
                return
            registered: dict[str, int] = {}
            ready: dict[str, int] = {}
            since: dict[str, dt.datetime] = {}
            for n in nodes:
                registered[n.pool] = registered.get(n.pool, 0) + 1
                ready[n.pool] = ready.get(n.pool, 0) + (1 if n.ready else 0)
                if n.created is not None and (n.pool not in since or n.created < since[n.pool]):
                    since[n.pool] = n.created
            pools = {}
            labels = {}
            now = self.clock.monotonic()
            for p in infos:
                message = p.status_message or ""
                pools[p.name] = PoolView(
                    p.name, p.status, registered.get(p.name, 0), ready.get(p.name, 0), message,
                    capacity_kind(message) if message else None, since.get(p.name),
                )
                labels[p.name] = dict(p.resource_labels or {})
                self.pool_cache.first_seen.setdefault(p.name, now)
            with self.lock:
                self.pool_cache.pools = pools
                self.pool_cache.labels = labels
                self.pool_cache.listed_at = self.clock.monotonic()
                self.pool_cache.synced = True
            metrics.pools_alive(self.name, self._falcon_pools_alive())
            w = self.conn.watcher
            if w is not None and w.reconnects > self.conn.reported_reconnects:
                metrics.watch_reconnects(self.name, w.reconnects - self.conn.reported_reconnects)
                self.conn.reported_reconnects = w.reconnects

    def _falcon_pools_alive(self) -> int:
        with self.lock:
            return sum(1 for n in self.pool_cache.pools if n.startswith(render.POOL_NAME_PREFIX))

    def _reservation_zones(self) -> list[str]:
        """Where to look for the reservation: the zone it names, else the cluster's zone(s),
        the zone it was last found in first."""
        zone, _ = render.reservation_parts(self.cluster.default_reservation)
        return ledger.search_zones(zone, self.conn.zones, self.reservation.zone)

    def _reservation_owner(self) -> tuple[str, str]:
        """(project, name) of the default reservation: the project that owns it (P of
        ``projects/P/...``, a reservation shared from P), else the cluster's."""
        c = self.cluster
        try:
            ref = render.parse_reservation(c.default_reservation)
        except ValueError:  # a registry row from before the forms were checked: as it was read then
            return c.project, render.reservation_parts(c.default_reservation)[1]
        return ref.owner(c.project), ref.name

    def _check_workload_policy(self, op: PoolOp) -> None:
        """A pool placed by a TPU7x workload policy: read the policy through Compute (the
        cluster's project and region) before the create; ``render.workload_policy_problem``
        decides, and a problem fails the create as PERMANENT (its Message names the gcloud
        command). Compute's transient errors are retried as the create's own."""
        policy = render.pool_policy_name(op.request or {})
        if not policy:
            return
        c = self.cluster
        if self.conn.policy_api is None:
            self.conn.policy_api = self.conn.adapters.resource_policies()
        found = self.conn.policy_api.get(c.project, render.cluster_region(c), policy)
        self.conn.last_ok["compute"] = self.clock.time()
        try:
            lease = self.store.get_lease(c.id, op.name)
        except Fenced:
            raise
        except Exception:  # the topology only makes the message more precise
            lease = None
        problem = render.workload_policy_problem(policy, lease.topology if lease else "", c, found)
        if problem:
            raise CloudError(ErrorKind.PERMANENT, problem)

    def _refresh_reservation(self) -> None:
        c = self.cluster
        if not c.default_reservation or self.conn.gke is None:
            return
        if self.conn.compute is None:
            self.conn.compute = self.conn.adapters.compute()
        if (self.reservation.reading is not None or self.reservation.error) and self.clock.monotonic() - self.reservation.read_at < self.settings.pool_refresh_s:
            return
        project, name = self._reservation_owner()
        zones = self._reservation_zones()
        self.reservation.read_at = self.clock.monotonic()
        registered = self._registered()  # listed before the read: in_use counts at least these
        for zone in zones:
            try:
                r = self.conn.compute.reservation(project, zone, name)
            except CloudError as e:
                if e.kind == ErrorKind.NOT_FOUND:
                    continue  # reservations are zonal: try the cluster's next zone
                log.warning("cluster %s: reservation %s/%s read failed: %s", self.name, zone, name, e.message)
                self.reservation.error = ReservationError(e.kind, e.message[:500], first_failure(self.reservation.error, self.clock.now()))
                self.reservation.reading = None
                return
            self.conn.last_ok["compute"] = self.clock.time()
            self.reservation.error = None
            foreign = ledger.foreign_hosts(r.in_use, c.tpu_type, self._lease_rows(fresh=False))
            self.reservation.reading = ReservationView(r.count, r.in_use, machine_type=r.machine_type, foreign=foreign)
            self.reservation.zone = zone
            self.reservation.registered = registered
            metrics.reservation_headroom(self.name, c.default_reservation, r.count - r.in_use)
            self._record_ledger()
            return
        tried = ", ".join(zones) or "none known"
        message = f"reservation {name} of project {project} not found in the zone(s) of cluster {c.name}: {tried}"
        log.warning("cluster %s: %s", self.name, message)
        self.reservation.error = ReservationError(ErrorKind.NOT_FOUND, message, first_failure(self.reservation.error, self.clock.now()))
        self.reservation.reading = None

    # ---- the capacity ledger ------------------------------------------------------------

    def _lease_rows(self, fresh: bool) -> list:
        """The cluster's lease rows for the ledger: read again for a claim (the claim is the
        arbiter), at most every ``LEDGER_READ_TTL_S`` for the view a decision reads (a view
        a moment old only delays a claim, it never grants one)."""
        at, rows = self.reservation.rows
        now = self.clock.monotonic()
        if fresh or rows is None or now - at >= LEDGER_READ_TTL_S:
            rows = self.store.leases(self.cluster.id)
            self.reservation.rows = (now, rows)
        return rows

    def _registered(self) -> dict[str, int]:
        """The registered nodes of every listed pool."""
        with self.lock:
            return {name: pool.registered for name, pool in self.pool_cache.pools.items()}

    def _drop_settled_grants(self, rows: list) -> None:
        """Forget the grants the ledger no longer counts (carried by a lease row, or expired).
        Only removes: a grant made meanwhile by a claim is kept."""
        seen = dict(self.reservation.grants)
        kept = ledger.outstanding_grants(seen, rows, self.clock.monotonic())
        for name in seen.keys() - kept.keys():
            self.reservation.grants.pop(name, None)

    def _claimed(self) -> int:
        """Hosts of the reservation that Falcon's pools hold and GKE does not count yet."""
        rows = self._lease_rows(fresh=False)
        self._drop_settled_grants(rows)
        return ledger.claimed_hosts(self.cluster.tpu_type, rows, self.reservation.registered, dict(self.reservation.grants))

    def claim_reservation(self, name: str, hosts: int) -> bool:
        """Grant ``hosts`` of the reservation to pool ``name`` if the ledger has them free
        (``nodepools.ledger.decide_claim``). Idempotent: a claim already granted (or carried
        by its lease row) is granted again."""
        self._fence(self.settings.leader_ttl_s / 3)
        with self.reservation.claim_lock:
            self._refresh_reservation()
            r = self.reservation.reading
            rows = self._lease_rows(fresh=True)  # the claim is the arbiter: read the rows afresh
            self._drop_settled_grants(rows)
            free = None if r is None else r.count - r.in_use
            decision = ledger.decide_claim(name, hosts, free, self.cluster.tpu_type, rows, self.reservation.registered, dict(self.reservation.grants))
            if decision.outcome == ledger.ClaimOutcome.REFUSED:
                log.info("cluster %s: claim of %d host(s) for %s refused: %d free", self.name, hosts, name, decision.free)
            elif decision.outcome == ledger.ClaimOutcome.GRANTED:
                self.reservation.grants[name] = ledger.Grant(hosts, self.clock.monotonic())
            return decision.granted

    def _ledger(self) -> dict[str, Any] | None:
        r = self.reservation_view()
        if r is None:
            return None
        return {
            "count": r.count,
            "in_use": r.in_use,
            "claimed": r.claimed,
            "free": r.free,
            "zone": self.reservation.zone,
            "machine_type": r.machine_type,
        }

    def reservation_view(self) -> ReservationView | None:
        r = self.reservation.reading
        return None if r is None else ReservationView(r.count, r.in_use, self._claimed(), r.machine_type, r.foreign)

    def _record_ledger(self) -> None:
        """Write the reservation's machine type and the ledger on the cluster row when a
        figure changed: the poller places by the machine type (durably, whichever process
        reads it), ``falcon-ray clusters list`` shows the ledger without Ray."""
        r = self.reservation_view()
        if r is None:
            return
        figures = (r.machine_type, r.count, r.in_use, r.claimed)
        if figures == self.reservation.recorded:
            return
        try:
            self.store.record_reservation(self.cluster.id, *figures)
            self.reservation.recorded = figures
        except Fenced:
            raise
        except Exception as e:  # the next reading writes it again
            log.warning("cluster %s: recording the reservation ledger failed: %s", self.name, e)

    def observe(self, queue_label: str, pool_names: list[str], want_reservation: bool) -> ClusterView:
        """What a QueueActor needs for one decision: its pools, their operations, its Jobs."""
        self._refresh_pools()
        reservation = None
        if want_reservation:
            self._refresh_reservation()
            reservation = self.reservation_view()
        with self.lock:
            topology = queue_label[len(self.name) + 1 :]
            for n in pool_names:  # whose pool it is, for the wake-up at the end of its operations
                self.op_queue.pool_topology[n] = topology
            jobs = {tid: jv for tid, jv in self.job_cache.jobs.items() if self.job_cache.queue_label.get(tid, queue_label) == queue_label}
            return ClusterView(
                pools={n: self.pool_cache.pools[n] for n in pool_names if n in self.pool_cache.pools},
                ops={n: self.op_queue.ops[n].view() for n in pool_names if n in self.op_queue.ops},
                jobs=jobs,
                reservation=reservation,
                reservation_error=self.reservation.error,
                synced=self.pool_cache.synced and self.job_cache.synced,
                error="" if self.conn.gke is not None else self.not_connected(),
                error_since=None if self.conn.gke is not None else self.conn.error_since,
                connecting=self.conn.gke is None and not self.conn.error,
                zones=self.conn.zones,
                reservation_zone=self.reservation.zone,
            )

    # ---- node pools: operations ------------------------------------------------------

    def ensure_pool(self, name: str, request: dict[str, Any], operation: str | None = None) -> str:
        """Queue a create for ``name`` unless one is queued, running or done. ``operation``:
        GKE already accepted this create (the lease recorded it): follow that operation."""
        with self.lock:
            serving = operations.create_answer(self._newest_op(name))
            if serving is not None:
                return serving
            op = PoolOp(name, OpKind.CREATE, request, operation=operation or "", queued_at=self.clock.monotonic())
            self.op_queue.ops[name] = op
            self.op_queue.fifo.append(op)
        self._wake_ops()
        return OpState.QUEUED

    def delete_pool(self, name: str) -> str:
        """Queue a delete for ``name`` (cancelling a create that has not started)."""
        with self.lock:
            answer = operations.delete_answer(self._newest_op(name))
            if answer.serving is not None:
                return answer.serving
            if answer.cancel_create:
                self.op_queue.ops[name].state = OpState.CANCELLED
            op = PoolOp(name, OpKind.DELETE, queued_at=self.clock.monotonic())
            self.op_queue.ops[name] = op
            self.op_queue.fifo.append(op)
        self._wake_ops()
        return OpState.QUEUED

    def _newest_op(self, name: str) -> operations.Newest:
        op = self.op_queue.ops.get(name)
        return None if op is None else (op.kind, op.state)

    def _next_op(self) -> PoolOp | None:
        """Take the operation to run now out of the FIFO (``nodepools.operations.next_operation``)
        and count it running; None when nothing is due or as many run as the cluster takes."""
        with self.lock:
            q = self.op_queue
            if len(q.running) >= self.ops_at_once():
                return None
            queued = list(q.fifo)
            seen = [
                operations.Queued(op.state != OpState.CANCELLED and q.ops.get(op.name) is op, op.next_at, op.name in q.running)
                for op in queued
            ]
            chosen = operations.next_operation(seen, self.clock.monotonic())
            q.fifo = deque(queued[i] for i in chosen.queue)
            if chosen.run is None:
                return None
            op = queued[chosen.run]
            q.running[op.name] = op
            return op

    def _op_step(self) -> None:
        """Run operations that are due, one at a time in this worker, while fewer than the
        cluster takes at once run in all (the other workers run the rest)."""
        while self.conn.gke is not None and not self.stop.is_set():
            op = self._next_op()
            if op is None:
                return
            try:
                self._run_taken(op)
            finally:
                with self.lock:
                    self.op_queue.running.pop(op.name, None)
            metrics.pool_op(self.name, op.kind, op.state, op.error_kind or "")
            self._hint_pool_owner(op.name)

    def _run_taken(self, op: PoolOp) -> None:
        """Run an operation taken out of the FIFO: fence, then GKE; a failure goes to ``_op_failed``."""
        try:
            self._fence()
        except BaseException:  # fenced, or the database did not answer the fence read
            with self.lock:  # the op stays queued: taken out of the FIFO, it would be lost
                self.op_queue.fifo.appendleft(op)  # for good (its queue sees it queued forever)
            raise
        op.state = OpState.RUNNING
        try:
            self._run_op(op)
            op.state = OpState.DONE
            op.error_kind, op.error = None, ""  # a retried error is over: not the pool's story
            self.pool_cache.listed_at = 0.0  # next observe re-lists
        except CloudError as e:
            self._op_failed(op, e)
        except Exception as e:  # never let the worker die
            self._op_failed(op, CloudError(ErrorKind.TRANSIENT, f"{type(e).__name__}: {e}"))

    def _hint_pool_owner(self, pool: str) -> None:
        """Wake the queue of ``pool``'s lease (known from the queue's observe, else read); a
        database that does not answer only costs the wake-up (the queue's timed step sees the
        operation's end), never the next operation."""
        with self.lock:
            topology = self.op_queue.pool_topology.get(pool)
            if len(self.op_queue.pool_topology) > 10_000:
                self.op_queue.pool_topology.clear()
        if topology is None:
            try:
                lease = self.store.get_lease(self.cluster.id, pool)
            except Fenced:
                raise
            except Exception as e:
                log.info("cluster %s: no wake-up for pool %s: %s", self.name, pool, e)
                return
            topology = lease.topology if lease is not None else None
        if topology is not None:
            self.port.hint(self.name, topology, create=False)

    def _start_op(self, op: PoolOp) -> bool:
        """Make the GKE call; False when there is nothing to follow (adopted, already gone)."""
        c = self.cluster
        try:
            if op.kind == OpKind.CREATE:
                self._check_workload_policy(op)
                op.operation = self.conn.gke.create_node_pool(c.project, c.location, c.name, op.request)
            else:
                name = self.conn.gke.delete_node_pool(c.project, c.location, c.name, op.name)
                if name is None:
                    return False
                op.operation = name
        except CloudError as e:
            if operations.goal_holds(op.kind, e.kind):  # created before a restart (adopt it), or already gone
                return False
            raise
        self.conn.last_ok["gke"] = self.clock.time()
        return True

    def _run_op(self, op: PoolOp) -> None:
        """Call GKE (unless the operation is known already) and follow it to DONE."""
        c = self.cluster
        if not op.operation and not self._start_op(op):
            return
        while not self.stop.is_set():
            try:
                info = self.conn.gke.get_operation(c.project, c.location, op.operation)
            except CloudError as e:
                if e.kind != ErrorKind.NOT_FOUND:
                    raise
                # a recorded operation GKE no longer knows: make the call again (409/404 adopt)
                if not self._start_op(op):
                    return
                continue
            self.conn.last_ok["gke"] = self.clock.time()
            if info.done:
                if operations.reached_goal(op.kind, None if info.error is None else info.error.kind):
                    return
                op.operation = ""  # that operation is over: a retry makes a new call
                raise info.error
            self.clock.wait(self.stop, self.settings.operation_poll_s)

    def _op_failed(self, op: PoolOp, e: CloudError) -> None:
        with self.lock:
            now, q = self.clock.monotonic(), self.op_queue
            ours = {o.operation or o.name for o in q.running.values() if o is not op}  # GKE's names (pool's before the call)
            learned = operations.refused_as_concurrent(e.kind, e.message, ours, now, self.settings.pool_ops_probe_s)
            before, q.learned = q.learned, operations.tighter(q.learned, learned, now)
            if q.learned is not before:
                log.warning("cluster %s: GKE refused a node-pool operation while %d of ours ran: at most %d at once for %.0fs",
                            self.name, len(ours), q.learned.limit, self.settings.pool_ops_probe_s)
        op.attempts += 1
        op.error_kind = e.kind
        op.error = e.message[:1000]
        log.warning("cluster %s: %s %s failed (%s, attempt %d): %s", self.name, op.kind, op.name, e.kind, op.attempts, e.message)
        if learned is not None:  # refused for our own operations: its turn again when one of them ends, no timer
            delay, in_turn = 0.0, True
        else:
            backoff = (self.settings.pool_op_backoff_initial_s, self.settings.pool_op_backoff_max_s)
            delay = operations.retry_delay_s(op.kind, e.kind, op.attempts, *backoff, jitter=self.rng.random())
            in_turn = False
        if delay is None:
            op.state = OpState.FAILED
            self.counters["ops_failed"] += 1
            return
        op.next_at, op.state = now + delay, OpState.QUEUED
        self.counters["ops_retried"] += 1
        with self.lock:
            fifo = self.op_queue.fifo
            if self.op_queue.ops.get(op.name) is op:  # in its turn: before the first asked for after it; else at the back
                at = next((i for i, o in enumerate(fifo) if o.queued_at > op.queued_at), len(fifo)) if in_turn else len(fifo)
                fifo.insert(at, op)

    # ---- Jobs ------------------------------------------------------------------------

    def submit_job(self, manifest: dict[str, Any], service: dict[str, Any] | None) -> dict[str, Any]:
        """Create the Job (and its headless Service); 409 adopts. Returns {uid} or {error_kind, error}."""
        self._fence()
        if self.conn.kube is None:
            return {"error_kind": ErrorKind.TRANSIENT.value, "error": self.not_connected()}
        try:
            if service is not None:
                self.conn.kube.create_service(service)
            ref = self.conn.kube.create_job(manifest)
            self.conn.last_ok["kubernetes"] = self.clock.time()
            return {"uid": ref.uid, "created": ref.created}
        except CloudError as e:
            return {"error_kind": e.kind.value, "error": e.message}

    def delete_job(self, namespace: str, name: str) -> bool:
        self._fence()
        if self.conn.kube is None:
            raise CloudError(ErrorKind.TRANSIENT, self.not_connected())
        # Foreground: the Job object stays until its pods are gone, so its absence (the watch's
        # DELETED) proves none of its pods still runs: the next attempt may start then
        gone = self.conn.kube.delete_job(namespace, name, propagation="Foreground")
        with self.lock:  # the views show the delete under way before the watch says so
            for tid, jv in list(self.job_cache.jobs.items()):
                if jv.name == name and jv.namespace == namespace and not jv.deleting:
                    self.job_cache.jobs[tid] = replace(jv, deleting=True)
        try:
            self.conn.kube.delete_service(namespace, render.service_of_job(name))
        except CloudError:
            pass
        self.conn.last_ok["kubernetes"] = self.clock.time()
        return gone

    # ---- orphan scan and gauges -----------------------------------------------------------

    def _gauges(self) -> None:
        """Set the per-cluster gauges again (Ray drops a gauge that is not set again for a while)."""
        self._fence(self.settings.leader_ttl_s / 3)
        idle = sum(1 for l in self.store.leases(self.cluster.id) if l.state == LeaseState.IDLE)
        metrics.pools_alive(self.name, self._falcon_pools_alive(), idle=idle)
        self._refresh_reservation()
        r = self.reservation.reading
        if r is not None:
            metrics.reservation_headroom(self.name, self.cluster.default_reservation, r.count - r.in_use)
            self._record_ledger()  # the claims change without a new reading

    def _orphan_pools(self) -> list[str]:
        """Falcon pools of this installation that no live lease manages and no live task
        holds (``nodepools.orphans``)."""
        live = {lease.name: lease for lease in self.store.leases(self.cluster.id, live_only=True)}
        held = {t.node_pool_name for t in self.store.live_tasks(self.cluster.id) if t.node_pool_name}
        now = self.clock.monotonic()
        with self.lock:
            listed = [orphans.ListedPool(n, labels, self.pool_cache.first_seen.get(n, now)) for n, labels in self.pool_cache.labels.items()]
            deleting = {n for n, op in self.op_queue.ops.items() if op.kind == OpKind.DELETE and op.state in OP_IN_FLIGHT}
        grace = self.settings.create_visibility_grace_s
        return orphans.orphan_pools(listed, self.settings.installation, live, held, deleting, grace, self.clock.now(), now)

    def orphan_scan(self) -> dict[str, list[str]]:
        """Delete leaked pools and Jobs; returns what it found and queued for deletion."""
        if self.conn.gke is None:
            return {"pools": [], "jobs": []}
        self._fence()
        self._refresh_pools(force=True)
        found = self._orphan_pools()
        for name in found:
            self.counters["orphans_found"] += 1
            self.delete_pool(name)
            self.counters["orphans_deleted"] += 1
            log.warning("cluster %s: orphan pool %s queued for deletion", self.name, name)
        metrics.orphans(self.name, len(found))
        return {"pools": found, "jobs": self._collect_jobs()}

    def _collect_jobs(self) -> list[str]:
        """Jobs whose task is over (a crash between the terminal write and the Job delete)."""
        with self.lock:
            jobs = dict(self.job_cache.jobs)
        if not jobs:
            return []
        stale: list[str] = []
        terminal = {t.id for t in self.store.get_tasks(jobs) if t.terminal}
        for tid, jv in jobs.items():
            if tid in terminal:
                try:
                    log.info("cluster %s: deleting Job %s: its task %s is terminal", self.name, jv.name, tid)
                    self.delete_job(jv.namespace, jv.name)
                    stale.append(jv.name)
                    self.counters["jobs_collected"] += 1
                except Exception as e:
                    log.warning("cluster %s: delete stale Job %s: %s", self.name, jv.name, e)
        return stale

    # ---- operator surface ---------------------------------------------------------------

    def refresh_cluster(self) -> None:
        c = self.store.get_cluster(self.name)
        if c is not None:
            self.cluster = c

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            w = self.conn.watcher
            return {
                "cluster": self.name,
                "status": self.cluster.status if self.cluster else "unknown",
                "connected": self.conn.gke is not None,
                "connect_error": self.conn.error,
                "connect_stage": self.conn.stage,
                "connect_stage_since": self.conn.stage_at,
                "connect_timings": dict(self.conn.timings),
                "pools": {n: vars(p) for n, p in self.pool_cache.pools.items()},
                "pool_ops": {
                    n: {"kind": o.kind, "state": o.state, "attempts": o.attempts, "error": o.error, "operation": o.operation}
                    for n, o in self.op_queue.ops.items()
                },
                "ops_queued": sum(1 for o in self.op_queue.fifo if o.state == OpState.QUEUED),
                "ops_running": sorted(self.op_queue.running),
                "ops_at_once": self.ops_at_once(),
                "jobs": {t: vars(j) for t, j in self.job_cache.jobs.items()},
                "reservation": self._ledger(),
                "zones": list(self.conn.zones),
                "last_ok": dict(self.conn.last_ok),
                "watch": {
                    "reconnects": getattr(w, "reconnects", 0),
                    "relists": getattr(w, "relists", 0),
                    "last_event_at": getattr(w, "last_event_at", None),
                    "last_ok_at": getattr(w, "last_ok_at", None),
                },
                "loops": {name: t.status() for name, t in self.tickers.items()},
                "counters": dict(self.counters),
                "db_statements": self.store.statements,
                "epoch": self.store.epoch,
                "fenced": self.store.fenced,
            }

    def shutdown(self) -> None:
        self.stop.set()
        for t in self.tickers.values():
            t.stop()
        if self.conn.watcher is not None:
            self.conn.watcher.close()  # ends a watch that is waiting for events now, not at its timeout

    def drain(self, timeout: float = 30.0) -> bool:
        """Let the running pool operation finish (its GKE call returns), then stop."""
        self.shutdown()
        deadline = self.clock.monotonic() + timeout
        ended = [t.join(max(0.0, deadline - self.clock.monotonic())) for name, t in self.tickers.items()]
        return all(ended[1:])  # the watch may still be closing its stream

    def __repr__(self) -> str:
        c = self.cluster
        with self.lock:
            busy = sum(1 for o in self.op_queue.ops.values() if o.state in OP_IN_FLIGHT)
        alive = self._falcon_pools_alive()
        return f"ClusterActor({self.name} {c.tpu_type if c else '?'} {c.status if c else '?'}: {alive} pools, {busy} ops, {len(self.job_cache.jobs)} jobs)"
