"""When a queue's decision next differs: the step a scheduler may not leave out.

Contract
--------
``next_due(queue, view, now, settings, tick, horizon_ticks) -> int`` answers, for a queue
that has just carried out ``decide(queue, view, now, settings)`` (every group of it won),
at which of its next ticks ``now + k * tick`` (k = 1 .. ``horizon_ticks``) the decision on
the same observations asks for something it did not ask for at ``now``: a group that is
not one of ``now``'s. Time alone changes a decision (a limit or a backoff runs out, a
Message's counter or start estimate moves on), so before that tick a step on unchanged
observations would only repeat what was done (each effect is idempotent and its write is
in the rows already) and a scheduler may leave it out. It returns ``horizon_ticks`` when
nothing new comes within the horizon.

The search asks the horizon first: most queues are quiet (nothing new within the
horizon: 408 of 464 answers over six simulated hours of a busy day), and that answer then
costs two calls to ``decide``. Otherwise it doubles from the first tick, then bisects:
about 2 log2(k) more calls for an answer k. A caller may give a guess (a queue whose
Messages move once a minute is due a minute after its last step, again and again): a
right guess costs two calls, a wrong one narrows the search. Both rest on one property of the rules: once
a wait has run out it stays run out (a decision that asks for something new at a tick
asks for something new at every later one, until the observations change). The function is pure: it reads no clock and does
no I/O; ``decide`` may be given (a test's) and is ``reconcile.decide`` otherwise.

What it does not know is what changes the observations (another writer's rows, the
cluster's pools, operations and Jobs): whoever calls it steps the queue when those
change as well.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from falcon_ray.config import Settings
from falcon_ray.model import ClusterView, QueueState
from falcon_ray.reconcile.effects import EffectGroup

Decide = Callable[[QueueState, ClusterView, dt.datetime, Settings], list[EffectGroup]]


def next_due(
    queue: QueueState,
    view: ClusterView,
    now: dt.datetime,
    settings: Settings,
    tick: float,
    horizon_ticks: int,
    decide: Decide | None = None,
    done: list[EffectGroup] | None = None,
    guess: int | None = None,
) -> int:
    """The first tick (1 .. ``horizon_ticks``) whose decision has a group ``now``'s lacks (the
    module's contract). ``done``: ``decide`` at ``now`` when the caller has it already;
    ``guess``: a likely answer (the last one of the same queue), tried first."""
    if decide is None:
        from falcon_ray.reconcile import decide as decide_rules

        decide = decide_rules
    if done is None:
        done = decide(queue, view, now, settings)
    horizon_ticks = max(1, horizon_ticks)

    def new_at(k: int) -> bool:
        return any(g not in done for g in decide(queue, view, now + dt.timedelta(seconds=k * tick), settings))

    lo, hi = 0, None  # nothing new at lo; something new at hi (None: not asked yet)
    if guess is not None:
        g = min(max(1, guess), horizon_ticks)
        if new_at(g):
            if g == 1 or not new_at(g - 1):
                return g
            hi = g - 1
        elif g == horizon_ticks:
            return horizon_ticks
        else:
            lo = g
    if hi is None:
        if not new_at(horizon_ticks):  # nothing new at the horizon: nothing new before it either
            return horizon_ticks
        hi = horizon_ticks
    return _boundary(new_at, lo, hi)


def _boundary(new_at: Callable[[int], bool], lo: int, hi: int) -> int:
    """The first k in (lo, hi] with ``new_at(k)``, nothing new at ``lo``, something new at
    ``hi``: doubling from ``lo``, then bisection."""
    step = 1
    while lo + step < hi and not new_at(lo + step):
        lo, step = lo + step, 2 * step
    hi = min(hi, lo + step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if new_at(mid):
            hi = mid
        else:
            lo = mid
    return hi
