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
task's TPU type whose supply for the task can serve its shape (``offer``: the supply
mode the task gets there; a reservation serves only the shapes of the machine type
it holds; the topology must be in the cluster's TPU catalogue). They are ordered by
a list of composable scoring functions, each returning a sort key (lower is better):
an idle pool of the same topology that no older task of that queue already claims
first, then the shortest queue, then the name for a stable order. Add a scorer to
``DEFAULT_SCORERS`` to change the policy.

Moving (``move_target``): a task that waits on its cluster for reservation headroom
may start elsewhere now; the function names the cluster, the queue carries it out.

Supply mode (original, section 5): the task's ``supply_mode`` if given, else
reservation when the cluster has a default reservation, else flex-start.
Reservation headroom is counted in slices: ``(count - inUseCount) // hosts``.
"""

from __future__ import annotations

import datetime as dt
import heapq
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar

from falcon_ray import tpu
from falcon_ray.model import Destination
from falcon_ray.spec import SupplyMode, TaskSpec


class Pickable(Protocol):
    id: int
    actor: str
    created_at: dt.datetime
    priority: int


T = TypeVar("T", bound="Pickable")


_age_key: Callable[[Pickable], tuple[dt.datetime, int]] = operator.attrgetter("created_at", "id")  # oldest first


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


# --- what a cluster can serve -------------------------------------------------------


class RankableCluster(Protocol):
    id: str
    name: str
    tpu_type: str
    status: str
    default_reservation: str
    reservation_machine_type: str  # what its reservation holds, as last read ("" not read yet)


class Unfit(StrEnum):
    """Why a cluster of the task's TPU type cannot serve it."""

    NO_RESERVATION = "no_reservation"  # reservation supply, and the cluster has no reservation
    MACHINE_TYPE = "machine_type"  # its reservation holds VMs of another machine type
    TOPOLOGY = "topology"  # the topology is not in the cluster's TPU catalogue


@dataclass(frozen=True)
class Offer:
    """What one cluster offers one task: the supply mode the task would get there (the
    original's rules, section 5: never a fallback from reservation to another mode) and,
    for a reservation, the machine type it holds and the topologies that type serves."""

    cluster: str
    tpu_type: str
    mode: SupplyMode
    reservation: str = ""
    machine_type: str = ""  # the reservation's; "" when not read yet or no reservation
    topologies: tuple[str, ...] = ()
    unfit: Unfit | None = None

    @property
    def serves(self) -> bool:
        return self.unfit is None


def reservation_topologies(tpu_type: str, machine_type: str) -> tuple[str, ...]:
    """The topologies of ``tpu_type`` whose one slice is made of ``machine_type`` hosts."""
    return tuple(t for t in tpu.topologies(tpu_type) if tpu.lookup(tpu_type, t).machine_type == machine_type)


def offer(spec: TaskSpec, c: RankableCluster, machine_type: str | None = None) -> Offer:
    """Can ``c`` serve ``spec``? A reservation serves only the shapes of the machine type it
    holds (``machine_type``: a fresher reading than the cluster row's); a reservation not
    read yet is taken to serve (the queue checks again before it creates anything)."""
    mode = supply_mode_for(spec, c.default_reservation)
    catalogue = tuple(tpu.topologies(c.tpu_type))
    if spec.topology not in catalogue:
        return Offer(c.name, c.tpu_type, mode, topologies=catalogue, unfit=Unfit.TOPOLOGY)
    if mode != SupplyMode.RESERVATION:
        return Offer(c.name, c.tpu_type, mode, topologies=catalogue)
    if not c.default_reservation:
        return Offer(c.name, c.tpu_type, mode, unfit=Unfit.NO_RESERVATION)
    held = machine_type if machine_type is not None else (c.reservation_machine_type or "")
    if not held:
        return Offer(c.name, c.tpu_type, mode, c.default_reservation, "", catalogue)
    unfit = None if spec.shape.machine_type == held else Unfit.MACHINE_TYPE
    return Offer(c.name, c.tpu_type, mode, c.default_reservation, held, reservation_topologies(c.tpu_type, held), unfit)


# --- cluster ranking ------------------------------------------------------------------


@dataclass(frozen=True)
class FleetLoad:
    """What the poller knows about the fleet when it ranks. ``idle_pools`` and
    ``claimants`` are per (cluster id, topology): the ready idle pools, and the tasks of
    that queue that would take one before a newcomer (waiting or acquiring)."""

    queue_depth: dict[str, int] = field(default_factory=dict)  # per cluster id: live tasks not yet Running
    idle_pools: dict[tuple[str, str], int] = field(default_factory=dict)
    claimants: dict[tuple[str, str], int] = field(default_factory=dict)

    def free_idle(self, cluster_id: str, topology: str) -> int:
        """Idle pools of the queue that no older task already claims."""
        key = (cluster_id, topology)
        return max(0, self.idle_pools.get(key, 0) - self.claimants.get(key, 0))

    def assigned(self, cluster_id: str, topology: str) -> None:
        """A task was placed on the queue in this poll: it is one more claimant."""
        self.queue_depth[cluster_id] = self.queue_depth.get(cluster_id, 0) + 1
        self.claimants[(cluster_id, topology)] = self.claimants.get((cluster_id, topology), 0) + 1


Scorer = Callable[[RankableCluster, TaskSpec, FleetLoad], float | str]


def idle_pool_first(c: RankableCluster, spec: TaskSpec, load: FleetLoad) -> float:
    return 0.0 if load.free_idle(c.id, spec.topology) > 0 else 1.0


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
    offers: tuple[Offer, ...] = ()  # no_candidate: what each active cluster of the type offers


def place(
    spec: TaskSpec,
    clusters: Sequence[RankableCluster],
    load: FleetLoad,
    scorers: Sequence[Scorer] = DEFAULT_SCORERS,
) -> Placement:
    """Candidates: the active clusters of the task's TPU type whose supply for the task
    can serve its shape (``offer``); ranked by ``scorers``."""
    same_type = [c for c in clusters if c.tpu_type == spec.tpu_type]
    if not same_type:
        offered = sorted({c.tpu_type for c in clusters}) or ["none"]
        return Placement(verdict="unsupported_tpu_type", detail=", ".join(offered))
    active = [c for c in same_type if c.status == "active"]
    if not active:
        return Placement(verdict="only_inactive", detail=", ".join(sorted(c.name for c in same_type)))
    offers = [offer(spec, c) for c in active]
    fit = [c for c, o in zip(active, offers, strict=True) if o.serves]
    if not fit:
        return Placement(verdict="no_candidate", offers=tuple(sorted(offers, key=lambda o: o.cluster)))
    ranked = sorted(fit, key=lambda c: tuple(score(c, spec, load) for score in scorers))
    return Placement(clusters=tuple(ranked))


# --- moving a task that waits for reservation headroom ------------------------------------


def move_target(spec: TaskSpec, origin: RankableCluster, destinations: Sequence[Destination]) -> Destination | None:
    """Where a task waiting on ``origin`` could start now with the same supply mode: an
    active cluster of its TPU type whose queue for the topology is empty, and that has a
    ready idle pool of that mode, or (reservation supply) a reservation of the task's
    machine type with room for one slice by its ledger. Never a switch from reservation to
    another mode (original, section 5). Idle pool first, then the name; None: stay."""
    mode = supply_mode_for(spec, origin.default_reservation)
    shape = spec.shape
    fits: list[tuple[int, str, Destination]] = []
    for d in destinations:
        c = d.cluster
        if c.name == origin.name or c.status != "active" or c.tpu_type != spec.tpu_type or d.claimants:
            continue
        o = offer(spec, c, d.machine_type or None)
        if not o.serves or o.mode != mode:
            continue
        if mode in d.idle_pools:
            fits.append((0, c.name, d))
        elif mode == SupplyMode.RESERVATION and d.machine_type == shape.machine_type and (d.free_hosts or 0) >= shape.hosts:
            fits.append((1, c.name, d))
    return min(fits, key=lambda f: f[:2])[2] if fits else None
