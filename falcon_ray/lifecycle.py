"""Task and node-pool lifecycles: every state, and every allowed move, in one table.

Contract
--------
A task's state is the pair (Status, Reason) of the original design (section 9):
Reason is set only in Pending (what Falcon is doing) and Failed (why it failed), and
is "" everywhere else. ``TASK_TRANSITIONS`` lists every allowed move with who causes
it; the repository refuses a write that is not in it, the tests walk it, and
docs/schema.md prints it. ``LEASE_TRANSITIONS`` does the same for node-pool leases.

The upper layer owns two moves: it inserts Pending tasks and sets Aborting. Every
other move belongs to Falcon, and no Falcon move starts from Aborting except
Aborting -> Aborted, so a compare-and-set that expects a non-Aborting state can never
overwrite an abort.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Status(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    ABORTING = "Aborting"
    ABORTED = "Aborted"


class Reason(StrEnum):
    NONE = ""
    # Pending: what Falcon is doing now
    WAITING = "Waiting"
    PROVISIONING = "Provisioning"
    CLUSTER_BUSY = "ClusterBusy"
    WAITING_FOR_NODE = "WaitingForNode"
    DISPATCHING = "Dispatching"
    # the fleet disrupted its run (host maintenance, node repair, capacity reclaimed): a new
    # attempt of its Job is on the way; it holds its pool but not the acquisition slot
    RECOVERING = "Recovering"
    # Failed: why
    NODE_POOL_TIMEOUT = "NodePoolTimeout"
    NODE_POOL_FAILED = "NodePoolFailed"
    JOB_SUBMIT_FAILED = "JobSubmitFailed"
    JOB_FAILED = "JobFailed"
    TIMEOUT = "Timeout"
    INVALID_SPEC = "InvalidSpec"  # the spec column failed validation
    UNSUPPORTED_TPU_TYPE = "UnsupportedTPUType"  # no registered cluster offers the TPU type
    NO_CANDIDATE_CLUSTER = "NoCandidateCluster"  # clusters exist, none can take this task
    DISRUPTED = "Disrupted"  # the fleet disrupted its runs more often than its max_recoveries
    START_DEADLINE_EXCEEDED = "StartDeadlineExceeded"  # not Running by created_at + the spec's start_deadline_s


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.ABORTED})
NON_TERMINAL = frozenset(Status) - TERMINAL

# A task in one of these holds its queue's acquisition slot (original, section 4).
ACQUIRING = frozenset(
    {Reason.PROVISIONING, Reason.CLUSTER_BUSY, Reason.WAITING_FOR_NODE, Reason.DISPATCHING}
)
FAILURE_REASONS = frozenset(
    {
        Reason.NODE_POOL_TIMEOUT,
        Reason.NODE_POOL_FAILED,
        Reason.JOB_SUBMIT_FAILED,
        Reason.JOB_FAILED,
        Reason.TIMEOUT,
        Reason.INVALID_SPEC,
        Reason.UNSUPPORTED_TPU_TYPE,
        Reason.NO_CANDIDATE_CLUSTER,
        Reason.DISRUPTED,
        Reason.START_DEADLINE_EXCEEDED,
    }
)


class Phase(NamedTuple):
    status: Status
    reason: Reason = Reason.NONE

    def __str__(self) -> str:
        return f"{self.status}/{self.reason}" if self.reason else str(self.status)


P = Phase
NEW = P(Status.PENDING)  # written by the upper layer, not yet taken by Falcon
WAITING = P(Status.PENDING, Reason.WAITING)
PROVISIONING = P(Status.PENDING, Reason.PROVISIONING)
CLUSTER_BUSY = P(Status.PENDING, Reason.CLUSTER_BUSY)
WAITING_FOR_NODE = P(Status.PENDING, Reason.WAITING_FOR_NODE)
DISPATCHING = P(Status.PENDING, Reason.DISPATCHING)
RECOVERING = P(Status.PENDING, Reason.RECOVERING)
RUNNING = P(Status.RUNNING)
SUCCEEDED = P(Status.SUCCEEDED)
ABORTING = P(Status.ABORTING)
ABORTED = P(Status.ABORTED)


def failed(reason: Reason) -> Phase:
    assert reason in FAILURE_REASONS, reason
    return P(Status.FAILED, reason)


ACQUIRING_PHASES = (PROVISIONING, CLUSTER_BUSY, WAITING_FOR_NODE, DISPATCHING)
PENDING_PHASES = (NEW, WAITING, *ACQUIRING_PHASES, RECOVERING)
LIVE_PHASES = (*PENDING_PHASES, RUNNING)
# The phases a task waits in for its first start: the spec's start_deadline_s ends it from
# each of them. Recovering is not one: a task there has had a run (or the fleet ended one
# that was starting), and the deadline is about the first start only.
BEFORE_START_PHASES = (NEW, WAITING, *ACQUIRING_PHASES)

# Who causes each move.
UPPER = "upper layer"
POLLER = "PollerActor"
QUEUE = "QueueActor"


_POOL_TIMEOUT = f"{QUEUE}: control plane not RUNNING within node_pool_timeout"
_POOL_REFUSED = f"{QUEUE}: GKE refused the create (quota, bad request), or capacity_budget_s ran out"

# Every task edge as (source phase or phases, destination, who causes it), in the order
# docs/schema.md prints them; TASK_TRANSITIONS expands the rows with several sources.
_TASK_EDGES: tuple[tuple[Phase | tuple[Phase, ...], Phase, str], ...] = (
    # intake
    (NEW, WAITING, f"{POLLER}: assigned to a (cluster, topology) queue"),
    (NEW, failed(Reason.INVALID_SPEC), f"{POLLER}: the spec failed validation"),
    (NEW, failed(Reason.UNSUPPORTED_TPU_TYPE), f"{POLLER}: no registered cluster offers the TPU type"),
    (NEW, failed(Reason.NO_CANDIDATE_CLUSTER), f"{POLLER}: no cluster can take the task (e.g. no reservation)"),
    (WAITING, NEW, f"{QUEUE}: its cluster left service; the poller ranks the task again"),
    (
        (PROVISIONING, CLUSTER_BUSY),
        NEW,
        f"{QUEUE}: its cluster's reservation holds another machine type; the poller ranks the task again",
    ),
    # acquisition (one task per queue at a time)
    (WAITING, PROVISIONING, f"{QUEUE}: picked for the slot"),
    ((PROVISIONING, CLUSTER_BUSY), CLUSTER_BUSY, f"{QUEUE}: reservation headroom short, or GKE refused the create for capacity (stockout); wait, no fallback"),
    (WAITING_FOR_NODE, CLUSTER_BUSY, f"{QUEUE}: the pool failed for capacity before its nodes came (stockout); its Job and pool deleted, wait"),
    (CLUSTER_BUSY, PROVISIONING, f"{QUEUE}: reservation headroom back, or the capacity backoff passed; creating"),
    (
        CLUSTER_BUSY,
        WAITING,
        f"{QUEUE}: another active cluster of its TPU type can start it with the same supply on what it has now (an idle pool, "
        "or reservation room for it and the tasks queued there), or (on-demand, "
        "flex-start after a capacity refusal) one in another zone with an empty queue that has not refused it; moved to that queue",
    ),
    ((PROVISIONING, CLUSTER_BUSY), WAITING_FOR_NODE, f"{QUEUE}: pool control plane RUNNING, nodes registering"),
    ((PROVISIONING, CLUSTER_BUSY, WAITING_FOR_NODE), DISPATCHING, f"{QUEUE}: pool ready (or an idle one reused)"),
    (WAITING, DISPATCHING, f"{QUEUE}: picked and an idle same-topology pool is ready"),
    (DISPATCHING, RUNNING, f"{QUEUE}: every pod of the Job is active"),
    # a pool that scales from zero (flex-start, or an idle pool the autoscaler emptied) gets its
    # nodes only for the Job's pending pods: the Job is submitted first, the nodes follow
    (DISPATCHING, WAITING_FOR_NODE, f"{QUEUE}: Job submitted; its pool has no nodes yet, they come for its pending pods"),
    (WAITING_FOR_NODE, RUNNING, f"{QUEUE}: the nodes came and every pod of the Job is active"),
    # acquisition failures
    (PROVISIONING, failed(Reason.NODE_POOL_TIMEOUT), _POOL_TIMEOUT),
    (PROVISIONING, failed(Reason.NODE_POOL_FAILED), _POOL_REFUSED),
    (CLUSTER_BUSY, failed(Reason.NODE_POOL_TIMEOUT), _POOL_TIMEOUT),
    (CLUSTER_BUSY, failed(Reason.NODE_POOL_FAILED), _POOL_REFUSED),
    (WAITING_FOR_NODE, failed(Reason.NODE_POOL_TIMEOUT), _POOL_TIMEOUT),
    (WAITING_FOR_NODE, failed(Reason.NODE_POOL_FAILED), _POOL_REFUSED),
    ((DISPATCHING, WAITING_FOR_NODE), failed(Reason.JOB_SUBMIT_FAILED), f"{QUEUE}: the Kubernetes API refused the Job"),
    # execution
    ((DISPATCHING, WAITING_FOR_NODE, RUNNING), SUCCEEDED, f"{QUEUE}: the Job completed"),
    ((DISPATCHING, WAITING_FOR_NODE, RUNNING), failed(Reason.JOB_FAILED), f"{QUEUE}: the Job failed (pod failure, OOM, ...)"),
    ((DISPATCHING, RUNNING), failed(Reason.TIMEOUT), f"{QUEUE}: dispatched_at + timeout_seconds passed"),
    # recovery: the fleet, not the task, ended a run (reconcile.recover, falcon_ray.faults)
    (
        (DISPATCHING, WAITING_FOR_NODE, RUNNING),
        RECOVERING,
        f"{QUEUE}: the fleet disrupted the run (maintenance, repair, reclaim, a lost node or pool) and its recoveries are not used up; its Job is deleted",
    ),
    (RECOVERING, RUNNING, f"{QUEUE}: every pod of the new attempt's Job is active (the attempt's timeout clock starts)"),
    (WAITING_FOR_NODE, WAITING, f"{QUEUE}: its pool held part of its nodes past contested_wait_s while another topology waited; pool and Job deleted, back at the head of the queue"),
    (PROVISIONING, WAITING, f"{QUEUE}: GKE's create was not RUNNING within node_pool_timeout_s; the pool given back, back at the head of the queue"),
    (RECOVERING, WAITING, f"{QUEUE}: its pool is gone or did not come back within recovery_pool_wait_s; it acquires a new one, ahead of the queue"),
    (RECOVERING, SUCCEEDED, f"{QUEUE}: the new attempt's Job completed"),
    (RECOVERING, failed(Reason.JOB_FAILED), f"{QUEUE}: the new attempt's Job failed by the task's own fault"),
    (RECOVERING, failed(Reason.JOB_SUBMIT_FAILED), f"{QUEUE}: the Kubernetes API refused the new attempt's Job"),
    (
        (DISPATCHING, WAITING_FOR_NODE, RUNNING, RECOVERING),
        failed(Reason.DISRUPTED),
        f"{QUEUE}: the fleet disrupted the run once more than the task's max_recoveries allows",
    ),
    # the start deadline: not Running by created_at + start_deadline_s; cleaned up as an abort is
    (NEW, failed(Reason.START_DEADLINE_EXCEEDED), f"{POLLER}: the spec's start_deadline_s passed before it was placed on a cluster"),
    (
        (WAITING, *ACQUIRING_PHASES),
        failed(Reason.START_DEADLINE_EXCEEDED),
        f"{QUEUE}: the spec's start_deadline_s passed before its first Running; its Job deleted, its pool kept idle or deleted",
    ),
    # abort: the upper layer may abort any live task; Falcon finishes it
    (LIVE_PHASES, ABORTING, f"{UPPER}: abort requested"),
    (ABORTING, ABORTED, f"{QUEUE} (or {POLLER} for a task unassigned or aborted while Waiting): Job and pool handled"),
)


def _edges() -> dict[tuple[Phase, Phase], str]:
    e: dict[tuple[Phase, Phase], str] = {}
    for src, dst, who in _TASK_EDGES:
        for s in src if isinstance(src, tuple) and isinstance(src[0], Phase) else (src,):
            e[(s, dst)] = who  # type: ignore[index]
    return e


TASK_TRANSITIONS: dict[tuple[Phase, Phase], str] = _edges()


def allowed(src: Phase, dst: Phase) -> bool:
    return (src, dst) in TASK_TRANSITIONS


def sources_of(dst: Phase) -> tuple[Phase, ...]:
    """Every phase from which ``dst`` may be reached: the compare-and-set's expected set."""
    return tuple(s for (s, d) in TASK_TRANSITIONS if d == dst)


_REASONED = frozenset({Status.PENDING, Status.FAILED})


_STATUSES: dict[str, Status] = {s.value: s for s in Status}  # a look-up, not Status(x): rows are many
_REASONS: dict[str, Reason] = {r.value: r for r in Reason}


def phase_of(status: str, reason: str | None) -> Phase:
    """The phase of a stored row. A reason left behind in a status that carries none
    (the upper layer sets Aborting without clearing Reason) is ignored."""
    st = _STATUSES.get(status)
    if st is None:
        raise ValueError(f"{status!r} is not a valid Status")
    if st not in _REASONED:
        return Phase(st, Reason.NONE)
    rs = _REASONS.get(reason or "")
    if rs is None:
        raise ValueError(f"{reason!r} is not a valid Reason")
    return Phase(st, rs)


# --- node-pool leases --------------------------------------------------------------


class LeaseState(StrEnum):
    REQUESTED = "Requested"  # row written with the pool name; create not yet confirmed
    CREATING = "Creating"  # create accepted by GKE; waiting for RUNNING and nodes
    READY = "Ready"  # RUNNING with every node registered, not yet given to a Job
    IN_USE = "InUse"  # a task's Job runs on it
    IDLE = "Idle"  # kept after a task ended: for a waiting same-topology task, or within its keep-alive window
    DELETING = "Deleting"  # delete requested (or retried)
    DELETED = "Deleted"  # GKE says it is gone


L = LeaseState
LEASE_TRANSITIONS: dict[tuple[LeaseState, LeaseState], str] = {
    (L.REQUESTED, L.CREATING): f"{QUEUE}: create call accepted (or 409 adopted)",
    (L.REQUESTED, L.DELETING): f"{QUEUE}: create refused or abandoned; make sure nothing is left",
    (L.CREATING, L.READY): f"{QUEUE}: pool RUNNING and all nodes registered",
    (L.CREATING, L.IN_USE): f"{QUEUE}: pool ready and its task's Job submitted at once",
    (L.CREATING, L.DELETING): f"{QUEUE}: create failed, timed out or its task aborted with nobody waiting",
    (L.CREATING, L.IDLE): f"{QUEUE}: its task aborted while creating and a same-topology task waits",
    (L.READY, L.IN_USE): f"{QUEUE}: a Job was submitted on it",
    (L.READY, L.IDLE): f"{QUEUE}: its task ended before dispatch; kept for a waiting task or its keep-alive window",
    (L.READY, L.DELETING): f"{QUEUE}: its task ended before dispatch and nobody waits",
    (L.IN_USE, L.IDLE): f"{QUEUE}: its task ended and a same-topology task waits (hand-over), or its keep-alive window keeps it",
    (L.IN_USE, L.DELETING): f"{QUEUE}: its task ended and nobody waits",
    (L.IDLE, L.IN_USE): f"{QUEUE}: handed over to the next task",
    (L.IDLE, L.READY): f"{QUEUE}: claimed by an acquiring task",
    (L.IDLE, L.DELETING): f"{QUEUE}: nobody waits and its keep-alive window (if any) is over or another topology needs the reservation, or the cluster left service",
    (L.DELETING, L.DELETING): f"{QUEUE}: delete retried with backoff",
    (L.DELETING, L.DELETED): "ClusterActor / QueueActor: GKE returned NotFound for the pool",
}
# The groups of lease states the controller reasons about; each is named here once.
LEASE_LIVE = frozenset(set(LeaseState) - {L.DELETED})  # a pool that exists or may exist
LEASE_BEING_CREATED = frozenset({L.REQUESTED, L.CREATING})  # asked for; not ready yet
LEASE_HELD = LEASE_BEING_CREATED | {L.READY, L.IN_USE}  # bound to one task
# hosts of a reservation that Falcon holds (GKE may not count them yet): every pool bound to
# a task or kept idle for one; a deleting pool gives its hosts back
LEASE_HOLDS_RESERVATION = LEASE_HELD | {L.IDLE}
# a pool that can have nodes while no task's pod runs on it: the idle chip-hours
LEASE_UNUSED = frozenset({L.READY, L.IDLE, L.DELETING})


def lease_allowed(src: LeaseState, dst: LeaseState) -> bool:
    return (src, dst) in LEASE_TRANSITIONS


# --- rendering (docs/schema.md embeds this output; a test keeps the two in step) -------


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "—"


def markdown_table() -> str:
    """``TASK_TRANSITIONS`` as a Markdown table, in the table's own order."""
    lines = [
        "| From status | From reason | To status | To reason | Caused by |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (src, dst), who in TASK_TRANSITIONS.items():
        lines.append(
            f"| {src.status} | {_cell(src.reason)} | {dst.status} | {_cell(dst.reason)} | {_cell(who)} |"
        )
    return "\n".join(lines)


def lease_markdown_table() -> str:
    """``LEASE_TRANSITIONS`` as a Markdown table."""
    lines = ["| From | To | Caused by |", "| --- | --- | --- |"]
    for (src, dst), who in LEASE_TRANSITIONS.items():
        lines.append(f"| {src} | {dst} | {_cell(who)} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m falcon_ray.lifecycle
    print(markdown_table())
    print()
    print(lease_markdown_table())
