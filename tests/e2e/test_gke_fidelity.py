"""Where GKE decides the outcome, on the faithful sim (docs/sim.md, "Sources"): flex-start
pools that scale from zero only for pending Pods, regional clusters, zonal reservations.

Each scenario runs the whole path: real Ray actors, the real clients over HTTP, SQLite.
"""

from __future__ import annotations

import time

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.sim.fleet import FleetConfig
from tests.harness.e2e import FAST, assert_clean, make_fleet, phase_is, spec, wait_for

pytestmark = pytest.mark.timeout(240)

REGIONAL = {
    "name": "edge-r",
    "project": "proj-r",
    "location": "us-central1",
    "node_locations": ["us-central1-a", "us-central1-c"],
    "tpu_type": "v6e",
    "gcs_bucket": "logs-r",
    "reservation": {"name": "res-r", "count": 4, "zone": "us-central1-c"},
    "chips": 32,
    "timings": dict(FAST),
}


def phases(run, tid: int) -> list[str]:
    return [str(lc.phase_of(e.status, e.reason)) for e in run.store.events(tid)]


def pool_of(run, cluster: str, tid: int) -> dict:
    (p,) = [p for p in run.sim.stats()["clusters"][cluster]["node_pools"] if p["name"].startswith(f"falcon-t{tid}-")]
    return p


def job_of(run, cluster: str, tid: int) -> dict:
    (j,) = [j for j in run.sim.stats()["clusters"][cluster]["jobs"] if j["name"] == f"falcon-task-{tid}"]
    return j


def test_flex_start_tasks_submit_their_job_before_the_nodes_and_succeed(controller):
    """GKE adds a flex-start pool's nodes only for pending Pods that select it: the Job comes first."""
    run = controller(make_fleet(a={"status": "offline"}))  # only edge-b (flex-start, 32 chips) serves v6e
    single = run.submit("alice", spec("2x2", 3), "flex-single-host")
    multi = run.submit("bob", spec("4x4", 3), "flex-multi-host")
    assert_clean(run, timeout=120)
    for tid, hosts in ((single, 1), (multi, 4)):
        assert run.store.get_task(tid).status == "Succeeded", run.store.get_task(tid)
        pool, job = pool_of(run, "edge-b", tid), job_of(run, "edge-b", tid)
        assert pool["request"].get("initialNodeCount", 0) == 0 and pool["request"]["config"]["flexStart"] is True
        assert pool["first_node_at"] is not None and job["first_created_at"] < pool["first_node_at"]
        seen = phases(run, tid)
        # a run that ends before its queue's next look goes WaitingForNode -> Succeeded (a legal
        # transition): the nodes' wait must come before whichever of the two the queue saw
        ran = next(p for p in seen if p in ("Running", "Succeeded"))
        assert "Pending/WaitingForNode" in seen and seen.index("Pending/WaitingForNode") < seen.index(ran), seen
        assert seen.index("Pending/Provisioning") < seen.index("Pending/WaitingForNode")
        assert len(pool["nodes"]) == hosts  # a multi-host slice came whole


def test_flex_start_keeps_waiting_past_the_node_pool_timeout_and_says_how_long_until_aborted(controller):
    """No capacity yet and no other topology waiting: keep the pool and wait; the abort ends it."""
    run = controller(
        make_fleet(a={"status": "offline"}, b={"timings": {"flex_capacity_wait": 60}}),
        node_pool_timeout_s=2,
    )
    tid = run.submit("alice", spec("2x2", 1), "flex-waits")
    t = wait_for(run, tid, phase_is(lc.WAITING_FOR_NODE), timeout=60)
    time.sleep(4)  # twice the node-pool timeout
    t = run.store.get_task(tid)
    assert t.phase == lc.WAITING_FOR_NODE, t
    assert "0/1 expected node(s) registered" in t.message and "(waiting since " in t.message, t.message
    assert job_of(run, "edge-b", tid)["creates"] == 1
    run.store.request_abort(tid)
    t = wait_for(run, tid, lambda t: t.terminal, timeout=60)
    assert t.status == "Aborted"
    assert_clean(run, timeout=60)


def test_regional_cluster_runs_reservation_and_flex_start_tasks_in_one_zone_each(controller):
    run = controller(FleetConfig(seed=5, clusters=[REGIONAL]))
    reserved = run.submit("alice", spec("2x2", 1), "reservation-on-regional")
    flex = run.submit("bob", spec("2x4", 1, supply_mode="flex-start"), "flex-on-regional")
    assert_clean(run, timeout=120)
    assert run.store.get_task(reserved).status == "Succeeded", run.store.get_task(reserved)
    assert run.store.get_task(flex).status == "Succeeded", run.store.get_task(flex)
    pool = pool_of(run, "edge-r", reserved)
    assert pool["request"]["locations"] == ["us-central1-c"]  # the reservation's zone
    affinity = pool["request"]["config"]["reservationAffinity"]
    assert affinity["consumeReservationType"] in ("SPECIFIC_RESERVATION", 3) and affinity["values"] == ["res-r"]
    assert pool_of(run, "edge-r", flex)["request"]["locations"] == ["us-central1-a"]  # the first node zone


def test_a_reservation_in_no_zone_of_the_cluster_fails_naming_the_zones_tried(controller):
    misplaced = {**REGIONAL, "reservation": {"name": "res-r", "count": 4, "zone": "us-central1-c"}}
    run = controller(FleetConfig(seed=5, clusters=[{**misplaced, "node_locations": ["us-central1-a", "us-central1-b"]}]))
    tid = run.submit("alice", spec("2x2", 1), "reservation-elsewhere")
    t = wait_for(run, tid, lambda t: t.terminal, timeout=60)
    assert (t.status, t.reason) == ("Failed", "NodePoolFailed"), t
    assert "us-central1-a, us-central1-b" in t.message and "res-r" in t.message
    assert_clean(run)


def test_two_topologies_share_a_small_reservation_through_the_ledger(controller):
    """A 2-host reservation, a 1-host and a 2-host task at once: the second waits in
    ClusterBusy until the first's pool is gone; nobody fails for capacity Falcon over-committed."""
    run = controller(make_fleet(a={"reservation": {"name": "res-a", "count": 2}}, with_b=False))
    small = run.submit("alice", spec("2x2", 10), "small")  # long enough to overlap the other's claim on a loaded machine
    large = run.submit("bob", spec("2x4", 1), "large")
    assert_clean(run, timeout=120)
    for tid in (small, large):
        assert run.store.get_task(tid).status == "Succeeded", run.store.get_task(tid)
    seen = phases(run, small) + phases(run, large)
    assert "Pending/ClusterBusy" in seen, [(e.task_id, lc.phase_of(e.status, e.reason), f"{e.at:%H:%M:%S.%f}", e.message) for t in (small, large) for e in run.store.events(t)]
    assert not any("NodePoolFailed" in p for p in seen)
