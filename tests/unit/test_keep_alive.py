"""The keep-alive rule for idle pools nobody waits for (pools.kept_alive), table by table,
and what decide() does with it: keep the pool Idle when its task ends, delete it once its
window has passed, give a reservation pool up when another topology waits."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import Cluster, ClusterView, JobView, Lease, QueueState, QueueTask
from falcon_ray.reconcile import DeletePool, MoveLease, decide
from falcon_ray.reconcile.pools import kept_alive
from falcon_ray.spec import parse_spec

NOW = dt.datetime(2026, 11, 30, 12, 0, 0)
WINDOWS = Settings(keep_idle_reservation_s=3600, keep_idle_on_demand_s=300, keep_idle_flex_start_s=600)
POOL = "falcon-t1-2x2"


def lease(state=LeaseState.IDLE, mode="flex-start", idle_s: float | None = 0, ready=True, task_id=None, id=1) -> Lease:
    t = NOW - dt.timedelta(seconds=5000)
    idle_since = NOW - dt.timedelta(seconds=idle_s) if idle_s is not None and state == LeaseState.IDLE else None
    return Lease(id, "c1", "2x2", POOL, mode, state.value, task_id, None, 0, "", t, t, t if ready else None, idle_since, None)


@pytest.mark.parametrize(
    "settings, pool, active, other_waiting, kept",
    [
        # the seed's rule: no window, nothing is kept for nobody
        (Settings(), lease(idle_s=10), True, False, False),
        # within its supply mode's window, counted from idle_since
        (WINDOWS, lease(mode="flex-start", idle_s=599), True, False, True),
        (WINDOWS, lease(mode="flex-start", idle_s=600), True, False, False),
        (WINDOWS, lease(mode="on-demand", idle_s=299), True, False, True),
        (WINDOWS, lease(mode="on-demand", idle_s=301), True, False, False),
        (WINDOWS, lease(mode="reservation", idle_s=3599), True, False, True),
        # a pool going Idle now (its task just ended): the window starts now
        (WINDOWS, lease(state=LeaseState.IN_USE, idle_s=None, task_id=7), True, False, True),
        # an Idle row without idle_since counts from now too (never deleted early)
        (WINDOWS, lease(idle_s=None), True, False, True),
        # another topology waits: a reservation pool gives its hosts up, the others stay
        (WINDOWS, lease(mode="reservation", idle_s=10), True, True, False),
        (WINDOWS, lease(mode="flex-start", idle_s=10), True, True, True),
        (WINDOWS, lease(mode="on-demand", idle_s=10), True, True, True),
        # a cluster out of service keeps nothing
        (WINDOWS, lease(idle_s=10), False, False, False),
        # a pool whose create never finished is not kept by the window
        (WINDOWS, lease(state=LeaseState.CREATING, idle_s=None, ready=False, task_id=7), True, False, False),
        # delete-at-once: the hand-over off turns every window off
        (WINDOWS.model_copy(update={"idle_pool_handover": False}), lease(idle_s=10), True, False, False),
    ],
)
def test_kept_alive(settings, pool, active, other_waiting, kept):
    assert kept_alive(settings, pool, NOW, active=active, other_topology_waiting=other_waiting) is kept


# ---- what decide() does with it ------------------------------------------------------------------

CLUSTER = Cluster("c1", "edge-a", "proj", "us-east5-b", "v6e", "logs", "res-a", "active", "falcon-jobs", "falcon-job", NOW, NOW)


def task(id: int, phase=lc.WAITING, pool=None) -> QueueTask:
    spec = parse_spec({"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["run"]})
    return QueueTask(id, f"t{id}", "alice", phase, NOW - dt.timedelta(seconds=100), None, spec, pool, None, "")


def state(tasks, leases, **kw) -> QueueState:
    return QueueState(cluster=CLUSTER, topology="2x2", tasks=tuple(tasks), leases=tuple(leases), last_granted="", **kw)


def moves(groups) -> list[tuple[LeaseState, LeaseState]]:
    return [(m.expect[0], m.to) for g in groups for m in g.effects if isinstance(m, MoveLease)]


def deletes(groups) -> list[str]:
    return [e.name for g in groups for e in g.effects if isinstance(e, DeletePool)]


SUCCEEDED = ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Succeeded", 0, 0, 1)})


@pytest.mark.parametrize(
    "settings, waiting, kept",
    [
        (Settings(), [], False),  # the seed's rule: nobody waits, deleted
        (Settings(), [task(2)], True),  # the seed's rule: a task of its topology waits, kept
        (WINDOWS, [], True),  # a window: kept for nobody
        (Settings(idle_pool_handover=False), [task(2)], False),  # delete-at-once, even for a waiting task
    ],
)
def test_a_finished_task_leaves_its_pool_idle_or_deleted(settings, waiting, kept):
    running = task(1, lc.RUNNING, POOL)
    g = decide(state([running, *waiting], [lease(LeaseState.IN_USE, idle_s=None, task_id=1)]), SUCCEEDED, NOW, settings)
    if kept:
        assert (LeaseState.IN_USE, LeaseState.IDLE) in moves(g) and deletes(g) == []
    else:
        assert (LeaseState.IN_USE, LeaseState.DELETING) in moves(g) and deletes(g) == [POOL]


@pytest.mark.parametrize(
    "mode, idle_s, other_waiting, deleted",
    [
        ("flex-start", 60, False, False),
        ("flex-start", 601, False, True),  # its window passed
        ("reservation", 60, False, False),
        ("reservation", 60, True, True),  # another topology waits: the reservation's hosts go back
        ("on-demand", 301, False, True),
    ],
)
def test_an_idle_pool_nobody_waits_for_is_deleted_once_its_window_passed(mode, idle_s, other_waiting, deleted):
    g = decide(state([], [lease(mode=mode, idle_s=idle_s)], other_topology_waiting=other_waiting), ClusterView(), NOW, WINDOWS)
    assert deletes(g) == ([POOL] if deleted else [])
    assert moves(g) == ([(LeaseState.IDLE, LeaseState.DELETING)] if deleted else [])


def test_a_pool_kept_alive_is_handed_over_to_the_next_task():
    g = decide(state([task(2)], [lease(idle_s=300)]), ClusterView(), NOW, WINDOWS)
    assert (LeaseState.IDLE, LeaseState.IN_USE) in moves(g) and deletes(g) == []


def test_pools_kept_alive_beyond_the_demand_stay_within_their_window():
    """Two idle pools, one waiting task: one is handed over, the other stays (its window),
    where the seed's rule deletes the surplus one."""
    pools = [lease(idle_s=100, id=1), dataclasses.replace(lease(idle_s=100, id=2), name="falcon-t9-2x2")]
    kept = decide(state([task(2)], pools), ClusterView(), NOW, WINDOWS)
    assert deletes(kept) == []
    seed = decide(state([task(2)], pools), ClusterView(), NOW, Settings())
    assert len(deletes(seed)) == 1


def test_the_window_is_bounded():
    with pytest.raises(ValueError):
        Settings(keep_idle_flex_start_s=86401)


# ---- the window a pool earns by what it took to get (keep_idle_reacquire_factor) -------------------

EARNED = Settings(keep_idle_reacquire_factor=1.0, keep_idle_max_s=7200)


def slow(mode="flex-start", took_s: float = 3000, idle_s: float = 0, **kw) -> Lease:
    """An Idle pool whose row was written ``took_s`` before its nodes were Ready."""
    base = lease(mode=mode, idle_s=idle_s, **kw)
    ready = NOW - dt.timedelta(seconds=idle_s + 60)
    return dataclasses.replace(base, created_at=ready - dt.timedelta(seconds=took_s), ready_at=ready)


@pytest.mark.parametrize(
    "settings, pool, other_waiting, kept",
    [
        # kept as long as it took to get: 3,000 s
        (EARNED, slow(took_s=3000, idle_s=2999), False, True),
        (EARNED, slow(took_s=3000, idle_s=3000), False, False),
        # twice that with a factor of 2
        (EARNED.model_copy(update={"keep_idle_reacquire_factor": 2.0}), slow(took_s=3000, idle_s=5999), False, True),
        # capped: a pool that took 3 h is kept 2 h
        (EARNED, slow(took_s=3 * 3600, idle_s=7199), False, True),
        (EARNED, slow(took_s=3 * 3600, idle_s=7200), False, False),
        # a pool that came fast earns little: 300 s
        (EARNED, slow(mode="on-demand", took_s=300, idle_s=301), False, False),
        (EARNED, slow(mode="on-demand", took_s=300, idle_s=299), False, True),
        # a reservation pool earns nothing: the reservation's hosts are there for the next create
        (EARNED, slow(mode="reservation", took_s=3000, idle_s=1), False, False),
        # another topology of the cluster waits: whatever the supply mode, its chips go back
        (EARNED, slow(mode="flex-start", idle_s=10), True, False),
        (EARNED, slow(mode="on-demand", idle_s=10), True, False),
        # a fixed window longer than the earned one keeps its own rule (a flex-start pool stays)
        (WINDOWS.model_copy(update={"keep_idle_reacquire_factor": 1.0}), slow(took_s=100, idle_s=500), True, True),
        # off with the hand-over off, and nothing earned by a pool never Ready
        (EARNED.model_copy(update={"idle_pool_handover": False}), slow(idle_s=10), False, False),
        (EARNED, lease(state=LeaseState.CREATING, idle_s=None, ready=False, task_id=7), False, False),
    ],
)
def test_a_pool_is_kept_as_long_as_it_took_to_get(settings, pool, other_waiting, kept):
    assert kept_alive(settings, pool, NOW, active=True, other_topology_waiting=other_waiting) is kept


def test_an_earned_window_ends_with_a_delete_at_its_end():
    pool = slow(took_s=1800, idle_s=1799)
    assert deletes(decide(state([], [pool]), ClusterView(), NOW, EARNED)) == []
    later = NOW + dt.timedelta(seconds=1)
    assert deletes(decide(state([], [pool]), ClusterView(), later, EARNED)) == [POOL]
