"""Whose fault ended a run: the task's own, or the fleet's.

Contract
--------
``classify(evidence, pool, *, flex, pools_synced, job_message, hosts)`` is a pure function of
what the cluster reported about one Job's run (``model.RunEvidence``: its pods, the nodes
of its pool, the Job's Failed condition), the pool as GKE lists it, and the pool's supply.
It returns a ``Verdict``: ``Fault.TASK`` (the task's own failure: a non-zero exit code,
OOM, an image that cannot be pulled, bad arguments; the task ends ``Failed/JobFailed``)
or ``Fault.FLEET`` with a ``DisruptionKind``, the node concerned and a sentence for the
Message (the controller starts a recovery). The fleet's evidence wins: in a multi-host
slice one disrupted host makes its peers fail too, often with an exit code of their own,
so any sign of the fleet on any pod or node of the run makes the whole run the fleet's.

The signs, in the order they are read (Kubernetes "Pod disruption conditions", the Job
``podFailurePolicy`` of ``render.pod_failure_policy``, GKE "Manage GKE node disruption
for GPUs and TPUs"):

1. a pod with the ``DisruptionTarget`` condition (drained for maintenance, deleted with
   its node, evicted, preempted);
2. a pod bound to a node that is gone or NotReady;
3. the Job's Failed condition names the ``DisruptionTarget`` rule (the pod itself may be
   gone already: the pod garbage collector deletes pods of a deleted node);
4. the pool is gone or in ERROR / STOPPING, unless a pod shows the task's own failure
   (exit code, OOM, an image that cannot be pulled) on a node that is fine.

``degraded(job, pool, hosts)`` is the same question for a run that has not ended: a Job
short of ready pods while nodes of its pool are NotReady or gone.

``track_run(phase, ready, expected, before, now)`` keeps what the gateway remembers of a
run between two of its Job's events (``RunReadiness``): whether every pod was ready once,
and since when it has had fewer. A run that never had every pod ready has not faltered
(its pods are still starting); one that had, and is short again, has, from the first event
that showed it short until every pod is ready again. It also says what to read of the run
for ``classify`` / ``degraded``: the pods and nodes once when the Job failed, afresh at
each event while it is short, nothing otherwise (and what was read is forgotten once every
pod is ready again).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum

from falcon_ray.model import (
    ABANDONED,
    CONTROLLER_MOVES,
    RELEASED,
    SWITCHED,
    JobPhase,
    JobView,
    NodeState,
    PodEnd,
    PoolStatus,
    PoolView,
    RunEvidence,
)


class Fault(StrEnum):
    TASK = "task"
    FLEET = "fleet"


class DisruptionKind(StrEnum):
    MAINTENANCE = "maintenance"  # host maintenance: GKE drained the node(s)
    REPAIR = "repair"  # a node went NotReady or was recreated (auto-repair)
    RECLAIM = "reclaim"  # flex-start capacity taken back: the nodes were deleted
    PREEMPTED = "preempted"  # the scheduler preempted the pod for another
    EVICTED = "evicted"  # another disruption Kubernetes reports (eviction, taint manager)
    POOL_LOST = "pool-lost"  # the node pool was deleted or failed under the run
    # not a disruption: a recovery left its pool (gone, or its nodes not back in time) and its
    # attempt's Job name with it; the next attempt, on a new pool, takes the next name. Such a
    # row is not counted against max_recoveries (the disruption before it was).
    ABANDONED = ABANDONED
    # not disruptions either: the controller's own moves (``model.CONTROLLER_MOVES``)
    RELEASED = RELEASED
    SWITCHED = SWITCHED


def counted(kind: str) -> bool:
    """Does a disruption row of this kind use up one of the task's max_recoveries?"""
    return kind not in CONTROLLER_MOVES


@dataclass(frozen=True)
class Verdict:
    fault: Fault
    kind: DisruptionKind | None = None
    node: str = ""
    detail: str = ""

    @property
    def fleet(self) -> bool:
        return self.fault == Fault.FLEET


TASK = Verdict(Fault.TASK)
_POOL_DOWN = (PoolStatus.ERROR, PoolStatus.STOPPING)


def _node_kind(node: NodeState | None, *, flex: bool) -> DisruptionKind:
    if node is None:  # the node object is gone: capacity reclaimed, or the VM recreated
        return DisruptionKind.RECLAIM if flex else DisruptionKind.REPAIR
    if node.maintenance:
        return DisruptionKind.MAINTENANCE
    return DisruptionKind.REPAIR


def _disrupted_kind(pod: PodEnd, node: NodeState | None, *, flex: bool, nodes_listed: bool) -> DisruptionKind:
    text = pod.disruption.lower()
    if node is not None and node.maintenance or "maintenance" in text:
        return DisruptionKind.MAINTENANCE
    if text.startswith("preemptionbyscheduler"):
        return DisruptionKind.PREEMPTED
    if flex and text.startswith("terminationbykubelet"):  # a flex-start VM shut down: taken back
        return DisruptionKind.RECLAIM
    if nodes_listed and node is None or text.startswith("deletionbypodgc"):
        return DisruptionKind.RECLAIM if flex else DisruptionKind.REPAIR
    if node is not None and not node.ready or text.startswith("deletionbytaintmanager"):
        return DisruptionKind.REPAIR
    return DisruptionKind.EVICTED


def _own_failure(pod: PodEnd) -> bool:
    """The pod ended by its own doing: its container exited non-zero (OOM included) or
    could not start (an image that cannot be pulled, a bad command)."""
    return bool(pod.exit_code) or pod.reason in _START_FAILURES


_START_FAILURES = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError", "CreateContainerError", "RunContainerError", "OOMKilled"}
)


def classify(
    evidence: RunEvidence | None,
    pool: PoolView | None,
    *,
    flex: bool = False,
    pools_synced: bool = True,
    job_message: str = "",
    hosts: int = 1,
) -> Verdict:
    """The fault of a run that ended Failed (see the module's contract)."""
    ev = evidence or RunEvidence(nodes_listed=False)
    nodes = {n.name: n for n in ev.nodes}
    for pod in ev.pods:  # 1. the condition Kubernetes sets on a pod the fleet took
        if pod.disruption:
            node = nodes.get(pod.node)
            kind = _disrupted_kind(pod, node, flex=flex, nodes_listed=ev.nodes_listed)
            return Verdict(Fault.FLEET, kind, pod.node, f"pod {pod.name} on node {pod.node or '?'}: {pod.disruption}")
    if ev.nodes_listed:  # 2. a pod whose node is gone or not Ready
        for pod in ev.pods:
            if not pod.node:
                continue
            node = nodes.get(pod.node)
            if node is None or not node.ready:
                state = "gone" if node is None else "NotReady"
                kind = _node_kind(node, flex=flex)
                return Verdict(Fault.FLEET, kind, pod.node, f"pod {pod.name}: node {pod.node} {state}")
    condition = ev.condition or job_message
    if "DisruptionTarget" in condition:  # 3. the Job's own record of rule 0
        down = next((n for n in ev.nodes if n.maintenance), None) or next((n for n in ev.nodes if not n.ready), None)
        if down is not None:
            kind = _node_kind(down, flex=flex)
        elif ev.nodes_listed and len(ev.nodes) < max(1, hosts):  # nodes of the slice are gone
            kind = DisruptionKind.RECLAIM if flex else DisruptionKind.REPAIR
        else:
            kind = DisruptionKind.EVICTED
        return Verdict(Fault.FLEET, kind, down.name if down else "", condition)
    if any(_own_failure(p) for p in ev.pods):  # the task's failure on nodes that are fine
        return TASK
    if pools_synced and pool is None:  # 4. the pool under the run
        return Verdict(Fault.FLEET, DisruptionKind.POOL_LOST, "", "its node pool is gone")
    if pool is not None and pool.status in _POOL_DOWN:
        detail = f"its node pool is {pool.status}" + (f": {pool.status_message}" if pool.status_message else "")
        return Verdict(Fault.FLEET, DisruptionKind.POOL_LOST, "", detail)
    return TASK


def degraded(job: JobView, pool: PoolView | None, hosts: int, *, flex: bool = False, pools_synced: bool = True) -> Verdict:
    """A Job that has not ended but is short of ready pods: the fleet's when nodes of its
    pool are NotReady or gone (or the pool itself is); otherwise nothing is concluded."""
    if job.ready >= hosts:
        return TASK
    ev = job.evidence
    if ev is not None:
        nodes = {n.name: n for n in ev.nodes}
        for pod in ev.pods:
            if pod.disruption or (ev.nodes_listed and pod.node and (pod.node not in nodes or not nodes[pod.node].ready)):
                return classify(RunEvidence(pods=(pod,), nodes=ev.nodes, nodes_listed=ev.nodes_listed), pool, flex=flex, pools_synced=pools_synced)
    if pools_synced and pool is None:
        return Verdict(Fault.FLEET, DisruptionKind.POOL_LOST, "", "its node pool is gone")
    if pool is not None and (pool.status in _POOL_DOWN or pool.ready < hosts):
        kind = DisruptionKind.RECLAIM if flex and pool.registered < hosts else DisruptionKind.REPAIR
        if pool.status in _POOL_DOWN:
            kind = DisruptionKind.POOL_LOST
        return Verdict(Fault.FLEET, kind, "", f"node pool {pool.name}: {pool.ready}/{hosts} node(s) Ready, {pool.registered} registered")
    return TASK


@dataclass(frozen=True)
class RunReadiness:
    """What is remembered of a run between its Job's events."""

    once_fully_ready: bool = False  # every pod was ready at some event
    short_since: dt.datetime | None = None  # since when it has had fewer ready pods than that


class EvidenceRead(StrEnum):
    NONE = "none"  # nothing to read: the run has not failed nor faltered
    ONCE = "once"  # the run failed: read its pods and nodes once, reuse that reading
    FRESH = "fresh"  # the run falters: read them again at this event


@dataclass(frozen=True)
class RunStep:
    readiness: RunReadiness
    evidence: EvidenceRead
    forget_evidence: bool = False  # every pod is ready again: drop what was read


def track_run(phase: JobPhase, ready: int, expected: int, before: RunReadiness, now: dt.datetime) -> RunStep:
    """What one Job event changes in the run's readiness, and what to read of the run (the
    module's contract)."""
    if phase == JobPhase.FAILED:
        return RunStep(before, EvidenceRead.ONCE)
    if phase == JobPhase.DELETED:
        return RunStep(before, EvidenceRead.NONE)
    if ready >= expected:
        return RunStep(RunReadiness(once_fully_ready=True), EvidenceRead.NONE, forget_evidence=True)
    if before.once_fully_ready:
        return RunStep(RunReadiness(True, before.short_since or now), EvidenceRead.FRESH)
    return RunStep(before, EvidenceRead.NONE)
