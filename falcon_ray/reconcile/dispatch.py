"""Rule 4, last step: a Dispatching task submits its Job and becomes Running.

Contract
--------
``dispatching(d, t)``: a Job refused for good fails the task (JobSubmitFailed); no
Job yet means submit it (a 409 adopts the existing one), moving the lease to InUse;
a Job whose every pod is ready makes the task Running; otherwise its Message counts
the ready pods.
"""

from __future__ import annotations

from falcon_ray import lifecycle as lc
from falcon_ray import render
from falcon_ray.lifecycle import LeaseState, Reason
from falcon_ray.model import Lease, QueueTask
from falcon_ray.reconcile.context import Decision
from falcon_ray.reconcile.effects import Effect, MoveLease, SubmitJob, Transition, UpdateTask


def _in_use(lease: Lease | None) -> list[Effect]:
    if lease is not None and lease.state == LeaseState.READY:
        return [MoveLease(lease.id, lease.name, (LeaseState.READY,), LeaseState.IN_USE)]
    return []


def submit(d: Decision, t: QueueTask, lease: Lease | None) -> None:
    pool = t.node_pool_name or (lease.name if lease else None)
    if pool is None:  # cannot happen through decide(); be safe: nothing to submit onto
        return
    q, s = d.q, d.s
    manifest = render.job_manifest(t.id, t.spec, q.cluster, pool, render.queue_label(q.cluster.name, q.topology), s.installation)
    service = render.headless_service(t.id, t.spec, q.cluster, s.installation) if t.spec.shape.multi_host else None
    d.add(f"task {t.id}: submit Job", *_in_use(lease), SubmitJob(t.id, manifest, service, first=t.dispatched_at is None))


def dispatching(d: Decision, t: QueueTask) -> None:
    job = d.job_of(t)
    err = d.q.submit_errors.get(t.id)
    if err is not None and job is None:
        d.finish(t, lc.failed(Reason.JOB_SUBMIT_FAILED), d.msg("job_submit_failed", detail=err.message))
        return
    lease = d.lease_by_task.get(t.id)
    if job is None:
        submit(d, t, lease)
        return
    d.add(f"task {t.id}: lease in use", *_in_use(lease))
    expected = t.spec.shape.hosts
    if job.ready >= expected:
        text = d.msg("running", active=job.ready, expected=expected)
        d.add(f"task {t.id}: running", Transition(t.id, (lc.DISPATCHING,), lc.RUNNING, text, {"job_uid": job.uid}))
        return
    text = d.msg("dispatching_pods", job=job.name, active=job.ready, expected=expected)
    if text != t.message:
        d.add(f"task {t.id}: dispatch message", UpdateTask(t.id, (lc.DISPATCHING,), text, {"job_uid": job.uid}))
