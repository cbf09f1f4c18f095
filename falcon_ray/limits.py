"""Every wait a live task can be in, its limit, and what happens when the limit passes.

Contract
--------
``LIMITS`` is the one table of waits. A row names the phase (Pending and a Reason, or
Aborting), the circumstance that tells two waits of one Reason apart, the setting that
holds the limit (or the task's own ``timeout_seconds``, or none: at once), the durable
record the wait is counted from, and the action (one row, the start deadline, spans the
phases before the first start: ``phases``): ``fail`` (the task ends Failed with the
row's Reason), ``re-rank`` (it goes back to the poller), or ``report`` (``falcon-ray
health`` lists it; nothing else happens). The decisions that enforce a limit read it
through ``seconds``; ``falcon-ray health`` classifies every live task with ``wait_of``
and lists those past their row's limit; docs/operations.md prints ``markdown_table``
(a test keeps the two in step). Every clock here is a durable record (the task's event
log, ``dispatched_at``, ``aborting_at``, a lease row), so a limit survives restarts.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import Phase, Reason

if TYPE_CHECKING:
    from falcon_ray.config import Settings

TASK_TIMEOUT = "timeout_seconds"  # the limit is the task's own timeout, not a setting
TASK_START_DEADLINE = "start_deadline_s"  # the limit is the task's own start deadline (none unless its spec sets one)
# A limit that fails or re-ranks a task is carried out at the queue's next tick; health
# lists such a task only once it is this many ticks past it (the enforcement is late).
REPORT_GRACE_TICKS = 3


class Action(StrEnum):
    FAIL = "fail"
    RERANK = "re-rank"
    REACQUIRE = "new pool"  # the task goes back to Waiting, ahead of the queue, for a new pool
    RECOVER = "recover"  # the run is ended as the fleet's fault: a new attempt
    REPORT = "report"


class Wait(StrEnum):
    INTAKE = "intake"
    QUEUE = "queue"
    OUT_OF_SERVICE = "out-of-service"
    CREATE_QUEUED = "create-queued"
    CREATE = "create"
    RESERVATION = "reservation"
    CAPACITY = "capacity"
    NODES_CONTESTED = "nodes-contested"
    NODES = "nodes"
    SUBMIT = "submit"
    PODS = "pods"
    ABORT = "abort"
    RECOVERY = "recovery"
    DEGRADED = "degraded"
    START_DEADLINE = "start-deadline"


@dataclass(frozen=True)
class WaitLimit:
    wait: Wait
    phase: Phase
    when: str  # the circumstance, for an operator
    setting: str | None  # a Settings field, TASK_TIMEOUT, or None: at once
    since: str  # the durable record the wait is counted from
    action: Action
    enforced_by: str  # the decision that carries the action out ("" for report)
    fails_with: Reason = Reason.NONE
    phases: str = ""  # the phases shown, for a row that spans several (``phase`` is the first)

    def seconds(self, settings: Settings, task_timeout: float | None = None, start_deadline: float | None = None) -> float | None:
        """The limit in seconds; None when there is none (a setting left at null, a task
        without a start deadline)."""
        if self.setting is None:
            return 0.0
        if self.setting == TASK_TIMEOUT:
            return None if task_timeout is None else float(task_timeout)
        if self.setting == TASK_START_DEADLINE:
            return None if start_deadline is None else float(start_deadline)
        value = getattr(settings, self.setting)
        return None if value is None else float(value)

    def grace(self, settings: Settings) -> float:
        """How far past the limit health waits before it lists a task of this row."""
        if self.action == Action.REPORT:
            return 0.0
        return REPORT_GRACE_TICKS * float(settings.queue_tick_s)


ENTERED = "entered the phase (event log)"
LIMITS: tuple[WaitLimit, ...] = (
    WaitLimit(Wait.INTAKE, lc.NEW, "not yet taken by the poller, or no active cluster of its TPU type",
              "intake_limit_s", ENTERED, Action.REPORT, ""),
    WaitLimit(Wait.QUEUE, lc.WAITING, "waiting for its queue's acquisition slot",
              "waiting_limit_s", ENTERED, Action.REPORT, ""),
    WaitLimit(Wait.OUT_OF_SERVICE, lc.WAITING, "its cluster left service and another active cluster of its TPU type exists",
              None, ENTERED, Action.RERANK, "pick.rerank"),
    WaitLimit(Wait.CREATE_QUEUED, lc.PROVISIONING, "its create waits its turn among the cluster's node-pool operations (pool_ops_at_once run together), or was refused as concurrent; the fleet's load, not the task",
              "create_queue_limit_s", "the pool's lease row (created_at)", Action.FAIL,
              "acquire.create_queued", Reason.NODE_POOL_FAILED),
    WaitLimit(Wait.CREATE, lc.PROVISIONING, "GKE accepted its create and the control plane is not RUNNING yet (past the limit the pool is given back and the task goes to the head of its queue, at most pool_release_limit times, then fails), or the cluster or its reservation cannot be read (also from ClusterBusy)",
              "node_pool_timeout_s", "GKE's acceptance of the create (the lease's accepted_at); before there is a lease, the later of the phase's start and the outage's first failed answer", Action.FAIL,
              "acquire.creating, acquire.unreachable, acquire.reservation_allows", Reason.NODE_POOL_TIMEOUT),
    WaitLimit(Wait.RESERVATION, lc.CLUSTER_BUSY, "the reservation has no free slice for it (no limit by default, as the original)",
              "reservation_wait_limit_s", ENTERED, Action.FAIL, "acquire.reservation_allows", Reason.NODE_POOL_FAILED),
    WaitLimit(Wait.CAPACITY, lc.CLUSTER_BUSY, "GKE refused its node pool for capacity (stockout); the create is asked again with backoff, or, past failover_after_s, an on-demand or flex-start task fails over to a cluster in another zone with an empty queue that has not refused it",
              "capacity_budget_s", "the first capacity refusal on this cluster (its lease rows' refused_at)", Action.FAIL,
              "capacity.refused, capacity.backing_off", Reason.NODE_POOL_FAILED),
    WaitLimit(Wait.NODES_CONTESTED, lc.WAITING_FOR_NODE, "its pool holds part of its nodes (some registered, not all) and a task of another topology waits on the cluster; the pool and Job are deleted and the task goes back to the head of its queue, at most pool_release_limit times, then fails (capacity not delivered in time)",
              "contested_wait_s", "the pool's first registered node (its oldest node's creation)", Action.REACQUIRE,
              "capacity.contested"),
    WaitLimit(Wait.NODES, lc.WAITING_FOR_NODE, "its nodes are not all there (GKE has not delivered the capacity), nobody else waits on the cluster; the pool and Job are deleted and the task moves to another cluster that can start it now or fails over to another zone's, or fails",
              "capacity_budget_s", "the first capacity refusal, else entering the phase (event log)", Action.FAIL,
              "capacity.nodes_not_delivered", Reason.NODE_POOL_FAILED),
    WaitLimit(Wait.SUBMIT, lc.DISPATCHING, "the Kubernetes API refuses its Job for now (5xx, timeouts)",
              "submit_budget_s", "the first refusal, or entered the phase when later", Action.FAIL, "dispatch.submit_refused", Reason.JOB_SUBMIT_FAILED),
    WaitLimit(Wait.PODS, lc.DISPATCHING, "its Job was accepted; its pods are starting",
              TASK_TIMEOUT, "the first accepted Job (dispatched_at)", Action.FAIL, "finish.timed_out", Reason.TIMEOUT),
    WaitLimit(Wait.DEGRADED, lc.RUNNING, "pods of its Job are not all ready and nodes under them are NotReady or gone",
              "disruption_grace_s", "when the ClusterActor first saw the Job short of ready pods", Action.RECOVER,
              "Decision.fleet_ended"),
    WaitLimit(Wait.RECOVERY, lc.RECOVERING, "the fleet disrupted its run; its pool's nodes are to come back for the next attempt",
              "recovery_pool_wait_s", ENTERED, Action.REACQUIRE, "recover.recovering"),
    WaitLimit(Wait.START_DEADLINE, lc.NEW, "its spec sets start_deadline_s and it has not started: not placed yet, Waiting, or holding the slot; once a run of it began (Running, or a run the fleet ended) the deadline no longer applies; its Job is deleted and its pool kept idle or deleted, as an abort's",
              TASK_START_DEADLINE, "its submission (created_at)", Action.FAIL, "scheduling.start_deadline_passed, deadline.expire",
              Reason.START_DEADLINE_EXCEEDED, phases=", ".join(map(str, lc.BEFORE_START_PHASES))),
    WaitLimit(Wait.ABORT, lc.ABORTING, "its Job and pool are being cleaned up",
              "aborting_limit_s", "the abort request (aborting_at)", Action.REPORT, ""),
)  # fmt: skip
BY_WAIT: dict[Wait, WaitLimit] = {row.wait: row for row in LIMITS}


def limit(wait: Wait) -> WaitLimit:
    return BY_WAIT[wait]


def seconds(wait: Wait, settings: Settings, task_timeout: float | None = None) -> float | None:
    """The limit of one wait, as the decision that enforces it reads it."""
    return BY_WAIT[wait].seconds(settings, task_timeout)


def passed(wait: Wait, settings: Settings, age_s: float, task_timeout: float | None = None) -> bool:
    """True when a wait of ``age_s`` seconds is past its limit (never, without one)."""
    s = seconds(wait, settings, task_timeout)
    return s is not None and age_s > s


def wait_of(
    phase: Phase,
    *,
    job_accepted: bool = False,
    out_of_service: bool = False,
    contested: bool = False,
    capacity_refused: bool = False,
    degraded: bool = False,
    create_accepted: bool = False,
) -> Wait | None:
    """Which row a live task is in, from facts its row and its cluster's show; None for a
    phase no row covers (Running is bounded by its own timeout, terminal phases by nothing).
    A Provisioning task is in the create's queue wait unless GKE is known to have accepted
    its create (the lease's ``accepted_at``): the longer limit, so no false alarm."""
    if phase == lc.WAITING:
        return Wait.OUT_OF_SERVICE if out_of_service else Wait.QUEUE
    if phase == lc.WAITING_FOR_NODE:
        return Wait.NODES_CONTESTED if contested else Wait.NODES
    if phase == lc.DISPATCHING:
        return Wait.PODS if job_accepted else Wait.SUBMIT
    if phase == lc.CLUSTER_BUSY:
        return Wait.CAPACITY if capacity_refused else Wait.RESERVATION
    if phase == lc.RUNNING:
        return Wait.DEGRADED if degraded else None
    if phase == lc.PROVISIONING:
        return Wait.CREATE if create_accepted else Wait.CREATE_QUEUED
    return next((row.wait for row in LIMITS if row.phase == phase), None)


# --- rendering (docs/operations.md embeds this output; a test keeps the two in step) -------


def _fmt_setting(row: WaitLimit, settings: Settings) -> str:
    if row.setting is None:
        return "at once"
    if row.setting == TASK_TIMEOUT:
        return "the task's `timeout_seconds`"
    if row.setting == TASK_START_DEADLINE:
        return "the task's `start_deadline_s` (none by default)"
    value = getattr(settings, row.setting)
    return f"`{row.setting}` ({'no limit' if value is None else f'{value:g} s'})"


def markdown_table(settings: Settings) -> str:
    """``LIMITS`` as a Markdown table, limits shown with ``settings``' values (the defaults in the docs)."""
    lines = [
        "| Phase | When | Limit | Counted from | Action | Carried out by |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in LIMITS:
        action = f"fail: `{row.fails_with}`" if row.action == Action.FAIL else str(row.action)
        by = ", ".join(f"`{x.strip()}`" for x in row.enforced_by.split(",")) if row.enforced_by else "`falcon-ray health`"
        lines.append(f"| {row.phases or row.phase} | {row.when} | {_fmt_setting(row, settings)} | {row.since} | {action} | {by} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m falcon_ray.limits
    from falcon_ray.config import Settings

    print(markdown_table(Settings()))
