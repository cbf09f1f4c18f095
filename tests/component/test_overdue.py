"""``falcon-ray health``'s overdue tasks: every live task past its wait's limit
(``falcon_ray.limits``), counted from the event log, on a QueueBench (SQLite, fake clock).

The queue is stepped to put tasks in their phases, then left alone (as if its actor were
down) while the clock moves: a report-only wait is listed as soon as it passes its limit,
a wait the queue would end is listed only three ticks past it, a running task never."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from falcon_ray.health import overdue_tasks
from falcon_ray.model import ClusterView, OpView, ReservationView
from falcon_ray.store.migrate import upgrade
from tests.component.test_queue import job, pool
from tests.harness.fakes import QueueBench

FULL = ReservationView(count=1, in_use=1)


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "q.db"
    upgrade(f"sqlite:///{path}", with_jobs_table=True)
    return path


@pytest.fixture
def bench(tmp_path, migrated) -> QueueBench:
    shutil.copy(migrated, tmp_path / "q.db")
    return QueueBench(
        f"sqlite:///{tmp_path / 'q.db'}", migrate=False, waiting_limit_s=900, node_pool_timeout_s=600, queue_tick_s=1
    )


def _overdue(b: QueueBench) -> dict[int, dict]:
    return {t["id"]: t for t in overdue_tasks(b.store, b.settings, now=b.clock())}


def test_waiting_and_provisioning_tasks_are_listed_past_their_own_limits(bench):
    first, second = bench.submit("alice"), bench.submit("bob")
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=0)))
    assert bench.phase(first) == "Pending/Provisioning" and bench.phase(second) == "Pending/Waiting"
    assert _overdue(bench) == {}

    bench.clock.advance(604)  # past node_pool_timeout_s: not the limit of a create GKE has not accepted
    assert _overdue(bench) == {}

    bench.clock.advance(300)  # the waiting one is past waiting_limit_s (report: no grace)
    rows = _overdue(bench)
    assert list(rows) == [second]
    assert rows[second]["wait"] == "queue" and rows[second]["action"] == "report" and rows[second]["limit_s"] == 900

    bench.clock.advance(10800 - 904 + 4)  # past create_queue_limit_s and its grace of 3 ticks
    row = _overdue(bench)[first]
    assert row["wait"] == "create-queued" and row["action"] == "fail" and row["limit_s"] == 10800
    assert row["since"] == "2026-12-01T12:00:00" and row["age_s"] == 10804


def test_a_create_gke_accepted_is_listed_past_node_pool_timeout_from_its_acceptance(bench):
    """Once GKE accepted the create (the lease's accepted_at), the task is in the create's
    wait proper: listed past node_pool_timeout_s counted from the acceptance, not from the
    lease row (the create waited its turn first) and not after the queued wait's 3 h."""
    task = bench.submit("alice")
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=0)))
    bench.clock.advance(1000)  # queued behind other operations for 1,000 s: not the task's time
    name = f"falcon-t{task}-2x2"
    accepted = ClusterView(ops={name: OpView("create", "running", operation="operation-1")}, reservation=ReservationView(count=4, in_use=0))
    bench.step(accepted)
    assert bench.phase(task) == "Pending/Provisioning"
    assert _overdue(bench) == {}
    bench.clock.advance(600 + 2)  # past the limit, within the grace of 3 ticks
    assert _overdue(bench) == {}
    bench.clock.advance(3)
    row = _overdue(bench)[task]
    assert row["wait"] == "create" and row["action"] == "fail" and row["limit_s"] == 600
    assert row["age_s"] == 605 and row["since"] == "2026-12-01T12:16:40"


def test_reservation_headroom_wait_is_listed_only_when_it_has_a_limit(bench):
    running, busy = bench.submit("alice"), bench.submit("bob")
    bench.step(ClusterView(reservation=ReservationView(count=1, in_use=0)))
    bench.step(ClusterView(pools=pool(running), reservation=FULL))
    bench.step(ClusterView(pools=pool(running), jobs=job(running, "Running"), reservation=FULL))
    bench.step(ClusterView(pools=pool(running), jobs=job(running, "Running"), reservation=FULL))
    assert bench.phase(running) == "Running" and bench.phase(busy) == "Pending/ClusterBusy"
    bench.clock.advance(10 * 86400)
    assert busy not in _overdue(bench) and running not in _overdue(bench)  # no limit by default; running: never

    limited = bench.settings.model_copy(update={"reservation_wait_limit_s": 3600})
    (row,) = overdue_tasks(bench.store, limited, now=bench.clock())
    assert row["id"] == busy and row["wait"] == "reservation" and row["reason"] == "ClusterBusy"


def test_the_clock_is_the_event_log_not_the_last_message_write(bench):
    holder, waiting = bench.submit("alice"), bench.submit("bob")
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=0)))
    bench.clock.advance(901)
    bench.store.refresh_messages([(waiting, bench.task(waiting).phase, "a newer position text")])
    assert bench.task(waiting).updated_at == bench.clock()  # the row was just written ...
    assert _overdue(bench)[waiting]["age_s"] == 901  # ... and the wait still counts from its event

    bench.store.request_abort(holder)
    bench.clock.advance(601)
    assert _overdue(bench)[holder]["wait"] == "abort" and _overdue(bench)[holder]["age_s"] == 601


def test_a_task_past_its_start_deadline_is_listed_three_ticks_past_it_unless_it_has_run(bench):
    """The queue is left alone: a Waiting task with a start deadline is listed once the
    deadline and its grace have passed (counted from its submission); one that has run
    (a disruption of the fleet on record) is not, whatever its deadline."""
    first, late, ran = bench.submit("alice"), bench.submit("bob", start_deadline_s=600), bench.submit("carol", start_deadline_s=600)
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=0)))
    assert bench.phase(late) == "Pending/Waiting" and bench.phase(first) == "Pending/Provisioning"
    bench.store.record_disruption(ran, 0, "maintenance", "node-1", f"falcon-task-{ran}", "drained")
    bench.clock.advance(600 + 3)  # the deadline and less than its grace
    assert late not in _overdue(bench)
    bench.clock.advance(2)
    row = _overdue(bench)[late]
    assert row["wait"] == "start-deadline" and row["action"] == "fail" and row["limit_s"] == 600
    assert row["since"] == "2026-12-01T12:00:00"
    assert ran not in _overdue(bench)
