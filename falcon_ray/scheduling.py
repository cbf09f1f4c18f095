"""Scheduling decisions as pure functions: the pick rule, cluster ranking, supply mode.

Contract
--------
Nothing here does I/O or reads a clock; every function takes the state it decides
on and returns the decision, so the tests drive them with plain values.

Pick rule (original, sections 4 and Phase 4): the waiting tasks of the highest
priority compete; group them by actor and take each actor's oldest; if more than one
actor is left, drop the actor that was granted the slot last; take the oldest of the
rest. ``pick_order`` applies the rule repeatedly to give every waiting task its
position. Priority never preempts a task that holds the slot or runs.

Cluster ranking (original, section 3): candidates are the active clusters of the
task's TPU type (with a reservation when the task asks for reservation supply);
they are ordered by a list of composable scoring functions, each returning a sort
key (lower is better): an idle pool of the same topology first, then the shortest
queue, then the name for a stable order. Add a scorer to ``DEFAULT_SCORERS`` to
change the policy.

Supply mode (original, section 5): the task's ``supply_mode`` if given, else
reservation when the cluster has a default reservation, else flex-start.
Reservation headroom is counted in slices: ``(count - inUseCount) // hosts``.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from falcon_ray.spec import SupplyMode, TaskSpec


class Pickable(Protocol):
    id: int
    actor: str
    created_at: dt.datetime
    priority: int


T = TypeVar("T", bound="Pickable")


def _age_key(t: Pickable) -> tuple[dt.datetime, int]:
    return (t.created_at, t.id)


def _heads(waiting: Sequence[T]) -> dict[str, T]:
    """Each actor's oldest waiting task: one pass, no sort."""
    heads: dict[str, T] = {}
    for t in waiting:
        h = heads.get(t.actor)
        if h is None or _age_key(t) < _age_key(h):
            heads[t.actor] = t
    return heads


def pick_next(waiting: Sequence[T], last_granted_actor: str) -> T | None:
    """The task that gets the slot next, or None when nothing waits."""
    if not waiting:
        return None
    top = max(t.priority for t in waiting)
    heads = _heads([t for t in waiting if t.priority == top])
    if not heads:
        return None
    candidates = list(heads.values())
    if len(candidates) > 1:
        candidates = [t for t in candidates if t.actor != last_granted_actor] or candidates
    return min(candidates, key=_age_key)


def pick_order(waiting: Sequence[T], last_granted_actor: str) -> list[T]:
    """Every waiting task in the order the pick rule would grant the slot.

    The same order as applying ``pick_next`` again and again (each pick becoming the
    last granted actor), in O(N log N): the priorities from the highest down, and within
    one priority each actor's tasks oldest first and a heap of the actors' heads; the
    oldest head wins unless its actor was granted last and another actor has a head,
    then the second oldest wins."""
    by_priority: dict[int, list[T]] = {}
    for t in waiting:
        by_priority.setdefault(t.priority, []).append(t)
    order: list[T] = []
    last = last_granted_actor
    for priority in sorted(by_priority, reverse=True):
        order += _round_robin(by_priority[priority], last)
        last = order[-1].actor
    return order


def _round_robin(waiting: Sequence[T], last_granted_actor: str) -> list[T]:
    """``pick_order`` within one priority."""
    by_actor: dict[str, list[T]] = {}
    for t in sorted(waiting, key=_age_key, reverse=True):  # each list: youngest first, pop() the oldest
        by_actor.setdefault(t.actor, []).append(t)
    heap = [(_age_key(ts[-1]), actor) for actor, ts in by_actor.items()]
    heapq.heapify(heap)
    order: list[T] = []
    last = last_granted_actor
    while heap:
        first = heapq.heappop(heap)
        if first[1] == last and heap:
            chosen = heapq.heappop(heap)
            heapq.heappush(heap, first)
        else:
            chosen = first
        actor = chosen[1]
        ts = by_actor[actor]
        order.append(ts.pop())
        if ts:
            heapq.heappush(heap, (_age_key(ts[-1]), actor))
        last = actor
    return order


# --- supply mode --------------------------------------------------------------------


def supply_mode_for(spec: TaskSpec, default_reservation: str) -> SupplyMode:
    if spec.supply_mode is not None:
        return spec.supply_mode
    return SupplyMode.RESERVATION if default_reservation else SupplyMode.FLEX_START


@dataclass(frozen=True)
class Headroom:
    remaining_slices: int
    needed_slices: int

    @property
    def enough(self) -> bool:
        return self.remaining_slices >= self.needed_slices


def reservation_headroom(count: int, in_use: int, hosts_per_slice: int, slices: int = 1, claimed: int = 0) -> Headroom:
    """Whole slices that still fit: ``count - inUseCount`` less what Falcon's pools claimed
    and GKE does not count yet (the capacity ledger)."""
    return Headroom(max(0, count - in_use - claimed) // max(1, hosts_per_slice), slices)


# --- cluster ranking ------------------------------------------------------------------


class RankableCluster(Protocol):
    id: str
    name: str
    tpu_type: str
    status: str
    default_reservation: str


@dataclass(frozen=True)
class FleetLoad:
    """What the poller knows about the fleet when it ranks: per cluster id."""

    queue_depth: dict[str, int] = field(default_factory=dict)  # live tasks not yet Running
    idle_pools: dict[str, frozenset[str]] = field(default_factory=dict)  # topologies with an idle pool


Scorer = Callable[[RankableCluster, TaskSpec, FleetLoad], float | str]


def idle_pool_first(c: RankableCluster, spec: TaskSpec, load: FleetLoad) -> float:
    return 0.0 if spec.topology in load.idle_pools.get(c.id, frozenset()) else 1.0


def shortest_queue(c: RankableCluster, spec: TaskSpec, load: FleetLoad) -> float:
    return float(load.queue_depth.get(c.id, 0))


def by_name(c: RankableCluster, spec: TaskSpec, load: FleetLoad) -> str:
    return c.name


DEFAULT_SCORERS: tuple[Scorer, ...] = (idle_pool_first, shortest_queue, by_name)


@dataclass(frozen=True)
class Placement:
    """The poller's verdict for one new task."""

    clusters: tuple = ()  # ranked candidates, best first
    verdict: str = "ok"  # ok | unsupported_tpu_type | only_inactive | no_candidate
    detail: str = ""


def place(
    spec: TaskSpec,
    clusters: Sequence[RankableCluster],
    load: FleetLoad,
    scorers: Sequence[Scorer] = DEFAULT_SCORERS,
) -> Placement:
    same_type = [c for c in clusters if c.tpu_type == spec.tpu_type]
    if not same_type:
        offered = sorted({c.tpu_type for c in clusters}) or ["none"]
        return Placement(verdict="unsupported_tpu_type", detail=", ".join(offered))
    active = [c for c in same_type if c.status == "active"]
    if not active:
        return Placement(verdict="only_inactive", detail=", ".join(sorted(c.name for c in same_type)))
    if spec.supply_mode == SupplyMode.RESERVATION:
        active = [c for c in active if c.default_reservation]
        if not active:
            return Placement(
                verdict="no_candidate",
                detail="the task asks for reservation supply and no active cluster has a reservation",
            )
    ranked = sorted(active, key=lambda c: tuple(score(c, spec, load) for score in scorers))
    return Placement(clusters=tuple(ranked))
