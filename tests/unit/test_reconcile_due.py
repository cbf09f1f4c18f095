"""reconcile.due.next_due: the first tick at which a decision asks for something new."""

from __future__ import annotations

import datetime as dt

import pytest

from falcon_ray.config import Settings
from falcon_ray.reconcile.due import next_due
from falcon_ray.reconcile.effects import EffectGroup, UpdateTask

T0 = dt.datetime(2026, 1, 5)


def _decide_with_minute_counter(limit_s: float | None = None):
    """A decision that writes a wait counter that moves once a minute and, past ``limit_s``,
    fails the task: what the acquisition rules do to a task waiting for its pool."""

    def decide(queue, view, now, settings):
        waited = (now - T0).total_seconds()
        groups = [EffectGroup("task 1: counter", (UpdateTask(1, (), f"waiting {int(waited // 60)}m"),))]
        if limit_s is not None and waited >= limit_s:
            groups.append(EffectGroup("task 1: timeout", (UpdateTask(1, (), "failed"),)))
        return groups

    return decide


@pytest.mark.parametrize(
    ("now_s", "limit_s", "expected"),
    [
        (0.0, None, 60),  # the counter moves at the next minute
        (59.0, None, 1),
        (60.0, None, 60),
        (0.0, 30.0, 30),  # the limit runs out before the minute
        (30.0, 30.0, 30),  # run out already: asked for at now, nothing new until the minute
    ],
)
def test_the_first_tick_that_asks_for_something_new(now_s, limit_s, expected):
    got = next_due(None, None, T0 + dt.timedelta(seconds=now_s), Settings(), 1.0, 600, decide=_decide_with_minute_counter(limit_s))
    assert got == expected


def test_nothing_new_within_the_horizon_returns_the_horizon():
    def constant(queue, view, now, settings):
        return [EffectGroup("task 1: same", (UpdateTask(1, (), "same"),))]

    assert next_due(None, None, T0, Settings(), 1.0, 600, decide=constant) == 600
    assert next_due(None, None, T0, Settings(), 5.0, 0, decide=constant) == 1


def test_the_ticks_are_counted_in_the_given_tick():
    # a 5 s tick: the minute's counter moves at the 12th tick
    assert next_due(None, None, T0, Settings(), 5.0, 720, decide=_decide_with_minute_counter()) == 12


def test_the_default_decide_is_the_rules(monkeypatch):
    import falcon_ray.reconcile as reconcile

    calls = []
    monkeypatch.setattr(reconcile, "decide", lambda *a: calls.append(a) or [])
    assert next_due(None, None, T0, Settings(), 1.0, 4) == 4
    assert calls and calls[0][2] == T0


def test_a_quiet_queue_costs_two_decisions_and_a_due_one_a_bisection():
    """The horizon is asked first (most queues are quiet); a due tick is found by doubling and
    bisection, never asking the horizon twice."""
    asked: list[float] = []

    def counting(inner):
        def decide(queue, view, now, settings):
            asked.append((now - T0).total_seconds())
            return inner(queue, view, now, settings)

        return decide

    def constant(queue, view, now, settings):
        return [EffectGroup("task 1: same", (UpdateTask(1, (), "same"),))]

    assert next_due(None, None, T0, Settings(), 2.0, 1800, decide=counting(constant)) == 1800
    assert asked == [0.0, 3600.0]
    asked.clear()
    limit = 1001 * 2.0  # due at the 1,001st tick
    assert next_due(None, None, T0, Settings(), 2.0, 1800, decide=counting(_limit_only(limit))) == 1001
    assert asked.count(3600.0) == 1 and len(asked) <= 2 + 2 * 11, asked


def _limit_only(limit_s: float):
    def decide(queue, view, now, settings):
        waited = (now - T0).total_seconds()
        return [EffectGroup("task 1: timeout", (UpdateTask(1, (), "failed"),))] if waited >= limit_s else []

    return decide


@pytest.mark.parametrize("guess", [1, 2, 29, 30, 31, 59, 60, 61, 120, 599, 600, 900])
@pytest.mark.parametrize(("now_s", "limit_s"), [(0.0, None), (59.0, None), (0.0, 30.0), (30.0, 30.0), (10.0, 700.0)])
def test_a_guess_never_changes_the_answer(guess, now_s, limit_s):
    decide = _decide_with_minute_counter(limit_s) if limit_s != 700.0 else _limit_only(limit_s)
    at = T0 + dt.timedelta(seconds=now_s)
    assert next_due(None, None, at, Settings(), 1.0, 600, decide=decide, guess=guess) == next_due(None, None, at, Settings(), 1.0, 600, decide=decide)


def test_a_right_guess_costs_two_decisions_and_the_callers_decision_spares_one():
    """A queue whose Messages move once a minute is due a minute after each step: the last
    answer, tried first, is confirmed by the tick before it."""
    asked: list[float] = []
    inner = _decide_with_minute_counter()

    def decide(queue, view, now, settings):
        asked.append((now - T0).total_seconds())
        return inner(queue, view, now, settings)

    done = inner(None, None, T0, Settings())
    assert next_due(None, None, T0, Settings(), 1.0, 3600, decide=decide, done=done, guess=60) == 60
    assert asked == [60.0, 59.0]
    asked.clear()
    assert next_due(None, None, T0, Settings(), 1.0, 3600, decide=decide, guess=3600) == 60  # wrong: searched below it
    assert asked[0] == 0.0 and asked[1] == 3600.0 and len(asked) <= 2 + 2 * 12, asked
