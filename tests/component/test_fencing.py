"""Fencing: a write under a stale leader epoch loses, atomically, on both databases.

The leader lease carries an epoch that a new holder bumps; a Store built with an
epoch adds "the lease is still at my epoch" to every task, lease and queue-state
write. Here two controllers' stores share one database: after the second takes the
lease, every write of the first loses, raises ``Fenced`` and leaves no trace, and the
queue and the poller built on it stop without calling any other actor.
"""

from __future__ import annotations

import datetime as dt
import math
import threading

import pytest
import sqlalchemy as sa

from actors.supervisor import Supervisor
from falcon_ray import lifecycle as lc
from falcon_ray.clock import ParkingClock
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState
from falcon_ray.store import Fenced, Store
from falcon_ray.store import tables as t
from tests.harness.fakes import T0, FakeClock, QueueBench


def _events(store: Store) -> int:
    with store.engine.connect() as c:
        return c.execute(sa.select(sa.func.count()).select_from(t.task_events)).scalar()


def test_epoch_grows_with_each_new_holder_only(store):
    clock = FakeClock()
    s = Store(store.url, clock=clock)
    try:
        assert s.acquire_leader("a", ttl_s=30)
        assert s.leader_epoch("a") == 1
        clock.advance(10)
        assert s.acquire_leader("a", ttl_s=30)  # a renewal keeps the epoch
        assert s.leader()["epoch"] == 1
        clock.advance(31)
        assert s.acquire_leader("a", ttl_s=30)  # expired, but nobody else took it: still a's epoch
        assert s.leader_epoch("a") == 1
        clock.advance(31)
        assert s.acquire_leader("b", ttl_s=30)
        assert s.leader_epoch("b") == 2 and s.leader_epoch("a") is None
        s.release_leader("b")
        assert s.leader() is None  # released: nobody holds it, yet the row keeps the epoch
        assert s.acquire_leader("b", ttl_s=30)  # even the same name is a new holder after a release
        assert s.leader_epoch("b") == 3
    finally:
        s.dispose()


def test_a_write_under_a_stale_epoch_loses(store):
    clock = FakeClock()
    s = Store(store.url, clock=clock)
    cluster = s.add_cluster("edge-a", "p", "us-east5-b", "v6e")
    tid = s.submit_task("alice", {"tpu_type": "v6e", "topology": "2x2", "image": "i", "command": ["x"]})
    assert s.acquire_leader("first", ttl_s=30)
    old = Store(store.url, clock=clock, epoch=s.leader_epoch("first"))
    try:
        # under its own epoch every kind of write goes through
        assert old.transition(tid, lc.NEW, lc.WAITING, "waiting", cluster_id=cluster.id)
        lease = old.create_lease(cluster.id, "2x2", "falcon-t1-2x2", "flex-start", tid)
        assert old.move_lease(lease.id, LeaseState.REQUESTED, LeaseState.CREATING)
        old.check_fence()

        clock.advance(31)  # the first controller's process died: its lease expires
        assert s.acquire_leader("second", ttl_s=30)
        new = Store(store.url, clock=clock, epoch=s.leader_epoch("second"))
        before = (s.get_task(tid), s.leases(), _events(s), s.last_granted(cluster.id, "2x2"))

        with pytest.raises(Fenced, match="epoch 1.*epoch 2"):
            old.transition(tid, lc.WAITING, lc.PROVISIONING, "provisioning")
        assert "epoch 2" in old.fenced
        # once fenced, every write refuses at once, and so does the check
        for write in (
            lambda: old.update_task(tid, lc.WAITING, "x"),
            lambda: old.refresh_messages([(tid, lc.WAITING, "x")]),
            lambda: old.create_lease(cluster.id, "2x2", "falcon-t9-2x2", "flex-start", tid),
            lambda: old.move_lease(lease.id, LeaseState.CREATING, LeaseState.READY),
            lambda: old.touch_lease(lease.id, operation="op"),
            old.check_fence,
        ):
            with pytest.raises(Fenced):
                write()
        assert (s.get_task(tid), s.leases(), _events(s), s.last_granted(cluster.id, "2x2")) == before

        # the new holder's writes win
        assert new.transition(tid, lc.WAITING, lc.PROVISIONING, "provisioning")
        assert new.move_lease(lease.id, LeaseState.CREATING, LeaseState.READY)
    finally:
        old.dispose()
        s.dispose()


@pytest.mark.parametrize("write", ["update", "insert"])
def test_each_guarded_statement_loses_without_a_prior_check(store, write):
    """A stale store that never read the lease: the guard inside the statement decides."""
    clock = FakeClock()
    s = Store(store.url, clock=clock)
    cluster = s.add_cluster("edge-a", "p", "us-east5-b", "v6e")
    tid = s.submit_task("alice", {"tpu_type": "v6e", "topology": "2x2", "image": "i", "command": ["x"]})
    assert s.acquire_leader("first", ttl_s=30)
    stale = Store(store.url, epoch=s.leader_epoch("first"))
    assert not s.acquire_leader("second", ttl_s=30)  # first's lease still lives
    clock.advance(31)  # and now it has lapsed
    assert s.acquire_leader("second", ttl_s=30)
    try:
        with pytest.raises(Fenced):
            if write == "update":
                stale.transition(tid, lc.NEW, lc.WAITING, "waiting", cluster_id=cluster.id)
            else:
                stale.create_lease(cluster.id, "2x2", "falcon-t1-2x2", "flex-start", tid)
        assert s.get_task(tid).phase == lc.NEW and s.leases() == [] and s.last_granted(cluster.id, "2x2") == ""
        assert _events(s) == 1  # only the submission's
    finally:
        stale.dispose()
        s.dispose()


def test_a_fenced_queue_and_poller_stop_and_call_nobody(tmp_path):
    b = QueueBench(f"sqlite:///{tmp_path}/q.db")
    assert b.store.acquire_leader("first", ttl_s=30)
    epoch = b.store.leader_epoch("first")
    b.store.epoch = epoch  # the bench's actors now run under the first controller's epoch
    tid = b.submit()
    assert b.phase(tid) == str(lc.WAITING)
    b.port.calls.clear()

    b.clock.advance(31)
    other = Store(b.store.url, clock=b.clock)
    assert other.acquire_leader("second", ttl_s=30)
    t2 = other.submit_task("bob", {"tpu_type": "v6e", "topology": "2x2", "image": "i", "command": ["x"]})

    with pytest.raises(Fenced):
        b.step()  # its first write (Waiting -> Provisioning) loses
    with pytest.raises(Fenced):
        b.step()  # and later steps stop before they observe anything
    with pytest.raises(Fenced):
        b.poller.poll_once()
    assert b.port.calls == []  # no ClusterActor call: no pool, no Job
    assert b.phase(tid) == str(lc.WAITING)
    assert other.get_task(t2).phase == lc.NEW  # the stale poller did not take the new task
    other.dispose()


def test_the_lease_is_renewed_from_the_moment_it_is_taken(store):
    """Before the run loop starts (``DemoRun.start``, or a first ``start()`` that creates
    every actor on a loaded machine and takes longer than the lease lives), the lease must
    already be renewed: a second controller must not take it meanwhile. It once did, in
    a full test run at load 13.

    On a ``ParkingClock`` at the production TTL: the keeper (a real thread) renews at each
    third of the TTL from the instant the lease was taken, not a millisecond before; a
    rival waiting two lifetimes never takes it; once the renewals stop, the lease is still
    held at its expiry and the rival takes it one millisecond later, as a new holder."""
    settings = Settings()
    ttl = settings.leader_ttl_s
    clock = ParkingClock(T0)
    first = Supervisor(settings, store.url, holder="first", clock=clock)
    second = Supervisor(settings, store.url, holder="second", clock=clock)

    def renewed() -> dt.datetime:
        return store.leader()["renewed_at"]

    try:
        m0 = clock.monotonic()
        assert first.wait_for_lead(timeout=5)
        assert clock.until_parked(1) == [m0 + ttl / 3]  # the keeper waits from the instant it was taken
        assert renewed() == T0 and store.leader()["expires_at"] == T0 + dt.timedelta(seconds=ttl)
        for k in range(1, 10):  # three lifetimes, no run loop: only the keeper renews
            clock.advance_to(m0 + k * ttl / 3 - 0.001)
            assert renewed() == T0 + dt.timedelta(seconds=(k - 1) * ttl / 3), f"renewed early, before {k}/3 of the TTL"
            clock.advance_to(m0 + k * ttl / 3)
            assert renewed() == T0 + dt.timedelta(seconds=k * ttl / 3), f"not renewed at {k}/3 of the TTL"
        assert not second.wait_for_lead(timeout=2 * ttl), "the first holder's lease lapsed before its run loop began"
        lease = store.leader()
        assert (lease["holder"], lease["epoch"]) == ("first", 1)
        last = lease["renewed_at"]
        assert lease["expires_at"] == last + dt.timedelta(seconds=ttl)

        first.stop.set()  # the keeper stops (as if its process died: nobody releases the lease)
        clock.advance(0)
        assert clock.deadlines() == []  # the keeper ended: nobody renews
        expiry = m0 + (last - T0).total_seconds() + ttl
        clock.advance_to(expiry)
        assert not second.try_lead() and store.leader()["holder"] == "first"  # held up to its expiry
        clock.advance(0.001)
        assert second.try_lead() and (store.leader()["holder"], second.epoch) == ("second", 2)
    finally:
        first.stop.set()  # (not shutdown(): that looks for actors, and would start a Ray here)
        second.stop.set()
        first.store.dispose()
        second.store.dispose()


def test_the_lease_is_renewed_while_the_first_start_is_still_creating_actors(store):
    """Creating (or adopting) every actor can take longer than the lease's TTL on a busy
    Ray cluster; the lease must not lapse meanwhile, or a waiting controller takes it and
    the first one's actors are fenced before they ever ran (found by the two-controller test).

    On a ``ParkingClock`` at the production TTL, ``run()`` on a thread of its own: the
    start takes three lifetimes; at every half-lifetime of it a rival tries, and finds the
    lease renewed at the keeper's last third. Once the start told the run loop to stop,
    the keeper ends at its next wake without renewing."""
    settings = Settings(registry_interval_s=60)
    ttl = settings.leader_ttl_s
    clock = ParkingClock(T0)
    sup = Supervisor(settings, store.url, holder="first", clock=clock)
    rival = Store(store.url, clock=clock.now)
    stop = threading.Event()
    m0 = clock.monotonic()
    tries: list[tuple[float, bool, dt.datetime]] = []

    def slow_start() -> None:  # stands in for actor creation that outlasts the TTL
        for _ in range(6):
            clock.sleep(ttl / 2)
            took = rival.acquire_leader("second", ttl_s=ttl)
            tries.append((clock.monotonic() - m0, took, rival.leader()["renewed_at"]))
        stop.set()

    sup.start = slow_start  # type: ignore[method-assign]
    runner = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    runner.start()
    try:
        assert clock.until_parked(2) == [m0 + ttl / 3, m0 + ttl / 2]  # the keeper, and the start's first wait
        clock.advance(3 * ttl)
        runner.join(10)
        assert not runner.is_alive()
        # the k-th try, at k/2 of the TTL, finds the lease renewed at the keeper's last third
        # before it; at a tie (k even) the try's wait began first, so it runs first
        def third(k: int) -> dt.datetime:
            return T0 + dt.timedelta(seconds=(math.ceil(3 * k / 2) - 1) * ttl / 3)

        assert tries == [(ttl / 2 * k, False, third(k)) for k in range(1, 7)]
        lease = rival.leader()
        assert (lease["holder"], lease["epoch"], lease["renewed_at"]) == ("first", 1, third(6))
        assert clock.deadlines() == []  # the keeper woke at 3 TTL, saw the run loop stopped, and ended
    finally:
        stop.set()
        rival.dispose()
        sup.store.dispose()


def test_a_lease_read_answers_fence_checks_until_its_expiry_less_the_margin(store):
    """check_fence reads the lease once, then trusts it until expires_at - FENCE_MARGIN_S
    (nobody else can take it before it expires); past that it reads at every check, and a
    newer holder fences it at the first read after the takeover."""
    clock = FakeClock()
    s = Store(store.url, clock=clock)
    assert s.acquire_leader("first", ttl_s=30)
    actor = Store(store.url, clock=clock, epoch=s.leader_epoch("first"))
    try:
        def reads() -> int:
            return actor.breakdown.get("check_fence SELECT", 0)

        actor.check_fence()
        assert reads() == 1
        clock.advance(30 - Store.FENCE_MARGIN_S - 0.5)
        actor.check_fence()
        actor.check_fence()
        assert reads() == 1  # the read holds: no SQL
        clock.advance(1)  # within the margin of the expiry: read again (still ours: nobody took it)
        actor.check_fence()
        actor.check_fence()
        assert reads() == 3  # an expiring lease is read at every check
        assert s.acquire_leader("first", ttl_s=30)  # renewed
        actor.check_fence()
        actor.check_fence()
        assert reads() == 4  # the renewed expiry holds again
        clock.advance(31)
        assert s.acquire_leader("second", ttl_s=30)  # the first's lease expired: taken
        with pytest.raises(Fenced, match="epoch 2"):
            actor.check_fence()
    finally:
        actor.dispose()
        s.dispose()


def test_a_released_lease_is_not_trusted_past_the_read(store):
    """A read that finds the lease released (no holder) holds for nothing: the next check reads."""
    clock = FakeClock()
    s = Store(store.url, clock=clock)
    assert s.acquire_leader("first", ttl_s=30)
    actor = Store(store.url, clock=clock, epoch=s.leader_epoch("first"))
    try:
        s.release_leader("first")
        actor.check_fence()  # the epoch is unchanged: not fenced yet
        assert s.acquire_leader("second", ttl_s=30)
        with pytest.raises(Fenced):
            actor.check_fence()
    finally:
        actor.dispose()
        s.dispose()
