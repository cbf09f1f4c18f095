"""The start deadline's decisions, without Ray, HTTP or a database (a fixed clock): the spec
field, the poller's and the queue's pure decisions, the waiting list's index of deadlines,
the due tick, and the Waiting Message's early warning."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState, Reason
from falcon_ray.model import ClusterView, Disruption, JobView, QueueHistory, StartSample, WaitingQueue
from falcon_ray.reconcile import DeleteJob, MoveLease, RefreshMessages, Transition, decide
from falcon_ray.reconcile.deadline import deadline_first
from falcon_ray.reconcile.due import next_due
from falcon_ray.spec import MAX_START_DEADLINE_SECONDS, SpecError, SupplyMode, parse_spec
from tests.unit.test_reconcile import NOW, cluster, effects, lease, spec, state, task, transitions

S = Settings(node_pool_timeout_s=600, create_visibility_grace_s=120)
EXCEEDED = lc.failed(Reason.START_DEADLINE_EXCEEDED)
BASE = {"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["run"]}


# ---- the spec field -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1, 0.5, 3600, 90.25, MAX_START_DEADLINE_SECONDS])
def test_a_positive_number_of_seconds_is_a_start_deadline(value):
    s = parse_spec({**BASE, "start_deadline_s": value})
    assert s.start_deadline_s == float(value)
    assert s.start_deadline_at(NOW) == NOW + dt.timedelta(seconds=value)


def test_without_a_start_deadline_there_is_none():
    assert parse_spec(BASE).start_deadline_s is None and parse_spec({**BASE, "start_deadline_s": None}).start_deadline_at(NOW) is None


@pytest.mark.parametrize(
    "value", [0, -5, True, "3600", [3600], {"s": 1}, MAX_START_DEADLINE_SECONDS + 1, 1e300, float("inf"), float("nan")]
)
def test_a_bad_start_deadline_is_refused_naming_the_field(value):
    with pytest.raises(SpecError) as e:
        parse_spec({**BASE, "start_deadline_s": value})
    assert str(e.value).startswith("start_deadline_s: "), str(e.value)


# ---- who has a deadline --------------------------------------------------------------------------


def _run(kind: str, attempt: int = 0) -> Disruption:
    return Disruption(attempt, kind, "", f"falcon-task-1-a{attempt}", "", NOW)


def test_the_deadline_is_about_the_first_start():
    t = task(1, start_deadline_s=600, age_s=100)
    assert t.start_deadline == NOW + dt.timedelta(seconds=500)
    for phase in (lc.RUNNING, lc.RECOVERING, lc.ABORTING):
        assert task(1, phase=phase, start_deadline_s=600).start_deadline is None, phase
    for phase in lc.BEFORE_START_PHASES:
        assert task(1, phase=phase, start_deadline_s=600).start_deadline is not None, phase
    # a run the fleet ended (the task ran, or its starting run was ended) lifts it
    ran = replace(task(1, start_deadline_s=600), disruptions=(_run("maintenance"),))
    assert ran.start_deadline is None
    # the controller's own moves (a pool given back, a switch) are no run
    moved = replace(ran, disruptions=(_run("released"), _run("switched", 1)))
    assert moved.start_deadline is not None
    assert task(1).start_deadline is None


def test_the_poller_ends_a_task_at_its_deadline_unless_it_has_run():
    s = spec(start_deadline_s=600)
    created = NOW - dt.timedelta(seconds=600)
    assert scheduling.start_deadline_passed(s, created, NOW - dt.timedelta(microseconds=1)) is None  # not before
    assert scheduling.start_deadline_passed(s, created, NOW) == NOW
    assert scheduling.start_deadline_passed(s, created, NOW, [_run("released")]) == NOW
    assert scheduling.start_deadline_passed(s, created, NOW, [_run("repair")]) is None
    assert scheduling.start_deadline_passed(spec(), created, NOW + dt.timedelta(days=40)) is None


@pytest.mark.parametrize(
    ("deadline", "expected", "latest", "first"),
    [
        (15, 16, None, True),  # the expected start is after the deadline
        (15, 14, None, False),
        (15, 15, None, False),  # starting at the deadline is in time
        (15, 14, 16, True),  # the latest start, when given, decides
        (15, 16, 14, False),
        (None, 16, None, False),  # no deadline
        (15, None, None, False),  # no estimate
    ],
)
def test_deadline_first_picks_the_latest_start_when_given_else_the_expected_one(deadline, expected, latest, first):
    def at(h):
        return None if h is None else NOW.replace(hour=h)

    assert deadline_first(at(deadline), at(expected), at(latest)) is first


# ---- the queue's rule ----------------------------------------------------------------------------


def _ends(groups) -> set[int]:
    return {e.task_id for e in effects(groups, Transition) if e.to == EXCEEDED}


def test_a_waiting_task_ends_at_its_deadline_not_a_moment_before_and_the_next_takes_the_slot():
    holder = task(1, phase=lc.PROVISIONING, age_s=900)
    late = task(2, age_s=600, start_deadline_s=600, in_phase_s=590, message="Queue position #2, 1 task(s) ahead (alice: t1)")
    other = task(3, age_s=500, start_deadline_s=3600)
    q = state([holder, late, other], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1)])
    view = ClusterView(synced=True)
    assert not _ends(decide(q, view, NOW - dt.timedelta(milliseconds=1), S))
    g = decide(q, view, NOW, S)
    assert _ends(g) == {2}
    (end,) = [e for e in effects(g, Transition) if e.to == EXCEEDED]
    assert end.expect == (lc.WAITING,)
    for words in ("Not started by its start deadline 2026-11-30 12:00 UTC", "start_deadline_s=10m",
                  "submission at 2026-11-30 11:50 UTC", "it was Pending/Waiting, waiting in queue edge-a/2x2 for its turn",
                  "since 2026-11-30 11:50 UTC", "its last Message: Queue position #2"):  # fmt: skip
        assert words in end.message, (words, end.message)
    # the message refresh of rule 8 counts it no more: task 3 is second behind the holder
    (refresh,) = effects(g, RefreshMessages)
    assert [u[0] for u in refresh.updates] == [3] and "#2, 1 task(s) ahead" in refresh.updates[0][2]


def test_the_slot_holder_ends_at_its_deadline_as_an_abort_would_and_frees_the_slot_in_the_same_decision():
    """Its pool (still being created) goes through keep-or-delete: another task waits, so it
    is kept Idle for it; its Job is deleted; the waiting task is picked at once."""
    holder = task(1, phase=lc.WAITING_FOR_NODE, age_s=1000, start_deadline_s=1000, pool="falcon-t1-2x2", in_phase_s=300)
    nxt = task(2, age_s=500)
    jobs = {1: JobView(1, "falcon-task-1", "falcon-jobs", "uid-1", "Running", 0, 0, 0)}
    q = state([holder, nxt], [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1, mode="flex-start")])
    g = decide(q, ClusterView(synced=True, jobs=jobs), NOW, S)
    assert _ends(g) == {1}
    (end,) = [e for e in effects(g, Transition) if e.to == EXCEEDED]
    assert "waiting for flex-start capacity: the nodes of node pool falcon-t1-2x2 since 2026-11-30 11:55 UTC" in end.message
    assert [e.name for e in effects(g, DeleteJob)] == ["falcon-task-1"]
    (kept,) = [e for e in effects(g, MoveLease) if e.lease_id == 1]
    assert kept.to == LeaseState.IDLE and kept.fields["task_id"] is None
    assert (2, lc.PROVISIONING) in transitions(g) or (2, lc.DISPATCHING) in transitions(g), transitions(g)


def test_a_slot_holder_alone_past_its_deadline_has_its_pool_deleted():
    holder = task(1, phase=lc.DISPATCHING, age_s=700, start_deadline_s=600, pool="falcon-t1-2x2")
    jobs = {1: JobView(1, "falcon-task-1", "falcon-jobs", "uid-1", "Running", 0, 0, 0)}
    g = decide(state([holder], [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1)]), ClusterView(synced=True, jobs=jobs), NOW, S)
    assert _ends(g) == {1}
    (moved,) = [e for e in effects(g, MoveLease) if e.lease_id == 1]
    assert moved.to == LeaseState.DELETING


def test_a_slot_holder_whose_pods_are_all_ready_at_the_deadline_is_left_to_start():
    holder = task(1, phase=lc.DISPATCHING, age_s=700, start_deadline_s=600, pool="falcon-t1-2x2")
    jobs = {1: JobView(1, "falcon-task-1", "falcon-jobs", "uid-1", "Running", 1, 1, 0)}
    g = decide(state([holder], [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1)]), ClusterView(synced=True, jobs=jobs), NOW, S)
    assert not _ends(g) and (1, lc.RUNNING) in transitions(g)


def test_running_and_recovering_tasks_are_never_ended_by_it():
    running = task(1, phase=lc.RUNNING, age_s=7200, start_deadline_s=600, pool="p1", dispatched_s=100)
    recovering = task(2, phase=lc.RECOVERING, age_s=7200, start_deadline_s=600, pool="p2")
    back = task(3, age_s=7200, start_deadline_s=600)
    back = replace(back, disruptions=(_run("maintenance"),))  # Waiting again after a run
    g = decide(state([running, recovering, back]), ClusterView(synced=True), NOW, S)
    assert not _ends(g)


def test_the_due_tick_is_the_deadlines():
    """A queue whose decision has nothing new to do but the deadline is woken at its tick."""
    t = task(1, age_s=100, start_deadline_s=400, message="x")
    quiet = state([t], c=cluster(status="maintenance"))  # nothing to pick: only the deadline is to come
    assert next_due(quiet, ClusterView(synced=True), NOW, S, 1.0, 3600) == 300


def test_the_waiting_lists_deadlines_follow_its_tasks():
    a, b, c = task(1, age_s=50, start_deadline_s=100), task(2, age_s=60, start_deadline_s=60), task(3, age_s=70)
    q = WaitingQueue.of([a, b, c])
    assert [t.id for t in q.deadlines] == [2, 1]
    assert [t.id for t in q.past_deadline(NOW)] == [2]
    assert [t.id for t in q.past_deadline(NOW + dt.timedelta(seconds=50), without={2})] == [1]
    idx = scheduling.WaitingIndex()
    for t in (a, b, c):
        idx.put(t)
    assert [t.id for t in idx.value().deadlines] == [2, 1]
    idx.replace([b.with_message("new")])
    assert idx.value().deadlines[0].message == "new"
    idx.discard(2)
    assert [t.id for t in idx.value().deadlines] == [1]
    idx.put(replace(a, disruptions=(_run("reclaim"),)))  # it ran: no deadline any more
    assert idx.value().deadlines == ()


# ---- the early warning ---------------------------------------------------------------------------


def _history() -> QueueHistory:
    """Three recent creates of 300 s: the estimate for the task behind a holder 100 s into its create is 500 s."""
    picked = [NOW - dt.timedelta(hours=5 - i) for i in range(3)]
    return QueueHistory(tuple(StartSample(100 + i, SupplyMode.RESERVATION, p, p + dt.timedelta(seconds=300), 0.0, 1200.0) for i, p in enumerate(picked)))


@pytest.mark.parametrize(("deadline_s", "warned"), [(600 + 400, True), (600 + 600, False)])
def test_a_waiting_message_says_early_that_the_deadline_passes_before_the_expected_start(deadline_s, warned):
    """Expected around 12:08 (500 s, rounded to the minute): a deadline at 12:06:40 passes
    before it, one at 12:10 does not."""
    holder = task(1, phase=lc.PROVISIONING, age_s=100, in_phase_s=100)
    waiting = task(2, age_s=600, start_deadline_s=deadline_s, in_phase_s=600)
    q = state([holder, waiting], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1, age_s=100)], history=_history())
    (refresh,) = effects(decide(q, ClusterView(synced=True), NOW, S), RefreshMessages)
    ((tid, _, text),) = refresh.updates
    assert "expected to start around 2026-11-30 12:08 UTC" in text, text
    assert ("its start deadline 2026-11-30 12:06 UTC passes before the expected start" in text) is warned, text
