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

``ParkingClock`` is a ``ManualClock`` for code that waits on threads of its own (the
supervisor's lease keeper, a run loop). The thread that built it is its driver: the
driver's ``advance`` / ``advance_to`` / ``sleep`` / unanswered ``wait`` move it. A
``sleep`` or ``wait`` made by any other thread parks that thread until the driver moves
the clock to its deadline (or, for a ``wait``, until its event is set). Moving, the driver
stops at each parked deadline on the way, earliest first (a tie in the order the waits
began), wakes that one thread and lets it run until it waits on the clock again or ends,
then goes on: every wait returns at its exact virtual instant and only one such thread
runs at a time. Before the clock moves (``advance(0)`` included), a thread whose event
was set runs to its next wait or its end; a thread asleep in a parked wait notices a set
event within ``POLL_S`` of the machine's seconds. A thread the clock has not seen wait
yet is not waited for: ``until_parked(n)`` blocks until ``n`` threads wait on it and
says their deadlines, so a test moves the clock once the threads it started are parked.
A woken thread that neither waits again nor ends within ``settle_s`` of the machine's
seconds makes the move raise (a deadlock in the test, not a timing).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import threading
import time as _time
from dataclasses import dataclass
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


@dataclass(eq=False)
class _Park:
    """One parked ``sleep`` / ``wait`` of a ``ParkingClock``."""

    deadline: float  # monotonic
    event: threading.Event | None
    seq: int
    released: bool = False

    def ready(self) -> bool:
        return self.released or (self.event is not None and self.event.is_set())


class ParkingClock(ManualClock):
    """A ``ManualClock`` whose waits on other threads than its driver's park until the
    driver moves it past their deadlines (see the module's contract)."""

    POLL_S = 0.005  # the machine's seconds between looks at a parked wait's event: liveness only

    def __init__(self, start: dt.datetime | None = None, *, settle_s: float = 30.0) -> None:
        super().__init__(start)
        self._cond = threading.Condition(self._lock)
        self._driver = threading.get_ident()
        self._parked: list[_Park] = []
        self._threads: dict[threading.Thread, _Park | None] = {}  # each thread that waited: its wait, or None
        self._seq = itertools.count()
        self.settle_s = settle_s

    # ---- the driver ------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._cond:
            target = self._mono + seconds
        self._run(target)

    def advance_to(self, mono: float) -> None:
        self._run(mono)

    def until_parked(self, n: int) -> list[float]:
        """Block until ``n`` (or more) threads wait on this clock and none that woke is still
        running; their deadlines (monotonic, ``inf`` for a wait without one), earliest first."""
        with self._cond:
            self._settle_locked(lambda: sum(not p.ready() for p in self._parked) >= n, f"{n} threads waiting on it")
            return sorted(p.deadline for p in self._parked)

    def deadlines(self) -> list[float]:
        """The deadlines of the waits parked now (monotonic), earliest first."""
        with self._cond:
            return sorted(p.deadline for p in self._parked)

    def _run(self, target: float, until: threading.Event | None = None) -> None:
        """Move to ``target``, stopping at every parked deadline on the way (see the contract);
        stop early, at the instant it happened, once ``until`` is set."""
        with self._cond:
            while True:
                self._settle_locked()
                if until is not None and until.is_set():
                    return
                due = [p for p in self._parked if not p.released and p.deadline <= target]
                if not due:
                    self._move_locked(target)
                    return
                first = min(due, key=lambda p: (p.deadline, p.seq))
                self._move_locked(first.deadline)
                first.released = True
                self._cond.notify_all()

    def _move_locked(self, mono: float) -> None:
        if mono > self._mono:
            self._wall += dt.timedelta(seconds=mono - self._mono)
            self._mono = mono

    def _busy_locked(self) -> list[str]:
        """The threads that woke (or whose event is set) and neither wait again nor ended,
        but the one asking."""
        for t in [t for t in self._threads if not t.is_alive()]:
            del self._threads[t]
        me = threading.current_thread()
        return [t.name for t, p in self._threads.items() if t is not me and (p is None or p.ready())]

    def _settle_locked(self, also=lambda: True, what: str = "") -> None:
        give_up = _time.monotonic() + self.settle_s
        while (busy := self._busy_locked()) or not also():
            if _time.monotonic() > give_up:
                raise RuntimeError(
                    f"ParkingClock: after {self.settle_s} s of the machine's time, "
                    + (f"threads {busy} woke and neither waited on the clock again nor ended" if busy else f"still not {what}")
                )
            self._cond.wait(self.POLL_S)

    # ---- every thread -------------------------------------------------------------------------

    def _driving(self) -> bool:
        return threading.get_ident() == self._driver

    def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self._driving():
            self.advance(seconds)
        else:
            self._park(seconds, None)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if self._driving():
            if timeout is None or timeout <= 0:
                self._run(self.monotonic())  # no time passes: the others run to their next wait
                return event.is_set()
            with self._cond:
                target = self._mono + timeout
            self._run(target, until=event)
            return event.is_set()
        if timeout is not None and timeout <= 0:
            return False
        return self._park(math.inf if timeout is None else timeout, event)

    def _park(self, seconds: float, event: threading.Event | None) -> bool:
        me = threading.current_thread()
        with self._cond:
            park = _Park(self._mono + seconds, event, next(self._seq))
            self._parked.append(park)
            self._threads[me] = park
            self._cond.notify_all()
            try:
                while not park.ready():
                    self._cond.wait(self.POLL_S)
            finally:
                self._parked.remove(park)
                self._threads[me] = None
                self._cond.notify_all()
        return event is not None and event.is_set()

    def __repr__(self) -> str:
        return f"ParkingClock({self.now().isoformat()})"
