"""The clock objects (falcon_ray/clock.py) and a loop run on a manual clock."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

import pytest

from actors.ticker import Ticker
from falcon_ray.clock import SYSTEM, ManualClock


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
