"""Whose fault ended a run: table-driven, pod / Job / node / pool state in, fault out."""

from __future__ import annotations

import pytest

from falcon_ray.faults import DisruptionKind, Fault, classify, degraded
from falcon_ray.model import JobView, NodeState, PodEnd, PoolView, RunEvidence

POOL = PoolView("falcon-t1-2x4", "RUNNING", 2, 2)
READY = (NodeState("n-0", True), NodeState("n-1", True))
RULE0 = "PodFailurePolicy: Pod falcon-jobs/p-0 has condition DisruptionTarget matching FailJob rule at index 0"
RULE1 = "PodFailurePolicy: Container task for pod falcon-jobs/p-0 failed with exit code 3 matching FailJob rule at index 1"


def pod(name="p-0", node="n-0", disruption="", code=None, reason=""):
    return PodEnd(name, node, "Failed", disruption, code, reason)


M = DisruptionKind
CASES = [
    # (what, evidence, pool, flex, fault, kind)
    ("exit code 3 on Ready nodes", RunEvidence((pod(code=3, reason="Error"),), READY, RULE1), POOL, False, Fault.TASK, None),
    ("OOM on Ready nodes", RunEvidence((pod(code=137, reason="OOMKilled"),), READY), POOL, False, Fault.TASK, None),
    ("image cannot be pulled", RunEvidence((pod(reason="ImagePullBackOff"),), READY), POOL, False, Fault.TASK, None),
    ("drained for maintenance", RunEvidence((pod(disruption="TerminationByKubelet: maintenance", code=143),), (NodeState("n-0", False, True, True), READY[1]), RULE0), POOL, False, Fault.FLEET, M.MAINTENANCE),
    ("node noticed for maintenance, pod evicted", RunEvidence((pod(disruption="EvictionByEvictionAPI: Eviction API: evicting"),), (NodeState("n-0", True, True),)), POOL, False, Fault.FLEET, M.MAINTENANCE),
    ("node deleted by repair (pod GC)", RunEvidence((pod(disruption="DeletionByPodGC: PodGC: node no longer exists"),), (READY[1],)), POOL, False, Fault.FLEET, M.REPAIR),
    ("flex-start nodes reclaimed", RunEvidence((pod(disruption="DeletionByPodGC: PodGC: node no longer exists"),), ()), POOL, True, Fault.FLEET, M.RECLAIM),
    ("taint manager evicted from a NotReady node", RunEvidence((pod(disruption="DeletionByTaintManager: Taint manager: deleting"),), (NodeState("n-0", False), READY[1])), POOL, False, Fault.FLEET, M.REPAIR),
    ("preempted by the scheduler", RunEvidence((pod(disruption="PreemptionByScheduler: preempted"),), READY), POOL, False, Fault.FLEET, M.PREEMPTED),
    # a multi-host slice: one host disrupted, its peer failed with an exit code of its own
    ("slice: peer's exit code after a host was drained", RunEvidence((pod("p-1", "n-1", code=1, reason="Error"), pod(disruption="TerminationByKubelet: maintenance")), (NodeState("n-0", False, True), READY[1]), RULE1), POOL, False, Fault.FLEET, M.MAINTENANCE),
    ("exit code on a node that went NotReady", RunEvidence((pod(code=1, reason="Error"),), (NodeState("n-0", False), READY[1])), POOL, False, Fault.FLEET, M.REPAIR),
    ("pod gone, the Job names rule 0", RunEvidence((), READY, RULE0), POOL, False, Fault.FLEET, M.EVICTED),
    ("pods and nodes deleted by repair, rule 0", RunEvidence((), (), RULE0), POOL, False, Fault.FLEET, M.REPAIR),
    ("flex VM shut down, node still listed", RunEvidence((pod(disruption="TerminationByKubelet: Pod was terminated in response to imminent node shutdown."),), READY), POOL, True, Fault.FLEET, M.RECLAIM),
    ("pod gone, rule 0, flex pool emptied", RunEvidence((), (), RULE0), POOL, True, Fault.FLEET, M.RECLAIM),
    ("pool deleted, nothing else known", None, None, False, Fault.FLEET, M.POOL_LOST),
    ("pool in ERROR", RunEvidence((), READY), PoolView("falcon-t1-2x4", "ERROR", 0, 0, "TPU unavailable"), False, Fault.FLEET, M.POOL_LOST),
    ("exit code while the pool is gone", RunEvidence((pod(code=2, reason="Error"),), READY), None, False, Fault.TASK, None),
    ("node list unreadable: an absent node proves nothing", RunEvidence((pod(code=1, reason="Error"),), (), nodes_listed=False), POOL, False, Fault.TASK, None),
]


@pytest.mark.parametrize(("what", "evidence", "pool", "flex", "fault", "kind"), CASES, ids=[c[0] for c in CASES])
def test_classify(what, evidence, pool, flex, fault, kind):
    v = classify(evidence, pool, flex=flex)
    assert (v.fault, v.kind) == (fault, kind), (what, v)
    if v.fleet:
        assert v.detail


def test_an_absent_pool_proves_nothing_before_the_view_is_synced():
    assert classify(None, None, pools_synced=False).fault == Fault.TASK


def job(ready: int, evidence: RunEvidence | None = None) -> JobView:
    return JobView(1, "falcon-task-1", "ns", "u", "Running" if ready == 2 else "Pending", ready, ready, 2, "", "falcon-t1-2x4", 0, evidence)


DEGRADED = [
    ("all pods ready", job(2), POOL, Fault.TASK, None),
    ("short of ready pods, nodes fine", job(1), POOL, Fault.TASK, None),
    ("short, a node NotReady", job(1), PoolView("falcon-t1-2x4", "RUNNING", 2, 1), Fault.FLEET, M.REPAIR),
    ("short, a node gone (flex)", job(1), PoolView("falcon-t1-2x4", "RUNNING", 1, 1), Fault.FLEET, M.RECLAIM),
    ("short, pod on a NotReady node", job(1, RunEvidence((PodEnd("p-0", "n-0", "Running"),), (NodeState("n-0", False), READY[1]))), POOL, Fault.FLEET, M.REPAIR),
    ("short, pool gone", job(1), None, Fault.FLEET, M.POOL_LOST),
]


@pytest.mark.parametrize(("what", "jv", "pool", "fault", "kind"), DEGRADED, ids=[c[0] for c in DEGRADED])
def test_degraded(what, jv, pool, fault, kind):
    v = degraded(jv, pool, 2, flex=what.endswith("(flex)"))
    assert (v.fault, v.kind) == (fault, kind), (what, v)
