"""Rules 1 and 2: aborts, and tasks whose Job ended, failed or ran out of time.

Contract
--------
``abort(d, t)``: an Aborting task's Job is deleted, its pool goes through
keep-or-delete, then it is Aborted. ``execute(d, t)`` for a Dispatching or Running
task: Succeeded, JobFailed or Timeout end it (``finish``); otherwise a Running task's
Message follows its pods and a Dispatching one goes on to ``dispatch.dispatching``.
Ending a task is ``Decision.finish``: the terminal write comes before the Job delete.
"""

from __future__ import annotations

import datetime as dt

from falcon_ray import lifecycle as lc
from falcon_ray import limits, render
from falcon_ray.lifecycle import Reason
from falcon_ray.model import QueueTask
from falcon_ray.reconcile import dispatch
from falcon_ray.reconcile.context import Decision
from falcon_ray.reconcile.effects import Effect, Transition, UpdateTask


def abort(d: Decision, t: QueueTask) -> None:
    text = d.msg("aborting")
    if t.message != text:  # what an operator sees if the cleanup below has to be retried
        d.add(f"task {t.id}: aborting message", UpdateTask(t.id, (lc.ABORTING,), text))
    effects: list[Effect] = list(d.delete_job(t))
    lease = d.lease_by_task.get(t.id)
    if lease is not None:
        effects += d.release(lease, t.id)
    effects.append(Transition(t.id, (lc.ABORTING,), lc.ABORTED, d.msg("aborted")))
    d.add(f"task {t.id}: abort", *effects)


def timed_out(d: Decision, t: QueueTask) -> bool:
    """dispatched_at + the task's own timeout passed (``limits``: the wait for its pods, and its run)."""
    limit = limits.seconds(limits.Wait.PODS, d.settings, t.spec.timeout_seconds)
    return t.dispatched_at is not None and limit is not None and d.now >= t.dispatched_at + dt.timedelta(seconds=limit)


def ended(d: Decision, t: QueueTask) -> bool:
    """Rule 2 for a Dispatching or Running task: True when it was finished here."""
    if d.earlier_attempt_left(t) or d.fleet_ended(t):
        return True
    job, outcome = d.job_of(t), d.job_outcome(t)
    if outcome is not None:
        d.finish(t, *outcome)
    elif timed_out(d, t):
        d.finish(t, lc.failed(Reason.TIMEOUT), d.msg("timeout", seconds=t.spec.timeout_seconds))
    elif t.phase == lc.RUNNING and job is None and d.cluster.synced and t.id not in d.cluster.jobs:
        detail = f"Job {render.job_name(t.id, t.attempt)} disappeared from the cluster"
        d.finish(t, lc.failed(Reason.JOB_FAILED), d.msg("job_failed", detail=detail))
    else:
        return False
    return True


def execute(d: Decision, t: QueueTask) -> None:
    """Dispatching or Running: finish it (rule 2), or follow its pods (rule 4's last step)."""
    if ended(d, t):
        return
    if t.phase == lc.RUNNING:
        job = d.job_of(t)
        if job is not None:
            d.say(t, d.running_text(t, job.ready), "running message")
        return
    dispatch.dispatching(d, t)
