"""The one table of waits (``falcon_ray.limits``): complete, read by the decisions, shown in the docs.

- every Pending Reason, Pending without a Reason, and Aborting has a row; every row's
  setting is a real setting; a row that fails names a failure its phase may move to;
- docs/operations.md carries the table as ``markdown_table`` renders it with the defaults;
- the decisions enforce the limits the table names: a changed setting changes when the
  task fails (reservation headroom, an unreadable reservation, a refused Job submission).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray import limits
from falcon_ray.config import Settings
from falcon_ray.lifecycle import Reason
from falcon_ray.limits import LIMITS, TASK_START_DEADLINE, TASK_TIMEOUT, Action, Wait
from falcon_ray.model import (
    Cluster,
    ClusterView,
    ErrorKind,
    QueueState,
    QueueTask,
    ReservationError,
    ReservationView,
    SubmitError,
)
from falcon_ray.reconcile import Transition, UpdateTask, decide
from falcon_ray.spec import parse_spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
NOW = dt.datetime(2026, 12, 1, 12, 0, 0)


def test_every_wait_phase_has_a_row_and_every_row_a_real_setting():
    phases = {row.phase for row in LIMITS}
    assert phases == {*lc.PENDING_PHASES, lc.ABORTING, lc.RUNNING}  # Running: only a degraded run
    for row in LIMITS:
        if row.setting not in (None, TASK_TIMEOUT, TASK_START_DEADLINE):
            assert row.setting in Settings.model_fields, row
        if row.action == Action.FAIL:
            assert all(lc.allowed(p, lc.failed(row.fails_with)) for p in _phases(row)), row
            assert row.enforced_by
        else:
            assert row.fails_with == Reason.NONE
    assert len({row.wait for row in LIMITS}) == len(LIMITS)


def _phases(row: limits.WaitLimit) -> tuple[lc.Phase, ...]:
    """The phases a row covers: the start deadline's, every phase before the first start."""
    return lc.BEFORE_START_PHASES if row.wait == Wait.START_DEADLINE else (row.phase,)


def test_the_start_deadline_row_spans_the_phases_before_the_first_start():
    row = limits.limit(Wait.START_DEADLINE)
    assert row.phases == ", ".join(map(str, lc.BEFORE_START_PHASES)) and lc.RECOVERING not in lc.BEFORE_START_PHASES
    assert row.seconds(Settings()) is None and row.seconds(Settings(), start_deadline=90.0) == 90.0
    assert limits.wait_of(lc.NEW) == Wait.INTAKE  # the per-phase row still classifies a Pending task


@pytest.mark.parametrize("phase", [*lc.PENDING_PHASES, lc.ABORTING])
def test_wait_of_gives_every_live_phase_but_running_a_row_of_that_phase(phase):
    for facts in ({}, {"job_accepted": True}, {"out_of_service": True}, {"contested": True}):
        wait = limits.wait_of(phase, **facts)
        assert wait is not None and limits.limit(wait).phase == phase
    assert limits.wait_of(lc.RUNNING) is None and limits.wait_of(lc.SUCCEEDED) is None
    assert limits.wait_of(lc.RUNNING, degraded=True) == Wait.DEGRADED


def test_limits_follow_the_settings():
    s = Settings(submit_budget_s=42, node_pool_timeout_s=7, contested_wait_s=8)
    assert limits.seconds(Wait.SUBMIT, s) == 42
    assert limits.seconds(Wait.CREATE, s) == 7 and limits.seconds(Wait.NODES_CONTESTED, s) == 8
    assert limits.seconds(Wait.RESERVATION, s) is None and not limits.passed(Wait.RESERVATION, s, 1e9)
    assert limits.seconds(Wait.PODS, s, 300) == 300 and limits.passed(Wait.PODS, s, 301, 300)
    assert limits.seconds(Wait.OUT_OF_SERVICE, s) == 0.0
    assert limits.limit(Wait.QUEUE).grace(s) == 0.0 and limits.limit(Wait.CREATE).grace(s) == 3 * s.queue_tick_s


def test_operations_doc_shows_the_table():
    text = DOC.read_text()
    m = re.search(r"<!-- limits-table:start[^\n]*-->\n(.*?)\n<!-- limits-table:end -->", text, re.S)
    assert m, "docs/operations.md lost its limits table markers"
    assert m.group(1).strip() == limits.markdown_table(Settings()), (
        "docs/operations.md's limits table is stale: paste `python -m falcon_ray.limits` between its markers"
    )


# ---- the decisions enforce what the table says ------------------------------------------------


def _state(phase, age_s: float, supply: str = "reservation", submit_error: SubmitError | None = None) -> QueueState:
    cluster = Cluster("c1", "edge-a", "proj", "us-east5-b", "v6e", "logs", "res-a", "active", "falcon-jobs", "sa", NOW, NOW)
    spec = parse_spec({"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["run"], "supply_mode": supply})
    since = NOW - dt.timedelta(seconds=age_s)
    t = QueueTask(1, "t1", "alice", phase, since, None, spec, None, None, "", phase_since=since)
    errors = {1: submit_error} if submit_error else {}
    return QueueState(cluster, "2x2", (t,), (), "", submit_errors=errors)


def _moves(state: QueueState, view: ClusterView, s: Settings) -> list:
    return [e for g in decide(state, view, NOW, s) for e in g.effects if isinstance(e, (Transition, UpdateTask))]


FULL = ClusterView(reservation=ReservationView(count=1, in_use=1))


def test_reservation_headroom_wait_has_no_limit_by_default():
    moves = _moves(_state(lc.CLUSTER_BUSY, 30 * 86400), FULL, Settings())
    assert not [m for m in moves if isinstance(m, Transition)], moves


def test_reservation_headroom_wait_fails_after_reservation_wait_limit_s():
    s = Settings(reservation_wait_limit_s=3600)
    assert not [m for m in _moves(_state(lc.CLUSTER_BUSY, 3599), FULL, s) if isinstance(m, Transition)]
    (move,) = [m for m in _moves(_state(lc.CLUSTER_BUSY, 3601), FULL, s) if isinstance(m, Transition)]
    assert move.to == lc.failed(Reason.NODE_POOL_FAILED)
    assert "no free slice in the reservation for 60m" in move.message and "reservation_remaining_slices=0" in move.message


def test_an_unreadable_reservation_holds_the_slot_only_until_node_pool_timeout_s():
    view = ClusterView(reservation_error=ReservationError(ErrorKind.TRANSIENT, "503 backend error"))
    s = Settings(node_pool_timeout_s=600)
    early = _moves(_state(lc.PROVISIONING, 599), view, s)
    assert not [m for m in early if isinstance(m, Transition)] and "Cannot read reservation" in early[0].message
    (move,) = [m for m in _moves(_state(lc.PROVISIONING, 601), view, s) if isinstance(m, Transition)]
    assert move.to == lc.failed(Reason.NODE_POOL_TIMEOUT) and "reservation res-a unreadable: 503" in move.message


@pytest.mark.parametrize("failing_s, fails", [(30, False), (3599, False), (3601, True)])
def test_a_reservation_wait_is_not_counted_as_time_the_reservation_was_unreadable(failing_s, fails):
    """A task two hours in ClusterBusy, waiting for room (no limit), when the reservation's
    reads begin to fail: the create's limit counts from the first failed read, not from
    its phase, so one 429 does not end a reservation wait NodePoolTimeout."""
    since = NOW - dt.timedelta(seconds=failing_s)
    view = ClusterView(reservation_error=ReservationError(ErrorKind.TRANSIENT, "429 too many requests", since))
    moves = _moves(_state(lc.CLUSTER_BUSY, 2 * 3600), view, Settings())
    failed = [m for m in moves if isinstance(m, Transition) and m.to == lc.failed(Reason.NODE_POOL_TIMEOUT)]
    assert bool(failed) == fails, moves
    if not fails:
        assert "Cannot read reservation res-a yet (429" in moves[0].message


@pytest.mark.parametrize("failing_s, fails", [(60, False), (3601, True)])
def test_an_unreachable_cluster_counts_from_the_first_failed_connect(failing_s, fails):
    view = ClusterView(error="RefreshError: metadata unreachable", error_since=NOW - dt.timedelta(seconds=failing_s), synced=False)
    moves = _moves(_state(lc.CLUSTER_BUSY, 2 * 3600), view, Settings())
    failed = [m for m in moves if isinstance(m, Transition) and m.to == lc.failed(Reason.NODE_POOL_TIMEOUT)]
    assert bool(failed) == fails, moves
    if fails:
        assert f"unreachable for {failing_s}s" in failed[0].message


@pytest.mark.parametrize("refused_s, fails", [(5, False), (599, False), (601, True)])
def test_the_submit_budget_counts_from_the_first_refusal_not_from_dispatching(refused_s, fails):
    """Twenty minutes in Dispatching (an earlier attempt's Job going away on a lost node)
    before the first submission, which is refused 503: retried for submit_budget_s from that
    refusal, not failed at once."""
    err = SubmitError(ErrorKind.TRANSIENT, "503 etcd leader changed", NOW - dt.timedelta(seconds=refused_s))
    moves = _moves(_state(lc.DISPATCHING, 1200, submit_error=err), ClusterView(), Settings())
    failed = [m for m in moves if isinstance(m, Transition) and m.to == lc.failed(Reason.JOB_SUBMIT_FAILED)]
    assert bool(failed) == fails, moves


def test_a_refused_submission_fails_after_the_tables_submit_limit():
    err = SubmitError(ErrorKind.TRANSIENT, "503 etcd leader changed")
    for budget, expect_fail in ((120, True), (600, False)):
        moves = _moves(_state(lc.DISPATCHING, 300, submit_error=err), ClusterView(), Settings(submit_budget_s=budget))
        failed = [m for m in moves if isinstance(m, Transition) and m.to == lc.failed(Reason.JOB_SUBMIT_FAILED)]
        assert bool(failed) == expect_fail, (budget, moves)
