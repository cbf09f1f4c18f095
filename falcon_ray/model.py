"""The values the decisions see: frozen types with enum fields, and nothing that does I/O.

Contract
--------
Everything that crosses from the database or from an edge cluster into a decision is
one of these types. The store maps its rows to ``Cluster``, ``Task``, ``Lease`` and
``TaskEvent``; the ClusterActor maps what GKE and Kubernetes answer to ``PoolView``,
``OpView``, ``JobView`` and ``ReservationView``; the QueueActor assembles a
``QueueState`` (with ``Destination`` rows for a task that could move; its Waiting tasks
as a ``WaitingQueue``, grouped for the pick rule) and a
``ClusterView`` and hands both to ``reconcile.decide``. States
and kinds are enums (``ClusterStatus``, ``LeaseState``, ``OpKind``, ``OpState``,
``JobPhase``, ``PoolStatus``, ``ErrorKind``), never strings: a ``StrEnum`` still
compares equal to its stored text, so rows and JSON read the same as before.

This module imports only the other core modules (lifecycle, spec); the layer contract
in ``pyproject.toml`` keeps it that way.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum, auto
from typing import Any

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Phase, Reason, Status
from falcon_ray.spec import SupplyMode, TaskSpec

# --- kinds -------------------------------------------------------------------------------


class ClusterStatus(StrEnum):
    ACTIVE = "active"  # takes new tasks
    MAINTENANCE = "maintenance"  # no new tasks; running ones finish, waiting ones re-rank
    OFFLINE = "offline"  # the same, and it is not expected back soon


class ErrorKind(StrEnum):
    """The few kinds of cloud and cluster failure the controller decides on (see ``errors``)."""

    NOT_FOUND = auto()
    ALREADY_EXISTS = auto()
    INCOMPATIBLE_OPERATION = auto()
    TOO_MANY_OPERATIONS = auto()
    STOCKOUT = auto()  # no capacity right now (zone exhausted, reservation short): it comes back
    QUOTA_EXCEEDED = auto()  # a quota is used up: it needs a quota change, not waiting
    TRANSIENT = auto()
    PERMANENT = auto()


# GKE refused for now, nothing was done: the same call later may succeed.
BUSY_KINDS = frozenset({ErrorKind.INCOMPATIBLE_OPERATION, ErrorKind.TOO_MANY_OPERATIONS})
RETRYABLE_KINDS = frozenset({ErrorKind.TRANSIENT, *BUSY_KINDS})
# A create refused like this is a wait (ClusterBusy, with backoff and a budget), not a failure.
CAPACITY_KINDS = frozenset({ErrorKind.STOCKOUT})
# A refused Job does not become acceptable by retrying: a 404 is a missing namespace, a 409
# on a name Falcon cannot adopt is someone else's object.
PERMANENT_SUBMIT_KINDS = frozenset(
    {ErrorKind.PERMANENT, ErrorKind.QUOTA_EXCEEDED, ErrorKind.STOCKOUT, ErrorKind.ALREADY_EXISTS, ErrorKind.NOT_FOUND}
)
# A reservation read that failed like this will not heal by reading again.
FINAL_READ_KINDS = frozenset({ErrorKind.NOT_FOUND, ErrorKind.PERMANENT})


class OpKind(StrEnum):
    CREATE = "create"
    DELETE = "delete"


class OpState(StrEnum):
    QUEUED = "queued"  # waiting its turn (or its backoff) in the cluster's FIFO
    RUNNING = "running"  # the GKE call was made; its operation is being followed
    DONE = "done"
    FAILED = "failed"  # a create GKE refused (quota, stockout, bad request); not retried by the ClusterActor
    CANCELLED = "cancelled"  # a queued create overtaken by a delete


OP_IN_FLIGHT = (OpState.QUEUED, OpState.RUNNING)


class JobPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DELETED = "Deleted"  # the watch saw it go


class PoolStatus(StrEnum):
    """GKE's NodePool.status; anything GKE adds later reads as UNSPECIFIED."""

    UNSPECIFIED = "STATUS_UNSPECIFIED"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    RUNNING_WITH_ERROR = "RUNNING_WITH_ERROR"
    RECONCILING = "RECONCILING"
    STOPPING = "STOPPING"
    ERROR = "ERROR"

    @classmethod
    def of(cls, value: str) -> PoolStatus:
        try:
            return cls(value)
        except ValueError:
            return cls.UNSPECIFIED

    @property
    def up(self) -> bool:
        """The control plane serves the pool (nodes may still be registering)."""
        return self in (PoolStatus.RUNNING, PoolStatus.RECONCILING, PoolStatus.RUNNING_WITH_ERROR)


def _enum(kind: type[StrEnum], value: Any) -> Any:
    """The enum member for a stored value; text no member knows is kept as it is. A dict
    look-up, not ``kind(value)``: a queue builds thousands of rows per read."""
    if isinstance(value, kind):
        return value
    return kind._value2member_map_.get(value, value)


def _with_message(value: Any, message: str) -> Any:
    """A copy of a frozen row value with another ``message`` (its cached properties kept):
    a queue rewrites thousands of Messages per hand-over, and ``dataclasses.replace`` would
    validate each row again."""
    out = object.__new__(type(value))
    out.__dict__.update(value.__dict__)
    out.__dict__["message"] = message
    return out


# --- rows, as the store hands them out -----------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    id: str
    name: str
    project: str
    location: str
    tpu_type: str
    gcs_bucket: str
    default_reservation: str
    status: ClusterStatus
    namespace: str
    service_account: str
    created_at: dt.datetime
    updated_at: dt.datetime
    zone: str = ""  # the operator's zone for pools without a reservation (regional clusters)
    # what the ClusterActor last read of the reservation: the machine type it holds ("" not
    # read yet) and its ledger (count, in use, claimed by Falcon; None until read)
    reservation_machine_type: str = ""
    reservation_count: int | None = None
    reservation_in_use: int | None = None
    reservation_claimed: int | None = None
    reservation_seen_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", ClusterStatus(self.status))

    @property
    def active(self) -> bool:
        return self.status == ClusterStatus.ACTIVE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Task:
    """A ``jobs`` row. ``spec`` is the upper layer's text, parsed only where it is used."""

    id: int
    name: str
    actor: str
    spec: str
    status: Status
    reason: Reason
    message: str
    cluster_id: str | None
    node_pool_name: str | None
    job_uid: str | None
    timeout_seconds: int | None
    created_at: dt.datetime
    updated_at: dt.datetime
    dispatched_at: dt.datetime | None
    finished_at: dt.datetime | None
    aborting_at: dt.datetime | None
    aborted_at: dt.datetime | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _enum(Status, self.status))
        object.__setattr__(self, "reason", _enum(Reason, self.reason or ""))

    @functools.cached_property
    def phase(self) -> Phase:  # computed once per row (the row is frozen)
        return lc.phase_of(self.status, self.reason)

    @property
    def terminal(self) -> bool:
        return self.status in lc.TERMINAL

    def with_message(self, message: str) -> Task:
        """The same row with another Message (a copy: the row stays frozen for its holders)."""
        return _with_message(self, message)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Lease:
    """A node-pool lease row: the pool's name is fixed here before GKE is asked."""

    id: int
    cluster_id: str
    topology: str
    name: str
    supply_mode: SupplyMode
    state: LeaseState
    task_id: int | None
    operation: str | None  # the last GKE operation on the pool (create or delete)
    delete_attempts: int
    last_error: str
    created_at: dt.datetime
    updated_at: dt.datetime
    ready_at: dt.datetime | None
    idle_since: dt.datetime | None
    deleted_at: dt.datetime | None
    refused_at: dt.datetime | None = None  # GKE refused this pool for capacity (a stockout), then
    refusal: str = ""  # ... with these words; the task's capacity wait is read from such rows
    # GKE accepted the create (written with the Requested -> Creating move): the create's
    # timeout counts from here, not from the row, which was written before the create
    # waited its turn among the cluster's node-pool operations
    accepted_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", LeaseState(self.state))
        object.__setattr__(self, "supply_mode", SupplyMode(self.supply_mode))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TaskEvent:
    task_id: int
    at: dt.datetime
    status: str
    reason: str
    message: str
    epoch: int | None = None  # leader epoch of the controller that wrote it; None: upper layer, CLI

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- what an edge cluster says ------------------------------------------------------------


@dataclass(frozen=True)
class PoolView:
    name: str
    status: PoolStatus
    registered: int  # nodes of the pool that exist as Kubernetes Nodes
    ready: int  # ... of which Ready
    status_message: str = ""  # GKE's statusMessage (why a pool is in ERROR)
    error_kind: ErrorKind | None = None  # what ``status_message`` says, classified by the ClusterActor
    nodes_since: dt.datetime | None = None  # when its oldest node came (its VM's creation); None: no node

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", PoolStatus.of(self.status))
        object.__setattr__(self, "error_kind", ErrorKind(self.error_kind) if self.error_kind else None)


@dataclass(frozen=True)
class OpView:
    kind: OpKind
    state: OpState
    attempts: int = 0
    error_kind: ErrorKind | None = None  # of the last failure
    error: str = ""  # the API's own message
    operation: str = ""  # GKE's operation name, once the call was accepted

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", OpKind(self.kind))
        object.__setattr__(self, "state", OpState(self.state))
        object.__setattr__(self, "error_kind", ErrorKind(self.error_kind) if self.error_kind else None)

    @property
    def accepted(self) -> bool:
        """GKE accepted the call: it ended, or it runs and GKE named its operation (a RUNNING
        operation without a name has not been answered yet: the call may still be refused)."""
        return self.state == OpState.DONE or (self.state == OpState.RUNNING and bool(self.operation))

    @property
    def busy(self) -> bool:
        """Refused because the cluster runs another operation, and still waiting to retry."""
        return self.error_kind in BUSY_KINDS and self.state != OpState.DONE

    @property
    def no_capacity(self) -> bool:
        """A create that GKE refused because there is no capacity right now."""
        return self.kind == OpKind.CREATE and self.state == OpState.FAILED and self.error_kind in CAPACITY_KINDS


@dataclass(frozen=True)
class PodEnd:
    """One pod of a Job as the cluster shows it when the run ended or faltered."""

    name: str
    node: str  # the node it was bound to ("" never bound)
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    disruption: str = ""  # its DisruptionTarget condition, when True: "Reason: message"
    exit_code: int | None = None  # of the task's container, once terminated
    reason: str = ""  # the container's terminated or waiting reason, else the pod's
    message: str = ""


@dataclass(frozen=True)
class NodeState:
    """A node of the Job's pool, as listed with the pods (a node not listed is gone)."""

    name: str
    ready: bool
    maintenance: bool = False  # GKE's notice of host maintenance is on it
    unschedulable: bool = False  # cordoned (drained for maintenance or repair)


@dataclass(frozen=True)
class RunEvidence:
    """What the ClusterActor read about a Job's run when it failed, or when its pods
    stopped being ready: its pods, the nodes of its pool, the Job's Failed condition."""

    pods: tuple[PodEnd, ...] = ()
    nodes: tuple[NodeState, ...] = ()
    condition: str = ""  # the Job's Failed (or FailureTarget) condition: "Reason: message"
    nodes_listed: bool = True  # False: the node list could not be read (absence proves nothing)


@dataclass(frozen=True)
class JobView:
    task_id: int
    name: str
    namespace: str
    uid: str
    phase: JobPhase
    active: int
    ready: int
    expected: int
    message: str = ""
    node_pool: str = ""  # the pool its pods select
    attempt: int = 0  # which run of the task (falcon.dev/attempt)
    evidence: RunEvidence | None = None  # read when it failed or its pods stopped being ready
    short_since: dt.datetime | None = None  # since when it has had fewer ready pods than it had
    deleting: bool = False  # its delete is under way (deletionTimestamp): not asked again

    def __post_init__(self) -> None:
        object.__setattr__(self, "phase", JobPhase(self.phase))

    @property
    def holds_pool(self) -> bool:
        """Its pods may still hold the pool's TPUs (a completed Job's pods do not)."""
        return self.phase not in (JobPhase.DELETED, JobPhase.SUCCEEDED)


@dataclass(frozen=True)
class ReservationView:
    """A reservation as the ledger sees it: GKE's ``count`` and ``inUseCount``, and the
    hosts Falcon's own pools have claimed that GKE does not count yet (pools being
    created, idle pools the autoscaler emptied)."""

    count: int
    in_use: int
    claimed: int = 0
    machine_type: str = ""  # specificReservation.instanceProperties.machineType ("" unknown)
    foreign: int = 0  # of ``in_use``, hosts of nodes outside Falcon's pools, as last read (``ledger.foreign_hosts``)

    @property
    def free(self) -> int:
        return max(0, self.count - self.in_use - self.claimed)


def first_failure(previous: ReservationError | SubmitError | None, now: dt.datetime) -> dt.datetime:
    """When a run of failed answers began: the previous failure's, else ``now`` (this one is the first)."""
    return previous.since if previous is not None and previous.since is not None else now


@dataclass(frozen=True)
class ReservationError:
    kind: ErrorKind
    message: str
    since: dt.datetime | None = None  # the first failed read of this run of failures (None: unknown)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ErrorKind(self.kind))

    @property
    def final(self) -> bool:
        return self.kind in FINAL_READ_KINDS


@dataclass(frozen=True)
class ClusterView:
    """The ClusterActor's answer for one queue. ``synced`` is False until its first
    full list of pools and Jobs has completed (e.g. right after a restart): then an
    absent pool or Job proves nothing and nothing is concluded from absence."""

    pools: dict[str, PoolView] = field(default_factory=dict)
    ops: dict[str, OpView] = field(default_factory=dict)
    jobs: dict[int, JobView] = field(default_factory=dict)
    reservation: ReservationView | None = None
    reservation_error: ReservationError | None = None  # of the last read
    synced: bool = True
    error: str = ""  # why the ClusterActor cannot reach GKE, if it cannot
    error_since: dt.datetime | None = None  # the first failed connect of this outage (None: unknown)
    # the ClusterActor is still building its clients and no attempt has failed yet: the
    # controller's own start (a restart, a loaded head), not an answer of GKE's
    connecting: bool = False
    zones: tuple[str, ...] = ()  # the cluster's node zones (Cluster.locations), once connected
    reservation_zone: str = ""  # the zone the reservation was found in


@dataclass(frozen=True)
class Destination:
    """Another active cluster of the TPU type, as a queue with a ClusterBusy task sees it
    for its topology (``scheduling.move_target`` decides whether the task moves there)."""

    cluster: Cluster
    idle_pools: tuple[SupplyMode, ...] = ()  # the supply modes of its ready idle pools
    claimants: int = 0  # tasks of that queue waiting or holding its slot
    free_hosts: int | None = None  # reservation hosts free by its ledger (None: not read)
    machine_type: str = ""  # what its reservation holds, as just read ("" unknown)
    held_hosts: int = 0  # of ``free_hosts``, the room held there for an older task of another topology
    refused: frozenset[int] = frozenset()  # ids of the origin queue's tasks GKE refused for capacity there before


@dataclass(frozen=True)
class ReservationWaiter:
    """A ClusterBusy task of a cluster (it holds its queue's slot), as the reservation hold
    reads it (``reconcile.hold``): its queue's topology, when it was submitted, the supply
    mode its spec names (None: the cluster's default) and when it entered ClusterBusy
    (event log; None when the log has no such entry)."""

    task_id: int
    topology: str
    created_at: dt.datetime
    supply_mode: str | None
    since: dt.datetime | None

    @property
    def order(self) -> tuple[dt.datetime, int]:
        """Who came first: submission time, then id."""
        return (self.created_at, self.task_id)


@dataclass(frozen=True)
class ReservationOccupant:
    """A reservation pool of the cluster that holds hosts (``LEASE_HOLDS_RESERVATION``, or
    being deleted), as
    the reservation hold's backfill reads it (``reconcile.hold``): its shape, and its task
    (None: no live task) with when that task's Job was submitted and its timeout, which
    bound when the pool comes free at the latest."""

    pool: str
    topology: str
    task_id: int | None
    dispatched_at: dt.datetime | None
    timeout_s: int
    created_at: dt.datetime  # the lease row's: a pool being created comes up by the node-pool timeout after it
    updated_at: dt.datetime  # the lease row's last move: a pool with no live task is deleted from then on


# --- what the database says about one queue -------------------------------------------------


@dataclass(frozen=True)
class QueueTask:
    """A live task of the queue as the decisions see it: its spec parsed once."""

    id: int
    name: str
    actor: str
    phase: Phase
    created_at: dt.datetime
    dispatched_at: dt.datetime | None
    spec: TaskSpec
    node_pool_name: str | None
    job_uid: str | None
    message: str
    phase_since: dt.datetime | None = None  # when it entered ``phase``, from the event log
    # the fleet's disruptions of its earlier runs, oldest first: the next Job is attempt len()
    disruptions: tuple[Disruption, ...] = ()

    @property
    def attempt(self) -> int:
        """The run its next (or current) Job is: one more per disruption row, so every Job
        of the task has its own name (``render.job_name(id, attempt)``)."""
        return len(self.disruptions)

    @property
    def recoveries(self) -> tuple[Disruption, ...]:
        """The disruptions that used up one of its max_recoveries (not the controller's own
        moves: ``CONTROLLER_MOVES``)."""
        return tuple(d for d in self.disruptions if d.kind not in CONTROLLER_MOVES)

    @property
    def releases(self) -> tuple[Disruption, ...]:
        """The pools it gave back because another topology waited for their capacity."""
        return tuple(d for d in self.disruptions if d.kind == RELEASED)

    @property
    def start_deadline(self) -> dt.datetime | None:
        """When it must have reached Running by (its spec's ``start_deadline_s`` after
        ``created_at``), while it waits for its first start (``lc.BEFORE_START_PHASES``);
        None without a deadline, or once a run of it began: the deadline is about the first
        start, and a task that has been Running has a disruption the fleet caused on record
        (``recoveries``: the only way out of Running but an end), as has one whose starting
        run the fleet ended."""
        if self.spec.start_deadline_s is None or self.phase not in lc.BEFORE_START_PHASES or has_run(self.disruptions):
            return None
        return self.spec.start_deadline_at(self.created_at)

    @property
    def priority(self) -> int:
        """The pick rule's priority: a task recovering from a disruption, or that gave its
        pool back to another topology, goes ahead of every task that has not run yet (its
        spec's priority orders it among those)."""
        ahead = any(d.kind != SWITCHED for d in self.disruptions)
        return self.spec.priority + (RECOVERY_PRIORITY if ahead else 0)

    def with_message(self, message: str) -> QueueTask:
        """The same value with another Message (a copy)."""
        return _with_message(self, message)


RECOVERY_PRIORITY = 1000  # above any spec priority (-100..100)
# ``falcon_task_disruptions`` rows that record a move of the controller's, not a disruption
# by the fleet: each leaves its attempt's Job name behind (the next Job takes the next one)
# and none uses up a max_recoveries. ``abandoned``: a recovery left its pool; ``released``:
# the task gave a pool that held part of its nodes back to another topology and went to the
# head of its queue, or gave back a create GKE was too slow with (``capacity.give_back``); ``switched``: a task waiting for the
# nodes of its new pool took an idle pool with Ready nodes instead (``acquire.switch_to_idle``).
ABANDONED, RELEASED, SWITCHED = "abandoned", "released", "switched"
CONTROLLER_MOVES = frozenset({ABANDONED, RELEASED, SWITCHED})


def has_run(disruptions: Iterable[Disruption]) -> bool:
    """Whether a task with these ``falcon_task_disruptions`` rows has had a run: the fleet
    ended one (a row that is not one of the controller's own moves, ``CONTROLLER_MOVES``).
    Leaving Running other than by an end always writes such a row, so a task without one
    has never been Running."""
    return any(d.kind not in CONTROLLER_MOVES for d in disruptions)


@dataclass(frozen=True)
class Disruption:
    """One run of a task that the fleet ended (a ``falcon_task_disruptions`` row)."""

    attempt: int  # the run it ended (0: the first)
    kind: str  # faults.DisruptionKind
    node: str
    job: str
    detail: str
    at: dt.datetime


@dataclass(frozen=True)
class StartSample:
    """One task of the queue that reached Running, from its event log: when it left
    Waiting (``picked_at``), when it ran, how much of that it spent waiting for capacity
    (ClusterBusy), its own timeout, how long it ran once it has ended, and when it was
    given a pool that existed already (``pool_at``: a hand-over, at the pick or later in
    place of its own create; None when its own create made the pool it ran on)."""

    task_id: int
    supply_mode: SupplyMode
    picked_at: dt.datetime
    running_at: dt.datetime
    capacity_wait_s: float
    timeout_s: float
    ran_s: float | None = None
    pool_at: dt.datetime | None = None

    @property
    def acquire_s(self) -> float:
        """The acquisition itself: picked -> Running, less the wait for capacity."""
        return max(0.0, (self.running_at - self.picked_at).total_seconds() - self.capacity_wait_s)

    @property
    def handed_over(self) -> bool:
        return self.pool_at is not None

    @property
    def create_seen(self) -> tuple[float, bool] | None:
        """What the start says of a create: (its seconds, ended). A create: its acquisition,
        ended. A pool given after the pick, in place of the acquisition under way: that
        acquisition had lasted this long and would have lasted longer (not ended). A pool
        given at the pick: nothing."""
        if self.pool_at is None:
            return self.acquire_s, True
        cut = (self.pool_at - self.picked_at).total_seconds() - self.capacity_wait_s
        return (max(0.0, cut), False) if self.pool_at > self.picked_at else None

    @property
    def handover_s(self) -> float:
        """A hand-over's own time: given the pool -> Running (0 for a create)."""
        return max(0.0, (self.running_at - self.pool_at).total_seconds()) if self.pool_at is not None else 0.0


@dataclass(frozen=True)
class QueueHistory:
    """The queue's recent starts, newest last (a bounded number: ``eta.HISTORY_TASKS``)."""

    samples: tuple[StartSample, ...] = ()
    # the calibration of the latest start: (supply mode, ``eta.score`` of a task's first
    # estimate against its actual start), newest last, ``eta.SCORES_KEPT`` at most
    scores: tuple[tuple[SupplyMode, float], ...] = ()
    # the tasks that came into the queue, (created_at, actor), oldest first,
    # ``eta.ARRIVALS_KEPT`` at most: the rate of the round robin's overtakers
    arrivals: tuple[tuple[dt.datetime, str], ...] = ()


@dataclass(frozen=True)
class SubmitError:
    """A Job submission the Kubernetes API refused, for good (the task fails with it) or for
    now (retried), and the first refusal of this run of refusals (None: unknown)."""

    kind: ErrorKind
    message: str
    since: dt.datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ErrorKind(self.kind))


def age_key(t: QueueTask) -> tuple[dt.datetime, int]:
    """The pick rule's age: oldest first, the id breaks ties."""
    return (t.created_at, t.id)


def deadline_key(t: QueueTask) -> tuple[dt.datetime, int]:
    """A task with a start deadline by that deadline (the ``WaitingQueue``'s ``deadlines``)."""
    at = t.start_deadline
    assert at is not None
    return (at, t.id)


@dataclass(frozen=True, eq=False)
class WaitingQueue:
    """The queue's Waiting tasks grouped as the pick rule reads them: per priority, per
    actor, oldest first (``age_key``). A value: its tuples never change; the
    QueueReconciler's ``scheduling.WaitingIndex`` builds one per round and shares the
    buckets that did not change, so a decision reads the heads and the count without a
    pass over the waiting tasks. ``ids``: every task in it."""

    buckets: Mapping[int, Mapping[str, tuple[QueueTask, ...]]] = field(default_factory=dict)
    ids: frozenset[int] = frozenset()
    # the tasks with a start deadline (``QueueTask.start_deadline``), soonest first
    deadlines: tuple[QueueTask, ...] = ()

    @classmethod
    def of(cls, tasks: Iterable[QueueTask]) -> WaitingQueue:
        """Built from plain tasks (sorted here): for tests and callers without an index."""
        buckets: dict[int, dict[str, list[QueueTask]]] = {}
        for t in sorted(tasks, key=age_key):
            buckets.setdefault(t.priority, {}).setdefault(t.actor, []).append(t)
        frozen = {p: {a: tuple(ts) for a, ts in by.items()} for p, by in buckets.items()}
        every = [t for by in frozen.values() for ts in by.values() for t in ts]
        return cls(frozen, frozenset(t.id for t in every), tuple(sorted((t for t in every if t.start_deadline), key=deadline_key)))

    def past_deadline(self, now: dt.datetime, without: Collection[int] = ()) -> list[QueueTask]:
        """The tasks whose start deadline is ``now`` or earlier, soonest first, leaving out
        ``without``: no pass over the tasks whose deadline is later, or that have none."""
        out = []
        for t in self.deadlines:
            if deadline_key(t)[0] > now:
                break
            if t.id not in without:
                out.append(t)
        return out

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.ids

    def __iter__(self) -> Iterator[QueueTask]:
        """Highest priority first, then by actor; not the pick order (``scheduling.queue_order``)."""
        for p in sorted(self.buckets, reverse=True):
            for ts in self.buckets[p].values():
                yield from ts

    def top_heads(self, without: Collection[int] = ()) -> list[QueueTask]:
        """Each actor's oldest task of the highest priority, leaving out ``without`` (a few
        ids): all the pick rule needs to choose (``scheduling.pick_next``)."""
        for p in sorted(self.buckets, reverse=True):
            heads = [next((t for t in ts if t.id not in without), None) for ts in self.buckets[p].values()]
            found = [t for t in heads if t is not None]
            if found:
                return found
        return []


class QueueTasks(Sequence):
    """Every live task of the queue: the ones that are not Waiting (``held``, few, in id
    order) and the ``WaitingQueue``; iterating or indexing walks both, the decisions read
    the two parts instead."""

    def __init__(self, held: tuple[QueueTask, ...], waiting: WaitingQueue) -> None:
        self.held, self.waiting = held, waiting
        self._all: tuple[QueueTask, ...] | None = None

    def __len__(self) -> int:
        return len(self.held) + len(self.waiting)

    def __iter__(self) -> Iterator[QueueTask]:
        yield from self.held
        yield from self.waiting

    def __getitem__(self, i):  # type: ignore[override]
        if self._all is None:
            self._all = tuple(self)
        return self._all[i]


@dataclass(frozen=True)
class QueueState:
    cluster: Cluster
    topology: str
    tasks: Sequence[QueueTask]  # every live task; the reconciler gives a ``QueueTasks``
    leases: tuple[Lease, ...]
    last_granted: str
    other_topology_waiting: bool = False
    alternatives_exist: bool = False  # another active cluster of the same TPU type
    submit_errors: dict[int, SubmitError] = field(default_factory=dict)
    # last holders of pools whose delete keeps failing: task -> (its terminal phase, its message)
    terminal_messages: dict[int, tuple[Phase, str]] = field(default_factory=dict)
    # pools GKE refused for capacity, of the queue's acquiring tasks, Deleted ones included:
    # the durable record of each task's capacity wait (how many refusals, since when)
    refused: tuple[Lease, ...] = ()
    # every pool name a lease row of this queue holds (its live leases, and every row, Deleted
    # ones too, of its acquiring tasks): a new create takes a name that is none of them
    pool_names: frozenset[str] = frozenset()
    history: QueueHistory = field(default_factory=QueueHistory)  # for the start estimates
    # other clusters a ClusterBusy task could move to (read only while a task is ClusterBusy)
    destinations: tuple[Destination, ...] = ()
    # the ClusterBusy tasks of the cluster's other queues (read only where the hold can apply)
    reservation_waiters: tuple[ReservationWaiter, ...] = ()
    # the cluster's reservation pools, for the hold's backfill (read only while a hold may apply)
    reservation_occupants: tuple[ReservationOccupant, ...] = ()
    # ``tasks`` in two parts: the tasks that are not Waiting (in their order) and the Waiting ones
    held: tuple[QueueTask, ...] = field(init=False, repr=False, compare=False)
    waiting: WaitingQueue = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.tasks, QueueTasks):
            held, waiting = self.tasks.held, self.tasks.waiting
        else:  # plain tasks (tests, tools): split them here
            held = tuple(t for t in self.tasks if t.phase != lc.WAITING)
            waiting = WaitingQueue.of(t for t in self.tasks if t.phase == lc.WAITING)
        object.__setattr__(self, "held", held)
        object.__setattr__(self, "waiting", waiting)

    @property
    def cluster_active(self) -> bool:
        return self.cluster.active
