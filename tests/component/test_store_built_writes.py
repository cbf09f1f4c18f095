"""The Store's hot writes and lease read are built once per shape and executed with their
values bound. A cached statement must still hold nothing of one call but its shape: the
task id, the values, the cluster are bound each time; the compare-and-set on the phase and
the leader fence are in every execution of it.

Every test runs on SQLite and on MariaDB/MySQL (the ``store`` fixture)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState
from falcon_ray.store import Fenced, Store
from falcon_ray.store import tables as t
from falcon_ray.store.repository import LOST
from tests.harness.db import STORE_CLUSTER as CLUSTER
from tests.harness.db import STORE_SPEC as SPEC
from tests.harness.db import waiting_task
from tests.harness.fakes import FakeClock

OTHER = "00000000-0000-0000-0000-00000000c002"


def _events(store: Store, tid: int) -> int:
    with store.engine.connect() as c:
        return c.execute(sa.select(sa.func.count()).select_from(t.task_events).where(t.task_events.c.task_id == tid)).scalar()


def test_update_task_with_a_stale_phase_loses_for_each_cached_shape(store):
    """Two shapes (a message; a bookkeeping column without one), each won once so its
    statement is cached, then asked again expecting Waiting of a task now Provisioning
    (same status, other reason): both lose and write nothing."""
    a, b = waiting_task(store), waiting_task(store, "bob")
    assert store.update_task(a, lc.WAITING, "held")
    assert store.update_task(a, lc.WAITING, None, node_pool_name="falcon-p1", job_uid="uid-1")
    # the same shapes on the other task: the id and values are bound, not those of the first call
    assert store.update_task(b, lc.WAITING, "other")
    assert store.update_task(b, lc.WAITING, None, node_pool_name="falcon-p2", job_uid="uid-2")
    row_a = store.get_task(a)
    assert (row_a.message, row_a.node_pool_name, row_a.job_uid) == ("held", "falcon-p1", "uid-1")

    assert store.transition(a, lc.WAITING, lc.PROVISIONING, "picked")
    before = store.get_task(a)
    assert store.update_task(a, lc.WAITING, "stale") is LOST
    assert store.update_task(a, lc.WAITING, None, node_pool_name="falcon-p9", job_uid="uid-9") is LOST
    assert store.get_task(a) == before

    won = store.update_task(a, [lc.WAITING, lc.PROVISIONING], "fresh")
    assert won and won.values["message"] == "fresh" and store.get_task(a).message == "fresh"
    row_b = store.get_task(b)
    assert (row_b.phase, row_b.message, row_b.node_pool_name) == (lc.WAITING, "other", "falcon-p2")


def test_a_failed_task_is_matched_on_its_reason_by_a_cached_statement(store):
    tid = waiting_task(store)
    assert store.transition(tid, lc.WAITING, lc.PROVISIONING, "picked")
    timeout, refused = lc.failed(lc.Reason.NODE_POOL_TIMEOUT), lc.failed(lc.Reason.NODE_POOL_FAILED)
    assert store.transition(tid, lc.PROVISIONING, timeout, "timed out")
    assert store.update_task(tid, timeout, "still timed out")
    assert store.update_task(tid, refused, "wrong reason") is LOST
    assert store.get_task(tid).message == "still timed out"


def test_transition_from_a_stale_phase_loses_and_writes_no_event_for_a_cached_shape(store):
    a, b = waiting_task(store), waiting_task(store, "bob")
    assert store.transition(a, lc.WAITING, lc.PROVISIONING, "picked")  # the shape is cached
    events = _events(store, a)
    assert store.transition(a, lc.WAITING, lc.PROVISIONING, "again") is LOST
    assert store.get_task(a).message == "picked" and _events(store, a) == events

    events = _events(store, b)
    moved = store.transition(b, lc.WAITING, lc.PROVISIONING, "picked b")  # same shape, other task
    assert moved.moved and store.get_task(b).phase == lc.PROVISIONING and _events(store, b) == events + 1
    # a self-loop: the move out of another phase loses, the refresh of the row wins, no event
    busy = store.transition(b, [lc.PROVISIONING, lc.CLUSTER_BUSY], lc.CLUSTER_BUSY, "busy")
    assert busy.moved and _events(store, b) == events + 2
    again = store.transition(b, [lc.PROVISIONING, lc.CLUSTER_BUSY], lc.CLUSTER_BUSY, "still busy")
    assert again.won and not again.moved and _events(store, b) == events + 2 and store.get_task(b).message == "still busy"


def test_leases_bind_the_cluster_of_each_call(store):
    mine = [store.create_lease(CLUSTER, "2x2", f"falcon-a{i}", "flex-start", None) for i in range(2)]
    theirs = store.create_lease(OTHER, "2x4", "falcon-b0", "reservation", 7)
    assert store.move_lease(mine[1].id, LeaseState.REQUESTED, LeaseState.DELETING)
    assert store.move_lease(mine[1].id, LeaseState.DELETING, LeaseState.DELETED)
    assert [l.name for l in store.leases(CLUSTER)] == ["falcon-a0"]
    assert store.leases(OTHER) == [store.get_lease(OTHER, "falcon-b0")] == [theirs]
    assert store.leases(CLUSTER, live_only=False) == [store.get_lease(CLUSTER, "falcon-a0"), store.get_lease(CLUSTER, "falcon-a1")]
    assert [l.name for l in store.leases()] == ["falcon-a0", "falcon-b0"]
    assert store.leases(CLUSTER)[0].state == LeaseState.REQUESTED and store.leases(OTHER)[0].task_id == 7


def test_a_store_under_a_stale_epoch_is_refused_by_its_cached_statements(store):
    """Writes cached while the epoch held carry the guard: after another controller takes
    the lease they lose, raise Fenced and change nothing. A Store whose epoch is changed
    builds its statements again for that epoch."""
    clock = FakeClock()
    s = Store(store.url, clock=clock)
    tid = s.submit_task("alice", SPEC, name="t")
    assert s.acquire_leader("first", ttl_s=30)
    first = s.leader_epoch("first")
    old = Store(store.url, clock=clock, epoch=first)
    try:
        assert old.transition(tid, lc.NEW, lc.WAITING, "queued", cluster_id=CLUSTER, topology="2x2")
        assert old.update_task(tid, lc.WAITING, "held")
        clock.advance(31)
        assert s.acquire_leader("second", ttl_s=30)
        second = s.leader_epoch("second")
        before, events = s.get_task(tid), _events(s, tid)
        with pytest.raises(Fenced):
            old.update_task(tid, lc.WAITING, "after the hand-over")
        with pytest.raises(Fenced):
            old.transition(tid, lc.WAITING, lc.PROVISIONING, "after the hand-over")
        assert s.get_task(tid) == before and _events(s, tid) == events

        # a Store that wrote under the new epoch, then is set back to the old one
        new = Store(store.url, clock=clock, epoch=second)
        try:
            assert new.update_task(tid, lc.WAITING, "new holder")
            new.epoch = first
            with pytest.raises(Fenced):
                new.update_task(tid, lc.WAITING, "stale again")
            assert s.get_task(tid).message == "new holder"
        finally:
            new.dispose()
    finally:
        old.dispose()
        s.dispose()
