"""The one clock: wall time, monotonic time and waiting, as an object that is given.

Contract
--------
Product code (``actors/`` and the product modules of ``falcon_ray/``) reads the time and
waits only through a ``Clock`` it was given, never through ``time`` or ``datetime``
directly (``tests/unit/test_clock_discipline.py`` holds the tree to it), so any budget
can be run at its production value in virtual time.

- ``now()``: the wall time as a naive UTC ``datetime`` at millisecond precision (what the
  database stores);
- ``time()``: the same instant as seconds since the epoch;
- ``monotonic()``: seconds on a clock that never goes back, for durations;
- ``sleep(s)``: wait ``s`` seconds;
- ``wait(event, timeout)``: wait until ``event`` is set or ``timeout`` seconds passed;
  True when it was set.

``SYSTEM`` is the real clock. ``ManualClock`` moves only when told (``advance``, or
``advance_to`` a monotonic time) or when its owner sleeps or waits in vain, which then
returns at once: a test drives hours of budget in milliseconds with it.
"""

from __future__ import annotations

import datetime as dt
import threading
import time as _time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> dt.datetime: ...

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def wait(self, event: threading.Event, timeout: float | None) -> bool: ...


def _millis(t: dt.datetime) -> dt.datetime:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


class SystemClock:
    """The machine's clocks."""

    def now(self) -> dt.datetime:
        return _millis(dt.datetime.now(dt.UTC).replace(tzinfo=None))

    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(timeout)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM = SystemClock()


class ManualClock:
    """A clock that moves only when told to: ``advance(s)``, or a ``sleep(s)`` or an
    unanswered ``wait(event, s)``, which move it by ``s`` and return at once."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._wall = (start or dt.datetime(2026, 1, 1)).replace(tzinfo=None)
        self._mono = 1000.0

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._wall += dt.timedelta(seconds=seconds)
            self._mono += seconds

    def advance_to(self, mono: float) -> None:
        """Move to the monotonic time ``mono`` (no move if it is not ahead)."""
        with self._lock:
            step = mono - self._mono
            if step > 0:
                self._wall += dt.timedelta(seconds=step)
                self._mono += step

    def now(self) -> dt.datetime:
        with self._lock:
            return _millis(self._wall)

    def time(self) -> float:
        with self._lock:
            return self._wall.replace(tzinfo=dt.UTC).timestamp()

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is not None and timeout > 0:
            self.advance(timeout)
        return event.is_set()

    def __repr__(self) -> str:
        return f"ManualClock({self.now().isoformat()})"
