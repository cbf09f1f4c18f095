"""The Store's reads and writes that issue 25 made cheaper answer as the reads they replace,
and ``Store.breakdown`` counts each statement under the method that sent it.

Every test runs on SQLite and on MariaDB/MySQL (the ``store`` fixture)."""

from __future__ import annotations

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState
from falcon_ray.store import Store
from tests.harness.db import STORE_CLUSTER as CLUSTER
from tests.harness.db import waiting_task


def test_breakdown_counts_each_statement_under_its_method_and_kind(store):
    tid = waiting_task(store)
    store.get_task(tid)  # warm both pools
    before, counts = store.statements, dict(store.breakdown)
    store.get_task(tid)
    assert store.update_task(tid, lc.WAITING, "held")
    assert store.transition(tid, lc.WAITING, lc.PROVISIONING, "picked")
    sent = {k: n - counts.get(k, 0) for k, n in store.breakdown.items() if n != counts.get(k, 0)}
    assert sum(sent.values()) == store.statements - before
    assert sent["get_task SELECT"] == 1 and sent["update_task UPDATE"] == 1
    assert sent["transition UPDATE"] == 1 and sent["transition INSERT"] == 1 and sent["transition COMMIT"] == 1


def test_a_requeued_task_keeps_one_queue_row_with_a_new_seq(store):
    """The queue row is replaced in one statement: still one row per task, a newer seq."""
    from falcon_ray.store import tables as t

    tid = waiting_task(store)
    with store.engine.connect() as c:
        (seq1,) = c.execute(t.task_queue.select().with_only_columns(t.task_queue.c.seq).where(t.task_queue.c.task_id == tid)).one()
    assert store.unassign(tid, "back")
    assert store.transition(tid, lc.NEW, lc.WAITING, "again", cluster_id=CLUSTER, topology="2x4")
    with store.engine.connect() as c:
        rows = c.execute(t.task_queue.select().where(t.task_queue.c.task_id == tid)).all()
    assert len(rows) == 1 and rows[0].seq > seq1 and rows[0].topology == "2x4"


def test_fleet_load_is_the_pending_and_running_tasks_per_queue_and_the_ready_idle_leases(store):
    waiting_task(store)
    waiting_task(store, "bob")
    runs = waiting_task(store, "carol")
    assert store.transition(runs, lc.WAITING, lc.DISPATCHING, "picked, an idle pool")
    assert store.transition(runs, lc.DISPATCHING, lc.RUNNING, "running")
    ended = waiting_task(store, "dave")
    assert store.transition(ended, lc.WAITING, lc.DISPATCHING, "picked, an idle pool")
    assert store.transition(ended, lc.DISPATCHING, lc.SUCCEEDED, "done")
    ready = store.create_lease(CLUSTER, "2x2", "falcon-a", "flex-start", None)
    assert store.move_lease(ready.id, LeaseState.REQUESTED, LeaseState.CREATING)
    assert store.move_lease(ready.id, LeaseState.CREATING, LeaseState.IDLE, ready_at=store.clock())
    store.create_lease(CLUSTER, "2x2", "falcon-b", "flex-start", None)  # Requested: not idle
    depth, running, idle = store.fleet_load()
    assert depth == {(CLUSTER, "2x2"): 2} and running == {(CLUSTER, "2x2"): 1}
    assert idle == {(CLUSTER, "2x2"): 1}


def test_create_lease_answers_the_row_as_read_back(store):
    lease = store.create_lease(CLUSTER, "2x2", "falcon-c", "reservation", 7)
    assert lease == store.get_lease(CLUSTER, "falcon-c")
    again = store.create_lease(CLUSTER, "2x2", "falcon-c", "reservation", 7)  # written before a crash: adopted
    assert again == lease


def test_entered_and_disruptions_is_both_reads_in_one(store):
    a, b = waiting_task(store), waiting_task(store, "bob")
    assert store.record_disruption(b, 0, "maintenance", "node-1", "falcon-task-b", "host maintenance")
    assert store.record_disruption(b, 1, "repair", "node-2", "falcon-task-b-a1", "node repair")
    before = store.statements
    entered, found = store.entered_and_disruptions([a, b], [a, b])
    assert store.statements - before == (1 if store.autocommit else 2)  # SQLite: the read and its ROLLBACK
    assert entered == store.phase_entered([a, b])
    assert found == store.disruptions([a, b]) and [d.attempt for d in found[b]] == [0, 1] and a not in found
    assert store.entered_and_disruptions([a], []) == (store.phase_entered([a]), {})


def test_a_statement_observer_sees_every_statement_of_every_store_with_its_method(store):
    """``observe_statements``: each Store of the process reports each statement it counts
    (the seam the bench counts through); stopping it stops the reports."""
    from falcon_ray.store import observe_statements

    seen: list[tuple[int, str, str]] = []
    stop = observe_statements(lambda s, method, kind: seen.append((id(s), method, kind)))
    try:
        before = store.statements
        tid = waiting_task(store)
        assert len(seen) == store.statements - before and {i for i, _, _ in seen} == {id(store)}
        assert ("submit_task", "INSERT") in {(m, k) for _, m, k in seen}
        assert ("transition", "UPDATE") in {(m, k) for _, m, k in seen}
    finally:
        stop()
    seen.clear()
    store.get_task(tid)
    assert seen == []


def _idle_lease(store: Store, name: str) -> int:
    lease = store.create_lease(CLUSTER, "2x2", name, "flex-start", None)
    assert store.move_lease(lease.id, LeaseState.REQUESTED, LeaseState.CREATING)
    assert store.move_lease(lease.id, LeaseState.CREATING, LeaseState.IDLE, ready_at=store.clock())
    return lease.id


def test_a_task_move_paired_with_a_lease_move_wins_whole_in_one_update_and_one_commit(store):
    tid, lid = waiting_task(store), _idle_lease(store, "falcon-h1")
    events = len(store.events(tid))
    before, counts = store.statements, dict(store.breakdown)
    task, lease = store.transition_with_lease(
        tid, lc.WAITING, lc.DISPATCHING, "hand-over", lid, LeaseState.IDLE, LeaseState.IN_USE, {"task_id": tid, "idle_since": None},
        node_pool_name="falcon-h1",
    )
    assert task.won and task.moved and lease.won and lease.values["state"] == "InUse"
    sent = {k: n - counts.get(k, 0) for k, n in store.breakdown.items() if n != counts.get(k, 0)}
    if store.autocommit:  # MySQL: one multi-table UPDATE, the event row, one COMMIT
        assert sent == {"transition_with_lease UPDATE": 1, "transition_with_lease INSERT": 1, "transition_with_lease COMMIT": 1}
    assert store.statements - before == sum(sent.values())
    row, l = store.get_task(tid), store.get_lease(CLUSTER, "falcon-h1")
    assert row.phase == lc.DISPATCHING and row.node_pool_name == "falcon-h1" and l.state == "InUse" and l.task_id == tid
    assert len(store.events(tid)) == events + 1


def test_a_lost_compare_and_set_in_a_paired_move_writes_neither_row(store):
    """Mid-group loss: the task aborted meanwhile (its CAS loses) leaves the lease Idle; a
    lease another move took (its CAS loses) leaves the task Waiting, with no event row."""
    tid, lid = waiting_task(store), _idle_lease(store, "falcon-h2")
    assert store.request_abort(tid)
    events = len(store.events(tid))
    task, lease = store.transition_with_lease(tid, lc.WAITING, lc.DISPATCHING, "hand-over", lid, LeaseState.IDLE, LeaseState.IN_USE)
    assert not task.won and not lease.won
    assert store.get_lease(CLUSTER, "falcon-h2").state == "Idle" and len(store.events(tid)) == events

    other, lid2 = waiting_task(store, "bob"), _idle_lease(store, "falcon-h3")
    assert store.move_lease(lid2, LeaseState.IDLE, LeaseState.DELETING)  # taken away before the pair runs
    events = len(store.events(other))
    task, lease = store.transition_with_lease(other, lc.WAITING, lc.DISPATCHING, "hand-over", lid2, LeaseState.IDLE, LeaseState.IN_USE)
    assert not task.won and not lease.won
    assert store.get_task(other).phase == lc.WAITING and len(store.events(other)) == events
    assert store.get_lease(CLUSTER, "falcon-h3").state == "Deleting"


def test_an_aborted_move_paired_with_its_pool_release_keeps_the_abort_request_in_the_log(store):
    """The upper layer's own SQL set Aborting and wrote no event: the paired Aborted move
    writes the Aborting step (at ``aborting_at``) before the Aborted one, and frees the pool."""
    from falcon_ray.store import tables as t

    tid, lid = waiting_task(store), _idle_lease(store, "falcon-h4")
    assert store.move_lease(lid, LeaseState.IDLE, LeaseState.IN_USE, task_id=tid)
    with store.tx_engine.begin() as c:
        c.execute(t.jobs.update().where(t.jobs.c.id == tid).values(status="Aborting", aborting_at=store.clock()))
    task, lease = store.transition_with_lease(tid, lc.ABORTING, lc.ABORTED, "aborted", lid, LeaseState.IN_USE, LeaseState.IDLE)
    assert task.won and lease.won and lease.values["task_id"] is None
    assert [e.status for e in store.events(tid)][-2:] == ["Aborting", "Aborted"]
    assert store.get_lease(CLUSTER, "falcon-h4").state == "Idle"
