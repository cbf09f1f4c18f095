"""The simulated fleet's timers in virtual time: one queue keyed by a given clock.

Contract
--------
``TimerQueue(clock)`` is a heap of callbacks keyed by (the clock's monotonic time, sequence):
``call_later`` / ``call_soon`` (the loop ``falcon_ray.sim.cluster.SimCluster`` needs) and
``at``. Two callbacks due at the same instant run in the order they were queued.
``run_next()`` moves the clock to the earliest entry (``clock.advance_to``) and runs it;
``run_until(t)`` runs, in that order, every entry due at or before ``t`` (those the
entries queue on the way included) and leaves the clock at the last one's time. Nothing
sleeps: the clock moves only here or by its owner.

The clock is a ``falcon_ray.clock.ManualClock`` or the ``falcon-ray simulate`` driver's
``VirtualClock``: anything with ``monotonic()`` and ``advance_to(mono)``. The driver's
``Scheduler`` is this queue; a ``SimFleet`` given such a clock runs its clusters' timers on
one (see ``falcon_ray.sim.server``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, Protocol


class SteppedClock(Protocol):
    def monotonic(self) -> float: ...

    def advance_to(self, mono: float) -> None: ...


class TimerQueue:
    """Callbacks in the order of a given clock (see the module's contract)."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.ran = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.clock.monotonic()), next(self._seq), fn, args))

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.clock.monotonic() + max(0.0, delay), fn, *args)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.clock.monotonic(), fn, *args)

    def next_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run_next(self) -> None:
        t, _, fn, args = heapq.heappop(self._heap)
        self.clock.advance_to(t)
        self.ran += 1
        fn(*args)

    def run_until(self, t: float) -> int:
        """Run every entry due at or before ``t``; how many ran."""
        n = 0
        while self._heap and self._heap[0][0] <= t:
            self.run_next()
            n += 1
        return n
