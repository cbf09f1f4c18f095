"""Ticker: the one control loop every Falcon actor runs.

Contract
--------
A daemon thread calls ``step()`` (at once, or after ``start_after`` seconds), then
again whenever ``wake()`` is called or ``interval()`` seconds have passed. A step that raises is logged and recorded in
``last_error``; the loop never dies of it. ``stop()`` ends the loop after the step in
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
from typing import Protocol

from falcon_ray.clock import SYSTEM, Clock


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
            except Exception as e:
                self.last_error = f"{type(e).__name__}: {e}"[:500]
                self._log.exception("%s: step failed", self.name)
            self.last_step_s = self.clock.monotonic() - t0
            self.last_step_at = self.clock.time()
            self.steps += 1
            if self._halted is not None and (reason := self._halted()):
                self.halted_reason = reason
                self._log.error("%s: loop stopped: %s", self.name, reason)
                break
            self.clock.wait(self._wake, self._interval())
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
        return {"steps": self.steps, "last_step_at": self.last_step_at, "last_step_s": self.last_step_s, "last_error": self.last_error, "halted": self.halted_reason}
