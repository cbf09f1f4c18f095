"""End-to-end placement by what a cluster can serve, and a ClusterBusy task moving to a
cluster that can start it now: real actors, the simulated fleet through the real clients
(the sim's reservations carry their machine type as Compute does), a real database."""

from __future__ import annotations

import time

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.devtools.demo import DemoRun
from tests.harness.e2e import assert_clean, make_fleet, phase_is, reasons, spec, wait_for

pytestmark = pytest.mark.timeout(180)


def wait_reservation_read(run: DemoRun, cluster: str, timeout: float = 30.0) -> str:
    """The ClusterActor reads the reservation right after it connects and writes what it holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = run.store.get_cluster(cluster).reservation_machine_type
        if held:
            return held
        time.sleep(0.1)
    raise AssertionError(f"{cluster}: the reservation's machine type was never recorded")


def test_a_shape_the_reservation_cannot_serve_runs_on_a_flex_start_cluster_of_its_type(controller):
    run = controller(make_fleet())  # edge-a: res-a of ct6e-standard-4t; edge-b: flex-start
    assert wait_reservation_read(run, "edge-a") == "ct6e-standard-4t"
    small = run.submit("alice", spec("1x1", 1), "one-chip")
    big = run.submit("bob", spec("2x2", 1), "four-chip")
    assert_clean(run, timeout=90)
    t = run.store.get_task(small)
    assert t.status == "Succeeded" and t.cluster_id == run.store.get_cluster("edge-b").id
    assert not any("NodePoolFailed" in r for r in reasons(run, small))
    assert run.store.get_task(big).status == "Succeeded"
    ledger = run.store.get_cluster("edge-a")
    assert ledger.reservation_count == 4 and ledger.reservation_in_use is not None  # what clusters list shows


def test_a_shape_no_cluster_can_serve_fails_at_intake_naming_what_each_offers(controller):
    run = controller(make_fleet(with_b=False))
    wait_reservation_read(run, "edge-a")
    tid = run.submit("alice", spec("1x1", 1), "one-chip")
    t = wait_for(run, tid, lambda t: t.terminal)
    assert (t.status, t.reason, t.cluster_id) == ("Failed", "NoCandidateCluster", None)
    assert "edge-a: reservation res-a holds ct6e-standard-4t (2x2, 2x4" in t.message, t.message
    assert reasons(run, tid) == ["Pending", "Failed/NoCandidateCluster"]
    assert_clean(run)


def test_a_cluster_busy_task_moves_to_a_second_reservation_cluster_with_headroom(controller):
    fleet = make_fleet(a={"reservation": {"name": "res-a", "count": 2}}, b={"reservation": {"name": "res-b", "count": 2}})
    run = controller(fleet)
    wait_reservation_read(run, "edge-a")
    wait_reservation_read(run, "edge-b")
    edge_a, edge_b = run.store.get_cluster("edge-a"), run.store.get_cluster("edge-b")
    run.store.set_cluster_status("edge-b", "maintenance")  # the first two tasks go to edge-a
    first = run.submit("alice", spec("2x4", 10), "holds-res-a")  # 2 hosts: all of res-a
    wait_for(run, first, phase_is(lc.RUNNING), timeout=60)
    second = run.submit("bob", spec("2x4", 1), "waits-for-res-a")
    t = wait_for(run, second, phase_is(lc.CLUSTER_BUSY), timeout=30)
    assert t.cluster_id == edge_a.id and "reservation res-a" in t.message
    run.store.set_cluster_status("edge-b", "active")  # res-b has room now: it moves there
    moved = wait_for(run, second, lambda t: t.cluster_id == edge_b.id, timeout=30)
    assert "Moved from edge-a" in moved.message or moved.phase != lc.WAITING
    done = wait_for(run, second, lambda t: t.terminal, timeout=60)
    assert done.status == "Succeeded" and done.cluster_id == edge_b.id
    assert run.store.get_task(first).phase == lc.RUNNING  # it did not wait for res-a to free up
    path = reasons(run, second)
    i = path.index("Pending/ClusterBusy")
    assert path[i + 1] == "Pending/Waiting" and "Succeeded" in path, path
    assert_clean(run, timeout=90)
