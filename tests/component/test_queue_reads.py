"""The queue's read path (issue 11): a QueueReconciler reads only its own queue's rows, and
between full reads only what may have changed, without missing what others change.

A QueueReconciler on SQLite with a fake port and clock; ``queue_full_read_s`` is set so long
that every round after the first is an incremental one unless a test says otherwise."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import Reason
from tests.harness.fakes import QueueBench


@pytest.fixture
def bench(tmp_path) -> QueueBench:
    return QueueBench(f"sqlite:///{tmp_path / 'q.db'}", queue_full_read_s=3600)


class Reads:
    """Records how many task rows each of the queue's reads returned, and whether it was full."""

    def __init__(self, bench: QueueBench) -> None:
        self.calls: list[tuple[bool, int]] = []
        store = bench.store
        inner = store.queue_snapshot

        def counted(*a, **kw):
            snap = inner(*a, **kw)
            self.calls.append((kw.get("delta") is None, len(snap.tasks)))
            return snap

        store.queue_snapshot = counted  # type: ignore[method-assign]


def ids(bench: QueueBench, phase=None) -> set[int]:
    st = bench.queue.last_state
    return {t.id for t in st.tasks if phase is None or t.phase == phase} if st else set()


def test_incremental_rounds_read_what_changed_not_every_waiting_task(bench):
    first = bench.submit("alice")
    waiting = [bench.submit(f"u{i}") for i in range(30)]
    reads = Reads(bench)
    bench.step()
    assert bench.phase(first) == str(lc.PROVISIONING)
    assert ids(bench, lc.WAITING) == set(waiting)
    reads.calls.clear()
    for _ in range(3):
        bench.step(advance=1)
    assert reads.calls and not any(full for full, _ in reads.calls)
    assert max(n for _, n in reads.calls) <= 2  # the slot holder (and nothing of the 30 waiting)
    assert ids(bench, lc.WAITING) == set(waiting)  # kept from the first read


def test_upper_layer_abort_of_a_waiting_task_is_seen_between_full_reads(bench):
    bench.submit("alice")
    victim = bench.submit("bob")
    bench.step()
    assert bench.phase(victim) == str(lc.WAITING)
    full_at = bench.queue.full_read_at
    assert bench.store.request_abort(victim)
    bench.step(advance=1)
    assert bench.queue.full_read_at == full_at  # no full read happened
    assert bench.task(victim).status == lc.Status.ABORTED
    assert victim not in ids(bench)


def test_task_assigned_after_the_first_read_joins_the_queue(bench):
    bench.submit("alice")
    bench.step()
    late = bench.submit("carol")  # the poller's assignment writes its falcon_task_queue row
    bench.step(advance=1)
    assert late in ids(bench, lc.WAITING)
    assert "position" in bench.task(late).message.lower() or bench.task(late).message


def test_a_task_assigned_between_a_full_reads_statements_is_not_skipped(bench):
    """A full read is two statements with no snapshot between them: the rows, and the
    queue's newest assignment (where the next incremental read starts). A task the poller
    assigns between them must still reach the queue: the newest assignment is read first,
    so it can never run ahead of the rows (read after, it would name the new task's seq
    while the rows lack it, and every incremental read after would skip the task)."""
    bench.submit("alice")
    late: list[int] = []

    def assign_in_between(conn, cursor, statement, params, context, executemany):
        if not late and statement.startswith("SELECT jobs.id") and "falcon_task_queue" in statement:  # the rows
            late.append(bench.submit("carol"))  # another connection: WAL lets it commit now

    sa.event.listen(bench.store.engine, "after_cursor_execute", assign_in_between)
    try:
        bench.step()  # the first step's read is a full one
    finally:
        sa.event.remove(bench.store.engine, "after_cursor_execute", assign_in_between)
    assert late, "the hook never ran: the full read's statements changed"
    bench.step(advance=1)  # an incremental read
    assert late[0] in ids(bench, lc.WAITING), bench.queue.mirror.seq


def test_other_topologies_of_the_cluster_are_not_read(bench):
    mine = bench.submit("alice")
    other = [bench.submit("bob", topology="2x4") for _ in range(5)]
    reads = Reads(bench)
    bench.queue.full_read_at = -float("inf")
    bench.step()
    assert reads.calls[0] == (True, 1)
    assert ids(bench) == {mine} and not set(other) & ids(bench)


def test_a_queue_that_was_restarted_reads_everything_again(bench):
    first = bench.submit("alice")
    waiting = [bench.submit(f"u{i}") for i in range(4)]
    bench.step()
    bench.restart()
    bench.step(advance=1)
    assert ids(bench) == {first, *waiting}


def test_cluster_set_by_hand_without_topology_records_the_queue_from_the_spec(bench):
    """A transition that gives a cluster without naming the topology (tests, tools) reads it
    from the spec, so the queue still finds the task."""
    tid = bench.store.submit_task("dave", {"tpu_type": "v6e", "topology": "2x2", "image": "i:1", "command": ["x"]})
    assert bench.store.transition(tid, lc.NEW, lc.WAITING, "queued", cluster_id=bench.cluster.id)
    bench.queue.full_read_at = -float("inf")
    bench.step()
    assert tid in ids(bench)


def test_full_read_every_queue_full_read_s_heals_a_row_changed_by_hand(tmp_path):
    """A Waiting row finished by hand (no path of Falcon's) is dropped at the next full read."""
    bench = QueueBench(f"sqlite:///{tmp_path / 'q.db'}", queue_full_read_s=0.2)
    bench.submit("alice")
    gone = bench.submit("bob")
    bench.step()
    with bench.store.engine.begin() as c:
        from falcon_ray.store import tables as t

        c.execute(t.jobs.update().where(t.jobs.c.id == gone).values(status="Failed", reason=Reason.JOB_FAILED.value))
    bench.step(advance=0.1)
    assert gone in ids(bench)  # the last full read is younger than 0.2 s
    bench.step(advance=0.1)
    assert gone not in ids(bench)


def test_an_empty_queue_step_is_one_read(bench):
    """Nothing live and no pools: a step reads only what may have come (the registry is
    read again with the next full read), so idle queues cost almost nothing."""
    bench.step()
    before = bench.store.statements
    for _ in range(5):
        bench.step(advance=1)
    per_step = (bench.store.statements - before) / 5
    assert per_step == (1 if bench.store.autocommit else 2)  # SQLite: the SELECT and its ROLLBACK
    tid = bench.submit("alice")  # and it still sees new work at once
    bench.step(advance=1)
    assert tid in ids(bench)


def test_a_waiting_task_aborted_is_finished_by_the_poller_even_with_its_queue_stalled(bench):
    """A task aborted while Waiting holds nothing on the cluster: the poller ends it at once,
    with no step of its queue (which may be restarting, or waiting on its ClusterActor); a
    task that holds the slot is left to its queue, which must delete what it holds."""
    holder = bench.submit("alice")
    victim = bench.submit("bob")
    bench.step()
    assert bench.phase(holder) == str(lc.PROVISIONING) and bench.phase(victim) == str(lc.WAITING)
    assert bench.store.request_abort(victim) and bench.store.request_abort(holder)
    bench.port.calls.clear()
    bench.poller.poll_once()  # no queue step
    assert bench.task(victim).status == lc.Status.ABORTED
    assert bench.task(holder).status == lc.Status.ABORTING  # its pool is the queue's to clean
    assert ("hint", "edge-a", "2x2") in bench.port.took("hint")
    bench.step(advance=1)
    assert bench.task(holder).status == lc.Status.ABORTED
    assert [e.status for e in bench.store.events(victim)][-2:] == ["Aborting", "Aborted"]


def test_a_pick_in_the_instant_of_the_abort_leaves_nothing_held(bench):
    """The race the poller's finish must survive: the queue read the task Waiting and picks
    it for the slot while the abort lands and the poller ends it. The queue's group stops at
    its lost compare-and-set: no pool is asked for, nothing is left held."""
    victim = bench.submit("bob")
    real = bench.store.queue_snapshot

    def abort_after_read(*a, **kw):  # the abort and the poller land between read and write
        snap = real(*a, **kw)
        if bench.task(victim).status == lc.Status.PENDING:
            assert bench.store.request_abort(victim)
            bench.poller.poll_once()
        return snap

    bench.store.queue_snapshot = abort_after_read  # type: ignore[method-assign]
    bench.port.calls.clear()
    bench.step()
    bench.store.queue_snapshot = real  # type: ignore[method-assign]
    assert bench.task(victim).status == lc.Status.ABORTED
    assert not bench.port.took("ensure_pool")  # the group stopped before GKE was asked
    events = [(e.status, e.reason) for e in bench.store.events(victim)]
    assert events[-2:] == [("Aborting", ""), ("Aborted", "")], events  # the queue's pick lost, wrote nothing
    for _ in range(3):
        bench.step(advance=1)
    held = [(l.name, l.state) for l in bench.store.leases(live_only=False) if l.state in ("Requested", "Creating", "Ready", "InUse")]
    assert not held, held
