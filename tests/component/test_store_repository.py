"""Store: compare-and-set task moves, events, batched messages, leases, leader lease, fairness state.

Every test runs on SQLite and on MariaDB/MySQL (the ``store`` fixture)."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from collections import deque

import pytest
import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Phase, Reason, Status
from falcon_ray.store import IllegalTransition, Store
from falcon_ray.store.repository import tls_connect_args

SPEC = {"tpu_type": "v6e", "topology": "2x4", "image": "python:3.12", "command": ["true"]}
CLUSTER = "00000000-0000-0000-0000-00000000c001"


def new_task(store: Store, actor: str = "alice") -> int:
    return store.submit_task(actor, SPEC, name="t")


def path_to(target: Phase) -> list[Phase]:
    """Shortest chain of Falcon moves from a freshly submitted task to ``target``."""
    prev: dict[Phase, Phase | None] = {lc.NEW: None}
    todo = deque([lc.NEW])
    while todo:
        cur = todo.popleft()
        for src, dst in lc.TASK_TRANSITIONS:
            if src == cur and dst not in prev and dst != lc.ABORTING:
                prev[dst] = cur
                todo.append(dst)
    assert target in prev, f"{target} is unreachable"
    chain: list[Phase] = []
    node: Phase | None = target
    while node is not None:
        chain.append(node)
        node = prev[node]
    return chain[::-1]


def drive(store: Store, task_id: int, target: Phase) -> None:
    chain = path_to(target)
    for src, dst in zip(chain, chain[1:], strict=False):
        extra = {"cluster_id": CLUSTER} if dst == lc.WAITING else {}
        assert store.transition(task_id, src, dst, f"to {dst}", **extra), (src, dst)
    assert store.get_task(task_id).phase == target


def row_phase(store: Store, task_id: int) -> Phase:
    return store.get_task(task_id).phase


def event_phases(store: Store, task_id: int) -> list[str]:
    return [str(Phase(Status(e.status), Reason(e.reason))) for e in store.events(task_id)]


# --- compare-and-set ----------------------------------------------------------------

FALCON_EDGES_FROM_LIVE = [
    (src, dst)
    for (src, dst), who in lc.TASK_TRANSITIONS.items()
    if src in lc.LIVE_PHASES and not who.startswith(lc.UPPER)
]


@pytest.mark.parametrize("src,dst", FALCON_EDGES_FROM_LIVE, ids=lambda p: str(p))
def test_no_controller_write_overwrites_abort(store, src, dst):
    tid = new_task(store)
    drive(store, tid, src)
    message_before = store.get_task(tid).message
    assert store.request_abort(tid)
    statements = store.statements

    assert store.transition(tid, src, dst, "controller write").won is False
    assert store.update_task(tid, src, message="controller message").won is False
    assert store.refresh_messages([(tid, src, "refreshed")]) == 0

    task = store.get_task(tid)
    assert task.status == "Aborting" and task.aborting_at is not None
    assert task.message == message_before
    assert event_phases(store, tid)[-1] == "Aborting"
    assert store.statements > statements  # the writes really ran and lost

    assert store.transition(tid, lc.ABORTING, lc.ABORTED, "aborted")
    task = store.get_task(tid)
    assert task.status == "Aborted" and task.reason == "" and task.aborted_at and task.finished_at


def test_lost_compare_and_set_returns_false_and_changes_nothing(store):
    tid = new_task(store)
    drive(store, tid, lc.WAITING)
    assert store.transition(tid, lc.WAITING, lc.PROVISIONING, "creating").won is True
    before = store.get_task(tid)
    assert store.transition(tid, lc.WAITING, lc.PROVISIONING, "again").won is False
    assert store.transition(tid, lc.WAITING, lc.DISPATCHING, "reuse").won is False
    after = store.get_task(tid)
    assert after == before
    assert event_phases(store, tid).count("Pending/Provisioning") == 1
    assert store.transition(999_999, lc.WAITING, lc.PROVISIONING, "no such task").won is False


@pytest.mark.parametrize(
    "src,dst",
    [
        (lc.NEW, lc.RUNNING),
        (lc.WAITING, lc.SUCCEEDED),
        (lc.ABORTING, lc.WAITING),
        (lc.ABORTING, lc.RUNNING),
        (lc.ABORTED, lc.ABORTING),
        (lc.SUCCEEDED, lc.RUNNING),
        (lc.RUNNING, lc.PROVISIONING),
        (lc.DISPATCHING, lc.WAITING),
    ],
    ids=str,
)
def test_illegal_transition_raises_before_any_sql(store, src, dst):
    tid = new_task(store)
    before = store.statements
    with pytest.raises(IllegalTransition):
        store.transition(tid, src, dst, "nope")
    with pytest.raises(IllegalTransition):  # one bad source in a list is enough
        store.transition(tid, [lc.WAITING, src] if src != lc.WAITING else [src], dst, "nope")
    assert store.statements == before


def test_race_abort_against_controller_writes(store):
    """Thread A aborts while thread B hammers Waiting->Provisioning and the acquisition moves.
    Whatever the interleaving, an abort is never overwritten."""
    ids = []
    for _ in range(12):
        tid = new_task(store)
        drive(store, tid, lc.WAITING)
        ids.append(tid)
    start = threading.Barrier(2)
    done = threading.Event()
    first_win = threading.Event()
    wins = {tid: 0 for tid in ids}
    errors: list[BaseException] = []

    def controller():
        try:
            start.wait()
            rounds = 0
            while not done.is_set() or rounds < 2:
                for tid in ids:
                    for src, dst in (
                        (lc.WAITING, lc.PROVISIONING),
                        (lc.PROVISIONING, lc.CLUSTER_BUSY),
                        (lc.CLUSTER_BUSY, lc.PROVISIONING),
                    ):
                        if store.transition(tid, src, dst, f"{dst}"):
                            wins[tid] += 1
                            first_win.set()
                rounds += 1
        except BaseException as e:  # surfaced below
            errors.append(e)

    def upper_layer():
        try:
            start.wait()
            first_win.wait(timeout=30)  # wall-clock: two real threads race on a real database; abort while the controller is busy
            order = ids[:]
            random.Random(7).shuffle(order)
            for tid in order:
                assert store.request_abort(tid)
                time.sleep(0.002)  # wall-clock: spaces the real threads' writes so the race interleaves
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    threads = [threading.Thread(target=controller), threading.Thread(target=upper_layer)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    assert sum(wins.values()) > 0, "the controller never won a write: the race did not happen"

    for tid in ids:
        assert store.get_task(tid).status == "Aborting"
        phases = event_phases(store, tid)
        assert phases[-1] == "Aborting", phases  # nothing was written after the abort
        assert phases.count("Aborting") == 1
        # every controller win is in the log, before the abort
        assert len(phases) - 3 == wins[tid], (phases, wins[tid])  # Pending, Waiting, ..., Aborting
        assert store.transition(tid, lc.WAITING, lc.PROVISIONING, "late").won is False
        assert store.transition(tid, lc.ABORTING, lc.ABORTED, "aborted")
        assert store.get_task(tid).status == "Aborted"


def test_abort_only_live_tasks(store):
    tid = new_task(store)
    drive(store, tid, lc.SUCCEEDED)
    assert store.request_abort(tid) is False
    assert store.get_task(tid).status == "Succeeded"
    assert store.request_abort(424242) is False
    live = new_task(store)
    assert store.request_abort(live) is True
    assert store.request_abort(live) is False  # already Aborting


# --- events -----------------------------------------------------------------------


def test_events_only_on_status_or_reason_changes(store):
    tid = new_task(store)
    assert event_phases(store, tid) == ["Pending"]
    drive(store, tid, lc.PROVISIONING)
    assert event_phases(store, tid) == ["Pending", "Pending/Waiting", "Pending/Provisioning"]

    store.update_task(tid, lc.PROVISIONING, message="still creating", node_pool_name="falcon-abc")
    store.refresh_messages([(tid, lc.PROVISIONING, "creating, 2 min")])
    store.transition(tid, lc.WAITING, lc.PROVISIONING, "lost")  # lost CAS: no event
    assert len(store.events(tid)) == 3

    assert store.transition(tid, [lc.PROVISIONING, lc.CLUSTER_BUSY], lc.CLUSTER_BUSY, "busy 1")
    assert len(store.events(tid)) == 4
    # the self-loop ClusterBusy -> ClusterBusy refreshes the message, logs nothing
    assert store.transition(tid, [lc.PROVISIONING, lc.CLUSTER_BUSY], lc.CLUSTER_BUSY, "busy 2")
    assert store.transition(tid, lc.CLUSTER_BUSY, lc.CLUSTER_BUSY, "busy 3")
    assert store.get_task(tid).message == "busy 3"
    assert event_phases(store, tid)[-1] == "Pending/ClusterBusy"
    assert len(store.events(tid)) == 4

    assert store.transition(tid, lc.CLUSTER_BUSY, lc.PROVISIONING, "headroom back")
    events = store.events(tid)
    assert [e.message for e in events][-2:] == ["busy 1", "headroom back"]
    assert all(a.at <= b.at for a, b in zip(events, events[1:], strict=False))


def test_event_and_row_agree_on_terminal_moves(store):
    tid = new_task(store)
    drive(store, tid, lc.RUNNING)
    assert store.transition(tid, lc.RUNNING, lc.failed(Reason.TIMEOUT), "Task timed out (5s)")
    task = store.get_task(tid)
    assert (task.status, task.reason) == ("Failed", "Timeout") and task.finished_at is not None
    last = store.events(tid)[-1]
    assert (last.status, last.reason, last.message) == ("Failed", "Timeout", "Task timed out (5s)")


def test_messages_are_clipped_to_the_column(store):
    tid = new_task(store)
    assert store.transition(tid, lc.NEW, lc.failed(Reason.INVALID_SPEC), "x" * 10_000)
    assert len(store.get_task(tid).message) == 4000
    assert len(store.events(tid)[-1].message) == 4000


# --- batched message refresh ----------------------------------------------------------


def test_refresh_messages_is_one_statement_and_skips_moved_rows(store):
    ids = []
    for _ in range(5):
        tid = new_task(store)
        drive(store, tid, lc.WAITING)
        ids.append(tid)
    # the last one moved on before the refresh
    assert store.transition(ids[-1], lc.WAITING, lc.PROVISIONING, "creating")
    events_before = {tid: len(store.events(tid)) for tid in ids}
    store.get_task(ids[0])  # warm the connection pool

    before = store.statements
    changed = store.refresh_messages([(tid, lc.WAITING, f"Queue position #{i + 1}") for i, tid in enumerate(ids)])
    # one UPDATE, and its COMMIT where the driver does not commit each statement (SQLite)
    assert store.statements - before == (1 if store.autocommit else 2)
    assert changed == 4
    for i, tid in enumerate(ids[:-1]):
        assert store.get_task(tid).message == f"Queue position #{i + 1}"
    assert store.get_task(ids[-1]).message == "creating"
    assert {tid: len(store.events(tid)) for tid in ids} == events_before
    assert store.refresh_messages([]) == 0


# --- reads ------------------------------------------------------------------------------


def test_intake_and_live_tasks(store):
    a, b, c = (new_task(store) for _ in range(3))
    drive(store, b, lc.WAITING)
    store.request_abort(c)
    new, aborting = store.intake()
    assert [x.id for x in new] == [a]
    assert [x.id for x in aborting] == [c]
    assert [x.id for x in store.live_tasks(CLUSTER)] == [b]
    assert [x.id for x in store.recent_tasks(2)] == [c, b]


# --- node-pool leases -----------------------------------------------------------------


def test_lease_compare_and_set(store):
    lease = store.create_lease(CLUSTER, "2x4", "falcon-2x4-aaaa", "flex-start", task_id=7)
    assert lease.state == "Requested" and lease.task_id == 7
    again = store.create_lease(CLUSTER, "2x4", "falcon-2x4-aaaa", "flex-start", task_id=7)
    assert again.id == lease.id  # idempotent by name: a crash before the create adopts the row

    assert store.move_lease(lease.id, LeaseState.REQUESTED, LeaseState.CREATING, operation="op-1")
    assert not store.move_lease(lease.id, LeaseState.REQUESTED, LeaseState.CREATING)  # lost
    with pytest.raises(IllegalTransition):
        store.move_lease(lease.id, LeaseState.CREATING, LeaseState.REQUESTED)
    with pytest.raises(IllegalTransition):
        store.move_lease(lease.id, LeaseState.DELETED, LeaseState.IN_USE)

    assert store.move_lease(lease.id, LeaseState.CREATING, LeaseState.IN_USE)
    assert store.move_lease(lease.id, LeaseState.IN_USE, LeaseState.IDLE)
    idle = store.get_lease(CLUSTER, "falcon-2x4-aaaa")
    assert idle.state == "Idle" and idle.task_id is None and idle.idle_since is not None
    assert idle.operation == "op-1"

    assert store.move_lease(lease.id, LeaseState.IDLE, LeaseState.DELETING)
    assert store.move_lease(lease.id, LeaseState.DELETING, LeaseState.DELETING, delete_attempts=1)
    assert store.move_lease(lease.id, [LeaseState.DELETING], LeaseState.DELETED)
    gone = store.get_lease(CLUSTER, "falcon-2x4-aaaa")
    assert gone.state == "Deleted" and gone.deleted_at is not None and gone.delete_attempts == 1
    assert store.leases(CLUSTER) == []
    assert [x.id for x in store.leases(CLUSTER, live_only=False)] == [lease.id]


def test_gke_acceptance_is_written_with_the_creating_move_and_read_back(store):
    """``accepted_at`` (the create's timeout counts from it) goes with the Requested ->
    Creating move, in its one statement, and a restarted queue reads it from the row."""
    lease = store.create_lease(CLUSTER, "2x4", "falcon-2x4-acc", "flex-start", task_id=7)
    assert lease.accepted_at is None
    plain = store.create_lease(CLUSTER, "2x4", "falcon-2x4-plain", "flex-start", task_id=8)
    before = store.statements
    assert store.move_lease(plain.id, LeaseState.REQUESTED, LeaseState.CREATING, operation="op-0")
    cost = store.statements - before
    at = lease.created_at + dt.timedelta(hours=1)  # it waited an hour behind other operations
    before = store.statements
    assert store.move_lease(lease.id, LeaseState.REQUESTED, LeaseState.CREATING, operation="op-1", accepted_at=at)
    assert store.statements - before == cost  # no statement more than the move without it
    read = store.get_lease(CLUSTER, "falcon-2x4-acc")
    assert read.accepted_at == at and read.created_at == lease.created_at and read.operation == "op-1"


def test_same_pool_name_on_two_clusters_is_two_leases(store):
    a = store.create_lease(CLUSTER, "2x4", "falcon-x", "reservation", None)
    b = store.create_lease("other-cluster", "2x4", "falcon-x", "reservation", None)
    assert a.id != b.id


# --- leader lease -----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = dt.datetime(2030, 1, 1, 12, 0, 0)

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def test_leader_lease_refuses_a_second_holder_until_expiry(store):
    clock = FakeClock()
    s = Store(store.url, clock=clock)
    try:
        assert s.acquire_leader("ctl-a", ttl_s=30)
        assert not s.acquire_leader("ctl-b", ttl_s=30)
        clock.advance(20)
        assert s.acquire_leader("ctl-a", ttl_s=30)  # renewal pushes expiry to +50
        clock.advance(29)
        assert not s.acquire_leader("ctl-b", ttl_s=30)
        assert s.leader()["holder"] == "ctl-a"
        clock.advance(2)  # a's lease expired
        assert s.acquire_leader("ctl-b", ttl_s=30)
        assert not s.acquire_leader("ctl-a", ttl_s=30)  # the old holder cannot take it back
        assert s.leader()["holder"] == "ctl-b"
        s.release_leader("ctl-a")  # not the holder: no effect
        assert s.leader()["holder"] == "ctl-b"
        s.release_leader("ctl-b")
        assert s.leader() is None
        assert s.acquire_leader("ctl-a", ttl_s=30)
    finally:
        s.dispose()


# --- queue fairness state ------------------------------------------------------------


def test_last_granted_is_the_actor_of_the_newest_move_that_took_the_queue_slot(store):
    """No write of its own: the newest Provisioning or Dispatching entry among the queue's
    tasks' events names it; Waiting, another topology's picks and other moves do not."""
    assert store.last_granted(CLUSTER, "2x4") == ""

    def queued(actor: str, topology: str) -> int:
        tid = store.submit_task(actor, {"tpu_type": "v6e", "topology": topology, "image": "i"})
        assert store.transition(tid, lc.NEW, lc.WAITING, "w", cluster_id=CLUSTER, topology=topology)
        return tid

    a, b, c = queued("alice", "2x4"), queued("bob", "2x4"), queued("carol", "4x4")
    assert store.last_granted(CLUSTER, "2x4") == ""  # Waiting grants nothing
    assert store.transition(a, lc.WAITING, lc.PROVISIONING, "picked")
    assert store.last_granted(CLUSTER, "2x4") == "alice"
    assert store.transition(a, lc.PROVISIONING, lc.DISPATCHING, "pool ready")  # the holder again
    assert store.transition(c, lc.WAITING, lc.DISPATCHING, "hand-over")  # the other queue's pick
    assert store.last_granted(CLUSTER, "2x4") == "alice" and store.last_granted(CLUSTER, "4x4") == "carol"
    assert store.transition(b, lc.WAITING, lc.DISPATCHING, "hand-over")
    assert store.last_granted(CLUSTER, "2x4") == "bob"
    read = store.queue_snapshot("edge-a", "2x4", with_granted=False)
    assert read.last_granted is None  # not read


# --- clusters --------------------------------------------------------------------------


def test_clusters_registry(store):
    c = store.add_cluster("edge-1", "proj", "us-central1", "v6e", default_reservation="res-1")
    assert store.get_cluster("edge-1") == c == store.get_cluster(c.id)
    assert c.namespace == "falcon-jobs" and c.active
    assert store.set_cluster_status("edge-1", "maintenance")
    assert store.get_cluster("edge-1").status == "maintenance"
    assert not store.set_cluster_status("nope", "offline")
    with pytest.raises(ValueError):
        store.set_cluster_status("edge-1", "broken")
    with pytest.raises(ValueError):
        store.add_cluster("edge-2", "p", "l", "v6e", status="dead")


def test_abort_set_by_the_upper_layers_own_sql_still_gets_its_event(store):
    import sqlalchemy as sa

    from falcon_ray import lifecycle as lc
    from falcon_ray.store import tables

    c = store.add_cluster("edge-z", "p", "us-east5-b", "v6e")
    tid = store.submit_task("alice", {"x": 1})
    assert store.transition(tid, lc.NEW, lc.WAITING, "queued", cluster_id=c.id)
    at = store.clock()
    with store.engine.begin() as conn:  # the upper layer, bypassing Store.request_abort
        conn.execute(sa.update(tables.jobs).where(tables.jobs.c.id == tid).values(status="Aborting", aborting_at=at))
    assert store.transition(tid, lc.ABORTING, lc.ABORTED, "Aborted by user")
    steps = [(e.status, e.reason) for e in store.events(tid)]
    assert steps == [("Pending", ""), ("Pending", "Waiting"), ("Aborting", ""), ("Aborted", "")]
    # through request_abort the event exists already: no second one
    tid2 = store.submit_task("bob", {"x": 1})
    assert store.request_abort(tid2)
    assert store.transition(tid2, lc.ABORTING, lc.ABORTED, "Aborted by user")
    assert [e.status for e in store.events(tid2)].count("Aborting") == 1


# --- statements sent (issue 11) ------------------------------------------------------------


def test_statements_per_call_read_one_write_one_move_in_one_transaction(store):
    """A read is one statement and a one-statement write is one (on MySQL the driver commits
    it: no ROLLBACK after a read, no COMMIT after a write); a task move is its UPDATE and
    its event row in one transaction ended by its COMMIT alone: no BEGIN is sent (on MySQL
    the transaction's pool is not in autocommit, its first statement opens it)."""
    tid = new_task(store)
    store.get_task(tid)  # warm the pool
    before = store.statements
    store.get_task(tid)
    read = store.statements - before
    before = store.statements
    assert store.update_task(tid, lc.NEW, "held")
    write = store.statements - before
    before = store.statements
    assert store.transition(tid, lc.NEW, lc.WAITING, "queued", cluster_id=CLUSTER, topology="2x4")
    move = store.statements - before  # + the task's falcon_task_queue row: one REPLACE (INSERT OR REPLACE on SQLite)
    if store.autocommit:
        assert (read, write, move) == (1, 1, 4)
    else:
        assert (read, write, move) == (2, 2, 4)
    assert event_phases(store, tid)[-1] == str(lc.WAITING)


def test_a_failed_move_leaves_neither_row_nor_event(store):
    """The explicit transaction is rolled back whole when a statement in it fails."""
    if not store.autocommit:
        pytest.skip("SQLite does not check VARCHAR widths: nothing fails there; engine.begin() is its transaction")
    tid = new_task(store)
    events = len(store.events(tid))
    with pytest.raises(Exception, match="too long|Data too long|1406"):
        store.transition(tid, lc.NEW, lc.WAITING, "queued", cluster_id=CLUSTER, topology="x" * 100)  # the queue row fails
    assert store.get_task(tid).phase == lc.NEW
    assert len(store.events(tid)) == events


def test_transition_many_is_one_update_per_kind_and_tells_each_lost_move(store):
    """The poller's assignments: one compare-and-set UPDATE for the batch; a task the upper
    layer aborted meanwhile loses (no event, no queue row), the others win with their own
    Message and cluster."""
    from falcon_ray.store import tables as t

    ids = [new_task(store) for _ in range(4)]
    assert store.request_abort(ids[1])
    moves = [(tid, lc.NEW, lc.WAITING, f"queued {tid}", {"cluster_id": f"c-{tid % 2}"}) for tid in ids]
    before = store.statements
    won = store.transition_many(moves, ["2x4"] * 4)
    sent = store.statements - before
    assert won == [True, False, True, True]
    # UPDATE, the look-up of who won, events INSERT, queue rows in one REPLACE, and the
    # transaction's COMMIT (no BEGIN is sent)
    assert sent == 5
    for tid, w in zip(ids, won, strict=True):
        row = store.get_task(tid)
        if w:
            assert (row.phase, row.message, row.cluster_id) == (lc.WAITING, f"queued {tid}", f"c-{tid % 2}")
            assert event_phases(store, tid)[-1] == str(lc.WAITING)
        else:
            assert row.status == Status.ABORTING and row.cluster_id is None
    with store.engine.connect() as c:
        queued = dict(c.execute(sa.select(t.task_queue.c.task_id, t.task_queue.c.cluster_id)).all())
    assert queued == {tid: f"c-{tid % 2}" for tid, w in zip(ids, won, strict=True) if w}
    before = store.statements
    assert store.transition_many([(ids[0], lc.WAITING, lc.PROVISIONING, "picked", {})]) == [True]
    assert store.statements - before == 3  # all won: no look-up


def test_a_connection_is_plain_unless_the_url_asks_for_tls(store):
    """PyMySQL 1.2 would try TLS on every connection (~42 ms of CPU each, no certificate
    checked); Falcon's connections use TLS exactly when the URL has an ``ssl*`` option."""
    url = store.url
    if url.startswith("sqlite"):
        assert tls_connect_args(url) == {}
        return
    with store.engine.connect() as c:
        assert c.connection.driver_connection.ssl is False
    with store.tx_engine.connect() as c:
        assert c.connection.driver_connection.ssl is False
    assert tls_connect_args(url) == {"ssl_disabled": True}
    sep = "&" if "?" in url else "?"
    assert tls_connect_args(f"{url}{sep}ssl_ca=/etc/falcon/server-ca.pem") == {}
    assert tls_connect_args(f"{url}{sep}ssl_verify_identity=true") == {}


def test_queue_leases_hold_every_row_of_an_acquiring_task_and_only_live_rows_of_the_others(store):
    """A new create never takes a name a lease row holds: the queue reads every row of its
    acquiring tasks (Deleted ones too, refused or not), and only the live rows of the others."""
    c = store.add_cluster("edge-q", "p", "us-east5-b", "v6e")
    acquiring, done = new_task(store), new_task(store, "bob")
    for tid in (acquiring, done):
        assert store.transition(tid, lc.NEW, lc.WAITING, "waiting", cluster_id=c.id)
        assert store.transition(tid, lc.WAITING, lc.PROVISIONING, "creating")
    names = {}
    for tid, name in ((acquiring, "falcon-a"), (done, "falcon-d")):
        lease = store.create_lease(c.id, "2x2", name, "reservation", tid)
        assert store.move_lease(lease.id, LeaseState.REQUESTED, LeaseState.DELETING)
        assert store.move_lease(lease.id, LeaseState.DELETING, LeaseState.DELETED)
        names[tid] = name
    assert store.transition(done, lc.PROVISIONING, lc.failed(lc.Reason.NODE_POOL_FAILED), "failed")
    live = store.create_lease(c.id, "2x2", "falcon-live", "reservation", None)
    got = {l.name: l.state for l in store.queue_leases(c.id, "2x2")}
    assert got == {"falcon-a": LeaseState.DELETED, "falcon-live": live.state}


def test_disruptions_are_recorded_once_per_run_and_read_in_order(store):
    a, b = new_task(store), new_task(store)
    assert store.record_disruption(a, 0, "maintenance", "node-0", "falcon-task-1", "drained")
    assert not store.record_disruption(a, 0, "repair", "node-9", "falcon-task-1", "again"), "a run is recorded once"
    assert store.record_disruption(a, 1, "reclaim", "", "falcon-task-1-a1", "x" * 5000)  # a long detail is cut
    got = store.disruptions([a, b])
    assert list(got) == [a]
    first, second = got[a]
    assert (first.attempt, first.kind, first.node, first.job, first.detail) == (0, "maintenance", "node-0", "falcon-task-1", "drained")
    assert (second.attempt, second.kind, len(second.detail)) == (1, "reclaim", 1000)
