"""Rule 2b: a task recovering from a disruption gets its next attempt.

Contract
--------
A task enters Recovering when the fleet (not the task) ended its run
(``Decision.disrupt``: the disruption recorded, the Job deleted); it keeps its pool
(lease InUse) and does not hold the queue's acquisition slot. ``recovering(d, t)``
moves it on, one step per call:

- a Job of the disrupted run is still there: it is deleted again and waited for (the
  next attempt's Job is created only once it is gone, so two attempts never run at once);
- no Job of this attempt: when its pool is there and up, the attempt's Job (its own name,
  ``render.job_name(task, attempt)``) is submitted onto it; its pods wait for the nodes
  to come back (maintenance ends, a repaired VM registers again, the autoscaler finds
  flex-start capacity again). When the pool is gone, in ERROR, or its nodes did not come
  back within ``recovery_pool_wait_s``, the pool goes to keep-or-delete's delete and the
  task goes back to Waiting, where the pick rule takes it ahead of every task that has not
  run (``QueueTask.priority``) and the normal acquisition finds it a new pool (ledger,
  capacity waits and budgets included); the attempt it leaves is recorded as
  ``abandoned`` (not counted against max_recoveries), so the new pool's Job has a name no
  Job of the old pool ever had;
- the attempt's Job: every pod ready makes it Running (its timeout clock starts again);
  it completing makes it Succeeded; it failing is classified again (``Decision.fleet_ended``:
  another disruption, or the task's own failure, JobFailed);
- a Job the Kubernetes API refuses for good, or for longer than ``submit_budget_s``,
  fails it (JobSubmitFailed), as a first submission would.
"""

from __future__ import annotations

from falcon_ray import faults, limits, render
from falcon_ray import lifecycle as lc
from falcon_ray.limits import Wait
from falcon_ray.model import Disruption, Lease, PoolStatus, PoolView, QueueTask
from falcon_ray.reconcile import dispatch
from falcon_ray.reconcile.context import Decision, fmt_limit
from falcon_ray.reconcile.effects import Effect, RecordDisruption, Transition

_POOL_DOWN = (PoolStatus.ERROR, PoolStatus.STOPPING)


def needs_new_pool(d: Decision, t: QueueTask, lease: Lease | None, pool: PoolView | None, head: str) -> bool:
    """The pool is gone, in ERROR, or its nodes did not come back in time: delete it and go
    back to Waiting, ahead of the queue, for a new one. True when decided here."""
    left = _abandoned_before(t)
    gone = lease is None or pool is None or pool.status in _POOL_DOWN
    if left is None and not gone and not limits.passed(Wait.RECOVERY, d.settings, d.phase_age_s(t)):
        return False
    if left is not None:
        # the abandonment is recorded and its move back to Waiting was not made (a crash,
        # a lost compare-and-set): finish it; a second row would burn another Job name
        why, record = left.detail, []
    else:
        name = lease.name if lease is not None else (t.node_pool_name or "?")
        why = (
            d.msg("pool_gone", pool=name)
            if gone
            else d.msg("pool_not_back", pool=name, limit=fmt_limit(limits.seconds(Wait.RECOVERY, d.settings) or 0))
        )
        # this attempt's name stays with the pool it leaves (its Job may exist there, or be
        # about to: a submit whose answer was lost): the next attempt, on a new pool, takes
        # the next one
        job = render.job_name(t.id, t.attempt)
        record = [RecordDisruption(t.id, t.attempt, faults.DisruptionKind.ABANDONED.value, "", job, why)]
    effects: list[Effect] = [*record, *d.delete_job(t)]
    if lease is not None:
        effects += d.delete_lease(lease, t.id)
    text = d.msg("recovering_new_pool", attempt=head, why=why)
    back = Transition(t.id, (lc.RECOVERING,), lc.WAITING, text, {"node_pool_name": None, "job_uid": None})
    # the Job and the lease go first: a Waiting task must hold neither (its acquisition would
    # take a held lease for its new pool); a crash before the move is decided here again
    d.add(f"task {t.id}: recovery needs a new pool", *effects, back)
    return True


def _abandoned_before(t: QueueTask) -> Disruption | None:
    """The abandonment already recorded for this recovery, if any. A recovering task's
    latest row is the disruption that made it recover; an ``abandoned`` row there means a
    step recorded the abandonment and its move back to Waiting is still to be made."""
    last = t.disruptions[-1] if t.disruptions else None
    return last if last is not None and last.kind == faults.DisruptionKind.ABANDONED.value else None


def recovering(d: Decision, t: QueueTask) -> None:
    head = d.attempt_text(t)
    if d.earlier_attempt_left(t):
        job = d.job_of(t)
        assert job is not None
        d.say(t, d.msg("recovering_job_gone", attempt=head, job=job.name, since=d.since(t)), "waiting for the old Job")
        return
    if d.fleet_ended(t):
        return
    outcome = d.job_outcome(t)
    if outcome is not None:
        d.finish(t, *outcome)
        return
    if not d.cluster.synced:  # right after a restart an absent Job or pool proves nothing
        return
    lease = d.lease_by_task.get(t.id)
    pool = d.cluster.pools.get(lease.name) if lease is not None else None
    job = d.job_of(t)
    if needs_new_pool(d, t, lease, pool, head):
        return
    assert lease is not None and pool is not None
    hosts = t.spec.shape.hosts
    if job is None:
        if dispatch.submit_refused(d, t):
            return
        text = d.msg("recovering_submit", attempt=head, job=render.job_name(t.id, t.attempt), pool=lease.name)
        d.add(f"task {t.id}: attempt {t.attempt} Job", dispatch.submit_effect(d, t, lease.name, lc.RECOVERING, text))
        return
    if job.ready >= hosts:
        fields = {"job_uid": job.uid, "dispatched_at": d.now}  # this attempt's timeout clock starts now
        d.add(f"task {t.id}: attempt {t.attempt} running", Transition(t.id, (lc.RECOVERING,), lc.RUNNING, d.running_text(t, job.ready), fields))
        return
    limit = fmt_limit(limits.seconds(Wait.RECOVERY, d.settings) or 0)
    text = d.msg(
        "recovering_nodes", attempt=head, job=job.name, pool=lease.name, ready=pool.ready, active=job.ready,
        expected=hosts, since=d.since(t), limit=limit,
    )
    d.say(t, text, "waiting for the nodes")
