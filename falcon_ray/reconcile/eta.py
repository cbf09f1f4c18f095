"""Rule 8's start estimate: when each Waiting task should reach Running, from the queue's own history.

Contract
--------
Pure: the history (``model.QueueHistory``, the queue's last ``HISTORY_TASKS`` starts as
the actor read them from the event log), the queue as it is now and its pools
(``Pools``) go in; seconds from ``now`` per Waiting task come out, or nothing for a task
when the history is too thin.

The model, stated once (docs/operations.md explains it to operators):

1. From the history, three typical times: a *hand-over*
   (given a pool whose nodes were Ready -> Running: ``StartSample.handed_over``; the median), a *create*
   (picked -> Running for the others, less the time in ClusterBusy, a start whose nodes had
   to come included; a create cut short by a pool given in its place counts as lasting at
   least as long as it had, Kaplan-Meier, ``StartSample.create_seen``: the creates that end
   are the short ones where pools come free often; the median per supply mode, its own few
   when one of them ended, all modes pooled otherwise: a
   flex-start create's capacity wait is not in a reservation's), and a *run* (each run as
   a fraction of its task's ``timeout_seconds``, from the ``RUN_NEIGHBOURS`` runs of the
   history whose timeouts are nearest the task's, counted at the same fraction of the
   task's timeout once the margin users add (``_offset_of``, learnt from the ended runs
   where it explains them) is taken out; a run still going counts as at least as
   long as it has lasted, Kaplan-Meier, ``Runs``). A time already spent counts: a running
   task (or a slot holder's create) is expected to last the median of the samples longer
   than it has lasted so far (a run with too few: its timeout; a create with none: a
   typical create more, as it waits for capacity again). A task not started yet is
   expected to run the mean run: the tasks ahead of a deep one add up, and the sum of
   heavy-tailed runs follows their mean, not their median.
2. Pools come free for the queue's topology: an idle pool now (when its create ends; with
   its nodes gone, when an acquisition begun at its create would: ``Pools.cold``, a cold
   hand-over, which a slot holder waiting for its own new pool's nodes does not take),
   a running task's pool at that task's expected end. The slot passes in pick order; the
   task that takes it at time s starts one hand-over after the first pool free at or after
   s, when that is before a create taken at s would end; otherwise it creates. A create
   whose task gets a pool that came free before it ended still ends, and its pool serves a
   later task; not so for a supply whose pool scales from zero (its capacity wait comes after
   its create, and a pool taken then replaces it), nor for a holder already waiting for
   the nodes of its new pool, which takes a pool that comes free first (issue 37's rule).
   A task that started frees its pool at its expected end.
3. Capacity-bound (the slot holder waits in ClusterBusy, or most of the last
   ``MIN_SAMPLES`` starts did): each task waits for room and then creates, unless a pool of
   the queue comes free first. Room comes free where the queue's own pools do not show it
   (another topology's run on the same reservation or chips ends): the wait for it is
   what is left of the waits for capacity the queue's starts went through
   (``Model.after_busy``); with none in the history, a task waits for a pool to come free
   only. No hand-over is foreseen when the queue does not hand pools over.
4. Overtakers (one slot): the pick rule grants one actor twice running only while no other
   actor has a task waiting, so where the pick order does, a task of another actor that
   arrives by then is picked between the two. Arrivals are foreseen at the rate of the
   queue's last ``ARRIVALS_KEPT`` (``QueueHistory.arrivals``), one at such a grant once the
   arrivals of other actors expected by then, less those foreseen already, reach
   ``OVERTAKE_AT``; it acquires and runs as the queue's recent starts did. Higher-priority
   arrivals, which overtake every task, are not foreseen.

No estimate without ``MIN_SAMPLES`` starts, nor capacity-bound without as many ended runs,
nor for the tasks from the first one that has neither a pool to wait for nor a create time
in the history, nor on a cluster out of service. The cluster's other node-pool operations
are not looked at: a create's typical time is what the recent creates took, their wait for
the cluster's operation queue included.

The range (``ranges``): with each expected start a latest start that holds for COVERAGE
(9 in 10) of the tasks. The queue scores each task's first estimate against its actual
start (``score``: the lateness over the expected wait plus SCALE_S, so a short wait is not
held to a bound of seconds) and keeps its last SCORES_KEPT scores with their supply mode
in the history (``QueueHistory.scores``). The latest start is the expected one moved by
the split-conformal COVERAGE quantile of the mode's scores (``Model.bound``); a mode with
fewer than MIN_SCORES takes the larger of its prior (``PRIOR_SCORES``, PRIOR_SCORE for
a mode without one) and the quantile of all the queue's scores; a flex-start bound is
never below its ``MIN_BOUNDS`` (a capacity wait's error is shared by the tasks behind
it, so its scores come in runs), nor is the bound of any task behind a flex-start holder
or a flex-start task of its queue while the queue has one slot (it shares that wait). The bound is calibrated per (cluster, topology, supply mode), so it keeps
its coverage where the model is wrong, and widens when the model errs more. The scores
live in the queue's memory: after a restart the prior holds until they are back.

``choices`` rounds an expected start to an absolute time for the Message (1 minute steps
when it is less than 10 minutes away, 5 minute steps less than 2 hours away, 30 minute
steps beyond, none coarser than the range is wide), ``latest_choices`` rounds a latest
start up with the same step, so a Message need not change while the range holds. The
estimate decides nothing.
"""

from __future__ import annotations

import datetime as dt
import functools
import heapq
import math
import statistics
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from falcon_ray import lifecycle as lc
from falcon_ray import render, scheduling
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import Lease, QueueHistory, QueueTask, StartSample, TaskEvent
from falcon_ray.spec import SupplyMode

HISTORY_TASKS = 20  # starts kept per queue
MIN_SAMPLES = 3
HANDOVER_S = 60.0  # a hand-over's time while the history has none
RUN_NEIGHBOURS = 8
SAME_TIMEOUT = 0.05  # two timeouts this close (a share of the larger) say nothing of the offset
OFFSET_GAIN = 0.5  # an offset counts when it takes at least half the runs' spread away

# the latest start: the expected one plus the COVERAGE quantile of the scores of the queue's
# recent first estimates (``score``), times the expected wait plus SCALE_S
COVERAGE = 0.9
SCALE_S = 300.0  # a short expected wait is as uncertain as one of this length
PRIOR_SCORE = 2.5  # the bound while a queue has fewer than MIN_SCORES scores of a mode
MIN_SCORES = 10
# a flex-start start waits for capacity, whose spread a queue's few creates do not show yet
PRIOR_SCORES = {SupplyMode.FLEX_START: 3.5}
# and never less, however well its recent estimates did: a flex-start start waits for capacity
# GKE promises no time for, and the tasks of one queue share that wait's error (one late
# delivery makes every task behind it late), so its scores come in runs and 40 of them may
# be a few independent draws; a flex-start latest start is at least twice the expected wait
MIN_BOUNDS = {SupplyMode.FLEX_START: 1.0}
SCORES_KEPT = 40  # scores kept per queue (all modes)

# the round robin's overtakers: tasks of other actors that arrive while a task waits behind
# its own actor's and are picked before it (``_Overtakers``)
ARRIVALS_KEPT = 40  # the queue's latest arrivals kept for their rate
MIN_ARRIVALS = 5  # fewer: no overtaker foreseen
OVERTAKE_AT = math.log(2)  # expected arrivals at which one has come for one in two (Poisson)


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
    the moves a queue made itself since it picked the task (``_given_at``: whether it ran on
    a pool given to it, and since when)."""
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
    given = _given_at(phases[picked:run], supply_mode)
    return StartSample(task_id, supply_mode, phases[picked][1], running_at, busy, float(timeout_s), ran, given)


def _given_at(moves: Sequence[tuple[lc.Phase, dt.datetime]], supply_mode: SupplyMode) -> dt.datetime | None:
    """When the task was given the pool whose Ready nodes it ran on (its last Dispatching),
    or None when its start waited for nodes to come: the moves from its pick to Running.

    - no Dispatching: its own pool's nodes came for its Job (a pool that scales from zero);
    - WaitingForNode after the last Dispatching: the pool it was given had no nodes (its own
      new pool, one whose create it took over, or an idle one the autoscaler had emptied),
      they came for its Job: an acquisition, not a hand-over;
    - WaitingForNode before the last Dispatching: on a pool that scales from zero, or after
      an earlier Dispatching, it was waiting for nodes and took a pool whose nodes were Ready
      instead (a hand-over then); otherwise its own pool's nodes registered (its create);
    - neither: given a pool with its nodes, at its pick or in place of its own create."""
    steps = [p for p, _ in moves]
    last = max((i for i, p in enumerate(steps) if p == lc.DISPATCHING), default=None)
    if last is None or lc.WAITING_FOR_NODE in steps[last + 1 :]:
        return None
    if lc.WAITING_FOR_NODE not in steps[:last]:
        return moves[last][1]
    first_wait = steps.index(lc.WAITING_FOR_NODE)
    return moves[last][1] if render.scales_from_zero(supply_mode) or lc.DISPATCHING in steps[:first_wait] else None


def ended(sample: StartSample, at: dt.datetime) -> StartSample:
    return replace(sample, ran_s=max(0.0, (at - sample.running_at).total_seconds()))


# ---- the model -----------------------------------------------------------------------------------


def _survival(points: Sequence[tuple[float, bool]]) -> list[tuple[float, float]]:
    """Kaplan-Meier: (value, share of the durations longer) after each value at which one
    ended, from (duration, ended) pairs; a duration not ended (censored) counts as lasting at
    least that long, and an end counts before a censoring at the same value."""
    ordered = sorted((v, not ended) for v, ended in points)
    at_risk, s, out = len(ordered), 1.0, []
    i = 0
    while i < len(ordered):
        v = ordered[i][0]
        ends = 0
        while i < len(ordered) and ordered[i][0] == v and not ordered[i][1]:
            ends, i = ends + 1, i + 1
        if ends:
            s *= 1.0 - ends / at_risk
            out.append((v, s))
            at_risk -= ends
        while i < len(ordered) and ordered[i][0] == v:
            at_risk, i = at_risk - 1, i + 1
    return out


@functools.lru_cache(maxsize=256)
def _survival_steps(samples: tuple[tuple[float, bool], ...]) -> tuple[tuple[float, float], ...]:
    """``_survival`` of a model's creates or waits for room: asked for every holder and fresh
    create of a step."""
    return tuple(_survival(samples))


def _median_after(steps: Sequence[tuple[float, float]], spent: float) -> float | None:
    """The median of the durations longer than ``spent`` (``_survival``'s steps), or None
    when it lies past every end seen; exactly half: between that end and the next."""
    s0 = next((s for v, s in reversed(steps) if v <= spent), 1.0)
    later = [(v, s) for v, s in steps if v > spent]
    half = s0 / 2.0
    for k, (v, s) in enumerate(later):
        if s <= half + 1e-12:
            if abs(s - half) <= 1e-12 and k + 1 < len(later):
                return (v + later[k + 1][0]) / 2.0
            return v
    return None


def _beyond(longest: float, spent: float) -> float:
    """How long a wait for room that has lasted ``spent``, longer than the ``longest`` seen,
    is expected to last: twice the longest, doubled until past the time spent. The expected
    end stays put while the wait goes on and moves a few times over a long one (promised a
    typical wait from now, it would move at every step: a Message rewritten each time)."""
    end = max(longest, 1.0)
    while end <= spent:
        end *= 2.0
    return end


@dataclass(frozen=True)
class Model:
    handover_s: float
    # (seconds, ended) per mode; not ended: a create cut short by a pool given in its place,
    # which would have lasted longer; a mode without an ended create: all modes' (pooled)
    create_s: dict[SupplyMode, tuple[tuple[float, bool], ...]]
    pooled_create_s: tuple[tuple[float, bool], ...]
    run_fractions: list[tuple[float, float]]  # (timeout, ended run / timeout); empty with fewer than MIN_SAMPLES
    bound_scores: dict[SupplyMode, float] = field(default_factory=dict)  # per mode with MIN_SCORES scores
    pooled_bound: float = PRIOR_SCORE  # the other modes'
    running: tuple[tuple[int, float, dt.datetime], ...] = ()  # (task, timeout, running since) of the runs not ended
    run_offset: float | None = None  # ``_offset_of(run_fractions)``, worked out once per history
    busy_s: tuple[tuple[float, bool], ...] = ()  # (seconds, ended in room) of the starts' waits in ClusterBusy

    def bound(self, mode: SupplyMode) -> float:
        """The score the latest start of a task of ``mode`` adds (``latest``)."""
        own = self.bound_scores.get(mode)
        score = own if own is not None else max(self.pooled_bound, PRIOR_SCORES.get(mode, PRIOR_SCORE))
        return max(score, MIN_BOUNDS.get(mode, 0.0))

    def creates(self, mode: SupplyMode) -> tuple[tuple[float, bool], ...]:
        return self.create_s.get(mode, self.pooled_create_s)

    def create(self, mode: SupplyMode, spent: float = 0.0) -> float | None:
        """Seconds left of a create of ``mode`` that has run ``spent``: the median of the
        creates longer than that (Kaplan-Meier: a create cut short by a hand-over counts as
        lasting at least as long as it had), less ``spent``; None: no create seen."""
        samples = self.creates(mode)
        if not samples:
            return None
        steps = _survival_steps(samples)
        median = _median_after(steps, spent)
        if median is not None:
            return median - spent
        longest = max(v for v, _ in samples)
        if longest > spent:  # past every create that ended, not past every one seen
            return longest - spent
        # longer than every create seen: it waits for capacity again (a flex-start scale-up
        # that found too little retries after another capacity wait), a typical create more
        typical = _median_after(steps, 0.0)
        return typical if typical is not None else longest

    def after_busy(self, mode: SupplyMode, spent: float = 0.0) -> float | None:
        """Seconds until a task of ``mode`` that has waited ``spent`` for capacity
        (ClusterBusy) gets room from outside the queue, then creates: the median of the
        queue's waits for room longer than ``spent`` (Kaplan-Meier: a wait that ended in a
        pool of the queue handed over would have lasted longer), then a create. None when no
        wait of the queue ended in room (a queue alone on its reservation gets room only from
        its own pools) or no create was seen. Room comes free where the queue's own pools do
        not show it: another topology's run on the same reservation or chips ends. A wait
        longer than all those seen is expected to last twice the longest, doubled until it is
        past the time spent: the promise moves a few times over a long wait, not at every step."""
        create = self.create(mode)
        if create is None or not any(ended for _, ended in self.busy_s):
            return None
        median = _median_after(_survival_steps(self.busy_s), spent)
        if median is None:
            median = _beyond(self.busy_s[-1][0], spent)
        return median - spent + create

    def runs(self, now: dt.datetime | None = None, going: Collection[int] = ()) -> Runs:
        """The run model at ``now``: the ended runs, and the history's runs of the tasks in
        ``going`` (the queue's Running tasks: a start whose end the history has not recorded,
        an abort for one, is left out) as runs at least as long as they have lasted."""
        if not self.run_fractions:
            return Runs(())
        ended = tuple((t, f, True) for t, f in self.run_fractions)
        if now is None:
            return Runs(ended, self.run_offset)
        still = tuple((t, min(1.0, _age(now, at) / t), False) for tid, t, at in self.running if t > 0 and tid in going)
        return Runs(ended + still, self.run_offset)


def _offset_of(runs: Sequence[tuple[float, float]]) -> float | None:
    """The offset of the line through the ended runs (timeout, fraction), run = offset +
    slope x timeout: with a timeout set as a multiple of the run plus a margin, minus the
    margin over the multiple (twice the run plus an hour: -1,800 s). Theil-Sen, which a run
    that failed early moves little: the slope the median of the slopes between every two
    runs of different timeouts, within [0, 1], the offset the median of run - slope x
    timeout. None when no two timeouts differ (the runs say nothing of it) or when the
    offset does not explain the runs."""
    slopes = [
        (fb * tb - fa * ta) / (tb - ta)
        for i, (ta, fa) in enumerate(runs)
        for tb, fb in runs[i + 1 :]
        if abs(tb - ta) > SAME_TIMEOUT * max(ta, tb)
    ]
    if not slopes:
        return None
    slope = min(1.0, max(0.0, statistics.median(slopes)))
    offset = statistics.median(f * t - slope * t for t, f in runs)
    # kept only when it explains the runs: their spread around one share of the timeout at
    # least halves once it is taken out (runs that are a share of their timeouts, with noise,
    # give an offset of noise alone)
    return offset if _spread([f - offset / t for t, f in runs]) < OFFSET_GAIN * _spread([f for _, f in runs]) else None


def _spread(values: Sequence[float]) -> float:
    """The median absolute deviation from the median."""
    mid = statistics.median(values)
    return statistics.median(abs(v - mid) for v in values)


@dataclass(frozen=True)
class Runs:
    """Run lengths as fractions of their tasks' timeouts: (timeout, fraction, ended), where a
    run not ended yet is censored at the fraction it has lasted. A queue's recent ended
    runs alone are the short ones (the long runs of the same starts are still going), so
    the runs still going count as lasting at least that long (Kaplan-Meier).

    A neighbour's run counts at the timeout asked about as the same fraction of it, once
    ``offset`` is taken from both (``_offset_of``, learnt from the ended runs): where users
    set a timeout of a margin plus a multiple of the run, a run's share of its timeout is
    not the same at 1 h and at 3 h, but (run - offset) / timeout is. Runs that are a share
    of their timeouts give an offset near 0, and a neighbour counts as the same fraction,
    as it does without an offset (every timeout the same)."""

    runs: tuple[tuple[float, float, bool], ...]
    offset: float | None = None

    def _survival(self, timeout_s: float) -> list[tuple[float, float]]:
        """(fraction, share of runs longer) after each ended run, from the RUN_NEIGHBOURS runs
        whose timeouts are nearest (by ratio) to ``timeout_s``: a short timeout is set for a
        short run, and the slack users leave is not proportional to the run."""
        near = self.runs
        if len(near) > RUN_NEIGHBOURS:
            at = math.log(max(1.0, timeout_s))
            near = tuple(sorted(near, key=lambda x: (abs(math.log(max(1.0, x[0])) - at), x[0]))[:RUN_NEIGHBOURS])
        if self.offset is not None and timeout_s > 0:
            a = self.offset
            near = tuple((t, min(1.0, max(0.0, f - a / t + a / timeout_s)), e) for t, f, e in near)
        return _survival([(f, ended) for _, f, ended in near])

    def left(self, timeout_s: float, age: float = 0.0) -> float:
        """Seconds left of a run with this timeout that has lasted ``age``: the median of
        the runs longer than that, less ``age``; the rest of its timeout when too few runs
        seen were longer."""
        rest = max(0.0, timeout_s - age)
        f = _median_after(self._survival(timeout_s), age / timeout_s if timeout_s > 0 else 0.0)
        return rest if f is None else min(max(0.0, f * timeout_s - age), rest)

    def mean(self, timeout_s: float) -> float:
        """The mean length of a run with this timeout that has not started (runs end by
        their timeout): a chain of runs ahead lasts about the sum of their means, and a
        heavy-tailed run's mean is far above its median."""
        steps = self._survival(timeout_s)
        total, prev, s = 0.0, 0.0, 1.0
        for f, after in steps:
            total += s * (min(f, 1.0) - prev)
            prev, s = min(f, 1.0), after
        total += s * max(0.0, 1.0 - prev)
        return total * timeout_s


_MODELS: dict[int, tuple[QueueHistory, Model | None]] = {}  # id(history) -> (history, its model)
_MODELS_KEPT = 256


def model_of(history: QueueHistory) -> Model | None:
    """The model of a history, worked out once per history value: a history is immutable, and
    a step decides several times on the same one (its rounds, its Messages, and in the
    simulation the search for its next due tick)."""
    kept = _MODELS.get(id(history))
    if kept is not None and kept[0] is history:
        return kept[1]
    model = _model_of(history)
    if len(_MODELS) >= _MODELS_KEPT:
        _MODELS.clear()
    _MODELS[id(history)] = (history, model)
    return model


def _model_of(history: QueueHistory) -> Model | None:
    samples = history.samples
    if len(samples) < MIN_SAMPLES:
        return None
    handed = [s.handover_s for s in samples if s.handed_over]
    by_mode: dict[SupplyMode, list[tuple[float, bool]]] = {}
    for s in samples:
        c = s.create_seen
        if c is not None:
            by_mode.setdefault(s.supply_mode, []).append(c)
    # a mode with fewer than MIN_SAMPLES creates: its own few when one of them ended (another
    # mode's creates leave out its capacity wait: a flex-start create waits for capacity, a
    # reservation's does not), all modes' otherwise
    per_mode = {m: tuple(sorted(v)) for m, v in by_mode.items() if any(ended for _, ended in v)}
    runs = [(s.timeout_s, min(1.0, s.ran_s / s.timeout_s)) for s in samples if s.ran_s is not None and s.timeout_s > 0]
    scores: dict[SupplyMode, list[float]] = {}
    for mode, x in history.scores:
        scores.setdefault(mode, []).append(x)
    pooled = [x for _, x in history.scores]
    return Model(
        statistics.median(handed) if handed else HANDOVER_S,
        per_mode,
        tuple(sorted(x for v in by_mode.values() for x in v)),
        sorted(runs) if len(runs) >= MIN_SAMPLES else [],
        {m: _quantile(v) for m, v in scores.items() if len(v) >= MIN_SCORES},
        max(PRIOR_SCORE, _quantile(pooled)) if len(pooled) >= MIN_SCORES else PRIOR_SCORE,
        tuple((s.task_id, s.timeout_s, s.running_at) for s in samples if s.ran_s is None and s.timeout_s > 0),
        _offset_of(runs) if len(runs) >= MIN_SAMPLES else None,
        # a wait for room that ended in a pool of the queue handed over says only that room had
        # not come from elsewhere by then (censored)
        tuple(sorted((s.capacity_wait_s, not s.handed_over) for s in samples if s.capacity_wait_s > 0)),
    )


# ---- the latest start ----------------------------------------------------------------------------


def score(expected_s: float, actual_s: float) -> float:
    """How late a task started against its first estimate, in units of that estimate's
    uncertainty: (actual - expected) / (expected + SCALE_S), both waits from when the
    estimate was made (negative: earlier than expected)."""
    return (actual_s - expected_s) / (max(0.0, expected_s) + SCALE_S)


def _quantile(values: Sequence[float]) -> float:
    """The split-conformal COVERAGE quantile: the ceil((n + 1) COVERAGE)-th smallest of n."""
    v = sorted(values)
    k = min(len(v), math.ceil((len(v) + 1) * COVERAGE))
    return v[k - 1]


def latest(expected_s: float, bound: float) -> float:
    """The latest start (seconds from now) that holds for COVERAGE of the tasks whose
    scores gave ``bound``: never before the expected one."""
    return expected_s + max(0.0, bound) * (max(0.0, expected_s) + SCALE_S)


# ---- the estimate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pools:
    """The queue's pools as the estimate reads them."""

    idle: Sequence[Lease] = ()  # Idle leases no task has claimed
    held: Mapping[int, Lease] = field(default_factory=dict)  # the slot holder's lease, by task id
    handover: bool = True  # the queue hands an ended task's pool to a waiting one
    cold: frozenset[int] = frozenset()  # idle leases up (ready_at) without all their nodes Ready


def _age(now: dt.datetime, since: dt.datetime | None) -> float:
    return max(0.0, (now - since).total_seconds()) if since else 0.0


class _Queue:
    """The slot passed task by task over heaps of the times pools come free: ``free``, pools
    whose nodes are Ready then, and ``short``, idle pools whose nodes must still come, which
    a slot holder waiting for the nodes of its own new pool does not take
    (``acquire.switch_to_idle``)."""

    def __init__(
        self, m: Model, runs: Runs, bound: bool, free: list[float], default_reservation: str, short: list[float] | None = None
    ) -> None:
        self.m, self.runs, self.bound, self.free, self.default_reservation = m, runs, bound, free, default_reservation
        heapq.heapify(self.free)
        self.short = sorted(short or ())  # a sorted list is a heap
        # a fresh create per mode (a median) and a whole run per timeout (a mean): asked once
        # per value, not once per waiting task (a queue of 10,000 has a few modes and timeouts)
        self.fresh_create: dict[SupplyMode, float | None] = {}
        self.fresh_busy: dict[SupplyMode, float | None] = {}
        self.whole_run: dict[float, float] = {}

    def mode(self, t: QueueTask) -> SupplyMode:
        return scheduling.supply_mode_for(t.spec, self.default_reservation)

    def create(self, mode: SupplyMode) -> float | None:
        if mode not in self.fresh_create:
            self.fresh_create[mode] = self.m.create(mode)
        return self.fresh_create[mode]

    def after_busy(self, mode: SupplyMode) -> float | None:
        if mode not in self.fresh_busy:
            self.fresh_busy[mode] = self.m.after_busy(mode)
        return self.fresh_busy[mode]

    def started(self, timeout: float, start: float) -> float:
        if self.m.run_fractions:
            run = self.whole_run.get(timeout)
            if run is None:
                run = self.whole_run[timeout] = self.runs.mean(timeout)
            heapq.heappush(self.free, start + run)
        return start

    def take(
        self, timeout: float, at: float, create_left: float | None, creating: bool = False, keeps: bool = True, ready: bool = False
    ) -> float | None:
        """A task of ``timeout`` holds the slot from ``at`` with ``create_left`` seconds of a create to go
        (None: it cannot create; ``creating``: its create was asked for already; ``keeps``:
        a create cut short by a pool that comes free goes on, for a later task; ``ready``:
        it takes only a pool whose nodes are Ready): its start."""
        heap = self.free
        if not ready and self.short and (not heap or self.short[0] < heap[0]):
            heap = self.short
        pool = heap[0] if heap else None
        if pool is not None and (create_left is None or pool < at + create_left):
            heapq.heappop(heap)
            if create_left is not None and keeps and (creating or pool > at):  # its create goes on, for a later task
                heapq.heappush(self.free, at + create_left)
            return self.started(timeout, max(at, pool) + self.m.handover_s)
        if create_left is None:
            return None  # nothing to wait for, nothing to create: no basis
        return self.started(timeout, at + create_left)

    def waiting(self, t: QueueTask, slot_at: float, bound: bool | None = None) -> float | None:
        """``bound``: whether ``t``'s supply waits for capacity with no create to count on
        (None: the queue's ``bound``)."""
        return self.waiting_as(self.mode(t), float(t.spec.timeout_seconds), slot_at, bound)

    def waiting_as(self, mode: SupplyMode, timeout: float, slot_at: float, bound: bool | None = None) -> float | None:
        """``waiting`` for a task of ``mode`` and ``timeout`` (one known or an overtaker to come)."""
        bound = self.bound if bound is None else bound
        if bound:  # it waits for room (ClusterBusy) and creates then, unless a pool comes free first
            return self.take(timeout, slot_at, self.after_busy(mode), keeps=False)
        # a pool that scales from zero waits for its nodes after its create: a pool that comes
        # free then most likely finds it waiting for them, and its own pool goes (dispatch)
        return self.take(timeout, slot_at, self.create(mode), keeps=not render.scales_from_zero(mode))

    def holder(self, t: QueueTask, lease: Lease | None, now: dt.datetime) -> float | None:
        timeout = float(t.spec.timeout_seconds)
        if t.phase == lc.CLUSTER_BUSY:
            # room or a pool that comes free first; no create asked yet, none goes on
            return self.take(timeout, 0.0, self.m.after_busy(self.mode(t), _age(now, t.phase_since)), keeps=False)
        if t.phase == lc.DISPATCHING:
            return self.started(timeout, max(0.0, self.m.handover_s - _age(now, t.phase_since)))
        since = lease.created_at if lease is not None else t.phase_since
        # a pool it took over acquires that pool's supply (an emptied flex-start pool handed
        # to a reservation task waits for flex-start capacity)
        left = self.m.create(scheduling.acquiring_mode(t.spec, lease, self.default_reservation), _age(now, since)) or 0.0
        if lease is None or lease.state in (LeaseState.REQUESTED, LeaseState.CREATING):
            return self.take(timeout, 0.0, left, creating=lease is not None)  # switches to a pool that comes free first
        if t.phase == lc.WAITING_FOR_NODE:  # takes a pool with Ready nodes that comes free first; its own goes
            return self.take(timeout, 0.0, left, keeps=False, ready=True)
        return self.started(timeout, left)


class _Overtakers:
    """The tasks of other actors that will arrive while a task waits and be picked before
    it. The pick rule gives the slot to the oldest actor's head but never twice running to
    one actor while another has a task waiting: where the pick order grants one actor twice
    in a row (nobody else waits then), a task of another actor that has arrived by then is
    picked between the two. Arrivals come at the queue's recent rate (its last
    ``ARRIVALS_KEPT``, Poisson), and one is foreseen at a grant when the arrivals expected by
    then, less those already foreseen, reach ``OVERTAKE_AT``. An overtaker acquires and runs
    as the queue's recent starts did (their commonest supply, their median timeout)."""

    def __init__(self, history: QueueHistory, now: dt.datetime, last_granted: str) -> None:
        arrivals = history.arrivals
        window = _age(now, arrivals[0][0]) if arrivals else 0.0
        self.on = len(arrivals) >= MIN_ARRIVALS and window > 0.0 and bool(history.samples)
        self.last = last_granted
        self.seen = 0
        if not self.on:
            return
        self.rate = len(arrivals) / window
        self.by_actor = Counter(actor for _, actor in arrivals)
        modes = Counter(x.supply_mode for x in history.samples)
        self.mode = max(modes, key=lambda m: (modes[m], m.value))
        self.timeout = statistics.median(x.timeout_s for x in history.samples)

    def before(self, q: _Queue, t: QueueTask, slot_at: float) -> float:
        """When the slot comes to ``t`` (it is free for the pick at ``slot_at``), an
        overtaker foreseen taken first (none when its start has no basis)."""
        last, self.last = self.last, t.actor
        if not self.on or t.actor != last:
            return slot_at
        others = self.rate * (1.0 - self.by_actor[t.actor] / self.by_actor.total())  # arrivals of other actors per second
        expected = others * slot_at - self.seen
        if expected < OVERTAKE_AT:
            return slot_at
        after = q.waiting_as(self.mode, self.timeout, slot_at)
        if after is None:
            return slot_at
        self.seen += 1
        return after


def estimate(
    now: dt.datetime,
    history: QueueHistory,
    holders: Sequence[QueueTask],
    running: Sequence[QueueTask],
    waiting_in_order: Sequence[QueueTask],
    default_reservation: str,
    pools: Pools | None = None,
    per_supply: bool = False,
    last_granted: str = "",
) -> dict[int, float]:
    """Seconds from ``now`` until each Waiting task is expected to reach Running.
    ``last_granted``: the actor the slot went to last (the pick rule's round robin; with
    one slot, the overtakers to come are foreseen, ``_Overtakers``).
    ``per_supply``: each supply mode has its own slot (``Settings.slot_per_supply``), so a
    task waits only for the holder and the tasks ahead of its own supply, and a
    reservation wait (ClusterBusy) leaves the other supplies' creates to count on; the
    pools that come free still go to the tasks in the pick order, whatever their supply."""
    m = model_of(history)
    if m is None or not waiting_in_order:
        return {}
    pools = pools or Pools()
    recent = history.samples[-MIN_SAMPLES:]
    capacity_bound = sum(1 for s in recent if s.capacity_wait_s > 0) * 2 > len(recent)  # most acquisitions waited
    bound = any(t.phase == lc.CLUSTER_BUSY for t in holders) or capacity_bound
    if (capacity_bound if per_supply else bound) and not m.run_fractions:
        return {}
    free: list[float] = []
    short: list[float] = []
    runs = m.runs(now, {t.id for t in running})
    if pools.handover:
        for lease in pools.idle:
            if lease.ready_at is not None and lease.id not in pools.cold:
                free.append(0.0)
            else:  # its nodes come when an acquisition begun at its create would
                short.append(m.create(lease.supply_mode, _age(now, lease.created_at)) or 0.0)
        if m.run_fractions:
            free += [runs.left(float(t.spec.timeout_seconds), _age(now, t.phase_since)) for t in running]
    q = _Queue(m, runs, bound, free, default_reservation, short)
    if per_supply:
        return _per_supply(q, now, holders, waiting_in_order, pools, capacity_bound)
    return _one_slot(q, now, holders, waiting_in_order, pools, _Overtakers(history, now, last_granted))


def _one_slot(
    q: _Queue, now: dt.datetime, holders: Sequence[QueueTask], waiting_in_order: Sequence[QueueTask], pools: Pools, overtakers: _Overtakers
) -> dict[int, float]:
    """``estimate`` with the queue's one slot: the holder, then the waiting tasks in the pick
    order, each behind the overtakers foreseen before it."""
    slot_at: float | None = 0.0
    for h in holders:  # at most one; its own acquisition has run for a while already
        slot_at = q.holder(h, pools.held.get(h.id), now)
    out: dict[int, float] = {}
    for t in waiting_in_order:
        if slot_at is None:
            break
        slot_at = q.waiting(t, overtakers.before(q, t, slot_at))
        if slot_at is not None:
            out[t.id] = slot_at
    return out


def _per_supply(
    q: _Queue, now: dt.datetime, holders: Sequence[QueueTask], waiting_in_order: Sequence[QueueTask], pools: Pools, capacity_bound: bool
) -> dict[int, float]:
    """``estimate`` with a slot per supply mode: each supply's holder, then its waiting
    tasks in the pick order; a supply whose holder waits for reservation room (ClusterBusy)
    counts on pools that come free only, as the whole queue does when most of its recent
    acquisitions waited for capacity."""
    busy = {q.mode(t) for t in holders if t.phase == lc.CLUSTER_BUSY}
    slots: dict[SupplyMode, float | None] = {}
    for h in holders:  # one a supply, besides parked capacity waits
        slots[q.mode(h)] = q.holder(h, pools.held.get(h.id), now)
    out: dict[int, float] = {}
    for t in waiting_in_order:
        mode = q.mode(t)
        at = slots.get(mode, 0.0)
        if at is None:
            continue
        at = slots[mode] = q.waiting(t, at, bound=capacity_bound or mode in busy)
        if at is not None:
            out[t.id] = at
    return out


@dataclass(frozen=True)
class Range:
    """A Waiting task's start range, in seconds from now: the model's ``expected`` start,
    the ``latest`` (``expected`` moved by the COVERAGE quantile of the queue's scores of
    the task's supply mode, ``Model.bound``) and that ``mode``."""

    expected: float
    latest: float
    mode: SupplyMode


def ranges(
    now: dt.datetime,
    history: QueueHistory,
    holders: Sequence[QueueTask],
    running: Sequence[QueueTask],
    waiting_in_order: Sequence[QueueTask],
    default_reservation: str,
    pools: Pools | None = None,
    per_supply: bool = False,
    last_granted: str = "",
) -> dict[int, Range]:
    """``estimate`` as each Waiting task's ``Range``."""
    expected = estimate(now, history, holders, running, waiting_in_order, default_reservation, pools, per_supply, last_granted)
    m = model_of(history)
    if not expected or m is None:
        return {}
    out: dict[int, Range] = {}
    modes: dict[SupplyMode | None, tuple[SupplyMode, float]] = {}
    # with one slot, a task waits behind the acquisitions ahead of it whatever their supply:
    # its bound is never below the floor of a supply whose capacity wait it may share
    # (MIN_BOUNDS: a holder's acquiring flex-start, on its own pool or one it took over, or a
    # flex-start task's ahead of it)
    acquiring = () if per_supply else [h for h in holders if h.phase != lc.DISPATCHING]
    held = pools.held if pools is not None else {}
    floor = max((MIN_BOUNDS.get(scheduling.acquiring_mode(h.spec, held.get(h.id), default_reservation), 0.0) for h in acquiring), default=0.0)
    for t in waiting_in_order:
        e = expected.get(t.id)
        mode_bound = modes.get(t.spec.supply_mode)
        if mode_bound is None:
            mode = scheduling.supply_mode_for(t.spec, default_reservation)
            mode_bound = modes[t.spec.supply_mode] = (mode, m.bound(mode))
        if e is not None:
            out[t.id] = Range(e, latest(e, max(mode_bound[1], floor)), mode_bound[0])
        if not per_supply:
            floor = max(floor, MIN_BOUNDS.get(mode_bound[0], 0.0))
    return out


# ---- how it is shown ----------------------------------------------------------------------------


def _step(seconds: float, width: float | None = None) -> int:
    """The rounding step of a time ``seconds`` away: 1, 5 or 30 minutes by how far, and no
    coarser than the range's ``width`` (latest - expected) when one is claimed."""
    step = 60 if seconds < 600 else 300 if seconds < 7200 else 1800
    if width is not None:
        step = min(step, 1800 if width >= 1800 else 300 if width >= 300 else 60)
    return step


def choices(now: dt.datetime, seconds: float, width: float | None = None) -> tuple[dt.datetime, ...]:
    """The rounded times a Message may show for a start ``seconds`` after ``now``: the
    nearest step first, then the other neighbour. A Message already showing either is
    kept (no rewrite)."""
    lo, hi, at = _around(now, seconds, _step(seconds, width))
    return (lo, hi) if (at - lo) < (hi - at) else (hi, lo)


LATEST_KEPT_STEPS = 6  # a Message showing a latest start up to this many steps later keeps it


def latest_choices(now: dt.datetime, seconds: float, width: float) -> tuple[dt.datetime, ...]:
    """The rounded times a Message may show for a latest start ``seconds`` after ``now``:
    rounded up (a bound is not moved earlier by its rounding), then up to
    LATEST_KEPT_STEPS steps later, which a Message already showing one keeps (a later
    bound still holds; the range is not rewritten for each small move)."""
    lo, hi, at = _around(now, seconds, _step(seconds, width))
    up = lo if at == lo else hi
    return tuple(up + k * (hi - lo) for k in range(LATEST_KEPT_STEPS + 1))


def _around(now: dt.datetime, seconds: float, step: int) -> tuple[dt.datetime, dt.datetime, dt.datetime]:
    at = now + dt.timedelta(seconds=seconds)
    midnight = at.replace(hour=0, minute=0, second=0, microsecond=0)
    into = (at - midnight).total_seconds()
    lo = midnight + dt.timedelta(seconds=int(into // step) * step)
    return lo, lo + dt.timedelta(seconds=step), at


@functools.lru_cache(maxsize=4096)
def fmt_at(at: dt.datetime) -> str:
    """A rounded start time as the Message shows it (UTC, like "waiting since")."""
    return at.strftime("%Y-%m-%d %H:%M")


@functools.lru_cache(maxsize=4096)
def fmt_latest(expected: dt.datetime, at: dt.datetime) -> str:
    """A rounded latest start as the Message shows it: the time alone on the expected
    start's day, with its date otherwise."""
    return at.strftime("%H:%M") if at.date() == expected.date() else at.strftime("%Y-%m-%d %H:%M")
