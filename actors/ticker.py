"""Ticker: the one control loop every Falcon actor runs.

Contract
--------
A daemon thread calls ``step()`` (at once, or after ``start_after`` seconds), then
again whenever ``wake()`` is called or ``interval()`` seconds have passed. A step that raises is logged and recorded in
``last_error``; the loop never dies of it. After a failed step the next one waits at least
``StepFailures.delay_s`` (0.2 s doubling to 10 s over consecutive failures; a wake in that
time is kept for its end), so a loop whose interval is 0 (a watch) does not spin while its
database or API is down; the first failure of a kind is logged with its traceback, repeats
of it as one line at the 2nd, 4th, 8th ... failure, and the first good step after failures
says how many there were and since when. ``stop()`` ends the loop after the step in
progress; ``drain(timeout)`` stops and waits for that step to finish. With ``halted``
(a callable returning a reason, empty while all is well) the loop also ends after a
step once it returns a reason, kept in ``halted_reason`` (a fenced actor's loops). Its
waits and its step times go through ``clock`` (``falcon_ray.clock``), the real one unless
given.

``Loop`` is what an owner of loops relies on (``wake``, ``stop``, ``join``, ``status``), and
``LoopFactory`` the constructor call that starts one, with ``Ticker``'s parameters: an
object that builds its loops through a ``LoopFactory`` can have them run by another
scheduler (a virtual-time simulator) instead of threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from falcon_ray.clock import SYSTEM, Clock

FAILED_STEP_DELAY_INITIAL_S = 0.2
FAILED_STEP_DELAY_MAX_S = 10.0


class StepFailures:
    """How a loop paces and reports consecutive failed steps (the module's contract); the
    thread ``Ticker`` and the simulate driver's loops share it. Pure: the caller gives the time."""

    def __init__(self, name: str, log: logging.Logger) -> None:
        self.name = name
        self._log = log
        self.count = 0  # consecutive failed steps
        self.since: float | None = None  # when the first of them ended (the caller's wall clock)
        self._kind = ""

    def failed(self, e: Exception, now: float) -> None:
        """Record a failed step (called inside its ``except``) and log it as the contract says."""
        kind = f"{type(e).__name__}: {e}"[:200]
        self.count += 1
        if self.count == 1:
            self.since = now
        if kind != self._kind:
            self._kind = kind
            self._log.exception("%s: step failed", self.name)
        elif self.count & (self.count - 1) == 0:
            self._log.warning("%s: step failed again (%d in a row): %s", self.name, self.count, kind)

    def succeeded(self, now: float) -> None:
        if self.count:
            self._log.warning("%s: step succeeded after %d failed in a row over %.1fs", self.name, self.count, now - (self.since or now))
        self.count, self.since, self._kind = 0, None, ""

    def delay_s(self) -> float:
        """The least wait before the next step: 0 after a good step."""
        if not self.count:
            return 0.0
        return min(FAILED_STEP_DELAY_INITIAL_S * 2.0 ** (self.count - 1), FAILED_STEP_DELAY_MAX_S)


def loop_status(loop: Any) -> dict[str, object]:
    """A loop's ``status()``: what its owner's snapshot shows (a ``Ticker`` or a loop that keeps
    its contract on another scheduler)."""
    return {
        "steps": loop.steps,
        "last_step_at": loop.last_step_at,
        "last_step_s": loop.last_step_s,
        "last_error": loop.last_error,
        "failed_in_a_row": loop.failures.count,
        "halted": loop.halted_reason,
    }


class Loop(Protocol):
    """A started loop, as its owner uses it (``Ticker`` is one)."""

    def wake(self) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout: float) -> bool: ...

    def status(self) -> dict[str, object]: ...


class LoopFactory(Protocol):
    """Starts a loop: called as ``Ticker`` is (see the module's contract)."""

    def __call__(
        self,
        name: str,
        step: Callable[[], object],
        interval: Callable[[], float],
        log: logging.Logger,
        start_after: float = 0.0,
        halted: Callable[[], str] | None = None,
        clock: Clock = SYSTEM,
    ) -> Loop: ...


class Ticker:
    def __init__(
        self,
        name: str,
        step: Callable[[], object],
        interval: Callable[[], float],
        log: logging.Logger,
        start_after: float = 0.0,
        halted: Callable[[], str] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.name = name
        self.clock = clock
        self._start_after = start_after
        self._step = step
        self._interval = interval
        self._log = log
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.steps = 0
        self.last_step_at: float | None = None  # wall clock
        self.last_step_s = 0.0
        self.last_error = ""
        self.failures = StepFailures(name, log)
        self._halted = halted
        self.halted_reason = ""
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def _run(self) -> None:
        if self._start_after > 0:
            self.clock.wait(self._stop, self._start_after)
        while not self._stop.is_set():
            t0 = self.clock.monotonic()
            try:
                self._step()
                self.last_error = ""
                self.failures.succeeded(self.clock.time())
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"[:500]
                self.failures.failed(e, self.clock.time())
            self.last_step_s = self.clock.monotonic() - t0
            self.last_step_at = self.clock.time()
            self.steps += 1
            if self._halted is not None and (reason := self._halted()):
                self.halted_reason = reason
                self._log.error("%s: loop stopped: %s", self.name, reason)
                break
            interval = self._interval()
            if backoff := self.failures.delay_s():
                self.clock.wait(self._stop, backoff)  # a wake now is kept for the end of it
                interval -= backoff
            if interval > 0 and not self._stop.is_set():
                self.clock.wait(self._wake, interval)
            self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def drain(self, timeout: float = 30.0) -> bool:
        """Stop after the step in progress; True when the loop has ended."""
        self.stop()
        return self.join(timeout)

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def status(self) -> dict[str, object]:
        return loop_status(self)
