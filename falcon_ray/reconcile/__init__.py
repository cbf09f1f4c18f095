"""The QueueActor's decisions: one pure function from what is observed to what to do.

Contract
--------
``decide(queue, view, now, settings) -> list[EffectGroup]``; ``plan`` is the same
decision as a ``Plan`` whose rule 8 is worked out when asked (the QueueActor's rounds
write rule 8 once, after the last one). ``queue`` is what the
database says (the queue's live tasks, its node-pool leases, the last granted
actor); ``view`` is what the edge cluster says (node pools and their nodes, pool
operations the ClusterActor runs, Jobs, reservation use). Both are frozen values
from ``falcon_ray.model``. The function reads no clock and does no I/O. Each
returned group is a short sequence of effects (``reconcile.effects``) for one task
or one lease; the actor carries a group out in order and stops that group at the
first failure, then decides again on the next tick from fresh observations. Every
effect is idempotent (deterministic names, compare-and-set writes), so repeating a
group after a crash is harmless.

The rules, in the order ``decide`` applies them (original design, sections 4-9):

1. Aborting tasks: delete the Job, hand the pool to keep-or-delete, then Aborted
   (``finish.abort``).
1b. Tasks waiting for their first start past their start deadline (the spec's
   ``start_deadline_s`` after ``created_at``): Failed/StartDeadlineExceeded, their Job and
   pool handled as an end's, the slot and the waiting list left to the next task
   (``deadline.expire``).
2. Running tasks: Succeeded, JobFailed (the Job failed by the task's fault, or
   vanished) or Timeout (dispatched_at + timeout passed) end them; a run the fleet ended
   (``falcon_ray.faults``) is recovered: Recovering, or Failed/Disrupted past the task's
   max_recoveries (``Decision.disrupt``); otherwise their Message follows the pods
   (``finish.execute``). 2b. Recovering tasks get their next attempt on their pool, or go
   back to Waiting, ahead of the queue, for a new one (``recover.recovering``).
3. Re-rank: a cluster in maintenance or offline sends its Waiting tasks back to the
   poller when another cluster of the TPU type is active (``pick.rerank``).
4. The acquisition slot: the one task that is Provisioning, ClusterBusy,
   WaitingForNode or Dispatching moves one step, decided by its lease's state
   (``acquire.acquire``; Dispatching ends in ``dispatch.dispatching``). A reservation
   of another machine type sends it back to the poller; a ClusterBusy task moves to
   another cluster that can start it now with the same supply (``move``).
5. The pick: a free slot goes to the next Waiting task by the pick rule; an idle
   pool of the topology goes straight to it; idle pools whose every node is Ready go to
   the next tasks whoever holds the slot, unless ``strict_slot`` (``pick.pick``).
6. Pools nobody needs: orphaned leases, idle pools nobody waits for, pools of a
   cluster out of service; Deleting leases followed to Deleted (``pools.leases``).
7. Jobs of this queue whose task is no longer live are deleted (``pools.stale_jobs``).
8. Waiting tasks get their position and the tasks ahead (``positions.positions``), and
   are told when their start deadline passes before their expected start.

Keep-or-delete (``Decision.release``): a pool that a task releases is kept (Idle)
while more tasks of its topology wait for a pool than there are idle pools,
otherwise deleted.
"""

from __future__ import annotations

import datetime as dt

from falcon_ray import tpu
from falcon_ray.config import Settings
from falcon_ray.model import ClusterView, QueueState
from falcon_ray.reconcile import acquire, deadline, finish, pick, pools, positions, recover
from falcon_ray.reconcile.context import Decision
from falcon_ray.reconcile.effects import (
    ClaimReservation,
    CreateLease,
    DeleteJob,
    DeletePool,
    Effect,
    EffectGroup,
    EnsurePool,
    MarkReady,
    MoveLease,
    MoveTask,
    RecordDisruption,
    RecordOperation,
    RefreshMessages,
    SubmitJob,
    Transition,
    Unassign,
    UpdateTask,
)


class Plan:
    """One round's decision: the effect groups of rules 1-7 (``groups``, in order) and rule
    8's Message refresh of the same decision (``messages()``, worked out on first ask from
    the same observations and the same claims: a caller that runs several rounds writes
    only its last round's, and pays for rule 8's pass over the waiting list once)."""

    def __init__(self, d: Decision) -> None:
        self._d = d
        self.groups: list[EffectGroup] = list(d.groups)
        self._messages: list[EffectGroup] | None = None

    @property
    def now(self) -> dt.datetime:
        """The instant decided at."""
        return self._d.now

    def decided(self) -> list[EffectGroup]:
        """The groups followed by the Messages: what ``decide`` returns."""
        return self.groups + self.messages()

    def ready_pools_left_idle(self) -> int:
        """Idle pools of the queue whose every node is Ready and that no Job of an earlier
        task still holds (``Decision.handable``) which this decision left idle while a task
        still waits in Waiting (0 when none waits): the waste the simulate report integrates
        over time (``ready_pool_idle_s``). It does not ask whether the waiting task may have
        the pool: a pool the rules keep from it (flex-start's run limit, the reservation
        hold) counts too."""
        d = self._d
        if not d.waiting_count():
            return 0
        hosts = tpu.lookup(d.queue.cluster.tpu_type, d.queue.topology).hosts
        return sum(1 for l in d.idle if l.id not in d.claimed and d.ready_nodes(l.name) >= hosts and d.handable(l))

    def messages(self) -> list[EffectGroup]:
        if self._messages is None:
            before = len(self._d.groups)
            positions.positions(self._d)  # 8
            self._messages = self._d.groups[before:]
        return self._messages


def plan(q: QueueState, view: ClusterView, now: dt.datetime, settings: Settings) -> Plan:
    """The rules 1-8 as one decision; rule 8 is computed when ``Plan.messages`` is asked."""
    d = Decision(q, view, now, settings)
    for t in d.aborting:  # 1
        finish.abort(d, t)
    deadline.expire(d)  # 1b
    for t in d.running:  # 2
        finish.execute(d, t)
    for t in d.recovering:  # 2b
        recover.recovering(d, t)
    pick.rerank(d)  # 3
    for t in d.acquiring:  # 4
        acquire.acquire(d, t)
    pick.pick(d)  # 5
    pools.leases(d)  # 6
    pools.stale_jobs(d)  # 7
    return Plan(d)


def decide(q: QueueState, view: ClusterView, now: dt.datetime, settings: Settings) -> list[EffectGroup]:
    """The rules 1-8: ``plan``'s groups followed by its Messages."""
    return plan(q, view, now, settings).decided()


__all__ = [
    "ClaimReservation",
    "CreateLease",
    "DeleteJob",
    "DeletePool",
    "Effect",
    "EffectGroup",
    "EnsurePool",
    "MarkReady",
    "MoveLease",
    "MoveTask",
    "RecordDisruption",
    "RecordOperation",
    "RefreshMessages",
    "SubmitJob",
    "Transition",
    "Unassign",
    "UpdateTask",
    "Plan",
    "decide",
    "plan",
]
