"""Virtual time: one event queue, one clock, the controller's loops as scheduled steps.

Contract
--------
``Scheduler`` is ``falcon_ray.sim.timers.TimerQueue`` (the queue a ``SimFleet`` in virtual
time runs its timers on), a heap of callbacks keyed by (monotonic time, sequence), on the
run's clock: the fleet model's timers (``call_later`` / ``call_soon``, the loop
``falcon_ray.sim.cluster.SimCluster`` needs) and the controller's steps share it, so two things due at the same instant always
run in the order they were scheduled. ``run_next()`` moves the clock to the earliest entry
and runs it; nothing sleeps.

``VirtualClock`` is a ``falcon_ray.clock.Clock`` that only the scheduler moves. A wait on
the driver's thread (no step is expected to make one) moves it like a ``ManualClock`` and
is counted in ``driver_waits``. A wait in a ``Worker`` parks it and hands control back
to the driver, which resumes it when the wait is over: the one step of the controller
that blocks (the ClusterActor's operation loop follows a GKE operation to its end,
polling it) runs in a worker, so the rest of the fleet keeps moving while it waits, as
it does in production. A worker is a greenlet on the driver's thread (a switch costs
about a microsecond, where a hand-over between two threads costs about a hundred): one
thing runs at any moment, the driver or the worker it switched to, so a run is
deterministic. A worker parks only in a clock wait, never inside a database transaction,
so sharing the thread's connections with the driver is safe.

``ScheduledLoop`` keeps ``actors.ticker.Ticker``'s contract (``step`` at once or after
``start_after``, again after ``interval()`` or at once on ``wake()``; a raising step is
logged and kept in ``last_error``, and paced by ``StepFailures``; ``halted``; ``stop``; ``status``) on the scheduler
instead of a thread. ``next_after``, when set, replaces ``now + interval()`` after a step
with the time the loop can next change anything (None: only a ``wake()``); it is where
the driver leaves out steps that cannot do anything. ``on_step`` is called after each step,
``on_settle`` each time a worker's step gives control back (parked in a wait, or done).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

import greenlet

from actors.ticker import StepFailures, loop_status
from falcon_ray.clock import ManualClock
from falcon_ray.sim.timers import TimerQueue


class VirtualClock:
    """A Clock moved only by the scheduler (see the module's contract)."""

    def __init__(self, start: dt.datetime) -> None:
        self._manual = ManualClock(start)
        self.driver_waits = 0

    def now(self) -> dt.datetime:
        return self._manual.now()

    def __call__(self) -> dt.datetime:  # the Store's clock: the wall time of every row written
        return self._manual.now()

    def time(self) -> float:
        return self._manual.time()

    def monotonic(self) -> float:
        return self._manual.monotonic()

    def advance_to(self, mono: float) -> None:
        step = mono - self._manual.monotonic()
        if step > 0:
            self._manual.advance(step)

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        worker = getattr(greenlet.getcurrent(), "worker", None)
        if worker is None:
            self.driver_waits += 1
            if timeout:
                self._manual.advance(timeout)
            return event.is_set()
        worker.park(None if timeout is None else self.monotonic() + max(0.0, timeout))
        return event.is_set()

    def __repr__(self) -> str:
        return f"VirtualClock({self.now().isoformat()})"


class Scheduler(TimerQueue):
    """The event queue of a run: the simulated fleet's ``TimerQueue`` on the run's
    ``VirtualClock`` (see the module's contract)."""

    clock: VirtualClock


class _Strand(greenlet.greenlet):
    """A worker's greenlet, with the worker it runs for (``VirtualClock.wait`` asks)."""

    worker: Worker


class Worker:
    """A blocking step run in turns with the driver (see the module's contract)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._strand: _Strand | None = None
        self._closing = False
        self.parked = False
        self.resume_at: float | None = None

    def start(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the worker until it returns or parks in a wait."""
        assert self._strand is None or self._strand.dead, f"{self.name}: a step is already running"
        self._strand = _Strand(self._body)
        self._strand.worker = self
        self._strand.switch(fn)

    def _body(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        finally:
            self.parked = False

    def park(self, until: float | None) -> None:
        """In the worker: give control back until the driver resumes it."""
        if self._closing:  # the run is over: its waits return at once (the caller was stopped)
            return
        assert self._strand is not None and self._strand.parent is not None
        self.parked, self.resume_at = True, until
        self._strand.parent.switch()
        self.parked = False

    def resume(self) -> None:
        assert self._strand is not None and not self._strand.dead
        self._strand.switch()

    def close(self) -> None:
        """End the worker; a step parked in a wait finishes first (its waits return at once)."""
        self._closing = True
        if self.parked and self._strand is not None and not self._strand.dead:
            self.resume()


class ScheduledLoop:
    """A ``Ticker`` on the scheduler (see the module's contract)."""

    def __init__(
        self,
        name: str,
        step: Callable[[], object],
        interval: Callable[[], float],
        log: logging.Logger,
        start_after: float = 0.0,
        halted: Callable[[], str] | None = None,
        clock: Any = None,
        *,
        scheduler: Scheduler,
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        self.clock = scheduler.clock
        self._step = step
        self._interval = interval
        self._log = log
        self._halted = halted
        self.halted_reason = ""
        self.steps = 0
        self.last_step_at: float | None = None
        self.last_step_mono: float | None = None  # when the last step ended, on the monotonic clock
        self.last_step_s = 0.0
        self.last_error = ""
        self.failures = StepFailures(name, log)
        self.next_after: Callable[[ScheduledLoop], float | None] | None = None
        self.worker: Worker | None = None
        self.on_step: Callable[[ScheduledLoop, object], None] | None = None  # the driver's hook
        self.on_settle: Callable[[ScheduledLoop], None] | None = None  # a worker gave control back
        self.due: float | None = None
        self._gen = 0
        self._running = False
        self._woken = False
        self._stopped = False
        self._result: object = None
        self._schedule(self.clock.monotonic() + max(0.0, start_after))

    # ---- the Ticker's surface -----------------------------------------------------------------

    def wake(self) -> None:
        if self._stopped:
            return
        if self._running:
            self._woken = True
            return
        now = self.clock.monotonic()
        if self.last_step_mono is not None:  # after a failed step, kept for the end of its wait (delay 0 otherwise)
            now = max(now, self.last_step_mono + self.failures.delay_s())
        self._schedule(now)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        self._stopped = True
        self._gen += 1
        self.due = None

    def drain(self, timeout: float = 30.0) -> bool:
        self.stop()
        return True

    def join(self, timeout: float) -> bool:
        return True

    def status(self) -> dict[str, object]:
        return loop_status(self)

    # ---- scheduling ---------------------------------------------------------------------------

    def wake_on_tick(self, at: float | None = None) -> None:
        """Step at the first tick of ``interval()`` (counted from the last step) at or after
        ``at`` (default now): where a Ticker that was not skipped would next step."""
        now = self.clock.monotonic()
        at = now if at is None else max(now, at)
        last = self.last_step_mono
        if last is None:
            self._schedule(at)
            return
        tick = self._interval()
        self._schedule(last + max(0.0, -(-(at - last - 1e-9) // tick)) * tick)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def result(self) -> object:
        """What the last step returned (None when it raised)."""
        return self._result

    def _schedule(self, t: float) -> None:
        if self._stopped or (self.due is not None and self.due <= t):
            return
        self._gen += 1
        self.due = t
        self.scheduler.at(t, self._fire, self._gen)

    def _fire(self, gen: int) -> None:
        if gen != self._gen or self._stopped:
            return
        self.due = None
        self._running, self._woken = True, False
        if self.worker is None:
            self._guarded()
            self._after()
            return
        self.worker.start(self._guarded)
        self._settle()

    def _resume(self) -> None:
        assert self.worker is not None
        self.worker.resume()
        self._settle()

    def _settle(self) -> None:
        """After the worker gave control back: parked in a wait (resume it when it is over),
        or its step is done."""
        w = self.worker
        assert w is not None
        if self.on_settle is not None:
            self.on_settle(self)
        if w.parked:
            if w.resume_at is not None:
                self.scheduler.at(w.resume_at, self._resume)
            return
        self._after()

    def _guarded(self) -> None:
        t0 = self.clock.monotonic()
        self._result = None
        try:
            self._result = self._step()
            self.last_error = ""
            self.failures.succeeded(self.clock.time())
        except Exception as e:
            self.last_error = f"{type(e).__name__}: {e}"[:500]
            self.failures.failed(e, self.clock.time())
        self.last_step_s = self.clock.monotonic() - t0
        self.last_step_at = self.clock.time()
        self.last_step_mono = self.clock.monotonic()
        self.steps += 1

    def _after(self) -> None:
        self._running = False
        if self.on_step is not None:
            self.on_step(self, self._result)
        if self._halted is not None and (reason := self._halted()):
            self.halted_reason = reason
            self._log.error("%s: loop stopped: %s", self.name, reason)
            self._stopped = True
            return
        now = self.clock.monotonic()
        earliest = now + self.failures.delay_s()  # after a failed step, as a Ticker waits
        if self._woken:
            self._schedule(earliest)
            return
        t = self.next_after(self) if self.next_after is not None else now + self._interval()
        if t is not None:
            self._schedule(max(t, earliest))
