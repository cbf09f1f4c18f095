"""Placement by what a cluster can serve, and a ClusterBusy task moving to another cluster,
on SQLite with the fake port and clock: the poller's choice and message, the move's
compare-and-set, its event row and wake-ups, and that nothing is dispatched twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from actors.queue import QueueReconciler
from falcon_ray import lifecycle as lc
from falcon_ray.model import ClusterView, ReservationView
from falcon_ray.store.migrate import upgrade
from tests.harness.fakes import QueueBench

HOLDS_4T = "ct6e-standard-4t"
FULL = ReservationView(count=4, in_use=4, machine_type=HOLDS_4T)
ROOM = ReservationView(count=4, in_use=0, machine_type=HOLDS_4T)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "p.db"
    upgrade(f"sqlite:///{path}", with_jobs_table=True)
    return path


def make_bench(tmp_path, migrated, topology: str = "2x2") -> QueueBench:
    shutil.copy(migrated, tmp_path / "p.db")
    return QueueBench(f"sqlite:///{tmp_path / 'p.db'}", topology=topology, migrate=False, node_pool_timeout_s=600)


def test_a_shape_the_reservation_cannot_serve_is_placed_on_a_flex_start_cluster(tmp_path, migrated):
    b = make_bench(tmp_path, migrated, "1x1")
    edge_b = b.store.add_cluster("edge-b", "proj-b", "us-central1-b", "v6e", "logs-b", "")
    b.store.add_cluster("edge-c", "proj-c", "us-east5-b", "v6e", "logs-c", "res-c")  # not read yet
    assert b.store.record_reservation(b.cluster.id, HOLDS_4T, 4, 0, 0)
    b.store.record_reservation(b.store.get_cluster("edge-c").id, HOLDS_4T, 4, 0, 0)
    tid = b.submit(topology="1x1")
    t = b.task(tid)
    assert (str(t.phase), t.cluster_id) == ("Pending/Waiting", edge_b.id)
    assert ("hint", "edge-b", "1x1") in b.port.calls


def test_a_task_goes_where_it_can_begin_to_acquire_while_the_reservation_slice_of_its_topology_is_taken(tmp_path, migrated):
    """edge-a's reservation holds 6 VMs: one 4x4 slice (4 hosts) at a time. While a 4x4 task
    runs there, the next 4x4 task goes to the flex-start cluster although its queue is
    longer; once that run has ended, the next one takes the reservation again."""
    b = make_bench(tmp_path, migrated, "4x4")
    edge_b = b.store.add_cluster("edge-b", "proj-b", "us-central1-b", "v6e", "logs-b", "")
    assert b.store.record_reservation(b.cluster.id, HOLDS_4T, 6, 0, 0)
    first = b.submit()
    assert b.task(first).cluster_id == b.cluster.id  # both queues empty: by name
    b.submit(topology="2x2", supply_mode="flex-start")  # edge-b's queue is the longer one now
    assert b.store.transition(first, lc.WAITING, lc.DISPATCHING, "picked, an idle pool")
    assert b.store.transition(first, lc.DISPATCHING, lc.RUNNING, "running")
    second = b.submit()
    assert b.task(second).cluster_id == edge_b.id
    assert b.store.transition(first, lc.RUNNING, lc.SUCCEEDED, "done")
    third = b.submit()
    assert b.task(third).cluster_id == b.cluster.id


def test_no_cluster_that_can_serve_the_shape_fails_at_intake_naming_each_offer(tmp_path, migrated):
    b = make_bench(tmp_path, migrated, "1x1")
    b.store.record_reservation(b.cluster.id, HOLDS_4T, 4, 0, 0)
    b.store.add_cluster("edge-b", "proj-b", "us-central1-b", "v6e", "logs-b", "")
    tid = b.submit(topology="1x1", supply_mode="reservation")
    t = b.task(tid)
    assert str(t.phase) == "Failed/NoCandidateCluster" and t.cluster_id is None
    assert "1x1 slice (ct6e-standard-1t, supply: reservation)" in t.message
    assert "edge-a: reservation res-a holds ct6e-standard-4t (2x2, 2x4, 4x4" in t.message
    assert "edge-b: no reservation" in t.message


def test_the_ledger_is_written_only_when_a_figure_changes(tmp_path, migrated):
    b = make_bench(tmp_path, migrated)
    assert b.store.record_reservation(b.cluster.id, HOLDS_4T, 4, 1, 2)
    first = b.store.get_cluster("edge-a")
    b.clock.advance(5)
    assert not b.store.record_reservation(b.cluster.id, HOLDS_4T, 4, 1, 2)
    assert b.store.record_reservation(b.cluster.id, HOLDS_4T, 4, 2, 1)
    after = b.store.get_cluster("edge-a")
    assert (after.reservation_count, after.reservation_in_use, after.reservation_claimed) == (4, 2, 1)
    assert after.reservation_seen_at > first.reservation_seen_at and after.updated_at == first.updated_at


def test_a_cluster_busy_task_moves_once_to_a_cluster_with_headroom_and_starts_there(tmp_path, migrated):
    b = make_bench(tmp_path, migrated)
    edge_c = b.store.add_cluster("edge-c", "proj-c", "us-east5-b", "v6e", "logs-c", "res-c")
    b.store.add_cluster("edge-d", "proj-d", "us-east5-b", "v6e", "logs-d", "res-d")  # full too
    tid = b.submit()
    assert b.task(tid).cluster_id == b.cluster.id  # equal queues: by name
    b.port.cluster_views = {"edge-c": ClusterView(reservation=ROOM), "edge-d": ClusterView(reservation=FULL)}
    b.step(ClusterView(reservation=FULL))
    t = b.task(tid)
    assert (str(t.phase), t.cluster_id, t.node_pool_name) == ("Pending/Waiting", edge_c.id, None)
    assert "Moved from edge-a (reservation res-a busy) to edge-c" in t.message
    phases = [str(lc.phase_of(e.status, e.reason)) for e in b.store.events(tid)]
    assert phases[-2:] == ["Pending/ClusterBusy", "Pending/Waiting"]
    assert ("hint", "edge-c", "2x2") in b.port.calls and ("hint", "edge-a", "2x2") in b.port.calls
    assert not b.port.took("claim_reservation") and not b.store.leases(b.cluster.id)  # nothing left behind
    # the old queue, and a restarted one, no longer see it: no second dispatch from there
    b.step(ClusterView(reservation=ROOM))
    b.restart()
    b.step(ClusterView(reservation=ROOM))
    assert not b.port.took("ensure_pool") and b.task(tid).cluster_id == edge_c.id
    # edge-c's queue takes it and creates its pool through edge-c's ledger
    b.port.cluster_views = {}
    q = QueueReconciler("edge-c", "2x2", b.settings, b.store, b.port, clock=b.clock)
    b.port.set_view(ClusterView(reservation=ROOM))
    q.step()
    assert str(b.task(tid).phase) == "Pending/Provisioning"
    assert [c[0] for c in b.port.calls if c[0] in ("claim_reservation", "ensure_pool")] == ["claim_reservation", "ensure_pool"]
    assert [l.cluster_id for l in b.store.leases()] == [edge_c.id]


def busy_beside_a_queued_task(tmp_path, migrated, in_use_there: int):
    """edge-a's task ClusterBusy on a full reservation, bob's task queued on edge-c, whose
    reservation of 4 hosts has ``in_use_there`` in use: one step of edge-a's queue."""
    b = make_bench(tmp_path, migrated)
    edge_c = b.store.add_cluster("edge-c", "proj-c", "us-east5-b", "v6e", "logs-c", "res-c")
    first = b.submit()
    other = b.submit("bob")  # the poller puts it on edge-c (shorter queue)
    assert b.task(other).cluster_id == edge_c.id
    b.port.cluster_views = {"edge-c": ClusterView(reservation=ReservationView(count=4, in_use=in_use_there, machine_type=HOLDS_4T))}
    b.step(ClusterView(reservation=FULL))
    return b, edge_c, first, other


def test_a_cluster_busy_task_stays_while_the_other_reservation_has_room_only_for_the_task_queued_there(tmp_path, migrated):
    b, _, first, _ = busy_beside_a_queued_task(tmp_path, migrated, in_use_there=3)
    assert (str(b.task(first).phase), b.task(first).cluster_id) == ("Pending/ClusterBusy", b.cluster.id)


def test_a_cluster_busy_task_moves_behind_the_other_queue_when_its_reservation_has_room_for_both(tmp_path, migrated):
    b, edge_c, first, other = busy_beside_a_queued_task(tmp_path, migrated, in_use_there=2)
    t = b.task(first)
    assert (str(t.phase), t.cluster_id, t.node_pool_name) == ("Pending/Waiting", edge_c.id, None)
    assert t.message == (
        "Moved from edge-a (reservation res-a busy) to edge-c, whose reservation res-c has room now for it and the 1 task(s) "
        "of its queue there; queued behind them"
    )
    assert not b.port.took("claim_reservation") and not b.store.leases(b.cluster.id)
    # edge-c's queue takes the task that was there first, then the moved one
    b.port.cluster_views = {}
    q = QueueReconciler("edge-c", "2x2", b.settings, b.store, b.port, clock=b.clock)
    b.port.set_view(ClusterView(reservation=ReservationView(count=4, in_use=2, machine_type=HOLDS_4T)))
    q.step()
    assert str(b.task(other).phase) == "Pending/Provisioning" and str(b.task(first).phase) == "Pending/Waiting"


def test_a_move_is_a_compare_and_set_on_phase_and_cluster(tmp_path, migrated):
    b = make_bench(tmp_path, migrated)
    edge_c = b.store.add_cluster("edge-c", "proj-c", "us-east5-b", "v6e", "logs-c", "res-c")
    tid = b.submit()
    b.step(ClusterView(reservation=FULL))  # no other cluster answers with room: it waits
    assert str(b.task(tid).phase) == "Pending/ClusterBusy"
    assert not b.store.move_task(tid, edge_c.id, b.cluster.id, "wrong origin")
    assert b.store.move_task(tid, b.cluster.id, edge_c.id, "moved")
    assert not b.store.move_task(tid, b.cluster.id, edge_c.id, "moved again")  # a repeat loses
    tid2 = b.submit("bob")
    b.step(ClusterView(reservation=FULL))
    b.store.request_abort(tid2)
    assert not b.store.move_task(tid2, b.cluster.id, edge_c.id, "aborted meanwhile")
    assert str(b.task(tid2).phase) == "Aborting"
