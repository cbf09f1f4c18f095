"""The queue's single writer: one (cluster, topology), its tasks, its node-pool leases.

Contract
--------
``QueueReconciler`` is a plain object built from a store, a port and a clock; the
QueueActor (``actors.remote``) is a thin Ray shell that runs its ``step`` on a
``Ticker`` and forwards hints. Hard state lives in the database: the queue's tasks
(``jobs`` rows with this cluster and topology), its node-pool leases, the last
granted actor, and the task event log (when each task entered its phase). Soft
state is rebuilt from them: the ClusterActor's view of pools, operations and Jobs is
asked through the port every round; the queue's rows and leases are kept between rounds
in a ``QueueMirror`` (``actors.queue_mirror``), with the queue's recent starts for the
start estimates (``QueueHistory``: read once from the event log, bounded, then kept up to
date from the queue's own moves; with it the scores of the tasks' first start estimates
against their starts, which calibrate the latest start, ``eta.score``, and the queue's
latest arrivals, the rate of the round robin's overtakers: both kept in memory only, so a
restarted queue shows the prior's wider range until it has scored again, and counts as
arrivals the rows it reads first). Every effect is idempotent, so the process may die at
any line: the constructor is the recovery path, there is no other.

The loop
--------
``step()`` runs rounds of three parts, at most ``MAX_ROUNDS``, while the rounds change
state:

1. observe: the queue's rows and leases (read, or as the mirror keeps them) and the
   cluster as its ClusterActor says, as one ``QueueState`` and one ``ClusterView``;
2. decide: one ``reconcile.plan`` call (pure), the round's whole decision;
3. act: the ``EffectRunner`` (``actors.queue_effects``) carries out the decision's effect
   groups (rules 1-7); each write's result goes to the mirror.

Rule 8 (the waiting tasks' position Messages) is part of each round's decision and is
written once, after the last round, as that round decided it: a round that moves a task
would make an earlier round's positions stale at once.

When it reads
-------------
A step's first round reads the database; a later round decides on the rows as the mirror
keeps them, with the queue's own won writes applied, and asks the ClusterActor again. A
lost compare-and-set, a refused effect or a failed one makes the next round read. With
``read_every_step`` False (the QueueActor's setting) a step reads the rows only when they
may have changed under it: after ``rows_changed()`` (the hint of the poller with each
assignment and with every poll while a task of the queue is Aborting, or of a queue that
moved a task here), after a lost, refused or failed effect, and at least every
``queue_full_read_s`` (a full read: what a lost hint costs). A plain ``QueueReconciler``
reads at every step. The registry (cluster status, reservation) is read at most every
``registry_interval_s``, as often as the supervisor reads it.

The Ticker steps it every ``interval()``: ``queue_tick_s``, or ``queue_idle_tick_s`` while
the queue is empty (no live task, no lease), and at once on a hint. An empty queue's new
work comes with a wake-up (the poller's assignment, another queue's move, the
ClusterActor's Job event or finished pool operation); the idle tick only bounds how long
a lost hint delays it. A step of a fenced store (a newer controller holds the leader
lease) raises ``Fenced`` before it observes anything or calls the port, so a stale queue
neither writes nor acts.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from actors.port import Port
from actors.queue_effects import EffectRunner
from actors.queue_mirror import QueueMirror
from falcon_ray import lifecycle as lc
from falcon_ray import limits, metrics, reconcile, render, scheduling, tpu
from falcon_ray.clock import SYSTEM, Clock
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LEASE_UNUSED, LeaseState, Phase
from falcon_ray.model import (
    Cluster,
    ClusterView,
    Destination,
    Lease,
    QueueHistory,
    QueueState,
    QueueTask,
    QueueTasks,
    ReservationOccupant,
    ReservationView,
    ReservationWaiter,
    StartSample,
)
from falcon_ray.reconcile import eta, hold, pools
from falcon_ray.spec import SpecError, SupplyMode, TaskSpec, parse_spec
from falcon_ray.store import Fenced, Store

log = logging.getLogger("falcon.queue")
MAX_ROUNDS = 8
DESTINATIONS_TTL_S = 1.0  # another cluster's state is read at most this often for a move
HISTORY_WINDOW_S = 86400.0  # starts older than this are not read back after a restart


class QueueReconciler:
    def __init__(
        self,
        cluster_name: str,
        topology: str,
        settings: Settings,
        store: Store,
        port: Port,
        clock: Clock = SYSTEM,
    ) -> None:
        self.s = settings
        self.cluster_name, self.topology = cluster_name, topology
        self.label = render.queue_label(cluster_name, topology)
        self.store, self.port, self.clock = store, port, clock
        self.mirror = QueueMirror(topology)
        self.effects = EffectRunner(cluster_name, topology, store, port, self.mirror, clock, self._cluster_id)
        self.effects.on_running = self._started
        self.effects.on_ended = self._ended
        self.lock = threading.Lock()
        self.last_state: QueueState | None = None
        self.last_view: ClusterView | None = None
        self.last_plan: reconcile.Plan | None = None  # the last round's decision, on last_state / last_view
        self.rounds = 0
        self.idle_accounted_at = self.clock.monotonic()
        self.history: list[StartSample] | None = None  # None: not read yet
        self.history_value: QueueHistory | None = None  # the last history observed
        self.started: set[int] = set()  # reached Running since the history was brought up to date
        # the range's calibration: each Waiting task's first model estimate (when, seconds, mode),
        # scored against its start (eta.score), the scores kept newest last
        self.promised: dict[int, tuple[dt.datetime, float, SupplyMode]] = {}
        self.scores: list[tuple[SupplyMode, float]] = []
        self.arrivals: dict[int, tuple[dt.datetime, str]] = {}  # the latest tasks to come into the queue, by id
        self.arrivals_value: tuple[tuple[dt.datetime, str], ...] = ()  # oldest first
        self.ranges: dict[int, tuple[dt.datetime, float, float]] = {}  # the last step's: (decided at, expected s, latest s)
        self.clusters: list[Cluster] | None = None  # the registry as last read; None: read it
        self.clusters_at = -float("inf")  # when the registry was last read
        self.destinations_at: tuple[float, tuple[Destination, ...]] = (-DESTINATIONS_TTL_S, ())
        # (when read, for which ClusterBusy task, the other clusters that refused it for capacity)
        self.refusals_read: tuple[float, int, frozenset[str]] = (-DESTINATIONS_TTL_S, 0, frozenset())
        self.other_waiting_at: tuple[float, bool] = (-DESTINATIONS_TTL_S, False)
        self.waiters_at: tuple[float, tuple[ReservationWaiter, ...]] = (-DESTINATIONS_TTL_S, ())
        self.occupants_at: tuple[float, tuple[ReservationOccupant, ...]] = (-DESTINATIONS_TTL_S, ())
        self.waiters_due = -float("inf")  # monotonic time before which the kept waiters answer (no hold can begin)
        self.read_every_step = True  # False: a step's first round reads only when must_read or hinted
        self.rows_hinted = False  # rows_changed() was called since the last read

    @property
    def full_read_at(self) -> float:
        """When the rows were last read in full (monotonic); -inf makes the next read a full one."""
        return self.mirror.full_read_at

    @full_read_at.setter
    def full_read_at(self, value: float) -> None:
        self.mirror.full_read_at = value

    # ---- the loop ------------------------------------------------------------------------

    def interval(self) -> float:
        """``queue_tick_s``; an empty queue (no task, no pool: nothing it could decide) waits
        ``queue_idle_tick_s``, a safety tick: its new work comes with a wake-up."""
        state = self.last_state
        if state is not None and not state.tasks and not state.leases:
            return max(self.s.queue_tick_s, self.s.queue_idle_tick_s)
        return self.s.queue_tick_s

    def rows_changed(self) -> None:
        """Another writer changed (or may have changed) the queue's rows: the next step reads them."""
        self.rows_hinted = True

    def step(self) -> int:
        """One tick: rounds of observe, decide, act; returns how many groups changed state."""
        t0 = self.clock.monotonic()
        applied = self.reconcile_once()
        metrics.queue_tick(self.cluster_name, self.topology, self.clock.monotonic() - t0)
        if self.last_state is not None:
            metrics.queue_depth(self.cluster_name, self.topology, self.last_state.held, len(self.last_state.waiting))
        return applied

    def reconcile_once(self) -> int:
        """The rounds of one step; rule 8's Messages of the last round's decision are written
        after it (see the module docstring)."""
        self._begin_step()
        applied, plan = 0, None
        self.last_plan = None
        for _ in range(MAX_ROUNDS):
            observed = self.observe(fresh=self.mirror.must_read)  # 1. observe
            self.mirror.must_read = False  # later rounds: the rows as kept, with this queue's own won writes
            if observed is None:
                break
            plan = self.last_plan = reconcile.plan(*observed, self.clock.now(), self.s)  # 2. decide, once per round
            if not plan.groups:
                break
            progressed = self.effects.run(plan.groups)  # 3. act
            applied += progressed
            self.rounds += 1
            if not progressed:
                break
        if plan is not None:
            self.effects.run(plan.messages())
            self._promise(plan)
        return applied

    def _promise(self, plan: reconcile.Plan) -> None:
        """Keep each Waiting task's first start range, to score it when the task starts."""
        ranges = plan.ranges()
        now = plan.now
        with self.lock:
            self.ranges = {tid: (now, r.expected, r.latest) for tid, r in ranges.items()}
        for tid, r in ranges.items():
            if tid not in self.promised:
                self.promised[tid] = (now, r.expected, r.mode)
        if len(self.promised) > 2 * len(ranges) + 64:  # tasks that left without starting here
            live = self.mirror.values
            self.promised = {tid: v for tid, v in self.promised.items() if tid in live}

    def _begin_step(self) -> None:
        """Refuse a fenced step; drop the registry when it is due; decide whether the first round reads."""
        if self.store.fenced:  # a newer controller leads: observe nothing, call nobody
            raise Fenced(self.store.fenced)
        m = self.mirror
        age = self.clock.monotonic() - self.clusters_at
        if age >= (self.s.registry_interval_s if m.rows or m.leases else self.s.queue_full_read_s):
            self.clusters = None  # read with the rows (an empty queue's: once per full read)
        hinted, self.rows_hinted = self.rows_hinted, False  # a hint after this is read by the next step
        if self.read_every_step or hinted or self.clock.monotonic() - m.full_read_at >= self.s.queue_full_read_s:
            m.must_read = True

    # ---- observe ---------------------------------------------------------------------------

    def observe(self, fresh: bool = True) -> tuple[QueueState, ClusterView] | None:
        """The queue as the database says (read when ``fresh``, else as the mirror keeps it)
        and the cluster as its ClusterActor says (always asked)."""
        read = self._read_tasks() if fresh else self._kept()
        if read is None:
            return None
        clusters, cluster = read
        state = self._queue_state(clusters, cluster)
        want_reservation = bool(cluster.default_reservation) and (
            bool(state.tasks.waiting) or any(t.phase in lc.ACQUIRING_PHASES for t in state.tasks.held)
        )
        view = self.port.observe(self.cluster_name, self.label, [x.name for x in state.leases], want_reservation)
        with self.lock:
            self.last_state, self.last_view = state, view
        return state, view

    def _queue_state(self, clusters: list[Cluster], cluster: Cluster) -> QueueState:
        m = self.mirror
        kept = m.leases or []
        leases = tuple(x for x in kept if x.state != LeaseState.DELETED)
        tasks = m.task_values(self.store.entered_and_disruptions)
        self._account_idle_chips(cluster.tpu_type, leases)
        return QueueState(
            cluster=cluster,
            topology=self.topology,
            tasks=tasks,
            leases=leases,
            last_granted=m.last_granted,
            other_topology_waiting=self._other_topology_waiting(cluster.id),
            alternatives_exist=any(c.name != cluster.name and c.tpu_type == cluster.tpu_type and c.active for c in clusters),
            submit_errors=dict(m.submit_errors),
            terminal_messages=self._terminal_messages(leases, m.values.keys()),
            refused=tuple(x for x in kept if x.refused_at is not None),
            pool_names=frozenset(x.name for x in kept),
            history=self._history(cluster.id, leases),
            destinations=self._destinations(cluster, clusters, tasks),
            reservation_waiters=(waiters := self._reservation_waiters(cluster, tasks, leases)),
            reservation_occupants=self._reservation_occupants(cluster, waiters),
        )

    def _read_tasks(self) -> tuple[list[Cluster], Cluster] | None:
        """The queue's rows: all of them at the first round and every ``queue_full_read_s``,
        otherwise only what may have changed (``Store.queue_snapshot``'s delta), merged into
        the mirror. The registry is read with them when ``_begin_step`` dropped it."""
        m = self.mirror
        now = self.clock.monotonic()
        full = now - m.full_read_at >= self.s.queue_full_read_s
        asked = m.asked()
        snap = self.store.queue_snapshot(
            self.cluster_name, self.topology, m.specs, delta=None if full else (m.seq, asked),
            clusters=self.clusters, with_granted=full and not m.granted_read, with_leases=full or m.leases is None,
        )
        if self.clusters is None:
            self.clusters_at = now
        self.clusters = snap.clusters
        cluster = next((c for c in snap.clusters if c.name == self.cluster_name), None)
        if cluster is None:
            m.full_read_at = -float("inf")  # read it all when it is back
            return None
        m.merge(snap, full, now, asked)
        if m.leases_stale:
            # this queue is its leases' only writer (its own writes are applied to the kept
            # rows, a write it could not apply sets leases_stale); which refused ones count
            # follows its acquiring tasks, and a task another writer moved may change that
            m.read_leases(self.store.queue_leases(cluster.id, self.topology))
        return snap.clusters, cluster

    def _kept(self) -> tuple[list[Cluster], Cluster] | None:
        """The rows as kept, for a round after the step's first when every write of the
        round before won (each was applied to them): no read but the leases' when one of
        their writes could not be applied, and the registry's when it is due."""
        m = self.mirror
        if self.clusters is None and m.leases is not None and m.rows:
            self.clusters, self.clusters_at = self.store.list_clusters(), self.clock.monotonic()  # the registry alone
        cluster = next((c for c in self.clusters or () if c.name == self.cluster_name), None)
        if cluster is None or m.leases is None:
            return self._read_tasks()
        if m.leases_stale:
            m.read_leases(self.store.queue_leases(cluster.id, self.topology))
        return self.clusters, cluster

    def _other_topology_waiting(self, cluster_id: str) -> bool:
        """Read only while a task of this queue has waited for its nodes past the contested
        limit (``Wait.NODES_CONTESTED``) or a pool is kept idle by a window that another
        topology's wait ends (``pools.keep_window``; the two rules that ask), at most once
        a second."""
        now_dt = self.clock.now()

        def contested(v: QueueTask | None) -> bool:
            if v is None or v.phase != lc.WAITING_FOR_NODE or v.phase_since is None:
                return False
            return limits.passed(limits.Wait.NODES_CONTESTED, self.s, (now_dt - v.phase_since).total_seconds())

        def yields(lease) -> bool:
            window, gives_up = pools.keep_window(self.s, lease)
            return window > 0 and gives_up

        kept = any(
            l.state == LeaseState.IDLE and yields(l) for l in self.mirror.leases or ()
        )  # a pool kept idle by a window that another topology's wait ends (pools.kept_alive)
        if not kept and not any(contested(self.mirror.values.get(tid)) for tid in self.mirror.not_waiting):
            return False
        now = self.clock.monotonic()
        if now - self.other_waiting_at[0] >= DESTINATIONS_TTL_S:
            self.other_waiting_at = (now, self.store.other_topology_waiting(cluster_id, self.topology))
        return self.other_waiting_at[1]

    def _started(self, task_id: int) -> None:
        """A task reached Running: the next observe puts its start into the history, and the
        score of its first range into the calibration."""
        self.started.add(task_id)
        promised = self.promised.pop(task_id, None)
        if promised is not None:
            at, expected, mode = promised
            self.scores.append((mode, eta.score(expected, (self.clock.now() - at).total_seconds())))
            del self.scores[: -eta.SCORES_KEPT]

    def _ended(self, task_id: int) -> None:
        """A Running task ended: its start sample gets its end."""
        if self.history is not None:
            now = self.clock.now()
            self.history = [eta.ended(x, now) if x.task_id == task_id else x for x in self.history]

    def _cluster_id(self) -> str:
        assert self.last_state is not None
        return self.last_state.cluster.id

    def _history(self, cluster_id: str, leases) -> QueueHistory:
        """The queue's recent starts: read back once (bounded), then one task's events per start."""
        if self.history is None:
            since = self.clock.now() - dt.timedelta(seconds=HISTORY_WINDOW_S)
            rows = self.store.queue_history(cluster_id, self.topology, since, eta.HISTORY_TASKS)
            self.history = [x for x in (self._sample(tid, mode, spec, eta.phases_of(evs)) for tid, mode, spec, evs in rows) if x]
            self.history.sort(key=lambda x: x.running_at)
            self.started.clear()
        modes = {l.task_id: l.supply_mode for l in leases if l.task_id is not None}
        for tid in sorted(self.started):
            spec = self.mirror.specs.get(tid)
            trail = self.mirror.trails.pop(tid, None)
            if trail is None:  # picked before a restart: its event log says how it went
                trail = eta.phases_of(self.store.events(tid))
            sample = self._sample(tid, modes.get(tid), spec, trail) if spec else None
            if sample is not None:
                self.history = [x for x in self.history if x.task_id != tid] + [sample]
        self.started.clear()
        del self.history[: -eta.HISTORY_TASKS]
        self._arrivals()
        samples, scores, arrivals = tuple(self.history), tuple(self.scores), self.arrivals_value
        h = self.history_value
        if h is None or h.samples != samples or h.scores != scores or h.arrivals is not arrivals:
            # the same value (and its model, eta.model_of) while no start or arrival is added
            self.history_value = QueueHistory(samples, scores, arrivals)
        return self.history_value

    def _arrivals(self) -> None:
        """The tasks new to the mirror join the queue's latest ``eta.ARRIVALS_KEPT`` arrivals."""
        arrived = self.mirror.arrived
        if not arrived:
            return
        for created, actor, tid in arrived:
            self.arrivals[tid] = (created, actor)
        arrived.clear()
        kept = sorted(self.arrivals.items(), key=lambda x: (x[1][0], x[0]))[-eta.ARRIVALS_KEPT :]
        self.arrivals = dict(kept)
        self.arrivals_value = tuple(v for _, v in kept)

    def _sample(self, tid: int, mode, spec: TaskSpec | str, phases: list) -> StartSample | None:
        """One start from the task's (phase, entered at) pairs."""
        if isinstance(spec, str):
            try:
                spec = parse_spec(spec)
            except SpecError:
                return None
        try:
            supply = SupplyMode(mode) if mode else SupplyMode(spec.supply_mode or SupplyMode.FLEX_START)
        except ValueError:
            return None
        return eta.sample_from_phases(tid, phases, supply, spec.timeout_seconds)

    def _destinations(self, cluster: Cluster, clusters: list[Cluster], tasks: QueueTasks) -> tuple[Destination, ...]:
        """Where a ClusterBusy task of this queue could move: the other active clusters of
        the TPU type, each with its ready idle pools of this topology, its queue's waiting
        and slot-holding tasks, its reservation as its ClusterActor's ledger says, and
        whether GKE refused the ClusterBusy task there before (read for that task). Read only
        while a task is ClusterBusy, at most once a second."""
        if not any(t.phase == lc.CLUSTER_BUSY for t in tasks.held):
            return ()
        others = [c for c in clusters if c.name != cluster.name and c.active and c.tpu_type == cluster.tpu_type]
        if not others:
            return ()
        busy = next(t for t in tasks.held if t.phase == lc.CLUSTER_BUSY)  # the slot's holder: one at most
        now = self.clock.monotonic()
        refused_on = self._refused_on(cluster, busy, now)
        if now - self.destinations_at[0] >= DESTINATIONS_TTL_S:
            self.destinations_at = (now, self._read_destinations(others, busy))
        if not refused_on:
            return self.destinations_at[1]
        return tuple(replace(d, refused=frozenset({busy.id})) if d.cluster.id in refused_on else d for d in self.destinations_at[1])

    def _read_destinations(self, others: list[Cluster], busy: QueueTask) -> tuple[Destination, ...]:
        slot = (lc.Reason.WAITING, *(p.reason for p in lc.ACQUIRING_PHASES))
        claimants = self.store.queue_claimants([c.id for c in others], slot)
        on = self.s.reservation_hold_after_s is not None
        waiters = self.store.reservation_waiters_of(c.id for c in others if c.default_reservation) if on else {}
        out = []
        for c in others:
            idle = tuple(
                l.supply_mode
                for l in self.store.leases(c.id)
                if l.topology == self.topology and l.state == LeaseState.IDLE and l.ready_at is not None
            )
            free, machine, held = None, "", 0
            if c.default_reservation:
                try:
                    r = self.port.observe(c.name, render.queue_label(c.name, self.topology), [], True).reservation
                except Exception as e:  # its ClusterActor does not answer: no headroom known there
                    log.info("queue %s: reservation of %s not known: %s", self.label, c.name, e)
                    r = None
                if r is not None:
                    free, machine = r.free, r.machine_type
                    held = self._held_there(c, r, busy, tuple(waiters.get(c.id, ())))
            out.append(Destination(c, idle, claimants.get((c.id, self.topology), 0), free, machine, held))
        return tuple(out)

    def _refused_on(self, cluster: Cluster, busy: QueueTask, now: float) -> frozenset[str]:
        """The other clusters where GKE refused ``busy``'s pool for capacity before (the
        failover tries each once: ``scheduling.move_target``), read at most once a second
        for the same task. Read only for a task of on-demand or flex-start supply that this
        cluster refused (its lease rows here)."""
        if scheduling.supply_mode_for(busy.spec, cluster.default_reservation) == SupplyMode.RESERVATION:
            return frozenset()
        if not any(l.task_id == busy.id and l.refused_at is not None for l in self.mirror.leases or ()):
            return frozenset()
        if now - self.refusals_read[0] >= DESTINATIONS_TTL_S or self.refusals_read[1] != busy.id:
            self.refusals_read = (now, busy.id, frozenset(self.store.refused_on(busy.id) - {cluster.id}))
        return self.refusals_read[2]

    def _held_there(self, c: Cluster, r: ReservationView, t: QueueTask, waiters: tuple[ReservationWaiter, ...]) -> int:
        """The room of cluster ``c``'s reservation held for a task submitted before ``t``
        (``reconcile.hold``, from ``c``'s ClusterBusy tasks): ``t`` moved there would be held back by it."""
        h = hold.hold_over(waiters, c, self.topology, r, self.clock.now(), self.s, before=(t.created_at, t.id))
        return h.hosts if h is not None else 0

    def _reservation_waiters(self, cluster: Cluster, tasks: QueueTasks, leases: tuple[Lease, ...]) -> tuple[ReservationWaiter, ...]:
        """The cluster's ClusterBusy tasks, for the reservation hold (``reconcile.hold``):
        read only where a hold can change this queue's decision (the cluster has a
        reservation, holds are on, and the queue has a Waiting or acquiring task, which may
        claim room or be handed a pool, or an idle reservation pool, which may be kept),
        at most once a second, and not again before a hold could begin: a read that found
        no waiter of ``reservation_hold_after_s`` yet answers until the first of its waiters
        could have waited that long, or that long after the read (a task that turns
        ClusterBusy later holds nothing before then), so a queue of a cluster without a long
        wait reads it once per ``reservation_hold_after_s``."""
        if self.s.reservation_hold_after_s is None or not cluster.default_reservation:
            return ()
        if not (
            tasks.waiting
            or any(t.phase in lc.ACQUIRING_PHASES for t in tasks.held)
            or any(l.state == LeaseState.IDLE and l.supply_mode == SupplyMode.RESERVATION for l in leases)
        ):
            return ()
        now = self.clock.monotonic()
        if now - self.waiters_at[0] >= DESTINATIONS_TTL_S and now >= self.waiters_due:
            waiters = tuple(self.store.reservation_waiters(cluster.id))
            self.waiters_at = (now, waiters)
            after, now_dt = self.s.reservation_hold_after_s, self.clock.now()
            starts = [now_dt + dt.timedelta(seconds=after)] + [w.since + dt.timedelta(seconds=after) for w in waiters if w.since is not None]
            self.waiters_due = now + max(0.0, (min(starts) - now_dt).total_seconds())  # no hold can begin before
        return self.waiters_at[1]

    def _reservation_occupants(self, cluster: Cluster, waiters: tuple[ReservationWaiter, ...]) -> tuple[ReservationOccupant, ...]:
        """The cluster's reservation pools, for the hold's backfill: read only while a
        waiter has waited long enough to hold room, at most once a second."""
        now_dt = self.clock.now()
        if not any(hold.waited_long(w, now_dt, self.s) for w in waiters):
            return ()
        now = self.clock.monotonic()
        if now - self.occupants_at[0] >= DESTINATIONS_TTL_S:
            self.occupants_at = (now, tuple(self.store.reservation_occupants(cluster.id)))
        return self.occupants_at[1]

    def _terminal_messages(self, leases, live_ids: Collection[int]) -> dict[int, tuple[Phase, str]]:
        """Last holders of pools whose delete keeps failing (their task is terminal)."""
        failing = [
            l.task_id
            for l in leases
            if l.state == LeaseState.DELETING and l.task_id is not None and l.task_id not in live_ids
            and l.delete_attempts + 1 >= self.s.pool_delete_report_after
        ]
        return {t.id: (t.phase, t.message) for t in self.store.get_tasks(failing) if t.terminal}

    def _account_idle_chips(self, tpu_type: str, leases) -> None:
        """Chip-seconds of this queue's pools that exist but run nothing (Ready, Idle, Deleting)."""
        now = self.clock.monotonic()
        elapsed, self.idle_accounted_at = now - self.idle_accounted_at, now
        try:
            chips = tpu.lookup(tpu_type, self.topology).chips
        except tpu.UnknownShape:
            return
        idle = sum(1 for l in leases if l.state in LEASE_UNUSED)
        if idle:
            metrics.idle_chip_seconds(self.cluster_name, idle * chips * elapsed)

    # ---- operator surface -----------------------------------------------------------------------

    def snapshot(self, waiting_offset: int = 0, waiting_limit: int | None = None, task_id: int | None = None) -> dict[str, Any]:
        """The queue as an operator reads it: waiting in pick order (each with its position and
        the tasks ahead of it as its Message counts them, the slot holders first, and its start
        range as the last step decided it, ``eta``: epoch seconds or None), slot holder,
        running, pools. The waiting list can be asked for in part, so a
        reader of a long queue is sent only what it shows: ``waiting_offset`` and
        ``waiting_limit`` (a page of the pick order), or ``task_id`` (that task's entry alone,
        none when it does not wait); ``waiting_total`` counts them all, ``waiting_offset`` says
        where a page begins."""
        with self.lock:
            state, view, ranges = self.last_state, self.last_view, self.ranges
        out: dict[str, Any] = {
            "cluster": self.cluster_name, "topology": self.topology, "waiting": [], "waiting_total": 0, "acquiring": [],
            "recovering": [], "running": [], "aborting": [], "leases": [], "last_granted": "", "db_statements": self.store.statements,
        }
        if state is None:
            return out
        now = self.clock.now()
        order = scheduling.queue_order(state.waiting, state.last_granted)
        out["waiting_total"] = len(order)
        if task_id is not None:
            page = [(pos, t) for pos, t in enumerate(order, start=1) if t.id == task_id]
        else:
            first = max(0, waiting_offset)
            last = len(order) if waiting_limit is None else first + max(0, waiting_limit)
            page = list(enumerate(order[first:last], start=first + 1))
            out["waiting_offset"] = first
        out["acquiring"] = [_task_view(t, now) for t in state.held if t.phase in lc.ACQUIRING_PHASES]
        holders = len(out["acquiring"])  # the slot holders, ahead of every waiting task
        out["waiting"] = [
            dict(_task_view(t, now), position=holders + pos, ahead=holders + pos - 1, eta=_eta_view(ranges.get(t.id)))
            for pos, t in page
        ]
        out["recovering"] = [dict(_task_view(t, now), attempt=t.attempt) for t in state.held if t.phase == lc.RECOVERING]
        out["running"] = [dict(_task_view(t, now), attempt=t.attempt) for t in state.held if t.phase == lc.RUNNING]
        out["aborting"] = [_task_view(t, now) for t in state.held if t.phase == lc.ABORTING]
        out["last_granted"] = state.last_granted
        out["leases"] = [_lease_view(x, view) for x in state.leases]
        return out

    def __repr__(self) -> str:
        state = self.last_state
        if state is None:
            return f"QueueActor({self.cluster_name}/{self.topology}: starting)"
        by = {"W": len(state.waiting), "R": 0}
        holder = ""
        for t in state.held:
            if t.phase in lc.ACQUIRING_PHASES:
                holder = f" slot={t.id}:{t.phase.reason}"
            elif t.phase == lc.RUNNING:
                by["R"] += 1
        pools = ",".join(f"{x.name}:{x.state}" for x in state.leases) or "-"
        return f"QueueActor({self.cluster_name}/{self.topology}: waiting={by['W']} running={by['R']}{holder} pools={pools})"


def _task_view(t: QueueTask, now: dt.datetime) -> dict[str, Any]:
    """One task as ``snapshot`` shows it."""
    return {
        "id": t.id,
        "name": t.name,
        "actor": t.actor,
        "status": str(t.phase.status),
        "reason": str(t.phase.reason),
        "message": t.message,
        "node_pool": t.node_pool_name,
        "waiting_s": round((now - t.created_at).total_seconds(), 1),
        "in_phase_s": round((now - t.phase_since).total_seconds(), 1) if t.phase_since else None,
    }


def _eta_view(r: tuple[dt.datetime, float, float] | None) -> dict[str, float] | None:
    """A Waiting task's start range as ``snapshot`` shows it: epoch seconds (None: no estimate)."""
    if r is None:
        return None
    at, expected, latest = r
    base = at.replace(tzinfo=at.tzinfo or dt.UTC).timestamp()
    return {"expected_at": round(base + expected, 1), "latest_at": round(base + latest, 1)}


def _lease_view(lease, view: ClusterView | None) -> dict[str, Any]:
    """One lease as ``snapshot`` shows it, with its pool as the ClusterActor last said."""
    pool = view.pools.get(lease.name) if view else None
    return {
        "name": lease.name,
        "state": str(lease.state),
        "task_id": lease.task_id,
        "supply_mode": str(lease.supply_mode),
        "operation": lease.operation,
        "created_at": lease.created_at.isoformat(),
        "idle_since": lease.idle_since.isoformat() if lease.idle_since else None,
        "pool_status": str(pool.status) if pool else None,
        "nodes_ready": pool.ready if pool else 0,
        "delete_attempts": lease.delete_attempts,
    }
