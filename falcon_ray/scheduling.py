"""Scheduling decisions as pure functions: the pick rule, cluster ranking, supply mode.

Contract
--------
Nothing here does I/O or reads a clock; every function takes the state it decides
on and returns the decision, so the tests drive them with plain values.

Pick rule (original, sections 4 and Phase 4): the waiting tasks of the highest
priority compete; group them by actor and take each actor's oldest; if more than one
actor is left, drop the actor that was granted the slot last; take the oldest of the
rest. ``pick_order`` applies the rule repeatedly to give every waiting task its
position (``queue_order``: the same for a ``WaitingQueue``, whose buckets are sorted
already). Priority never preempts a task that holds the slot or runs. ``WaitingIndex``
keeps a queue's Waiting tasks in that structure across rounds (a new or a finished
task: O(log N) comparisons), so choosing needs only the heads of the highest priority.

Cluster ranking (original, section 3): candidates are the active clusters of the
task's TPU type whose supply for the task can serve its shape (``offer``: the supply
mode the task gets there; a reservation serves only the shapes of the machine type
it holds; the topology must be in the cluster's TPU catalogue). They are ordered by
a list of composable scoring functions, each returning a sort key (lower is better):
an idle pool of the same topology that no older task of that queue already claims
first; then a cluster where the task would not wait for a reservation whose slices of its
topology its queue's tasks all hold or claim (``reservation_full``); then the shortest
queue (the cluster's tasks not yet Running); then the name for a stable order. Add a
scorer to ``DEFAULT_SCORERS`` to change the policy.

Moving (``move_target``): a task that waits on its cluster for reservation headroom
may move where it can start on what is there now (an idle pool, or reservation room for it
and the tasks queued there); the function names the cluster, the queue carries it out.

Supply mode (original, section 5): the task's ``supply_mode`` if given, else
reservation when the cluster has a default reservation, else flex-start.
Reservation headroom is counted in slices: ``(count - inUseCount) // hosts``.
"""

from __future__ import annotations

import bisect
import datetime as dt
import heapq
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar

from falcon_ray import tpu
from falcon_ray.model import Destination, Disruption, Lease, QueueTask, WaitingQueue, deadline_key, has_run
from falcon_ray.render import FLEX_START_MAX_RUN_SECONDS
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
    by_priority: dict[int, dict[str, list[T]]] = {}
    for t in sorted(waiting, key=_age_key):
        by_priority.setdefault(t.priority, {}).setdefault(t.actor, []).append(t)
    return _by_priority(by_priority, last_granted_actor)


def queue_order(waiting: WaitingQueue, last_granted_actor: str, without: Collection[int] = ()) -> list[QueueTask]:
    """``pick_order`` of a ``WaitingQueue`` (its buckets are sorted already), leaving out
    the tasks ``without`` names."""
    if without:
        buckets = {p: {a: [t for t in ts if t.id not in without] for a, ts in by.items()} for p, by in waiting.buckets.items()}
        return _by_priority(buckets, last_granted_actor)
    return _by_priority(waiting.buckets, last_granted_actor)


def _by_priority(buckets: Mapping[int, Mapping[str, Sequence[T]]], last_granted_actor: str) -> list[T]:
    order: list[T] = []
    last = last_granted_actor
    for priority in sorted(buckets, reverse=True):
        part = _round_robin(buckets[priority], last)
        if part:
            order += part
            last = order[-1].actor
    return order


def _round_robin(by_actor: Mapping[str, Sequence[T]], last_granted_actor: str) -> list[T]:
    """``pick_order`` within one priority; each actor's tasks oldest first."""
    heap = [(_age_key(ts[0]), actor, 0) for actor, ts in by_actor.items() if ts]
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
        _, actor, i = chosen
        ts = by_actor[actor]
        order.append(ts[i])
        if i + 1 < len(ts):
            heapq.heappush(heap, (_age_key(ts[i + 1]), actor, i + 1))
        last = actor
    return order


class WaitingIndex:
    """The QueueReconciler's Waiting tasks kept in pick-rule order from round to round.

    One list per (priority, actor), oldest first; ``put`` and ``discard`` find a task's
    place by bisection (O(log N) comparisons), so a new or a finished task costs no pass
    over the others. ``value()`` is the ``WaitingQueue`` a decision reads: the buckets
    changed since the last value are copied into new tuples (a pointer copy of that one
    bucket), the others shared; the id set is copied only when it changed. The tasks with a
    start deadline are kept apart, soonest first (``WaitingQueue.deadlines``), so the
    deadline rule reads only those. Pure: no I/O."""

    def __init__(self) -> None:
        self._lists: dict[tuple[int, str], list[QueueTask]] = {}
        self._tasks: dict[int, QueueTask] = {}
        self._tuples: dict[tuple[int, str], tuple[QueueTask, ...]] = {}
        self._dirty: set[tuple[int, str]] = set()
        self._ids: frozenset[int] | None = frozenset()  # None: the set changed since the last value
        self._value: WaitingQueue | None = WaitingQueue()
        self._deadlines: list[QueueTask] = []  # the tasks with a start deadline, soonest first
        self._deadlines_value: tuple[QueueTask, ...] | None = ()  # None: changed since the last value

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._tasks

    def put(self, t: QueueTask) -> None:
        """Add a Waiting task, or replace its value (same place when its age and bucket hold)."""
        old = self._tasks.get(t.id)
        b = (t.priority, t.actor)
        if old is not None and (old.priority, old.actor, old.created_at) == (b[0], b[1], t.created_at):
            ts = self._lists[b]
            ts[bisect.bisect_left(ts, _age_key(t), key=_age_key)] = t
            self._tasks[t.id] = t
            self._deadline_put(old, t)
            self._dirty.add(b)
            self._value = None
            return
        self.discard(t.id)
        bisect.insort(self._lists.setdefault(b, []), t, key=_age_key)
        self._tasks[t.id] = t
        self._deadline_put(None, t)
        self._dirty.add(b)
        self._value = self._ids = None

    def replace(self, values: Iterable[QueueTask]) -> None:
        """New values of tasks in the index with the same place (a Message written): one
        pass per bucket touched instead of a bisection per task; any other value is ``put``."""
        by_bucket: dict[tuple[int, str], dict[int, QueueTask]] = {}
        for t in values:
            old = self._tasks.get(t.id)
            if old is None or (old.priority, old.actor, old.created_at) != (t.priority, t.actor, t.created_at):
                self.put(t)
                continue
            self._tasks[t.id] = t
            self._deadline_put(old, t)
            by_bucket.setdefault((t.priority, t.actor), {})[t.id] = t
        for b, new in by_bucket.items():
            ts = self._lists[b]
            if len(new) * 8 < len(ts):  # a few: bisect each
                for t in new.values():
                    ts[bisect.bisect_left(ts, _age_key(t), key=_age_key)] = t
            else:
                ts[:] = [new.get(t.id, t) for t in ts]
            self._dirty.add(b)
            self._value = None

    def discard(self, task_id: int) -> None:
        t = self._tasks.pop(task_id, None)
        if t is None:
            return
        b = (t.priority, t.actor)
        ts = self._lists[b]
        del ts[bisect.bisect_left(ts, _age_key(t), key=_age_key)]
        self._deadline_put(t, None)
        self._dirty.add(b)
        self._value = self._ids = None

    def _deadline_put(self, old: QueueTask | None, new: QueueTask | None) -> None:
        """Keep ``_deadlines`` in step when task ``old`` becomes ``new`` (either may be None)."""
        if old is not None and old.start_deadline is not None:
            ts = self._deadlines
            del ts[bisect.bisect_left(ts, deadline_key(old), key=deadline_key)]
            self._deadlines_value = None
        if new is not None and new.start_deadline is not None:
            bisect.insort(self._deadlines, new, key=deadline_key)
            self._deadlines_value = None

    def value(self) -> WaitingQueue:
        if self._value is not None:
            return self._value
        for b in self._dirty:
            ts = self._lists.get(b)
            if ts:
                self._tuples[b] = tuple(ts)
            else:
                self._lists.pop(b, None)
                self._tuples.pop(b, None)
        self._dirty.clear()
        buckets: dict[int, dict[str, tuple[QueueTask, ...]]] = {}
        for (p, a), ts in sorted(self._tuples.items()):
            buckets.setdefault(p, {})[a] = ts
        if self._ids is None:
            self._ids = frozenset(self._tasks)
        if self._deadlines_value is None:
            self._deadlines_value = tuple(self._deadlines)
        self._value = WaitingQueue(buckets, self._ids, self._deadlines_value)
        return self._value


# --- supply mode --------------------------------------------------------------------


def supply_mode_for(spec: TaskSpec, default_reservation: str) -> SupplyMode:
    if spec.supply_mode is not None:
        return spec.supply_mode
    return SupplyMode.RESERVATION if default_reservation else SupplyMode.FLEX_START


def acquiring_mode(spec: TaskSpec, lease: Lease | None, default_reservation: str) -> SupplyMode:
    """The supply a task acquires: its pool's, once it holds one (a pool it took over may be
    of another supply), else its spec's (``supply_mode_for``)."""
    return lease.supply_mode if lease is not None else supply_mode_for(spec, default_reservation)


# --- the start deadline of a task the poller holds ------------------------------------


def start_deadline_passed(
    spec: TaskSpec, created_at: dt.datetime, now: dt.datetime, disruptions: Iterable[Disruption] = ()
) -> dt.datetime | None:
    """The start deadline of an unassigned Pending task (the poller's) when ``now`` has
    reached it and the task has not run (``model.has_run`` of its disruption rows: a task
    sent back to the poller after a run has no start deadline any more); None otherwise.
    Called without the rows first (they are read only for a task past its deadline)."""
    at = spec.start_deadline_at(created_at)
    if at is None or now < at or has_run(disruptions):
        return None
    return at


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
    reservation_count: int | None  # how many VMs its reservation holds, as last read (None: not read)
    location: str  # a zone (zonal cluster) or a region (regional cluster)
    zone: str  # a regional cluster's zone for pools without a reservation ("" otherwise)


class Unfit(StrEnum):
    """Why a cluster of the task's TPU type cannot serve it."""

    NO_RESERVATION = "no_reservation"  # reservation supply, and the cluster has no reservation
    MACHINE_TYPE = "machine_type"  # its reservation holds VMs of another machine type
    RESERVATION_SIZE = "reservation_size"  # its whole reservation holds fewer VMs than one slice needs
    TOPOLOGY = "topology"  # the topology is not in the cluster's TPU catalogue
    FLEX_START_MAX_RUN = "flex_start_max_run"  # flex-start, and the task's timeout exceeds its run limit


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
    count: int | None = None  # the reservation's VMs, when read

    @property
    def serves(self) -> bool:
        return self.unfit is None


def reservation_topologies(tpu_type: str, machine_type: str) -> tuple[str, ...]:
    """The topologies of ``tpu_type`` whose one slice is made of ``machine_type`` hosts."""
    return tuple(t for t in tpu.topologies(tpu_type) if tpu.lookup(tpu_type, t).machine_type == machine_type)


def outlives_flex_start(spec: TaskSpec, mode: SupplyMode, max_run_s: int = FLEX_START_MAX_RUN_SECONDS) -> bool:
    """Flex-start VMs run at most ``max_run_s`` (the pool's ``maxRunDuration``, 7 days):
    a task with a longer timeout would be cut off by GKE, so flex-start cannot serve it."""
    return mode == SupplyMode.FLEX_START and spec.timeout_seconds > max_run_s


def offer(spec: TaskSpec, c: RankableCluster, machine_type: str | None = None) -> Offer:
    """Can ``c`` serve ``spec``? A reservation serves only the shapes of the machine type it
    holds (``machine_type``: a fresher reading than the cluster row's), and only slices of
    at most as many hosts as it holds VMs; a reservation not read yet is taken to serve (the
    queue checks again before it creates anything)."""
    mode = supply_mode_for(spec, c.default_reservation)
    catalogue = tuple(tpu.topologies(c.tpu_type))
    if spec.topology not in catalogue:
        return Offer(c.name, c.tpu_type, mode, topologies=catalogue, unfit=Unfit.TOPOLOGY)
    if outlives_flex_start(spec, mode):
        return Offer(c.name, c.tpu_type, mode, topologies=catalogue, unfit=Unfit.FLEX_START_MAX_RUN)
    if mode != SupplyMode.RESERVATION:
        return Offer(c.name, c.tpu_type, mode, topologies=catalogue)
    if not c.default_reservation:
        return Offer(c.name, c.tpu_type, mode, unfit=Unfit.NO_RESERVATION)
    held = machine_type if machine_type is not None else (c.reservation_machine_type or "")
    if not held:
        return Offer(c.name, c.tpu_type, mode, c.default_reservation, "", catalogue)
    count = getattr(c, "reservation_count", None)
    unfit = None if spec.shape.machine_type == held else Unfit.MACHINE_TYPE
    if unfit is None and too_small(count, spec.shape.hosts):
        unfit = Unfit.RESERVATION_SIZE
    return Offer(c.name, c.tpu_type, mode, c.default_reservation, held, reservation_topologies(c.tpu_type, held), unfit, count)


def too_small(count: int | None, hosts: int) -> bool:
    """A reservation of ``count`` VMs (None: not read) can never hold a slice of ``hosts``:
    whatever frees up, the slice does not fit (GKE would leave its pool without nodes)."""
    return count is not None and count < hosts


# --- cluster ranking ------------------------------------------------------------------


@dataclass(frozen=True)
class FleetLoad:
    """What the poller knows about the fleet when it ranks, per queue (cluster id,
    topology): ``depth`` its live tasks not yet Running, ``running`` its Running tasks,
    ``idle_pools`` its ready idle pools, and ``claimants`` the tasks of that queue that
    would take one before a newcomer (waiting or acquiring)."""

    depth: dict[tuple[str, str], int] = field(default_factory=dict)
    running: dict[tuple[str, str], int] = field(default_factory=dict)
    idle_pools: dict[tuple[str, str], int] = field(default_factory=dict)
    claimants: dict[tuple[str, str], int] = field(default_factory=dict)

    def free_idle(self, cluster_id: str, topology: str) -> int:
        """Idle pools of the queue that no older task already claims."""
        key = (cluster_id, topology)
        return max(0, self.idle_pools.get(key, 0) - self.claimants.get(key, 0))

    def live(self, cluster_id: str, topology: str) -> int:
        """The queue's tasks that hold a slice or will take one before a newcomer."""
        key = (cluster_id, topology)
        return self.depth.get(key, 0) + self.running.get(key, 0)

    def cluster_depth(self, cluster_id: str) -> int:
        """The tasks of every queue of the cluster not yet Running."""
        return sum(n for (cid, _), n in self.depth.items() if cid == cluster_id)

    def assigned(self, cluster_id: str, topology: str) -> None:
        """A task was placed on the queue in this poll: it is one more claimant."""
        key = (cluster_id, topology)
        self.depth[key] = self.depth.get(key, 0) + 1
        self.claimants[key] = self.claimants.get(key, 0) + 1


Scorer = Callable[[RankableCluster, TaskSpec, FleetLoad], float | str]


def idle_pool_first(c: RankableCluster, spec: TaskSpec, load: FleetLoad) -> float:
    return 0.0 if load.free_idle(c.id, spec.topology) > 0 else 1.0


def reservation_full(c: RankableCluster, spec: TaskSpec, load: FleetLoad) -> float:
    """1: the task would take ``c``'s reservation, and the slices of its topology that
    reservation holds at once (its VMs over the slice's hosts, as last read) are all held
    or claimed by the tasks of its queue, so it would wait for one of their runs to end;
    0 otherwise (any other supply: GKE publishes no capacity to count against). The queue's
    tasks are counted whatever their supply: a full reservation may be taken for full
    a little early, never the other way."""
    if supply_mode_for(spec, c.default_reservation) != SupplyMode.RESERVATION:
        return 0.0
    if c.reservation_count is None:
        return 0.0
    return 1.0 if load.live(c.id, spec.topology) >= c.reservation_count // spec.shape.hosts else 0.0


def shortest_queue(c: RankableCluster, spec: TaskSpec, load: FleetLoad) -> float:
    return float(load.cluster_depth(c.id))


def by_name(c: RankableCluster, spec: TaskSpec, load: FleetLoad) -> str:
    return c.name


DEFAULT_SCORERS: tuple[Scorer, ...] = (idle_pool_first, reservation_full, shortest_queue, by_name)


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


def pool_zone(c: RankableCluster) -> str:
    """The zone a pool without a reservation gets on ``c``: the operator's ``zone`` of a
    regional cluster, else its location (a zonal cluster's zone)."""
    return c.zone or c.location


def move_target(
    spec: TaskSpec, origin: RankableCluster, destinations: Sequence[Destination], task_id: int | None = None, refused: bool = False
) -> Destination | None:
    """Where a task waiting on ``origin`` could start now with the same supply mode: an
    active cluster of its TPU type whose queue for the topology is empty and that has a
    ready idle pool of that mode, or (reservation supply) a reservation of the task's
    machine type with room by its ledger, beyond the room held there for an older task of
    another topology (``reconcile.hold``), for one slice more than the tasks its queue for
    the topology already has (``room_for_queue``). Never a switch from reservation to
    another mode (original, section 5).

    ``refused``: GKE refused the task's on-demand or flex-start pool on ``origin`` for
    capacity (a stockout is its zone's). It may then also go to a cluster in another zone
    whose queue for the topology is empty and that has not refused task ``task_id`` before
    (``Destination.refused``), to ask GKE there: the failover. Each cluster is tried at most
    once that way, so the task never goes back and forth. Idle pool first, then reservation
    room, then the failover; then the name; None: stay."""
    mode = supply_mode_for(spec, origin.default_reservation)
    shape = spec.shape
    fits: list[tuple[int, str, Destination]] = []
    for d in destinations:
        c = d.cluster
        if c.name == origin.name or c.status != "active" or c.tpu_type != spec.tpu_type:
            continue
        o = offer(spec, c, d.machine_type or None)
        if not o.serves or o.mode != mode:
            continue
        empty = not d.claimants  # an idle pool or the failover: only where nobody of the topology queues
        if empty and mode in d.idle_pools:
            fits.append((0, c.name, d))
        elif mode == SupplyMode.RESERVATION and d.machine_type == shape.machine_type and room_for_queue(d, shape.hosts):
            fits.append((1, c.name, d))
        elif empty and refused and mode != SupplyMode.RESERVATION and task_id not in d.refused and pool_zone(c) != pool_zone(origin):
            fits.append((2, c.name, d))
    return min(fits, key=lambda f: f[:2])[2] if fits else None


def room_for_queue(d: Destination, hosts: int) -> bool:
    """``d``'s reservation, by its ledger and beyond the room held there for an older task
    of another topology, has room for one slice of ``hosts`` hosts for each task its queue
    for the topology already has (waiting or acquiring) and one more: a task moved there
    starts behind those, on room that is there now, not on room that must free up."""
    return (d.free_hosts or 0) - d.held_hosts >= hosts * (d.claimants + 1)
