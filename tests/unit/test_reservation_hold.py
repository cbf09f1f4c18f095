"""The reservation hold (``reconcile.hold``): a slice that waited long for its reservation's
room gets it before newer tasks of the cluster's other topologies."""

from __future__ import annotations

import datetime as dt

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.devtools.chaos import promised_free_by
from falcon_ray.lifecycle import LeaseState, Reason
from falcon_ray.model import (
    ClusterView,
    Destination,
    JobView,
    ReservationOccupant,
    ReservationView,
    ReservationWaiter,
)
from falcon_ray.reconcile import (
    CreateLease,
    DeletePool,
    MoveLease,
    RefreshMessages,
    Transition,
    UpdateTask,
    decide,
)
from falcon_ray.reconcile.hold import RELEASE_S, hold_for, hold_over, shadow, short
from falcon_ray.scheduling import move_target
from tests.unit.test_reconcile import NOW, cluster, effects, lease, spec, state, task, transitions

S = Settings(reservation_hold_after_s=1800)


def waiter(id: int, topology: str = "8x8", submitted_s: float = 7200, busy_s: float = 3600, mode: str | None = None) -> ReservationWaiter:
    """Task ``id`` of queue ``topology``, submitted ``submitted_s`` ago, ClusterBusy for ``busy_s``."""
    return ReservationWaiter(id, topology, NOW - dt.timedelta(seconds=submitted_s), mode, NOW - dt.timedelta(seconds=busy_s))


R16 = ReservationView(count=16, in_use=12)  # 4 hosts free of 16


def test_the_first_waiter_in_submission_order_that_waited_long_enough_holds_its_slices_hosts():
    older_short_wait = waiter(1, "4x4", submitted_s=9000, busy_s=600)  # not long enough yet
    held = waiter(2, "8x8", submitted_s=8000)
    later = waiter(3, "4x8", submitted_s=7000)
    h = hold_over((later, held, older_short_wait), cluster(), "2x2", R16, NOW, S)
    assert h is not None and (h.waiter.task_id, h.hosts) == (2, 16)
    assert hold_over((held,), cluster(), "2x2", R16, NOW, Settings(reservation_hold_after_s=None)) is None
    assert hold_over((held,), cluster(reservation=""), "2x2", R16, NOW, S) is None


def test_no_hold_for_the_waiters_own_topology_a_task_submitted_before_it_or_another_supply():
    held = waiter(2, "8x8", submitted_s=8000)
    assert hold_over((held,), cluster(), "8x8", R16, NOW, S) is None  # its own queue is FIFO already
    assert hold_over((held,), cluster(), "2x2", R16, NOW, S, before=(NOW - dt.timedelta(seconds=9000), 1)) is None
    assert hold_over((held,), cluster(), "2x2", R16, NOW, S, before=(NOW - dt.timedelta(seconds=100), 9)) is not None
    assert hold_over((waiter(2, mode="flex-start"),), cluster(), "2x2", R16, NOW, S) is None
    assert hold_over((waiter(2, mode="reservation"),), cluster(), "2x2", R16, NOW, S) is not None


def test_only_a_slice_of_at_least_half_the_reservation_and_no_more_than_all_of_it_holds_room():
    assert hold_over((waiter(2, "8x8"),), cluster(), "2x2", ReservationView(count=8, in_use=0), NOW, S) is None  # never fits
    assert hold_over((waiter(2, "4x8"),), cluster(), "2x2", R16, NOW, S).hosts == 8  # half of 16
    assert hold_over((waiter(2, "4x4"),), cluster(), "2x2", R16, NOW, S) is None  # a quarter: finds room in the churn


def test_short_while_fewer_hosts_are_free_than_the_room_held():
    h = hold_over((waiter(2, "8x8"),), cluster(), "2x2", R16, NOW, S)
    assert short(h, ReservationView(count=16, in_use=12))
    assert not short(h, ReservationView(count=16, in_use=0))
    assert short(h, ReservationView(count=16, in_use=0, claimed=1))
    assert not short(None, R16)


def occupant(pool: str = "falcon-t1-4x8", topology: str = "4x8", task_id: int | None = 1, ran_s: float = 3600, timeout_s: int = 36000) -> ReservationOccupant:
    """A reservation pool whose task's Job was submitted ``ran_s`` ago with a ``timeout_s`` limit."""
    at = NOW - dt.timedelta(seconds=ran_s)
    return ReservationOccupant(pool, topology, task_id, at, timeout_s, at, at)


BUSY = (occupant(),)  # 8 hosts in use until 9 h from now at the latest
BUSY12 = (*BUSY, occupant("falcon-t3-4x4", "4x4", 3, ran_s=0, timeout_s=7200))  # and 4 more until 2 h from now


def test_a_newer_task_of_another_topology_claims_only_the_room_beyond_the_held_one_and_says_why():
    long_run = task(5, phase=lc.PROVISIONING, age_s=100, timeout_seconds=86400)
    q = state([long_run], reservation_waiters=(waiter(2),), reservation_occupants=BUSY)
    g = decide(q, ClusterView(reservation=ReservationView(count=16, in_use=8)), NOW, S)  # 8 free, 16 held
    assert transitions(g) == {(5, lc.CLUSTER_BUSY)} and not effects(g, CreateLease)
    msg = effects(g, Transition)[0].message
    assert "reservation_remaining_slices=8" in msg and "16 host(s) of reservation res-a are held for task 2 (8x8)" in msg
    free_beyond = decide(q, ClusterView(reservation=ReservationView(count=32, in_use=8)), NOW, S)  # 24 free: 8 beyond
    assert effects(free_beyond, CreateLease) and not transitions(free_beyond)  # already Provisioning: it creates
    older = task(6, phase=lc.PROVISIONING, age_s=9000, timeout_seconds=86400)  # submitted before the waiter: not held back
    g = decide(state([older], reservation_waiters=(waiter(2),), reservation_occupants=BUSY), ClusterView(reservation=ReservationView(count=16, in_use=8)), NOW, S)
    assert effects(g, CreateLease)


def test_a_newer_run_that_ends_before_the_held_room_must_be_free_backfills_it():
    """The held room is free 9 h from now at the latest (the 4x8's run limit): a 1 h run
    created now ends well before, so it takes the free hosts; a 9 h one does not."""
    view = ClusterView(reservation=ReservationView(count=16, in_use=8))
    short_run = task(5, phase=lc.PROVISIONING, age_s=100, timeout_seconds=3600)
    g = decide(state([short_run], reservation_waiters=(waiter(2),), reservation_occupants=BUSY), view, NOW, S)
    assert effects(g, CreateLease)
    too_long = task(5, phase=lc.PROVISIONING, age_s=100, timeout_seconds=9 * 3600)
    g = decide(state([too_long], reservation_waiters=(waiter(2),), reservation_occupants=BUSY), view, NOW, S)
    assert not effects(g, CreateLease)
    lagging = decide(state([too_long], reservation_waiters=(waiter(2),)), view, NOW, S)  # in_use not read again since the pools went
    assert not effects(lagging, CreateLease)  # the rows say the room is free now: the waiter's
    foreign = ClusterView(reservation=ReservationView(count=16, in_use=8, foreign=1))  # another user's node, and Falcon's 8
    assert effects(decide(state([too_long], reservation_waiters=(waiter(2),), reservation_occupants=BUSY), foreign, NOW, S), CreateLease)


def test_the_shadow_is_when_enough_pools_must_have_given_their_hosts_back():
    h = hold_over((waiter(2, "8x8"),), cluster(), "2x2", R16, NOW, S)
    occupants = (occupant("a", "4x4", 1, ran_s=0, timeout_s=3600), occupant("b", "4x4", 2, ran_s=0, timeout_s=7200), occupant("c", "4x4", 3, ran_s=0, timeout_s=10800))
    r = ReservationView(count=16, in_use=12)  # 4 free; 12 in the three pools
    assert shadow(h, r, occupants, cluster(), NOW, S) == NOW + dt.timedelta(seconds=10800 + RELEASE_S)
    idle = (occupant("i", "4x8", None, ran_s=0),)  # no live task since now: back once deleted
    assert shadow(h, ReservationView(count=16, in_use=8), idle, cluster(), NOW, S) == NOW + dt.timedelta(seconds=RELEASE_S)
    creating = ReservationOccupant("p", "4x8", 4, None, 3600, NOW - dt.timedelta(seconds=60), NOW)  # asked for a minute ago
    expected = NOW + dt.timedelta(seconds=S.node_pool_timeout_s - 60 + 3600 + RELEASE_S)
    assert shadow(h, ReservationView(count=16, in_use=0, claimed=8), (creating,), cluster(), NOW, S) == expected
    assert shadow(h, ReservationView(count=16, in_use=16), (), cluster(), NOW, S) == NOW  # in_use lags: the rows decide
    assert shadow(h, ReservationView(count=16, in_use=12, foreign=4), occupants[:2], cluster(), NOW, S) is None  # never 16 free


def test_while_the_room_is_short_a_reservation_pool_is_neither_kept_nor_handed_to_newer_tasks():
    running = task(1, phase=lc.RUNNING, pool="falcon-t1-2x2", dispatched_s=10, age_s=9500)
    newer = task(5, "bob", age_s=100, timeout_seconds=86400)
    view = ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Succeeded", 0, 0, 1)}, reservation=ReservationView(count=16, in_use=12))
    leases = [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1)]
    kept = decide(state([running, newer], leases), view, NOW, S)
    assert [m.to for m in effects(kept, MoveLease)] == [LeaseState.IDLE]  # no hold: kept for the hand-over
    held = decide(state([running, newer], leases, reservation_waiters=(waiter(2),), reservation_occupants=BUSY12), view, NOW, S)
    assert [m.to for m in effects(held, MoveLease)] == [LeaseState.DELETING] and effects(held, DeletePool)
    idle = [lease(7, "falcon-t7-2x2", LeaseState.IDLE)]
    busy = ClusterView(reservation=ReservationView(count=16, in_use=12))
    g = decide(state([newer], idle, reservation_waiters=(waiter(2),), reservation_occupants=BUSY12), busy, NOW, S)
    assert (5, lc.DISPATCHING) not in transitions(g)
    assert [m.to for m in effects(g, MoveLease)] == [LeaseState.DELETING]  # given up: its hosts go to the held room
    short_run = task(5, "bob", age_s=100, timeout_seconds=3600)
    g = decide(state([short_run], idle, reservation_waiters=(waiter(2),), reservation_occupants=BUSY12), busy, NOW, S)
    assert (5, lc.DISPATCHING) in transitions(g)  # its run ends before the room must be free: handed over
    room = decide(state([newer], idle, reservation_waiters=(waiter(2),), reservation_occupants=BUSY12), ClusterView(reservation=ReservationView(count=32, in_use=12)), NOW, S)
    assert (5, lc.DISPATCHING) in transitions(room)  # 20 free cover the held 16: handed over as usual


def test_a_move_counts_only_the_room_beyond_what_is_held_at_the_destination():
    other = cluster()
    dest = Destination(other.__class__(**{**other.__dict__, "id": "c2", "name": "edge-b"}), free_hosts=4, machine_type="ct6e-standard-4t")
    sp = spec("2x2", supply_mode="reservation")
    assert move_target(sp, cluster(), [dest]) is not None
    held = Destination(dest.cluster, free_hosts=4, machine_type="ct6e-standard-4t", held_hosts=4)
    assert move_target(sp, cluster(), [held]) is None


def test_hold_for_reads_the_queues_waiters_and_the_task():
    q = state([], reservation_waiters=(waiter(2),))
    assert hold_for(q, R16, NOW, S) is not None
    assert hold_for(q, R16, NOW, S, task(9, age_s=9000)) is None


def test_the_waiters_own_message_says_its_room_is_held_and_free_by_when():
    waiting = task(2, phase=lc.CLUSTER_BUSY, age_s=7200, in_phase_s=3600, topology="8x8")
    q = state([waiting], reservation_waiters=(waiter(2),), reservation_occupants=BUSY12)
    g = decide(q, ClusterView(reservation=ReservationView(count=16, in_use=12)), NOW, S)
    (upd,) = effects(g, UpdateTask)
    by = (NOW + dt.timedelta(seconds=36000 - 3600 + RELEASE_S)).strftime("%Y-%m-%d %H:%M")  # the 4x8's limit
    assert f"its 16 host(s) are held for it against newer tasks of other topologies, free by {by} UTC" in upd.message
    assert "waiting since" in upd.message


def test_the_tasks_waiting_behind_it_are_told_whom_they_wait_behind_and_by_when():
    """Without a start estimate (no history here), a Waiting task behind the slot holder's
    reservation wait says which task it waits behind and the holder's promise."""
    waiting = task(2, phase=lc.CLUSTER_BUSY, age_s=7200, in_phase_s=3600, topology="8x8")
    behind = task(3, phase=lc.WAITING, age_s=600, in_phase_s=600, topology="8x8")
    q = state([waiting, behind], reservation_waiters=(waiter(2),), reservation_occupants=BUSY12)
    g = decide(q, ClusterView(reservation=ReservationView(count=16, in_use=12)), NOW, S)
    (refresh,) = effects(g, RefreshMessages)
    ((tid, phase, message),) = refresh.updates
    by = (NOW + dt.timedelta(seconds=36000 - 3600 + RELEASE_S)).strftime("%Y-%m-%d %H:%M")
    assert (tid, phase) == (3, lc.WAITING)
    assert f"task 2 ahead of it waits for 16 host(s) of reservation res-a, free by {by} UTC at the latest" in message, message
    assert promised_free_by(message) == dt.datetime.strptime(by, "%Y-%m-%d %H:%M")  # the judge holds it to that
    alone = decide(state([waiting, behind]), ClusterView(reservation=ReservationView(count=16, in_use=12)), NOW, S)
    assert "ahead of it waits for" not in next(iter(effects(alone, RefreshMessages))).updates[0][2]  # no hold yet: no promise


def test_a_task_held_out_of_free_room_never_fails_of_the_reservation_wait_limit():
    limited = Settings(reservation_hold_after_s=1800, reservation_wait_limit_s=600)
    t = task(5, phase=lc.CLUSTER_BUSY, age_s=3000, in_phase_s=2400, timeout_seconds=86400)
    view = ClusterView(reservation=ReservationView(count=16, in_use=8))
    held = decide(state([t], reservation_waiters=(waiter(2),), reservation_occupants=BUSY), view, NOW, limited)
    assert not transitions(held) and not effects(held, CreateLease)  # still ClusterBusy: there was room, the hold kept it
    full = ClusterView(reservation=ReservationView(count=16, in_use=16))
    no_room = decide(state([t]), full, NOW, limited)
    assert transitions(no_room) == {(5, lc.failed(Reason.NODE_POOL_FAILED))}
