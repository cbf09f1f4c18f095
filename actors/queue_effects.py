"""Carries out a queue's decided effects: the store's writes and the ClusterActor's calls.

Contract
--------
``EffectRunner.run(groups)`` carries out each ``reconcile.EffectGroup`` in order and stops
a group at its first effect that is lost (a compare-and-set another writer won), refused
(a reservation claim, a Job submit) or failed; it returns how many groups moved a task's
phase or a lease. Each effect's handler returns ``(carry on, moved)``. A lease move
and a task move next to each other in a group are one compare-and-set over both rows
(``paired``): both won or neither. Every write's
result (``store.WriteResult``) goes to the ``QueueMirror``, which applies the won ones to
the rows it keeps; a lost, refused or failed effect sets ``mirror.must_read`` so the next
round reads the database. Every effect is idempotent, so a group cut short by a crash is
decided again. A ``Fenced`` from the store ends the step when this queue's own epoch is
stale (its ClusterActor being fenced alone only ends the group).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from actors.port import Port
from actors.queue_mirror import QueueMirror
from falcon_ray import faults, metrics, reconcile, render
from falcon_ray import lifecycle as lc
from falcon_ray.clock import Clock
from falcon_ray.lifecycle import Status
from falcon_ray.model import PERMANENT_SUBMIT_KINDS, Disruption, ErrorKind, SubmitError, first_failure
from falcon_ray.reconcile import (
    ClaimReservation,
    CreateLease,
    DeleteJob,
    DeletePool,
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
from falcon_ray.store import Fenced, Store

log = logging.getLogger("falcon.queue")
Outcome = tuple[bool, bool]  # (carry on with the group, this effect moved a task or lease)


class EffectRunner:
    """The act part of one queue's loop: effects in, write results to the mirror."""

    def __init__(
        self, cluster_name: str, topology: str, store: Store, port: Port, mirror: QueueMirror, clock: Clock,
        cluster_id: Callable[[], str],
    ) -> None:
        self.cluster_name, self.topology = cluster_name, topology
        self.label = render.queue_label(cluster_name, topology)
        self.store, self.port, self.mirror, self.clock = store, port, mirror, clock
        self.cluster_id = cluster_id  # the queue's cluster id, as last observed
        self.on_running: Callable[[int], None] = lambda tid: None  # a task reached Running
        self.on_ended: Callable[[int], None] = lambda tid: None  # a Running task ended
        self.handlers: dict[type, Callable[[Any], Outcome]] = {
            Transition: self._transition, UpdateTask: self._update_task, RefreshMessages: self._refresh_messages,
            CreateLease: self._create_lease,
            RecordOperation: self._record_operation, MarkReady: self._mark_ready,
            ClaimReservation: self._claim_reservation, EnsurePool: self._ensure_pool, MoveLease: self._move_lease,
            DeletePool: self._delete_pool, SubmitJob: self._submit, DeleteJob: self._delete_job,
            RecordDisruption: self._record_disruption, Unassign: self._unassign, MoveTask: self._move,
        }

    def run(self, groups: list[reconcile.EffectGroup]) -> int:
        """Carry out each group in order; returns how many groups changed a task's phase or a lease."""
        progressed = 0
        for g in groups:
            try:
                progressed += self._run_group(g)
            except Fenced:
                self.store.check_fence()  # raises when this queue's own epoch is stale
                raise  # only its ClusterActor is fenced: the step ends, the next one decides again
            except Exception as e:
                self.mirror.must_read = self.mirror.leases_stale = True
                log.warning(
                    "queue %s: %s failed: %s: %s", self.label, g.what, type(e).__name__, e,
                    extra={"cluster": self.cluster_name, "topology": self.topology},
                )
        return progressed

    def _run_group(self, g: reconcile.EffectGroup) -> int:
        changed, i = False, 0
        while i < len(g.effects):
            e, pair = g.effects[i], paired(g.effects, i)
            if isinstance(e, DeleteJob):  # destructive: say which rule asked for it
                log.info("queue %s: %s: deleting Job %s", self.label, g.what, e.name)
            ok, moved = self._apply_pair(*pair) if pair else self.apply(e)
            changed = changed or moved
            if not ok:
                self.mirror.must_read = True  # lost, refused or not known: the next round reads
                log.info("queue %s: %s stopped at %s", self.label, g.what, type(e).__name__)
                break
            i += 2 if pair else 1
        return 1 if changed else 0

    def _apply_pair(self, lease_move: MoveLease, move: Transition) -> Outcome:
        """A lease move and a task move next to each other in a group: one compare-and-set
        over both rows (``Store.transition_with_lease``), both won or neither."""
        if self.mirror.refused_leases_kept():
            self.mirror.leases_stale = True
        self.mirror.writing(move.task_id)
        task, lease = self.store.transition_with_lease(
            move.task_id, move.expect, move.to, move.message,
            lease_move.lease_id, lease_move.expect, lease_move.to, lease_move.fields, **move.fields,
        )
        self.mirror.wrote_lease(lease_move.lease_id, lease)
        if lease.won:
            metrics.lease_moved(self.cluster_name, self.topology, lease_move.expect[0], lease_move.to)
        if task.won:
            self._transitioned(move, task.at)  # first: it reads the value the decision saw
            self.mirror.wrote_task(move.task_id, task, move.to)
        return task.won, task.won

    def apply(self, e: reconcile.Effect) -> Outcome:
        """Carry out one effect: ``(carry on with the group, this effect moved a task or lease)``."""
        handler = self.handlers.get(type(e))
        if handler is None:
            raise TypeError(f"unknown effect {e!r}")
        if self.mirror.refused_leases_kept():
            # the next round reads the leases again: a task whose refused leases (read while
            # it acquires) may drop out moves
            self.mirror.leases_stale = True
        task_id = getattr(e, "task_id", None)
        if task_id is not None:
            self.mirror.writing(task_id)
        return handler(e)

    # ---- task writes -----------------------------------------------------------------------

    def _transition(self, e: Transition) -> Outcome:
        result = self.store.transition(e.task_id, e.expect, e.to, e.message, **e.fields)
        if result.won:
            self._transitioned(e, result.at if result.moved else None)  # first: it reads the value the decision saw
            self.mirror.wrote_task(e.task_id, result, e.to)
        return result.won, result.won

    def _update_task(self, e: UpdateTask) -> Outcome:
        result = self.store.update_task(e.task_id, e.expect, e.message, **e.fields)
        if result.won:
            self.mirror.wrote_task(e.task_id, result)
        return result.won or not e.fields, False

    def _refresh_messages(self, e: RefreshMessages) -> Outcome:
        self.store.refresh_messages(e.updates)
        self.mirror.messages_written(e.updates)
        return True, False

    def _unassign(self, e: Unassign) -> Outcome:
        result = self.store.unassign(e.task_id, e.message, e.expect)
        if result.won:
            self.mirror.left(e.task_id)  # back to the poller: no longer this queue's
        return result.won, result.won

    def _record_disruption(self, e: RecordDisruption) -> Outcome:
        """Write the run the fleet ended (idempotent by task and attempt) and keep it."""
        first = self.store.record_disruption(e.task_id, e.attempt, e.kind, e.node, e.job, e.detail)
        self.mirror.disruption_written(e.task_id, Disruption(e.attempt, e.kind, e.node, e.job, e.detail, self.clock.now()))
        if first and faults.counted(e.kind):
            log.warning(
                "task %s: run %s disrupted by the fleet (%s, node %s): %s", e.task_id, e.attempt, e.kind, e.node or "?", e.detail,
                extra={"falcon_task_id": e.task_id, "cluster": self.cluster_name, "topology": self.topology},
            )
            metrics.disruption(self.cluster_name, e.kind)
        return True, False

    def _move(self, e: MoveTask) -> Outcome:
        """The compare-and-set that moves a ClusterBusy task to another cluster's queue, then
        both wake-ups. A crash after the write leaves a Waiting task there that its queue's
        periodic re-read finds; a lost write (aborted, moved meanwhile) changes nothing."""
        won = self.store.move_task(e.task_id, e.from_cluster_id, e.to_cluster_id, e.message, e.topology)
        if won:
            self.mirror.left(e.task_id)
            log.info(
                "task %s: %s -> %s/%s on %s: %s", e.task_id, lc.CLUSTER_BUSY, lc.WAITING, e.topology, e.to_cluster, e.message,
                extra={"falcon_task_id": e.task_id, "cluster": e.to_cluster, "topology": e.topology},
            )
            metrics.task_transition(e.to_cluster, e.topology, lc.WAITING)
            self.port.hint(e.to_cluster, e.topology)
            self.port.hint(self.cluster_name, self.topology, create=False)
        return won, won

    # ---- lease writes ----------------------------------------------------------------------

    def _create_lease(self, e: CreateLease) -> Outcome:
        lease = self.store.create_lease(self.cluster_id(), self.topology, e.name, e.supply_mode, e.task_id)
        self.mirror.created_lease(lease)
        metrics.pool_created(self.cluster_name, e.supply_mode)
        return True, True

    def _record_operation(self, e: RecordOperation) -> Outcome:
        self.mirror.wrote_lease(e.lease_id, self.store.touch_lease(e.lease_id, operation=e.operation))
        return True, False

    def _mark_ready(self, e: MarkReady) -> Outcome:
        self.mirror.wrote_lease(e.lease_id, self.store.touch_lease(e.lease_id, ready_at=self.clock.now()))
        return True, True

    def _move_lease(self, e: MoveLease) -> Outcome:
        result = self.store.move_lease(e.lease_id, e.expect, e.to, **e.fields)
        self.mirror.wrote_lease(e.lease_id, result)
        if result.won:
            metrics.lease_moved(self.cluster_name, self.topology, e.expect[0], e.to)
        return result.won, result.won

    # ---- the ClusterActor's calls ----------------------------------------------------------

    def _claim_reservation(self, e: ClaimReservation) -> Outcome:
        granted = self.port.claim_reservation(self.cluster_name, e.name, e.hosts)
        if not granted:
            log.info("queue %s: reservation claim for %s refused: another queue took it", self.label, e.name)
        return granted, False

    def _ensure_pool(self, e: EnsurePool) -> Outcome:
        self.port.ensure_pool(self.cluster_name, e.name, e.request, e.operation)
        return True, False

    def _delete_pool(self, e: DeletePool) -> Outcome:
        self.port.delete_pool(self.cluster_name, e.name)
        return True, False

    def _delete_job(self, e: DeleteJob) -> Outcome:
        self.port.delete_job(self.cluster_name, e.namespace, e.name)
        return True, False

    def _submit(self, e: SubmitJob) -> Outcome:
        """Submit the Job; an accepted one's uid (and, the first time, ``dispatched_at``) is
        written with the Message; a refusal is kept for the decision to read."""
        try:
            res = self.port.submit_job(self.cluster_name, e.manifest, e.service)
        except Exception as exc:  # the ClusterActor did not answer: a refusal for now, with a budget
            res = {"error_kind": ErrorKind.TRANSIENT.value, "error": f"{type(exc).__name__}: {exc}"[:500]}
        if "error_kind" in res:
            kind = ErrorKind(res["error_kind"])
            # the decision reads it: a refusal for good fails the task at once, another one is
            # retried until submit_budget_s has passed in Dispatching since the first refusal
            since = first_failure(self.mirror.submit_errors.get(e.task_id), self.clock.now())
            self.mirror.submit_errors[e.task_id] = SubmitError(kind, res["error"], since)
            log.info("queue %s: Job submit for task %s refused (%s): %s", self.label, e.task_id, kind, res["error"])
            if e.recorded and e.first:  # the move started the timeout clock: it starts with the Job
                self.mirror.wrote_task(e.task_id, self.store.update_task(e.task_id, (e.phase,), None, dispatched_at=None))
            return False, kind in PERMANENT_SUBMIT_KINDS
        self.mirror.submit_errors.pop(e.task_id, None)
        if e.recorded:  # its move wrote the Message (and dispatched_at); the uid goes with Running
            return True, True
        fields: dict[str, Any] = {"job_uid": res["uid"]}
        if e.first:
            fields["dispatched_at"] = self.clock.now()
        result = self.store.update_task(e.task_id, (e.phase,), e.message, **fields)
        self.mirror.wrote_task(e.task_id, result)  # a lost one (aborted meanwhile): the next round reads it
        return True, True

    # ---- a won move's log line, metrics and start sample ------------------------------------

    def _transitioned(self, e: Transition, at) -> None:
        """One log line and the metrics of a won transition; the trail of a picked task."""
        task = self.mirror.values.get(e.task_id)  # the value the decision saw (phase, actor, phase_since)
        log.info(
            "task %s: %s -> %s: %s", e.task_id, task.phase if task else "?", e.to, e.message,
            extra={
                "falcon_task_id": e.task_id, "cluster": self.cluster_name, "topology": self.topology,
                "actor": task.actor if task else "", "status": str(e.to.status), "reason": str(e.to.reason),
            },
        )
        metrics.task_transition(self.cluster_name, self.topology, e.to)
        if e.to == lc.RECOVERING:
            metrics.recovery(self.cluster_name, self.topology)
        if task is None:
            return
        now = self.clock.now()
        if task.phase.status == Status.PENDING and task.phase.reason and task.phase_since is not None:
            seconds = (now - task.phase_since).total_seconds()
            metrics.pending_reason_time(self.cluster_name, self.topology, str(task.phase.reason), seconds)
        at = at or now
        if task.phase == lc.WAITING and task.phase_since is not None:
            self.mirror.trails[task.id] = [(lc.WAITING, task.phase_since), (e.to, at)]
        elif task.id in self.mirror.trails:
            self.mirror.trails[task.id].append((e.to, at))
        if e.to == lc.RUNNING:
            metrics.time_to_running(self.cluster_name, self.topology, (now - task.created_at).total_seconds())
            self.on_running(task.id)  # the next observe puts its start into the history
        elif task.phase == lc.RUNNING and e.to.status in lc.TERMINAL:
            self.on_ended(task.id)


def paired(effects: tuple[reconcile.Effect, ...], i: int) -> tuple[MoveLease, Transition] | None:
    """The lease move and the task move at ``i`` and ``i + 1`` (in either order), when
    they can be one compare-and-set: the task's move leaves its phase and gives no cluster."""
    if i + 1 >= len(effects):
        return None
    a, b = effects[i], effects[i + 1]
    lease_move, move = (a, b) if isinstance(a, MoveLease) else (b, a)
    if not isinstance(lease_move, MoveLease) or not isinstance(move, Transition):
        return None
    if move.to in move.expect or "cluster_id" in move.fields:
        return None
    return lease_move, move


__all__ = ["EffectRunner", "paired"]
