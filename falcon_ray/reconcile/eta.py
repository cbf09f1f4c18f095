"""Rule 8's start estimate: when each Waiting task should reach Running, from the queue's own history.

Contract
--------
Pure: the history (``model.QueueHistory``, the queue's last ``HISTORY_TASKS`` starts as
the actor read them from the event log) and the queue as it is now go in; seconds from
``now`` per Waiting task come out, or nothing for a task when the history is too thin.

The model, stated once (docs/operations.md explains it to operators):

1. From the history: the typical acquisition (picked -> Running, less the time spent in
   ClusterBusy waiting for capacity) per supply mode, the median of that mode's samples
   (all modes pooled when a mode has fewer than ``MIN_SAMPLES``); and the typical run,
   as a fraction of the task's own ``timeout_seconds`` (median over the samples that ended).
2. The queue is capacity-bound when its slot holder waits for capacity (ClusterBusy), or
   when most of its last ``MIN_SAMPLES`` starts did: then a task can start only when a
   running one (or the slot holder, once it runs) ends. A running task is expected to end
   at its start + fraction x its timeout, never after its timeout.
3. The slot is taken by one task at a time, in pick order; each task starts one typical
   acquisition after it got the slot, and gets the slot when the task ahead of it started.
   Capacity-bound, it also waits for the earliest expected end among the running tasks
   (its own run then takes that place).

No estimate without ``MIN_SAMPLES`` starts, nor when capacity-bound without as many ended
runs, nor for the tasks behind a point where nothing is running to wait for, nor on a
cluster out of service.
``choices`` rounds an estimate for the Message (1 minute steps below 10 minutes, 5 minute
steps below 2 hours, 30 minute steps above), so the text changes seldom.
"""

from __future__ import annotations

import datetime as dt
import heapq
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.model import QueueHistory, QueueTask, StartSample, TaskEvent
from falcon_ray.spec import SupplyMode

HISTORY_TASKS = 20  # starts kept per queue
MIN_SAMPLES = 3


# ---- the history, from the event log -----------------------------------------------------------


def sample_from_events(
    task_id: int, events: Sequence[TaskEvent], supply_mode: SupplyMode, timeout_s: float
) -> StartSample | None:
    """The task's last start (``events`` in order): None if it never reached Running."""
    return sample_from_phases(task_id, phases_of(events), supply_mode, timeout_s)


def phases_of(events: Sequence[TaskEvent]) -> list[tuple[lc.Phase, dt.datetime]]:
    """The (phase, entered at) pairs of a task's event log."""
    return [(lc.phase_of(e.status, e.reason or None), e.at) for e in events]


def sample_from_phases(
    task_id: int, phases: Sequence[tuple[lc.Phase, dt.datetime]], supply_mode: SupplyMode, timeout_s: float
) -> StartSample | None:
    """``sample_from_events`` from (phase, entered at) pairs in order: the event log's, or
    the moves a queue made itself since it picked the task."""
    run = max((i for i, (p, _) in enumerate(phases) if p == lc.RUNNING), default=None)
    if run is None:
        return None
    picked = next((i + 1 for i in range(run - 1, -1, -1) if phases[i][0] in (lc.WAITING, lc.NEW)), 0)
    picked = min(picked, run)
    busy = 0.0
    for (p, at), (_, nxt) in zip(phases[picked:run], phases[picked + 1 : run + 1], strict=True):
        if p == lc.CLUSTER_BUSY:
            busy += (nxt - at).total_seconds()
    end = next((at for p, at in phases[run + 1 :] if p.status in lc.TERMINAL or p == lc.ABORTING), None)
    running_at = phases[run][1]
    ran = (end - running_at).total_seconds() if end is not None else None
    return StartSample(task_id, supply_mode, phases[picked][1], running_at, busy, float(timeout_s), ran)


def ended(sample: StartSample, at: dt.datetime) -> StartSample:
    return replace(sample, ran_s=max(0.0, (at - sample.running_at).total_seconds()))


# ---- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    acquire_s: dict[SupplyMode, float]
    pooled_acquire_s: float
    run_fraction: float | None  # typical run / timeout; None without MIN_SAMPLES ended runs

    def acquire(self, mode: SupplyMode) -> float:
        return self.acquire_s.get(mode, self.pooled_acquire_s)

    def run_s(self, timeout_s: float) -> float:
        assert self.run_fraction is not None
        return self.run_fraction * timeout_s


def model_of(history: QueueHistory) -> Model | None:
    samples = history.samples
    if len(samples) < MIN_SAMPLES:
        return None
    by_mode: dict[SupplyMode, list[float]] = {}
    for s in samples:
        by_mode.setdefault(s.supply_mode, []).append(s.acquire_s)
    per_mode = {m: statistics.median(v) for m, v in by_mode.items() if len(v) >= MIN_SAMPLES}
    runs = [min(1.0, s.ran_s / s.timeout_s) for s in samples if s.ran_s is not None and s.timeout_s > 0]
    fraction = statistics.median(runs) if len(runs) >= MIN_SAMPLES else None
    return Model(per_mode, statistics.median(s.acquire_s for s in samples), fraction)


# ---- the estimate --------------------------------------------------------------------------------


def _age(now: dt.datetime, since: dt.datetime | None) -> float:
    return max(0.0, (now - since).total_seconds()) if since else 0.0


def _running_ends(m: Model, running: Sequence[QueueTask], now: dt.datetime) -> list[float]:
    """Seconds from now until each running task is expected to end (a heap)."""
    ends = []
    for t in running:
        timeout, age = float(t.spec.timeout_seconds), _age(now, t.phase_since)
        ends.append(min(max(0.0, m.run_s(timeout) - age), max(0.0, timeout - age)))
    heapq.heapify(ends)
    return ends


def estimate(
    now: dt.datetime,
    history: QueueHistory,
    holders: Sequence[QueueTask],
    running: Sequence[QueueTask],
    waiting_in_order: Sequence[QueueTask],
    default_reservation: str,
) -> dict[int, float]:
    """Seconds from ``now`` until each Waiting task is expected to reach Running."""
    m = model_of(history)
    if m is None or not waiting_in_order:
        return {}
    recent = history.samples[-MIN_SAMPLES:]
    bound = any(t.phase == lc.CLUSTER_BUSY for t in holders) or (
        sum(1 for s in recent if s.capacity_wait_s > 0) * 2 > len(recent)
    )
    if bound and m.run_fraction is None:
        return {}
    ends = _running_ends(m, running, now) if bound else []

    def mode(t: QueueTask) -> SupplyMode:
        return scheduling.supply_mode_for(t.spec, default_reservation)

    def start_after(t: QueueTask, slot_at: float) -> float | None:
        if not bound:
            return slot_at + m.acquire(mode(t))
        if not ends:
            return None  # capacity-bound with nothing running to wait for: no basis
        start = max(slot_at, heapq.heappop(ends)) + m.acquire(mode(t))
        heapq.heappush(ends, start + m.run_s(float(t.spec.timeout_seconds)))
        return start

    slot_at: float | None = 0.0
    for h in holders:  # at most one; its own acquisition has run for a while already
        if h.phase == lc.CLUSTER_BUSY:
            slot_at = start_after(h, 0.0)
        else:
            slot_at = max(0.0, m.acquire(mode(h)) - _age(now, h.phase_since))
            if bound:
                heapq.heappush(ends, slot_at + m.run_s(float(h.spec.timeout_seconds)))
    out: dict[int, float] = {}
    for t in waiting_in_order:
        if slot_at is None:
            break
        slot_at = start_after(t, slot_at)
        if slot_at is not None:
            out[t.id] = slot_at
    return out


# ---- how it is shown ----------------------------------------------------------------------------


def _step(seconds: float) -> int:
    return 60 if seconds < 600 else 300 if seconds < 7200 else 1800


def choices(seconds: float) -> tuple[int, ...]:
    """The rounded values a Message may show for ``seconds``: the nearest step first, then
    the other neighbour. A Message already showing either is kept (no rewrite)."""
    step = _step(seconds)
    lo = int(seconds // step) * step
    hi = lo + step
    return (lo, hi) if seconds - lo < hi - seconds else (hi, lo)


def fmt_eta(rounded: int) -> str:
    if rounded < 60:
        return "<1m"
    minutes = rounded // 60
    return f"~{minutes}m" if minutes < 60 else f"~{minutes // 60}h{minutes % 60:02d}m"
