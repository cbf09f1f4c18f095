"""The clock objects (falcon_ray/clock.py) and loops run on a manual and a parking clock."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

import pytest

from actors.ticker import Ticker
from falcon_ray.clock import SYSTEM, ManualClock, ParkingClock


def test_the_system_clock_agrees_with_the_machine():
    assert abs(SYSTEM.time() - time.time()) < 1  # wall-clock: tests the system clock itself
    assert SYSTEM.now().tzinfo is None and SYSTEM.now().microsecond % 1000 == 0  # wall-clock: the system clock itself
    assert abs((SYSTEM.now() - dt.datetime.now(dt.UTC).replace(tzinfo=None)).total_seconds()) < 1  # wall-clock: the system clock itself
    e = threading.Event()
    e.set()
    assert SYSTEM.wait(e, 5) is True  # wall-clock: the system clock itself (a set event: no wait)


def test_a_manual_clock_moves_only_when_told():
    c = ManualClock(dt.datetime(2026, 3, 1, 12, 0, 0))
    m0, t0 = c.monotonic(), c.time()
    assert c.now() == dt.datetime(2026, 3, 1, 12, 0, 0) and c.monotonic() == m0
    c.sleep(3600)
    assert c.now() == dt.datetime(2026, 3, 1, 13, 0, 0)
    assert c.monotonic() - m0 == 3600 and c.time() - t0 == 3600
    e = threading.Event()
    assert c.wait(e, 7200) is False and c.monotonic() - m0 == 3 * 3600
    e.set()
    assert c.wait(e, 7200) is True and c.monotonic() - m0 == 3 * 3600, "a set event answers at once, no time passes"
    with pytest.raises(ValueError):
        c.advance(-1)


def test_a_loop_of_hourly_steps_runs_a_day_in_milliseconds_on_a_manual_clock():
    c = ManualClock()
    m0 = c.monotonic()
    done = threading.Event()
    seen: list[float] = []

    def step():
        seen.append(c.monotonic() - m0)
        if len(seen) == 25:
            done.set()

    t = Ticker("hourly", step, lambda: 3600.0, logging.getLogger("test"), clock=c)
    try:
        assert done.wait(10), seen  # wall-clock: the Ticker's thread is real; its steps run on the ManualClock
    finally:
        t.drain(10)
    assert seen[:25] == [3600.0 * i for i in range(25)], seen[:25]
    assert t.last_step_at is not None and t.last_step_at >= ManualClock().time() + 24 * 3600


# ---- ParkingClock: other threads' waits park until the driver moves the clock ----------------


def _on_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_a_parking_clock_holds_another_threads_sleep_to_its_exact_deadline():
    c = ParkingClock()
    m0 = c.monotonic()
    seen: list[float] = []

    def sleeper():
        for _ in range(3):
            c.sleep(10)
            seen.append(c.monotonic() - m0)

    t = _on_thread(sleeper)
    assert c.until_parked(1) == [m0 + 10]
    c.advance(9.999)
    assert seen == [] and c.deadlines() == [m0 + 10], "woke before its deadline"
    c.advance(0.001)
    assert seen == [10.0] and c.deadlines() == [m0 + 20]  # it ran, and waits again, before advance returned
    c.advance(25)  # stops at 20 and 30 on the way
    assert seen == [10.0, 20.0, 30.0] and c.monotonic() - m0 == 35
    t.join(10)
    assert not t.is_alive() and c.deadlines() == []


def test_a_parking_clock_wakes_waits_one_at_a_time_by_deadline_then_by_when_they_began():
    c = ParkingClock()
    m0 = c.monotonic()
    log: list[tuple[str, float]] = []

    def every(name: str, period: float, times: int):
        def loop():
            for _ in range(times):
                c.sleep(period)
                log.append((name, c.monotonic() - m0))

        return loop

    a = _on_thread(every("a", 3, 5))
    c.until_parked(1)  # a's first wait began first
    b = _on_thread(every("b", 5, 3))
    c.until_parked(2)
    c.advance(15)
    # at 15 both are due: b's wait began at 10, a's at 12
    assert log == [("a", 3), ("b", 5), ("a", 6), ("a", 9), ("b", 10), ("a", 12), ("b", 15), ("a", 15)], log
    a.join(10)
    b.join(10)


def test_the_drivers_wait_ends_at_the_instant_another_thread_sets_its_event():
    c = ParkingClock()
    m0 = c.monotonic()
    e = threading.Event()

    def setter():
        c.sleep(7)
        e.set()

    t = _on_thread(setter)
    c.until_parked(1)
    assert c.wait(e, 100) is True and c.monotonic() - m0 == 7  # not 100: it returned when the event was set
    t.join(10)
    assert c.wait(threading.Event(), 3) is False and c.monotonic() - m0 == 10  # a wait in vain moves it


def test_an_event_set_wakes_a_parked_wait_without_moving_the_clock():
    c = ParkingClock()
    m0 = c.monotonic()
    e = threading.Event()
    out: list[tuple[bool, float]] = []
    t = _on_thread(lambda: out.append((c.wait(e, 60), c.monotonic() - m0)))
    c.until_parked(1)
    e.set()
    c.advance(0)  # the woken thread runs to its end before the clock may move
    assert out == [(True, 0.0)]
    t.join(10)


def test_a_woken_thread_that_neither_waits_again_nor_ends_fails_the_move():
    c = ParkingClock(settle_s=0.2)
    release = threading.Event()

    def stuck():
        c.sleep(1)
        release.wait()  # blocks on something the clock does not know

    t = _on_thread(stuck)
    c.until_parked(1)
    with pytest.raises(RuntimeError, match="neither waited on the clock again nor ended"):
        c.advance(1)
    release.set()
    t.join(10)


# ---- a failing step is paced and logged once, not spun ------------------------------------


def test_a_loop_whose_step_keeps_failing_backs_off_and_logs_one_traceback(caplog):
    """A watch loop (interval 0) whose database is down: before, it retried at once and
    logged a traceback each time (1,468 in a 6 s outage of the soak's database test)."""
    c = ManualClock()
    m0 = c.monotonic()
    at: list[float] = []
    done = threading.Event()

    def step():
        at.append(round(c.monotonic() - m0, 6))
        if len(at) == 12:
            done.set()
        if len(at) <= 10:
            raise ConnectionRefusedError("database down")

    with caplog.at_level(logging.WARNING, logger="test.failing"):
        t = Ticker("watch", step, lambda: 0.0, logging.getLogger("test.failing"), clock=c)
        try:
            assert done.wait(10), at  # wall-clock: the Ticker's thread is real; its waits run on the ManualClock
        finally:
            t.drain(10)
    gaps = [round(b - a, 6) for a, b in zip(at, at[1:], strict=False)]
    # 0.2 s doubling up to 10 s after each of the 10 failures, then the interval (0) after a good step
    assert gaps[:10] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0, 10.0], gaps
    assert gaps[10] == 0.0, gaps
    tracebacks = [r for r in caplog.records if r.exc_info]
    repeats = [r.getMessage() for r in caplog.records if "failed again" in r.getMessage()]
    assert len(tracebacks) == 1, "the same error is logged with its traceback once"
    assert [m.split("(")[1].split(" ")[0] for m in repeats] == ["2", "4", "8"], repeats
    assert any("succeeded after 10 failed in a row" in r.getMessage() for r in caplog.records)
    assert t.status()["failed_in_a_row"] == 0


def test_a_new_error_is_logged_with_its_traceback_and_a_wake_waits_for_the_backoff():
    c = ParkingClock()
    m0 = c.monotonic()
    at: list[float] = []
    errors = [ValueError("a"), ValueError("a"), KeyError("b")]
    log = logging.getLogger("test.kinds")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log.addHandler(handler)

    def step():
        at.append(round(c.monotonic() - m0, 6))
        if errors:
            raise errors.pop(0)

    t = Ticker("ops", step, lambda: 30.0, log, clock=c)
    try:
        c.until_parked(1)  # after the first failure: 0.2 s of backoff, then the interval's rest
        t.wake()
        c.advance_to(m0 + 0.199)
        assert at == [0.0], "a wake inside the backoff waits for its end"
        c.advance_to(m0 + 0.2)
        assert at == [0.0, 0.2]
        assert t.status()["failed_in_a_row"] == 2
        t.wake()
        c.advance_to(m0 + 0.6)  # the third fails with another error; the fourth comes after the interval's rest
        assert at == [0.0, 0.2, 0.6]
        c.advance_to(m0 + 30.6 - 0.001)
        assert at == [0.0, 0.2, 0.6]
        c.advance_to(m0 + 30.6)
        assert at == [0.0, 0.2, 0.6, 30.6]
    finally:
        t.stop()
        c.advance(0)
        log.removeHandler(handler)
    assert [r.exc_info is not None for r in records if "step failed" in r.getMessage()] == [True, False, True]
