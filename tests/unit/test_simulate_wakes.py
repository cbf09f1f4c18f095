"""Which queues the simulator steps after another queue's step (``driver._visible`` and
``driver._reads``): a queue is stepped when the other changed something its own decisions
read of that queue's rows, and not otherwise. A wake-up left out here is a decision the
simulation would take late that production (every queue at every tick) takes at once."""

from __future__ import annotations

from types import SimpleNamespace

from falcon_ray import lifecycle as lc
from falcon_ray.devtools.simulate.driver import PENDING, POOLS, SHADOW, TOPOLOGY, WAITERS, _reads, _visible
from falcon_ray.lifecycle import LeaseState
from tests.unit.test_reconcile import lease, state, task


def _q(tasks=(), leases=()):
    return SimpleNamespace(last_state=state(tasks, leases))


def _changed(before, after) -> set[int]:
    a, b = _visible(before), _visible(after)
    return {i for i in (POOLS, WAITERS, SHADOW, PENDING, TOPOLOGY) if a[i] != b[i]}


def test_a_queue_that_has_not_observed_reads_everything_and_shows_nothing_yet():
    q = SimpleNamespace(last_state=None)
    assert _reads(q) == (True, True) and _visible(q) is None


def test_a_task_that_starts_on_a_flex_start_pool_frees_its_slot_and_changes_nothing_of_the_reservation():
    flex = lease(1, "falcon-t1-2x2", LeaseState.IN_USE, task_id=1, mode="flex-start")
    assert _changed(_q([task(1, phase=lc.WAITING_FOR_NODE)], [flex]), _q([task(1, phase=lc.RUNNING)], [flex])) == {PENDING, TOPOLOGY}
    # the next task picked: still a Pending task, as many claimants, nothing of the reservation
    running = task(1, phase=lc.RUNNING)
    assert _changed(_q([running, task(2)], [flex]), _q([running, task(2, phase=lc.PROVISIONING)], [flex])) == set()


def test_a_reservation_pools_task_submitting_its_job_moves_the_holds_shadow():
    pool = lease(1, "falcon-t1-2x2", LeaseState.IN_USE, task_id=1)
    before = _q([task(1, phase=lc.DISPATCHING)], [pool])
    after = _q([task(1, phase=lc.RUNNING, dispatched_s=0)], [pool])
    assert _changed(before, after) == {SHADOW, PENDING, TOPOLOGY}


def test_a_reservation_pool_that_stops_holding_hosts_changes_the_ledger_a_flex_one_does_not():
    def pools(state_, mode):
        return [lease(1, "falcon-t1-2x2", state_, mode=mode)]

    assert _changed(_q(leases=pools(LeaseState.IDLE, "reservation")), _q(leases=pools(LeaseState.DELETING, "reservation"))) == {POOLS, TOPOLOGY}
    assert _changed(_q(leases=pools(LeaseState.IDLE, "flex-start")), _q(leases=pools(LeaseState.DELETING, "flex-start"))) == {TOPOLOGY}
    # from being created to ready and in use: it holds its hosts throughout
    assert _changed(_q(leases=pools(LeaseState.CREATING, "reservation")), _q(leases=pools(LeaseState.READY, "reservation"))) == set()


def test_a_first_pending_task_shows_that_a_topology_waits_and_adds_a_claimant():
    running = task(1, phase=lc.RUNNING)
    assert _changed(_q([running]), _q([running, task(2)])) == {PENDING, TOPOLOGY}
    assert _changed(_q([running, task(2)]), _q([running, task(2), task(3)])) == {TOPOLOGY}


def test_a_task_turning_cluster_busy_is_a_waiter_the_reservation_hold_reads():
    assert _changed(_q([task(1, phase=lc.PROVISIONING)]), _q([task(1, phase=lc.CLUSTER_BUSY, in_phase_s=0)])) == {WAITERS}


def test_what_a_queues_decisions_read_of_the_other_queues_follows_its_tasks_and_pools():
    assert _reads(_q([task(1, phase=lc.RUNNING)])) == (False, False)
    assert _reads(_q([task(1, phase=lc.CLUSTER_BUSY)])) == (True, False)
    assert _reads(_q([task(1, phase=lc.PROVISIONING)])) == (True, False)  # no pool yet: it claims next
    creating = lease(1, "falcon-t1-2x2", LeaseState.CREATING, task_id=1)
    assert _reads(_q([task(1, phase=lc.PROVISIONING), task(2)], [creating])) == (False, False)  # the slot is taken
    assert _reads(_q([task(2)])) == (True, False)  # the slot is free: it picks and claims
    assert _reads(_q([task(1, phase=lc.WAITING_FOR_NODE)], [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, task_id=1)])) == (False, True)
    assert _reads(_q(leases=[lease(1, "falcon-t1-2x2", LeaseState.IDLE)])) == (True, True)  # kept or handed over
    assert _reads(_q(leases=[lease(1, "falcon-t1-2x2", LeaseState.IDLE, mode="flex-start")])) == (True, False)
    assert _reads(_q(leases=[lease(1, "falcon-t1-2x2", LeaseState.DELETING)])) == (False, False)
