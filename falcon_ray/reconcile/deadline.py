"""Rule 1b: a task not started by its start deadline ends Failed/StartDeadlineExceeded; a
Waiting task's Message says so early when its latest start (the expected one without a
range) comes after the deadline.

Contract
--------
A spec's ``start_deadline_s`` bounds the wait for the task's first start: by
``created_at + start_deadline_s`` it must be Running (``QueueTask.start_deadline``; None
once a run of it has begun, so a recovering task is never ended by it).

- ``expire(d)``: every task of the queue waiting for its first start whose deadline is
  ``d.now`` or earlier ends Failed/StartDeadlineExceeded, Waiting ones (found soonest first
  in ``WaitingQueue.deadlines``, no pass over the waiting list) and the slot holder
  (Provisioning, ClusterBusy, WaitingForNode, Dispatching) alike. It ends through
  ``Decision.finish``, as every end: the terminal write, then its Job's delete, then its
  pool's keep-or-delete (``Decision.release``), the same as an abort's (``finish.abort``):
  a pool it created is kept Idle for a task that waits (its create, if not finished, is
  followed as an abandoned one), else deleted; a pool it was handed goes back Idle or is
  deleted the same way; a pool it has not named yet does not exist. It leaves the slot,
  the demand for idle pools and the waiting list, so the later rules of the same
  decision give them to the next task. A slot holder whose Job has every pod ready, or
  has ended, started before the queue could see it: the execution rules decide it.
- The Message (``text``) names the deadline, the submission it counts from, the phase the
  task was in, since when, what it waited for there (``waited_for``: its queue's turn, its
  pool's create, capacity of its supply mode, its pool's nodes, its Job's pods) and its last
  Message. The poller (``actors.poller``) ends a task it holds with the same text.
- ``deadline_first(deadline_at, expected_at, latest_at=None)``: whether the deadline passes
  before the start the Waiting Message shows (the latest start when there is one, else the
  expected start); rule 8 then adds that to the Message (``positions``).

A decision that returns the end once the deadline is reached returns it at every later
instant too, so ``reconcile.due`` wakes the queue at the deadline's tick.
"""

from __future__ import annotations

import datetime as dt

from falcon_ray import lifecycle as lc
from falcon_ray import messages, scheduling
from falcon_ray.lifecycle import Phase, Reason
from falcon_ray.model import JobPhase, QueueTask
from falcon_ray.reconcile.context import Decision, fmt_limit, stamp

EXCEEDED = lc.failed(Reason.START_DEADLINE_EXCEEDED)


def expire(d: Decision) -> None:
    for t in list(d.acquiring):
        at = t.start_deadline
        if at is not None and d.now >= at and not started_meanwhile(d, t):
            d.forget_holder(t)
            d.finish(t, EXCEEDED, text_for(d, t, at))
    for t in d.waiting_past_deadline():
        d.leave(t)
        d.demand.discard(t.id)
        at = t.start_deadline
        assert at is not None
        d.finish(t, EXCEEDED, text_for(d, t, at))


def started_meanwhile(d: Decision, t: QueueTask) -> bool:
    """The slot holder's Job of this attempt has every pod ready, or has ended: it started
    (or ran) before this decision; ``finish.execute`` and ``dispatch`` decide it."""
    job = d.job_of(t)
    if job is None or job.attempt < t.attempt:
        return False
    return job.ready >= t.spec.shape.hosts or job.phase in (JobPhase.SUCCEEDED, JobPhase.FAILED)


def waited_for(d: Decision, t: QueueTask) -> str:
    """What ``t`` waits for in its phase, in words (the deadline Message's middle part)."""
    q = d.queue
    lease = d.lease_by_task.get(t.id)
    supply = scheduling.acquiring_mode(t.spec, lease, q.cluster.default_reservation).value
    pool = lease.name if lease is not None else t.node_pool_name
    if t.phase == lc.WAITING:
        return d.msg("deadline_wait_waiting", cluster=q.cluster.name, topology=q.topology)
    if t.phase == lc.CLUSTER_BUSY:
        return d.msg("deadline_wait_cluster_busy", supply=supply, cluster=q.cluster.name)
    if t.phase == lc.WAITING_FOR_NODE:
        return d.msg("deadline_wait_nodes", supply=supply, pool=pool or "?")
    if t.phase == lc.DISPATCHING:
        return d.msg("deadline_wait_dispatching", pool=pool or "?")
    if pool is None:
        return d.msg("deadline_wait_create", supply=supply)
    return d.msg("deadline_wait_provisioning", pool=pool, supply=supply)


def text_for(d: Decision, t: QueueTask, at: dt.datetime) -> str:
    assert t.spec.start_deadline_s is not None
    since = t.phase_since or t.created_at
    return text(d.settings.lang, at, t.spec.start_deadline_s, t.created_at, t.phase, waited_for(d, t), since, t.message)


def text(
    lang: str | None, deadline_at: dt.datetime, limit_s: float, created_at: dt.datetime, phase: Phase, waiting: str,
    since: dt.datetime, message: str,
) -> str:
    """The StartDeadlineExceeded Message (see the module's contract)."""
    detail = messages.text("start_deadline_detail", lang, message=message) if message else ""
    return messages.text(
        "start_deadline_exceeded", lang, deadline=stamp(deadline_at), limit=fmt_limit(limit_s), created=stamp(created_at),
        phase=str(phase), waiting=waiting, since=stamp(since), detail=detail,
    )  # fmt: skip


def deadline_first(deadline_at: dt.datetime | None, expected_at: dt.datetime | None, latest_at: dt.datetime | None = None) -> bool:
    """Whether the start deadline passes before the start a Message shows: ``latest_at`` when
    given (a bound on the start), else ``expected_at``; False without a deadline or a start."""
    start = latest_at if latest_at is not None else expected_at
    return deadline_at is not None and start is not None and start > deadline_at


def warning(d: Decision, t: QueueTask, expected_at: dt.datetime | None, latest_at: dt.datetime | None = None) -> str:
    """The Waiting Message's part that says the deadline passes before the start, or ""."""
    at = t.start_deadline
    if not deadline_first(at, expected_at, latest_at):
        return ""
    assert at is not None
    return d.msg("start_deadline_first", deadline=stamp(at))
