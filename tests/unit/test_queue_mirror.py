"""The QueueMirror without a database: reads merged, write results applied, values rebuilt.

Each test gives the mirror what a ``Store`` would answer (a ``QueueRead``, a
``WriteResult``) and checks the rows, leases and decision values it keeps afterwards.
"""

from __future__ import annotations

import datetime as dt
import json

from actors.queue_mirror import QueueMirror
from falcon_ray import lifecycle as lc
from falcon_ray.model import Disruption, Lease, Task
from falcon_ray.store import QueueRead, WriteResult

T0 = dt.datetime(2026, 12, 1, 12, 0, 0)
SPEC = json.dumps({"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["run"]})


def task(tid: int, phase: lc.Phase = lc.WAITING, actor: str = "alice", **kw) -> Task:
    values = dict(
        id=tid, name=f"t{tid}", actor=actor, spec=SPEC, status=phase.status, reason=phase.reason, message="",
        cluster_id="c1", node_pool_name=None, job_uid=None, timeout_seconds=None, created_at=T0 + dt.timedelta(seconds=tid),
        updated_at=T0, dispatched_at=None, finished_at=None, aborting_at=None, aborted_at=None,
    )
    values.update(kw)
    return Task(**values)


def lease(lid: int, state: lc.LeaseState = lc.LeaseState.REQUESTED, task_id: int | None = 1, **kw) -> Lease:
    values = dict(
        id=lid, cluster_id="c1", topology="2x2", name=f"pool-{lid}", supply_mode="flex-start", state=state, task_id=task_id,
        operation=None, delete_attempts=0, last_error="", created_at=T0, updated_at=T0, ready_at=None, idle_since=None,
        deleted_at=None,
    )
    values.update(kw)
    return Lease(**values)


def no_entries(unknown, disrupted):
    return {}, {}


def read(*tasks: Task, leases: list[Lease] | None = None, seq: int = 1, granted: str = "") -> QueueRead:
    return QueueRead([], list(tasks), leases, granted, seq)


def full_mirror(*tasks: Task, leases: list[Lease] | None = None) -> QueueMirror:
    m = QueueMirror("2x2")
    m.merge(read(*tasks, leases=leases if leases is not None else []), full=True, at=10.0, asked=set())
    m.task_values(no_entries)
    return m


def test_a_full_read_keeps_every_row_and_splits_waiting_from_held():
    m = full_mirror(task(1), task(2, lc.RUNNING), task(3))
    values = m.task_values(no_entries)
    assert [t.id for t in values.held] == [2]
    assert sorted(t.id for t in values.waiting) == [1, 3]
    assert m.not_waiting == {2} and m.full_read_at == 10.0 and m.must_read


def test_an_incremental_read_drops_the_asked_rows_it_did_not_return():
    m = full_mirror(task(1), task(2, lc.RUNNING), task(3))
    asked = m.asked()
    m.merge(read(task(1)), full=False, at=11.0, asked=asked)  # 2 ended meanwhile; 3 was not asked
    assert sorted(m.rows) == [1, 3]
    assert 2 not in m.values and m.full_read_at == 10.0


def test_a_won_move_is_applied_to_the_kept_row_with_its_phase_entry():
    m = full_mirror(task(1))
    at = T0 + dt.timedelta(minutes=1)
    values = dict(status=lc.PROVISIONING.status.value, reason=lc.PROVISIONING.reason.value, message="creating", updated_at=at)
    m.wrote_task(1, WriteResult(True, values, at, moved=True), lc.PROVISIONING)
    assert m.rows[1].phase == lc.PROVISIONING and m.rows[1].message == "creating"
    assert m.phase_since[1] == (lc.PROVISIONING, at)
    assert 1 in m.not_waiting
    held = m.task_values(no_entries).held
    assert [(t.id, t.phase, t.phase_since) for t in held] == [(1, lc.PROVISIONING, at)]


def test_a_lost_write_makes_the_next_round_read():
    m = full_mirror(task(1))
    m.must_read = False
    m.wrote_task(1, WriteResult(False))
    assert m.must_read and m.rows[1].phase == lc.WAITING


def test_a_terminal_write_takes_the_task_out_of_the_queue():
    m = full_mirror(task(1, lc.RUNNING))
    values = dict(status=lc.SUCCEEDED.status.value, reason=lc.SUCCEEDED.reason.value, finished_at=T0)
    m.wrote_task(1, WriteResult(True, values, T0, moved=True), lc.SUCCEEDED)
    assert 1 not in m.rows and 1 not in m.not_waiting
    assert not m.task_values(no_entries).held


def test_lease_writes_are_applied_and_a_lost_one_makes_them_stale():
    m = full_mirror(task(1), leases=[lease(7)])
    m.wrote_lease(7, WriteResult(True, dict(state=lc.LeaseState.CREATING.value, operation="op-1"), T0))
    assert (m.leases[0].state, m.leases[0].operation) == (lc.LeaseState.CREATING, "op-1")
    assert not m.leases_stale
    m.wrote_lease(7, WriteResult(False))
    assert m.leases_stale
    m.created_lease(lease(5, task_id=2))
    assert [x.id for x in m.leases] == [5, 7]


def test_messages_written_change_the_kept_values_in_place():
    m = full_mirror(task(1), task(2, lc.RUNNING))
    m.messages_written([(1, lc.WAITING, "position 1"), (2, lc.WAITING, "not its phase any more")])
    assert m.rows[1].message == "position 1" and m.values[1].message == "position 1"
    assert m.rows[2].message == ""
    assert [t.message for t in m.task_values(no_entries).waiting] == ["position 1"]


def test_the_phase_entry_and_disruptions_are_read_once_per_task():
    asked = []

    def entries(unknown, disrupted):
        asked.append((sorted(unknown), sorted(disrupted)))
        return {(1, lc.RUNNING): T0}, {1: (Disruption(1, "maintenance", "n1", "j1", "gone", T0),)}

    m = QueueMirror("2x2")
    m.merge(read(task(1, lc.RUNNING), leases=[]), full=True, at=1.0, asked=set())
    (value,) = m.task_values(entries).held
    assert value.phase_since == T0 and len(value.disruptions) == 1
    m.changed.add(1)
    m.task_values(entries)
    assert asked == [([1], [1])]


def test_a_refused_lease_of_a_task_another_writer_moved_makes_the_leases_stale():
    m = full_mirror(task(1, lc.CLUSTER_BUSY), leases=[lease(3, lc.LeaseState.DELETED, refused_at=T0)])
    assert m.refused_leases_kept()
    m.merge(read(task(1, lc.ABORTING)), full=False, at=11.0, asked=m.asked())
    assert m.leases_stale


def test_a_read_that_brings_the_phase_entry_spares_the_event_log_read():
    asked = []

    def entries(unknown, disrupted):
        asked.append((sorted(unknown), sorted(disrupted)))
        return {}, {}

    m = QueueMirror("2x2")
    entered = T0 + dt.timedelta(seconds=5)
    snap = QueueRead([], [task(1), task(2), task(3)], [], "", 1, {1: (entered, False), 2: (None, False), 3: (entered, True)})
    m.merge(snap, full=True, at=1.0, asked=set())
    values = {t.id: t for t in m.task_values(entries).waiting}
    assert values[1].phase_since == entered and values[1].disruptions == ()
    assert asked == [([2], [3])]  # only what the read did not bring: 2's entry, 3's runs


def test_rows_new_to_the_mirror_are_told_as_arrivals_once():
    m = full_mirror(task(1), task(2, lc.RUNNING))
    assert [(tid, actor) for _, actor, tid in m.arrived] == [(1, "alice"), (2, "alice")]
    m.arrived.clear()
    m.merge(read(task(1), task(3, actor="bob"), seq=2), full=False, at=11.0, asked={1, 2})  # 2 left, 3 is new
    assert m.arrived == [(T0 + dt.timedelta(seconds=3), "bob", 3)]
