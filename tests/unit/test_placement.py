"""Placement by what a cluster can serve, and moving a ClusterBusy task: the pure functions
(``scheduling.offer``, ``place``, ``move_target``) and the queue decisions built on them."""

from __future__ import annotations

import datetime as dt

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.config import Settings
from falcon_ray.lifecycle import Reason
from falcon_ray.model import Cluster, ClusterView, Destination, Lease, QueueState, QueueTask, ReservationView
from falcon_ray.reconcile import ClaimReservation, CreateLease, MoveTask, Transition, Unassign, decide
from falcon_ray.scheduling import FleetLoad, Unfit
from falcon_ray.spec import SupplyMode, parse_spec

NOW = dt.datetime(2026, 11, 30, 12, 0, 0)
S = Settings(node_pool_timeout_s=600, create_visibility_grace_s=120)
FLEX, RES = SupplyMode.FLEX_START, SupplyMode.RESERVATION


def cluster(
    name: str, reservation: str = "", holds: str = "", status: str = "active", tpu_type: str = "v6e", count: int | None = None
) -> Cluster:
    return Cluster(
        f"id-{name}", name, "proj", "us-east5-b", tpu_type, "logs", reservation, status, "falcon-jobs", "falcon-job", NOW, NOW,
        reservation_machine_type=holds, reservation_count=count,
    )  # fmt: skip


def spec(topology: str = "2x2", **kw):
    return parse_spec({"tpu_type": "v6e", "topology": topology, "image": "img:1", "command": ["run"], **kw})


EDGE_A = cluster("edge-a", "res-a", holds="ct6e-standard-4t")  # serves 2x2, 2x4, ... not 1x1
EDGE_B = cluster("edge-b")  # flex-start by default
EDGE_C = cluster("edge-c", "res-c", holds="ct6e-standard-4t")


# ---- offer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("c", "task", "mode", "unfit"),
    [
        (EDGE_A, spec("2x4"), RES, None),
        (EDGE_A, spec("1x1"), RES, Unfit.MACHINE_TYPE),  # ct6e-standard-1t is not what res-a holds
        (EDGE_A, spec("1x1", supply_mode="flex-start"), FLEX, None),  # the task's own mode: no reservation used
        (EDGE_B, spec("1x1"), FLEX, None),
        (EDGE_B, spec("2x2", supply_mode="reservation"), RES, Unfit.NO_RESERVATION),
        (cluster("edge-n", "res-n"), spec("1x1"), RES, None),  # reservation not read yet: taken to serve
        (cluster("edge-r", "res-r", "ct6e-standard-4t", count=8), spec("8x8"), RES, Unfit.RESERVATION_SIZE),  # 16 hosts > 8 VMs
        (cluster("edge-r", "res-r", "ct6e-standard-4t", count=16), spec("8x8"), RES, None),  # fits when all of it is free
        (cluster("edge-r", "res-r", "ct6e-standard-4t", count=8), spec("8x8", supply_mode="flex-start"), FLEX, None),
    ],
)
def test_offer_is_the_supply_the_task_gets_there_and_whether_it_serves_the_shape(c, task, mode, unfit):
    o = scheduling.offer(task, c)
    assert (o.mode, o.unfit) == (mode, unfit)


def test_a_reservation_offer_names_the_topologies_its_machine_type_serves():
    o = scheduling.offer(spec("1x1"), EDGE_A)
    assert o.machine_type == "ct6e-standard-4t" and o.reservation == "res-a"
    assert "1x1" not in o.topologies and {"2x2", "2x4", "16x16"} <= set(o.topologies)
    assert scheduling.reservation_topologies("v6e", "ct6e-standard-1t") == ("1x1",)


def test_a_fresher_machine_type_reading_overrides_the_cluster_row():
    assert scheduling.offer(spec("1x1"), cluster("edge-n", "res-n"), "ct6e-standard-4t").unfit == Unfit.MACHINE_TYPE


# ---- place ---------------------------------------------------------------------------------------


def test_a_shape_the_reservation_cannot_serve_goes_to_another_cluster_of_its_type():
    p = scheduling.place(spec("1x1"), [EDGE_A, EDGE_B], FleetLoad(depth={("id-edge-b", "1x1"): 9}))
    assert p.verdict == "ok" and [c.name for c in p.clusters] == ["edge-b"]  # despite its longer queue


def test_no_cluster_that_can_serve_the_shape_is_no_candidate_with_every_offer():
    p = scheduling.place(spec("1x1"), [EDGE_C, EDGE_A, cluster("edge-x", tpu_type="v7x")], FleetLoad())
    assert p.verdict == "no_candidate" and not p.clusters
    assert [(o.cluster, o.unfit) for o in p.offers] == [("edge-a", Unfit.MACHINE_TYPE), ("edge-c", Unfit.MACHINE_TYPE)]


def test_inactive_clusters_are_not_candidates_and_hold_the_task_when_none_is_active():
    assert scheduling.place(spec("2x2"), [cluster("edge-a", "res-a", status="maintenance")], FleetLoad()).verdict == "only_inactive"
    p = scheduling.place(spec("2x2"), [cluster("edge-a", "res-a", status="offline"), EDGE_B], FleetLoad())
    assert [c.name for c in p.clusters] == ["edge-b"]


def test_an_idle_pool_ranks_first_only_when_no_older_task_of_its_queue_claims_it():
    load = FleetLoad(depth={("id-edge-c", "2x4"): 3}, idle_pools={("id-edge-c", "2x2"): 1})
    assert scheduling.place(spec("2x2"), [EDGE_A, EDGE_C], load).clusters[0].name == "edge-c"
    claimed = FleetLoad(load.depth, idle_pools=load.idle_pools, claimants={("id-edge-c", "2x2"): 1})
    assert scheduling.place(spec("2x2"), [EDGE_A, EDGE_C], claimed).clusters[0].name == "edge-a"  # shortest queue then
    other_topology = FleetLoad(load.depth, idle_pools=load.idle_pools, claimants={("id-edge-c", "2x4"): 5})
    assert scheduling.place(spec("2x2"), [EDGE_A, EDGE_C], other_topology).clusters[0].name == "edge-c"


def test_a_placement_in_the_same_poll_claims_the_idle_pool():
    load = FleetLoad(idle_pools={("id-edge-c", "2x2"): 1})
    first = scheduling.place(spec("2x2"), [EDGE_A, EDGE_C], load).clusters[0]
    load.assigned(first.id, "2x2")
    assert first.name == "edge-c" and load.free_idle("id-edge-c", "2x2") == 0
    assert load.depth == {("id-edge-c", "2x2"): 1} and load.cluster_depth("id-edge-c") == 1


def test_the_shortest_queue_is_the_clusters_tasks_not_yet_running_over_all_its_topologies():
    load = FleetLoad(depth={("id-edge-a", "2x2"): 1, ("id-edge-a", "2x4"): 2, ("id-edge-c", "2x2"): 2}, running={("id-edge-a", "2x2"): 9})
    assert [c.name for c in scheduling.place(spec("2x2"), [EDGE_A, EDGE_C], load).clusters] == ["edge-c", "edge-a"]


SMALL = cluster("edge-s", "res-s", holds="ct6e-standard-4t", count=6)  # one 4x4 (4 hosts) at a time, three 2x4


@pytest.mark.parametrize(
    ("task", "running", "waiting", "first"),
    [
        (spec("4x4"), 0, 0, "edge-s"),  # its slice is free: the shorter queue
        (spec("4x4"), 1, 0, "edge-b"),  # its one 4x4 slice runs: the task would wait for that run to end
        (spec("4x4"), 0, 1, "edge-b"),  # ... or for the run of the task ahead of it
        (spec("2x4"), 2, 0, "edge-s"),  # three 2x4 slices: one is left
        (spec("2x4"), 2, 1, "edge-b"),
        (spec("4x4", supply_mode="flex-start"), 1, 0, "edge-s"),  # not the reservation: nothing to count against
    ],
)
def test_a_reservation_whose_slices_for_the_topology_are_all_spoken_for_ranks_after_a_cluster_that_can_acquire_now(task, running, waiting, first):
    key = (SMALL.id, task.topology)
    load = FleetLoad(depth={key: waiting, ("id-edge-b", "1x1"): 5}, running={key: running})
    assert scheduling.place(task, [SMALL, EDGE_B], load).clusters[0].name == first


def test_a_reservation_not_read_yet_is_not_counted_full():
    unread = cluster("edge-n", "res-n")
    load = FleetLoad(depth={("id-edge-b", "1x1"): 5}, running={(unread.id, "4x4"): 7})
    assert scheduling.place(spec("4x4"), [unread, EDGE_B], load).clusters[0].name == "edge-n"


# ---- move_target ----------------------------------------------------------------------------------


def dest(c: Cluster, idle=(), claimants=0, free=None, holds=None) -> Destination:
    return Destination(c, tuple(idle), claimants, free, c.reservation_machine_type if holds is None else holds)


@pytest.mark.parametrize(
    ("task", "dests", "expect"),
    [
        (spec("2x2"), [dest(EDGE_C, free=4)], "edge-c"),  # reservation headroom there
        (spec("2x4"), [dest(EDGE_C, free=1)], None),  # 2x4 needs 2 hosts
        (spec("2x2"), [dest(EDGE_C, free=1, claimants=1)], None),  # the room is the queued task's
        (spec("2x2"), [dest(EDGE_C, free=2, claimants=1)], "edge-c"),  # room for the queued task and this one
        (spec("2x4"), [dest(EDGE_C, free=3, claimants=1)], None),  # 2 hosts each: 4 needed
        (spec("2x4"), [dest(EDGE_C, free=4, claimants=1)], "edge-c"),
        (spec("2x2"), [dest(EDGE_C, idle=[RES], free=0, claimants=1)], None),  # the idle pool goes to the task ahead
        (spec("2x2"), [dest(EDGE_B, idle=[FLEX])], None),  # never reservation -> flex-start
        (spec("2x2"), [dest(EDGE_B, free=None)], None),
        (spec("2x2"), [dest(EDGE_C, idle=[RES], free=0)], "edge-c"),  # an idle pool of the same supply
        (spec("2x2"), [dest(EDGE_C, idle=[FLEX], free=0)], None),  # an idle pool of another supply
        (spec("2x2"), [dest(EDGE_C, free=4, holds="")], None),  # what its reservation holds is not known
        (spec("2x2"), [dest(cluster("edge-c", "res-c", "ct6e-standard-4t", status="maintenance"), free=4)], None),
        (spec("2x2"), [dest(EDGE_A, free=4)], None),  # its own cluster
        (spec("2x2"), [dest(EDGE_C, free=4), dest(cluster("edge-d", "res-d", "ct6e-standard-4t"), idle=[RES])], "edge-d"),
    ],
)
def test_move_target_is_a_cluster_that_can_start_the_task_now_with_the_same_supply(task, dests, expect):
    got = scheduling.move_target(task, EDGE_A, dests)
    assert (got.cluster.name if got else None) == expect


def test_a_flex_start_task_moves_only_to_an_idle_flex_start_pool():
    task = spec("2x2", supply_mode="flex-start")
    assert scheduling.move_target(task, EDGE_B, [dest(EDGE_C, free=4)]) is None
    assert scheduling.move_target(task, EDGE_B, [dest(EDGE_C, idle=[FLEX])]).cluster.name == "edge-c"


# ---- the queue's decisions ---------------------------------------------------------------------------


def qtask(id: int, phase, topology: str = "2x2", **kw) -> QueueTask:
    return QueueTask(id, f"t{id}", "alice", phase, NOW, None, spec(topology, **kw), None, None, "", NOW - dt.timedelta(seconds=30))


def qstate(tasks, c: Cluster = EDGE_A, topology: str = "2x2", leases=(), **kw) -> QueueState:
    return QueueState(cluster=c, topology=topology, tasks=tuple(tasks), leases=tuple(leases), last_granted="", **kw)


def all_effects(groups, kind):
    return [e for g in groups for e in g.effects if isinstance(e, kind)]


FULL = ReservationView(count=4, in_use=4, machine_type="ct6e-standard-4t")


def test_a_cluster_busy_task_moves_to_a_reservation_with_headroom():
    q = qstate([qtask(7, lc.CLUSTER_BUSY)], destinations=(dest(EDGE_C, free=2),), alternatives_exist=True)
    [m] = all_effects(decide(q, ClusterView(reservation=FULL), NOW, S), MoveTask)
    assert (m.task_id, m.from_cluster_id, m.to_cluster_id, m.to_cluster, m.topology) == (7, "id-edge-a", "id-edge-c", "edge-c", "2x2")
    assert "edge-a" in m.message and "edge-c" in m.message and "res-c" in m.message


def test_a_task_moved_behind_a_queue_whose_room_fits_them_all_says_it_queues_behind_them():
    q = qstate([qtask(7, lc.CLUSTER_BUSY)], destinations=(dest(EDGE_C, free=3, claimants=2),), alternatives_exist=True)
    [m] = all_effects(decide(q, ClusterView(reservation=FULL), NOW, S), MoveTask)
    assert m.to_cluster == "edge-c"
    assert m.message == (
        "Moved from edge-a (reservation res-a busy) to edge-c, whose reservation res-c has room now for it and the 2 task(s) "
        "of its queue there; queued behind them"
    )


def test_a_task_stays_where_the_other_reservation_has_room_only_for_the_tasks_queued_there():
    q = qstate([qtask(7, lc.CLUSTER_BUSY)], destinations=(dest(EDGE_C, free=2, claimants=2),), alternatives_exist=True)
    assert not all_effects(decide(q, ClusterView(reservation=FULL), NOW, S), MoveTask)


def test_a_task_that_only_now_meets_a_full_reservation_waits_first_then_moves():
    q = qstate([qtask(7, lc.PROVISIONING)], destinations=(dest(EDGE_C, free=2),), alternatives_exist=True)
    g = decide(q, ClusterView(reservation=FULL), NOW, S)
    assert not all_effects(g, MoveTask) and (7, lc.CLUSTER_BUSY) in {(e.task_id, e.to) for e in all_effects(g, Transition)}


def test_a_cluster_busy_task_with_a_lease_row_never_moves():
    """A crash after its lease row was written (before Provisioning): the create goes on here."""
    lease = Lease(1, "id-edge-a", "2x2", "falcon-t7-2x2", "reservation", "Requested", 7, None, 0, "", NOW, NOW, None, None, None)
    q = qstate([qtask(7, lc.CLUSTER_BUSY)], leases=[lease], destinations=(dest(EDGE_C, free=2),))
    assert not all_effects(decide(q, ClusterView(reservation=FULL), NOW, S), MoveTask)


def test_with_headroom_here_the_task_creates_here_and_does_not_move():
    q = qstate([qtask(7, lc.CLUSTER_BUSY)], destinations=(dest(EDGE_C, free=4),))
    g = decide(q, ClusterView(reservation=ReservationView(4, 0, machine_type="ct6e-standard-4t")), NOW, S)
    assert not all_effects(g, MoveTask) and all_effects(g, ClaimReservation) and all_effects(g, CreateLease)


def test_a_reservation_of_another_machine_type_sends_the_task_back_to_the_poller():
    q = qstate([qtask(7, lc.PROVISIONING, "1x1")], topology="1x1", alternatives_exist=True)
    g = decide(q, ClusterView(reservation=ReservationView(4, 0, machine_type="ct6e-standard-4t")), NOW, S)
    assert all_effects(g, Unassign) == [Unassign(7, all_effects(g, Unassign)[0].message, lc.PROVISIONING)]
    assert not all_effects(g, ClaimReservation) and not all_effects(g, CreateLease)
    assert lc.allowed(lc.PROVISIONING, lc.NEW)


def test_a_reservation_of_another_machine_type_with_nowhere_else_fails_before_any_create():
    q = qstate([qtask(7, lc.PROVISIONING, "1x1")], topology="1x1", alternatives_exist=False)
    g = decide(q, ClusterView(reservation=ReservationView(4, 0, machine_type="ct6e-standard-4t")), NOW, S)
    [t] = all_effects(g, Transition)
    assert t.to == lc.failed(Reason.NODE_POOL_FAILED) and "res-a holds ct6e-standard-4t" in t.message
    assert not all_effects(g, CreateLease)


def test_a_slice_larger_than_the_whole_reservation_goes_back_to_the_poller_or_fails():
    """An 8x8 slice (16 hosts) on a reservation of 8 VMs can never fit, whatever frees up:
    back to the poller (which places it by the same rule) when another cluster of its type
    exists, else NodePoolFailed saying what the reservation holds; never a ClusterBusy wait."""
    res8 = ClusterView(reservation=ReservationView(8, 0, machine_type="ct6e-standard-4t"))
    q = qstate([qtask(7, lc.PROVISIONING, "8x8")], topology="8x8", alternatives_exist=True)
    g = decide(q, res8, NOW, S)
    [u] = all_effects(g, Unassign)
    assert u.task_id == 7 and "holds 8 VM(s), fewer than the 16 a 8x8 slice needs" in u.message
    assert not all_effects(g, ClaimReservation) and not all_effects(g, CreateLease)
    q = qstate([qtask(7, lc.CLUSTER_BUSY, "8x8")], topology="8x8", alternatives_exist=False)
    [t] = all_effects(decide(q, res8, NOW, S), Transition)
    assert t.to == lc.failed(Reason.NODE_POOL_FAILED) and "res-a holds 8 VM(s)" in t.message


def test_no_reservation_large_enough_for_the_slice_is_no_candidate():
    small = [cluster("edge-r", "res-r", "ct6e-standard-4t", count=8), cluster("edge-s", "res-s", "ct6e-standard-4t", count=4)]
    p = scheduling.place(spec("8x8"), small, FleetLoad())
    assert p.verdict == "no_candidate" and [o.unfit for o in p.offers] == [Unfit.RESERVATION_SIZE] * 2
    assert [o.count for o in p.offers] == [8, 4]
    p = scheduling.place(spec("8x8"), [*small, cluster("edge-t", "res-t", "ct6e-standard-4t", count=16)], FleetLoad())
    assert [c.name for c in p.clusters] == ["edge-t"]


def test_moving_is_an_edge_of_the_lifecycle_table():
    assert lc.allowed(lc.CLUSTER_BUSY, lc.WAITING) and not lc.allowed(lc.DISPATCHING, lc.WAITING)
