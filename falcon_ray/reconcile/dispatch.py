"""Rule 4, last step: the slot holder submits its Job and becomes Running.

Contract
--------
``dispatching(d, t)``: a Job refused for good fails the task (JobSubmitFailed); no
Job yet means submit it (a 409 adopts the existing one), moving the lease to InUse;
a Job whose every pod is ready makes the task Running; a Job whose pool has fewer
nodes than the slice (an idle pool the autoscaler emptied) goes to WaitingForNode;
otherwise its Message counts the ready pods.

``start_on_empty_pool`` / ``waiting_for_pods``: a pool that scales from zero
(flex-start) gets its nodes only for the Job's pending Pods, so its Job is submitted
as soon as the control plane is RUNNING and the task waits in WaitingForNode, its
Message saying for how long, until every pod is ready (Running; the timeout clock
starts then). The pool is kept while it waits. Nodes that do not come are a capacity
wait (``capacity.nodes_not_delivered``): once ``capacity_budget_s`` is spent the Job and
pool are deleted and the task moves to another cluster or ends NodePoolFailed. A pool
that holds part of its nodes while another topology waits is given back
(``capacity.contested``, which ``acquire`` asks first).
"""

from __future__ import annotations

import dataclasses

from falcon_ray import lifecycle as lc
from falcon_ray import limits, render
from falcon_ray.lifecycle import LeaseState, Phase, Reason
from falcon_ray.limits import Wait
from falcon_ray.model import PERMANENT_SUBMIT_KINDS, JobView, Lease, PoolView, QueueTask
from falcon_ray.reconcile import capacity
from falcon_ray.reconcile.context import Decision, fmt_limit
from falcon_ray.reconcile.effects import Effect, MoveLease, SubmitJob, Transition, UpdateTask


def _in_use(lease: Lease | None) -> list[Effect]:
    if lease is not None and lease.state == LeaseState.READY:
        return [MoveLease(lease.id, lease.name, (LeaseState.READY,), LeaseState.IN_USE)]
    return []


def submit_effect(d: Decision, t: QueueTask, pool: str, phase: Phase = lc.DISPATCHING, message: str | None = None) -> SubmitJob:
    q, s = d.queue, d.settings
    manifest = render.job_manifest(t.id, t.spec, q.cluster, pool, render.queue_label(q.cluster.name, q.topology), s.installation, t.attempt)
    service = render.headless_service(t.id, t.spec, q.cluster, s.installation) if t.spec.shape.multi_host else None
    # on a pool with its nodes the timeout clock starts with the Job; on one that scales
    # from zero it starts when the nodes have come (WaitingForNode -> Running)
    first = t.dispatched_at is None and phase == lc.DISPATCHING
    # a Dispatching task's Message once its Job is accepted, written with the Job's uid (the
    # next round finds it already said, instead of writing it again)
    text = d.msg("dispatching_pods", job=render.job_name(t.id, t.attempt), active=0, expected=t.spec.shape.hosts) if phase == lc.DISPATCHING else message
    return SubmitJob(t.id, manifest, service, first=first, phase=phase, message=text)


def submit(d: Decision, t: QueueTask, lease: Lease | None) -> None:
    pool = t.node_pool_name or (lease.name if lease else None)
    if pool is None:  # cannot happen through decide(); be safe: nothing to submit onto
        return
    d.add(f"task {t.id}: submit Job", *_in_use(lease), submit_effect(d, t, pool, t.phase))


def node_text(d: Decision, t: QueueTask, pool_name: str, pool: PoolView | None, job: JobView | None) -> str:
    """The WaitingForNode Message: the nodes registered so far and how long it has waited."""
    hosts = t.spec.shape.hosts
    counts = dict(pool=pool_name, registered=pool.registered if pool else 0, expected=hosts, ready=pool.ready if pool else 0)
    if job is None:
        return d.msg("waiting_for_node", **counts)
    return d.msg("waiting_for_node_job", job=job.name, since=d.since(t), **counts)


def start_on_empty_pool(d: Decision, t: QueueTask, lease: Lease, st: LeaseState, pool: PoolView, effects: list[Effect]) -> None:
    """The control plane of a pool that scales from zero is RUNNING: submit the Job now."""
    # its create has finished (ready_at): the pool may be handed over once it goes Idle
    effects.append(MoveLease(lease.id, lease.name, (st,), LeaseState.IN_USE, {} if lease.ready_at else {"ready_at": d.now}))
    submit = submit_effect(d, t, lease.name, lc.WAITING_FOR_NODE)
    if t.phase != lc.WAITING_FOR_NODE:
        text = node_text(d, t, lease.name, pool, None)
        effects.append(Transition(t.id, (t.phase,), lc.WAITING_FOR_NODE, text, {"node_pool_name": lease.name}))
        submit = dataclasses.replace(submit, recorded=True)  # the move said it all; the uid goes with Running
    effects.append(submit)
    d.add(f"task {t.id}: Job onto empty pool {lease.name}", *effects)


def waiting_for_pods(d: Decision, t: QueueTask, lease: Lease) -> None:
    """WaitingForNode with the Job submitted: Running once every pod is ready."""
    job, outcome = d.job_of(t), d.job_outcome(t)
    if d.earlier_attempt_left(t) or d.fleet_ended(t):  # the fleet ended its run before every pod was ready
        return
    if outcome is not None:  # it ran and ended between two looks
        d.finish(t, *outcome)
    elif job is None and submit_refused(d, t):
        return
    elif job is None:
        d.add(f"task {t.id}: submit Job", submit_effect(d, t, lease.name, lc.WAITING_FOR_NODE))
    elif job.ready >= t.spec.shape.hosts:
        text = d.running_text(t, job.ready)
        fields = {"job_uid": job.uid, "dispatched_at": d.now}  # the timeout clock starts now
        d.add(f"task {t.id}: running", Transition(t.id, (lc.WAITING_FOR_NODE,), lc.RUNNING, text, fields))
    elif capacity.nodes_not_delivered(d, t, lease, d.cluster.pools.get(lease.name)):
        return
    else:
        d.say(t, node_text(d, t, lease.name, d.cluster.pools.get(lease.name), job), "waiting for nodes")


def submit_refused(d: Decision, t: QueueTask) -> bool:
    """No Job, and the Kubernetes API refused it for good or for longer than submit_budget_s
    (in Dispatching, since its first refusal):
    JobSubmitFailed (its pool is deleted, original failure table). A refusal for now is
    retried, and the Message says so and since when. True when the task was decided here."""
    err = d.queue.submit_errors.get(t.id)
    # counted from the first refusal: time in Dispatching before it (an earlier attempt's Job
    # still going away) was no refusal
    age = d.failing_s(t, None if err is None else err.since)
    if err is not None and err.kind in PERMANENT_SUBMIT_KINDS:
        detail = err.message
    elif err is not None and limits.passed(Wait.SUBMIT, d.settings, age):
        detail = f"no Job accepted within {fmt_limit(limits.seconds(Wait.SUBMIT, d.settings) or 0)}; last error: {err.message}"
    else:
        if err is not None:
            d.say(t, d.msg("submit_retrying", detail=err.message, since=d.since(t)), "submit retrying")
        return False
    d.finish(t, lc.failed(Reason.JOB_SUBMIT_FAILED), d.msg("job_submit_failed", detail=detail), keep_pool=False)
    return True


def dispatching(d: Decision, t: QueueTask) -> None:
    if d.earlier_attempt_left(t):
        return
    job = d.job_of(t)
    if job is None and submit_refused(d, t):
        return
    lease = d.lease_by_task.get(t.id)
    if job is None:
        submit(d, t, lease)
        return
    d.add(f"task {t.id}: lease in use", *_in_use(lease))
    expected = t.spec.shape.hosts
    pool_name = t.node_pool_name or (lease.name if lease else "")
    pool = d.cluster.pools.get(pool_name)
    if job.ready < expected and pool is not None and pool.registered < expected and lease is not None:
        text = node_text(d, t, pool_name, pool, job)
        d.add(f"task {t.id}: nodes scaled away", Transition(t.id, (lc.DISPATCHING,), lc.WAITING_FOR_NODE, text))
        return
    if job.ready >= expected:
        text = d.running_text(t, job.ready)
        d.add(f"task {t.id}: running", Transition(t.id, (lc.DISPATCHING,), lc.RUNNING, text, {"job_uid": job.uid}))
        return
    text = d.msg("dispatching_pods", job=job.name, active=job.ready, expected=expected)
    if text != t.message:
        d.add(f"task {t.id}: dispatch message", UpdateTask(t.id, (lc.DISPATCHING,), text, {"job_uid": job.uid}))
