"""The queue's single writer: one (cluster, topology), its tasks, its node-pool leases.

Contract
--------
``QueueReconciler`` is a plain object built from a store, a port and a clock; the
QueueActor (``actors.remote``) is a thin Ray shell that runs its ``step`` on a
``Ticker`` and forwards hints. Hard state lives in the database: the queue's tasks
(``jobs`` rows with this cluster and topology), its node-pool leases, the last
granted actor, and the task event log (when each task entered its phase). Soft
state is rebuilt on every step: the ClusterActor's view of pools, operations and
Jobs, asked through the port. The object keeps only caches that are safe to lose:
parsed specs, phase-entry times read from the event log, the last refused Job
submission per task (a lost one is rediscovered by submitting again), and the queue's
recent starts for the start estimates (``QueueHistory``: read once from the event log,
bounded, then kept up to date from the queue's own transitions: a start's sample is built
from the moves the queue made since it picked the task, its event log is read only for a
task picked before a restart; never a read per waiting task).

The Ticker steps it every ``interval()``: ``queue_tick_s``, or ``queue_idle_tick_s`` (30 s
by default) while the queue is empty (no live task, no lease), and at once on a hint.
The wake-ups are what an empty queue relies on: the poller hints it with each
assignment, another queue with each task it moves here, the ClusterActor with each Job
event and finished pool operation (``RayPort.hint`` looks the handle up again when it
meets a dead or re-created actor). The idle tick only bounds how long a lost hint
delays a new task; each timed step of an empty queue is one full read (about five
statements), so it costs under 0.2 statements/s.

Between the rounds the object keeps the decisions' values of its tasks in two parts
(``held``: the few that are not Waiting, and ``waiting``: a ``scheduling.WaitingIndex``
of the Waiting ones, per priority and actor, oldest first); a changed row moves between
them in O(log N), so a round does no pass over the waiting list before it carries out
the pick (rule 8's positions, once per step after the rounds, do).

``step()`` observes the database and the cluster, calls ``reconcile.decide`` (pure),
and carries out the effect groups it returns; it repeats while decisions change
state (at most ``MAX_ROUNDS`` rounds). A group stops at its first failed or lost
effect; the next step decides again. A step's first round reads the database; the
later rounds of the same step decide on the rows as kept, with the columns of the
queue's own won writes applied to them (``Store.written``: task moves and updates,
lease moves and touches; this queue is the only writer of its leases and of its tasks'
moves, others only add tasks or abort them, which the next step's read sees), and ask
the ClusterActor again. A lost compare-and-set, a refused effect or a failed one makes the next round
read the database. The registry (cluster status, reservation) is read at most every
``registry_interval_s``, as often as the supervisor reads it.

With ``read_every_step`` False (the QueueActor's setting) a step reads the queue's rows
only when they may have changed under it: after ``rows_changed()`` (the hint of the
poller, with each assignment and with every poll while a task of the queue is
Aborting, or of a queue that moved a task here), after a lost, refused or failed
effect, and at least every ``queue_full_read_s`` (a full read: what a lost hint costs);
a step woken by its ClusterActor (a Job event, a pool operation), by the supervisor or
by its tick decides on the rows as kept (the registry alone read when due) and the
cluster as asked again. A plain ``QueueReconciler`` reads at
every step. Every effect is idempotent, so the process may
die at any line: the constructor is the recovery path, there is no other. A step of a
fenced store (a newer controller holds the leader lease) raises ``Fenced`` before it
observes anything or calls the port, so a stale queue neither writes nor acts.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Collection
from dataclasses import fields as dc_fields
from dataclasses import replace
from typing import Any

from actors.port import Port
from falcon_ray import faults, limits, metrics, reconcile, render, scheduling, tpu
from falcon_ray import lifecycle as lc
from falcon_ray.clock import SYSTEM, Clock
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState, Phase, Status
from falcon_ray.model import (
    PERMANENT_SUBMIT_KINDS,
    Cluster,
    ClusterView,
    Destination,
    Disruption,
    ErrorKind,
    Lease,
    QueueHistory,
    QueueState,
    QueueTask,
    QueueTasks,
    StartSample,
    SubmitError,
    Task,
)
from falcon_ray.reconcile import (
    ClaimReservation,
    CreateLease,
    DeleteJob,
    DeletePool,
    EnsurePool,
    MarkReady,
    MoveLease,
    MoveTask,
    RecordDisruption,
    RecordOperation,
    RefreshMessages,
    SetLastGranted,
    SubmitJob,
    Transition,
    Unassign,
    UpdateTask,
    eta,
)
from falcon_ray.spec import SpecError, SupplyMode, TaskSpec, parse_spec
from falcon_ray.store import Fenced, Store, clip_message

log = logging.getLogger("falcon.queue")
MAX_ROUNDS = 8
DESTINATIONS_TTL_S = 1.0  # another cluster's state is read at most this often for a move
IDLE_LEASE_STATES = (LeaseState.READY, LeaseState.IDLE, LeaseState.DELETING)
HISTORY_WINDOW_S = 86400.0  # starts older than this are not read back after a restart
TASK_COLUMNS = frozenset(f.name for f in dc_fields(Task))
LEASE_COLUMNS = frozenset(f.name for f in dc_fields(Lease))


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
        self.cluster_name = cluster_name
        self.topology = topology
        self.label = render.queue_label(cluster_name, topology)
        self.store = store
        self.port = port
        self.clock = clock
        self.specs: dict[int, TaskSpec] = {}
        self.phase_since: dict[int, tuple[Phase, dt.datetime]] = {}
        self.submit_errors: dict[int, SubmitError] = {}
        # the fleet's disruptions of each task's earlier runs (falcon_task_disruptions): read
        # once per task when the queue first sees it, then kept from this queue's own writes
        self.disrupted: dict[int, tuple[Disruption, ...]] = {}
        self.lock = threading.Lock()
        self.last_state: QueueState | None = None
        self.last_view: ClusterView | None = None
        self.rounds = 0
        self.idle_accounted_at = self.clock.monotonic()
        self.history: list[StartSample] | None = None  # None: not read yet
        self.started: set[int] = set()  # reached Running since the history was brought up to date
        # the phases (and when) of the tasks this queue picked, from its own won moves: a start's
        # sample is built from them instead of its event log (a restart loses them: then it is read)
        self.trails: dict[int, list[tuple[Phase, dt.datetime]]] = {}
        self.destinations_at: tuple[float, tuple[Destination, ...]] = (-DESTINATIONS_TTL_S, ())
        # the queue's rows as last read (soft state: a full read rebuilds them, see _read_tasks)
        self.rows: dict[int, Task] = {}
        self.hot: set[int] = set()  # rows not Waiting at the last read: asked again each round
        self.dirty: set[int] = set()  # tasks this queue wrote since the last read
        self.seq = 0  # the newest falcon_task_queue.seq read
        self.full_read_at = -float("inf")
        self.last_granted = ""  # read with each full read; this queue is its only writer
        self.clusters: list[Cluster] | None = None
        self.clusters_at = -float("inf")  # when the registry was last read
        self.qtasks: dict[int, QueueTask] = {}  # the decisions' value of each row
        # qtasks in two parts, kept from round to round: the Waiting ones in pick-rule
        # order, the others (few) in id order; only changed rows move between them
        self.waiting = scheduling.WaitingIndex()
        self.held: dict[int, QueueTask] = {}
        self.held_values: tuple[QueueTask, ...] | None = ()  # None: held changed
        self.changed: set[int] = set()  # rows read or written since their value was built
        self.lease_rows: list | None = None  # the queue's leases as last read
        self.leases_stale = True  # read them again: a lease write could not be applied to them
        self.must_read = True  # the next round reads the database
        self.read_every_step = True  # False: a step's first round reads only when must_read or hinted
        self.rows_hinted = False  # rows_changed() was called since the last read
        self.other_waiting_at: tuple[float, bool] = (-DESTINATIONS_TTL_S, False)

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
        """One tick: observe, decide, act; repeated while decisions change state."""
        t0 = self.clock.monotonic()
        applied = self.reconcile_once()
        metrics.queue_tick(self.cluster_name, self.topology, self.clock.monotonic() - t0)
        if self.last_state is not None:
            metrics.queue_depth(self.cluster_name, self.topology, self.last_state.held, len(self.last_state.waiting))
        return applied

    def reconcile_once(self) -> int:
        """Rounds of observe-decide-act while decisions change state. The queue positions'
        Message refresh (rule 8, only Message text) is written once, after the last round,
        as that round decided it: a round that moves a task would make the earlier refresh
        stale at once, and with a long queue it is the largest write of the step."""
        if self.store.fenced:  # a newer controller leads: observe nothing, call nobody
            raise Fenced(self.store.fenced)
        applied = 0
        last: tuple[QueueState, ClusterView, dt.datetime] | None = None
        age = self.clock.monotonic() - self.clusters_at
        if age >= (self.s.registry_interval_s if self.rows or self.lease_rows else self.s.queue_full_read_s):
            self.clusters = None  # read with the rows, as often as the supervisor reads it (an empty queue's: once per full read)
        hinted, self.rows_hinted = self.rows_hinted, False  # a hint after this is read by the next step
        if self.read_every_step or hinted or self.clock.monotonic() - self.full_read_at >= self.s.queue_full_read_s:
            self.must_read = True
        for _ in range(MAX_ROUNDS):
            observed = self.observe(fresh=self.must_read)
            self.must_read = False  # later rounds: the rows as kept, with this queue's own won writes
            if observed is None:
                break
            state, view = observed
            with self.lock:
                self.last_state, self.last_view = state, view
            last = (state, view, self.clock.now())
            groups = reconcile.decide(*last, self.s, messages=False)
            if not groups:
                break
            progressed = self.act(groups)
            applied += progressed
            self.rounds += 1
            if not progressed:
                break
        if last is not None:  # rule 8 as the last round decides it, written once
            messages = [g for g in reconcile.decide(*last, self.s) if all(isinstance(e, RefreshMessages) for e in g.effects)]
            if messages:
                self.act(messages)
        return applied

    # ---- observe ---------------------------------------------------------------------------

    def _spec(self, task: Task) -> TaskSpec | None:
        spec = self.specs.get(task.id)
        if spec is None:  # the snapshot carries the spec text of tasks not parsed yet
            try:
                spec = parse_spec(task.spec)
            except SpecError:
                return None
            self.specs[task.id] = spec
        return spec

    def _phase_since(self, tasks: list[Task], disrupted: Collection[int] = ()) -> None:
        """When each of ``tasks`` entered its current phase: kept, else from the event log;
        and the fleet's disruptions of the tasks ``disrupted`` (not known yet), in the same read."""
        unknown = {t.id for t in tasks if self.phase_since.get(t.id, (None,))[0] != t.phase}
        if not unknown and not disrupted:
            return
        entered, found = self.store.entered_and_disruptions(unknown, disrupted)
        for t in tasks:
            if t.id in unknown:
                self.phase_since[t.id] = (t.phase, entered.get((t.id, t.phase)) or t.updated_at)
        self.disrupted.update({tid: found.get(tid, ()) for tid in disrupted})

    def _read_tasks(self) -> tuple[list[Cluster], Cluster, list] | None:
        """The queue's rows: all of them at the first round and every ``queue_full_read_s``,
        otherwise only what may have changed (``Store.queue_snapshot``'s delta) merged into
        the rows kept from the last read; the ids whose row changed or went are added to
        ``changed``. The registry is read with them when ``reconcile_once`` dropped it."""
        now = self.clock.monotonic()
        full = now - self.full_read_at >= self.s.queue_full_read_s
        asked = self.hot | self.dirty
        snap = self.store.queue_snapshot(
            self.cluster_name,
            self.topology,
            self.specs,
            delta=None if full else (self.seq, asked),
            clusters=self.clusters,
            with_granted=full,
            with_leases=full or self.lease_rows is None,
        )
        if self.clusters is None:
            self.clusters_at = now
        self.clusters = snap.clusters
        cluster = next((c for c in snap.clusters if c.name == self.cluster_name), None)
        if cluster is None:
            self.full_read_at = -float("inf")  # read it all when it is back
            return None
        got = {t.id: t for t in snap.tasks}
        gone = (self.rows.keys() if full else asked) - got.keys()  # ended, moved away or unassigned
        if snap.leases is not None:
            self.lease_rows, self.leases_stale = snap.leases, False
        elif self.leases_stale or self._refused_may_change(gone, got):
            # this queue is its leases' only writer (its own writes are applied to the kept
            # rows, a write it could not apply sets leases_stale); which refused ones count
            # follows its acquiring tasks, and a task another writer moved may change that
            self.lease_rows, self.leases_stale = self.store.queue_leases(cluster.id, self.topology), False
        for tid in gone:
            self._drop(tid)
        self.changed |= gone | got.keys()
        self.rows.update(got)
        if full:
            self.last_granted, self.full_read_at, self.seq = snap.last_granted, now, snap.seq
        else:
            self.seq = max(self.seq, snap.seq)
        self.dirty.clear()
        self.hot = {tid for tid in self.hot | got.keys() if tid in self.rows and self.rows[tid].phase != lc.WAITING}
        return snap.clusters, cluster, self.lease_rows

    def _refused_may_change(self, gone: Collection[int], got: dict[int, Task]) -> bool:
        """Whether another writer's change to the rows read may change which Deleted
        (refused) leases ``queue_leases`` returns: those of tasks acquiring. A task that was
        acquiring and left or moved does; a new task, or a change to one that neither was nor
        is acquiring, does not (only this queue moves a task into an acquiring phase)."""
        for tid in gone:
            old = self.rows.get(tid)
            if tid not in self.dirty and (old is None or old.phase in lc.ACQUIRING_PHASES):
                return True
        for tid, t in got.items():
            old = self.rows.get(tid)
            if tid in self.dirty or old is None or old == t:
                continue
            if old.phase in lc.ACQUIRING_PHASES or t.phase in lc.ACQUIRING_PHASES:
                return True
        return False

    def _drop(self, tid: int) -> None:
        """Forget a task that left the queue (its row, parsed spec and every cache of it)."""
        for cache in (self.rows, self.specs, self.submit_errors, self.phase_since, self.trails, self.disrupted):
            cache.pop(tid, None)
        self._forget_value(tid)

    def _queue_tasks(self) -> QueueTasks:
        """The decisions' values of the queue's tasks, rebuilt only for the rows in ``changed``:
        a changed Waiting task is put in (or taken out of) the ``WaitingIndex``, O(log N);
        nothing here passes over the unchanged tasks."""
        changed, self.changed = self.changed, set()
        rows = []
        for tid in changed:
            t = self.rows.get(tid)
            spec = self._spec(t) if t is not None else None
            if spec is None or spec.topology != self.topology:
                self._forget_value(tid)
                continue
            rows.append(t)
        self._phase_since(rows, [t.id for t in rows if t.id not in self.disrupted])
        for t in rows:
            entry = self.phase_since.get(t.id)
            self._set_value(QueueTask(
                id=t.id,
                name=t.name,
                actor=t.actor,
                phase=t.phase,
                created_at=t.created_at,
                dispatched_at=t.dispatched_at,
                spec=self.specs[t.id],
                node_pool_name=t.node_pool_name,
                job_uid=t.job_uid,
                message=t.message,
                phase_since=entry[1] if entry else None,
                disruptions=self.disrupted.get(t.id, ()),
            ))
        if self.held_values is None:
            self.held_values = tuple(self.held[k] for k in sorted(self.held))
        return QueueTasks(self.held_values, self.waiting.value())

    def _set_value(self, value: QueueTask) -> None:
        self.qtasks[value.id] = value
        if value.phase == lc.WAITING:
            if self.held.pop(value.id, None) is not None:
                self.held_values = None
            self.waiting.put(value)
        else:
            self.waiting.discard(value.id)
            self.held[value.id] = value
            self.held_values = None

    def _forget_value(self, tid: int) -> None:
        self.qtasks.pop(tid, None)
        self.waiting.discard(tid)
        if self.held.pop(tid, None) is not None:
            self.held_values = None

    def _other_topology_waiting(self, cluster_id: str) -> bool:
        """Read only while a task of this queue has waited for its nodes past the contested
        limit (``Wait.NODES_CONTESTED``: the only rule that asks), at most once a second."""
        now_dt = self.clock.now()

        def contested(v: QueueTask | None) -> bool:
            if v is None or v.phase != lc.WAITING_FOR_NODE or v.phase_since is None:
                return False
            return limits.passed(limits.Wait.NODES_CONTESTED, self.s, (now_dt - v.phase_since).total_seconds())

        if not any(contested(self.qtasks.get(tid)) for tid in self.hot):
            return False
        now = self.clock.monotonic()
        if now - self.other_waiting_at[0] >= DESTINATIONS_TTL_S:
            self.other_waiting_at = (now, self.store.other_topology_waiting(cluster_id, self.topology))
        return self.other_waiting_at[1]

    def _kept(self) -> tuple[list[Cluster], Cluster, list] | None:
        """The rows as kept, for a round after the step's first when every write of the
        round before won (each was applied to them): no read but the leases' when one of
        their writes could not be applied."""
        if self.clusters is None and self.lease_rows is not None and self.rows:
            self.clusters, self.clusters_at = self.store.list_clusters(), self.clock.monotonic()  # the registry alone
        cluster = next((c for c in self.clusters or () if c.name == self.cluster_name), None)
        if cluster is None or self.lease_rows is None:
            return self._read_tasks()
        if self.leases_stale:
            self.lease_rows, self.leases_stale = self.store.queue_leases(cluster.id, self.topology), False
        return self.clusters, cluster, self.lease_rows

    def observe(self, fresh: bool = True) -> tuple[QueueState, ClusterView] | None:
        """The queue as the database says (read when ``fresh``, else as kept) and the
        cluster as its ClusterActor says (always asked)."""
        read = self._read_tasks() if fresh else self._kept()
        if read is None:
            return None
        clusters, cluster, queue_leases = read
        leases = tuple(l for l in queue_leases if l.state != LeaseState.DELETED)
        refused = tuple(l for l in queue_leases if l.refused_at is not None)
        tasks = self._queue_tasks()
        other_waiting = self._other_topology_waiting(cluster.id)
        last_granted = self.last_granted
        history = self._history(cluster.id, leases)
        self._account_idle_chips(cluster.tpu_type, leases)
        state = QueueState(
            cluster=cluster,
            topology=self.topology,
            tasks=tasks,
            leases=leases,
            last_granted=last_granted,
            other_topology_waiting=other_waiting,
            alternatives_exist=any(c.name != cluster.name and c.tpu_type == cluster.tpu_type and c.active for c in clusters),
            submit_errors=dict(self.submit_errors),
            terminal_messages=self._terminal_messages(leases, self.qtasks.keys()),
            refused=refused,
            pool_names=frozenset(l.name for l in queue_leases),
            history=history,
            destinations=self._destinations(cluster, clusters, tasks),
        )
        want_reservation = bool(cluster.default_reservation) and (
            bool(tasks.waiting) or any(t.phase in lc.ACQUIRING_PHASES for t in tasks.held)
        )
        view = self.port.observe(self.cluster_name, self.label, [l.name for l in leases], want_reservation)
        return state, view

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
            spec = self.specs.get(tid)
            trail = self.trails.pop(tid, None)
            if trail is None:  # picked before a restart: its event log says how it went
                trail = eta.phases_of(self.store.events(tid))
            sample = self._sample(tid, modes.get(tid), spec, trail) if spec else None
            if sample is not None:
                self.history = [x for x in self.history if x.task_id != tid] + [sample]
        self.started.clear()
        del self.history[: -eta.HISTORY_TASKS]
        return QueueHistory(tuple(self.history))

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
        and slot-holding tasks, and its reservation as its ClusterActor's ledger says. Read
        only while a task is ClusterBusy, at most once a second."""
        if not any(t.phase == lc.CLUSTER_BUSY for t in tasks.held):
            return ()
        others = [c for c in clusters if c.name != cluster.name and c.active and c.tpu_type == cluster.tpu_type]
        if not others:
            return ()
        now = self.clock.monotonic()
        if now - self.destinations_at[0] < DESTINATIONS_TTL_S:
            return self.destinations_at[1]
        slot = (lc.Reason.WAITING, *(p.reason for p in lc.ACQUIRING_PHASES))
        claimants = self.store.queue_claimants([c.id for c in others], slot)
        out = []
        for c in others:
            idle = tuple(
                l.supply_mode
                for l in self.store.leases(c.id)
                if l.topology == self.topology and l.state == LeaseState.IDLE and l.ready_at is not None
            )
            free, machine = None, ""
            if c.default_reservation:
                try:
                    r = self.port.observe(c.name, render.queue_label(c.name, self.topology), [], True).reservation
                except Exception as e:  # its ClusterActor does not answer: no headroom known there
                    log.info("queue %s: reservation of %s not known: %s", self.label, c.name, e)
                    r = None
                if r is not None:
                    free, machine = r.free, r.machine_type
            out.append(Destination(c, idle, claimants.get((c.id, self.topology), 0), free, machine))
        self.destinations_at = (now, tuple(out))
        return self.destinations_at[1]

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
        idle = sum(1 for l in leases if l.state in IDLE_LEASE_STATES)
        if idle:
            metrics.idle_chip_seconds(self.cluster_name, idle * chips * elapsed)

    # ---- act ----------------------------------------------------------------------------------

    def act(self, groups: list[reconcile.EffectGroup]) -> int:
        """Carry out each group in order; returns how many groups changed a task's phase or a lease."""
        progressed = 0
        for g in groups:
            try:
                changed = False
                for e in g.effects:
                    if isinstance(e, DeleteJob):  # destructive: say which rule asked for it
                        log.info("queue %s: %s: deleting Job %s", self.label, g.what, e.name)
                    ok, moved = self.apply(e)
                    changed = changed or moved
                    if not ok:
                        self.must_read = True  # lost, refused or not known: the next round reads
                        log.info("queue %s: %s stopped at %s", self.label, g.what, type(e).__name__)
                        break
                if changed:
                    progressed += 1
            except Fenced:
                self.store.check_fence()  # raises when this queue's own epoch is stale
                raise  # only its ClusterActor is fenced: the step ends, the next one decides again
            except Exception as e:
                self.must_read = True
                self.leases_stale = True
                log.warning(
                    "queue %s: %s failed: %s: %s",
                    self.label,
                    g.what,
                    type(e).__name__,
                    e,
                    extra={"cluster": self.cluster_name, "topology": self.topology},
                )
        return progressed

    def apply(self, e: reconcile.Effect) -> tuple[bool, bool]:
        """Returns (carry on with the group, this effect moved a task or lease)."""
        st, c = self.store, self.cluster_name
        if self.lease_rows and any(l.refused_at is not None for l in self.lease_rows):
            # the next round reads the leases again: a task whose refused leases (read while
            # it acquires) may drop out moves
            self.leases_stale = True
        task_id = getattr(e, "task_id", None)
        if task_id is not None:
            self.dirty.add(task_id)  # the next step's read asks for its row, whatever happens here
        match e:
            case Transition():
                won = st.transition(e.task_id, e.expect, e.to, e.message, **e.fields)
                if won:
                    if st.moved_at is not None:  # its event row is the phase entry: no re-read
                        self.phase_since[e.task_id] = (e.to, st.moved_at)
                    self._transitioned(e)  # first: it reads the value the decision saw
                    self._wrote_task(e.task_id, st.written)
                return won, won
            case UpdateTask():
                won = st.update_task(e.task_id, e.expect, e.message, **e.fields)
                if won:
                    self._wrote_task(e.task_id, st.written)
                return won or not e.fields, False
            case RefreshMessages():
                st.refresh_messages(e.updates)
                self._messages_written(e.updates)
                return True, False
            case SetLastGranted():
                st.set_last_granted(self._cluster_id(), self.topology, e.actor)
                self.last_granted = e.actor
                return True, False
            case CreateLease():
                lease = st.create_lease(self._cluster_id(), self.topology, e.name, e.supply_mode, e.task_id)
                self._kept_lease(lease)
                metrics.pool_created(c, e.supply_mode)
                return True, True
            case RecordOperation():
                self._wrote_lease(e.lease_id, st.touch_lease(e.lease_id, operation=e.operation))
                return True, False
            case MarkReady():
                self._wrote_lease(e.lease_id, st.touch_lease(e.lease_id, ready_at=self.clock.now()))
                return True, True
            case ClaimReservation():
                granted = self.port.claim_reservation(c, e.name, e.hosts)
                if not granted:
                    log.info("queue %s: reservation claim for %s refused: another queue took it", self.label, e.name)
                return granted, False
            case EnsurePool():
                self.port.ensure_pool(c, e.name, e.request, e.operation)
                return True, False
            case MoveLease():
                won = st.move_lease(e.lease_id, e.expect, e.to, **e.fields)
                self._wrote_lease(e.lease_id, won)
                if won:
                    metrics.lease_moved(c, self.topology, e.expect[0], e.to)
                return won, won
            case DeletePool():
                self.port.delete_pool(c, e.name)
                return True, False
            case SubmitJob():
                return self._submit(e)
            case DeleteJob():
                self.port.delete_job(c, e.namespace, e.name)
                return True, False
            case RecordDisruption():
                self._record_disruption(e)
                return True, False
            case Unassign():
                won = st.unassign(e.task_id, e.message, e.expect)
                if won:
                    self._left(e.task_id)  # back to the poller: no longer this queue's
                return won, won
            case MoveTask():
                return self._move(e)
        raise TypeError(f"unknown effect {e!r}")

    def _record_disruption(self, e: RecordDisruption) -> None:
        """Write the run the fleet ended (idempotent by task and attempt) and keep it."""
        first = self.store.record_disruption(e.task_id, e.attempt, e.kind, e.node, e.job, e.detail)
        known = self.disrupted.get(e.task_id, ())
        if len(known) == e.attempt:
            self.disrupted[e.task_id] = (*known, Disruption(e.attempt, e.kind, e.node, e.job, e.detail, self.clock.now()))
        elif len(known) < e.attempt:  # not known here: read it back with the row
            self.disrupted.pop(e.task_id, None)
        self.changed.add(e.task_id)
        if first and faults.counted(e.kind):
            log.warning(
                "task %s: run %s disrupted by the fleet (%s, node %s): %s", e.task_id, e.attempt, e.kind, e.node or "?", e.detail,
                extra={"falcon_task_id": e.task_id, "cluster": self.cluster_name, "topology": self.topology},
            )
            metrics.disruption(self.cluster_name, e.kind)

    def _messages_written(self, updates) -> None:
        """The kept rows carry the Messages just written (a row whose phase moved meanwhile
        kept its old one, and is read again as a row that is not Waiting any more)."""
        waiting = []
        for tid, phase, text in updates:
            row = self.rows.get(tid)
            if row is not None and row.phase == phase:
                text = clip_message(text)
                self.rows[tid] = row.with_message(text)
                value = self.qtasks.get(tid)
                if value is None:
                    continue
                value = self.qtasks[tid] = value.with_message(text)
                if value.phase == lc.WAITING and tid in self.waiting:
                    waiting.append(value)
                else:
                    self._set_value(value)
        self.waiting.replace(waiting)

    def _wrote_task(self, tid: int, values: dict[str, Any] | None) -> None:
        """Apply a won write's columns to the kept row, so that the step's next round
        decides on it without reading it back; a row that became terminal leaves the queue."""
        row = self.rows.get(tid)
        if row is None or values is None:
            self.must_read = True
            return
        before = row
        row = replace(row, **{k: v for k, v in values.items() if k in TASK_COLUMNS})
        if row.terminal or row.cluster_id != before.cluster_id:
            self._left(tid)
            return
        self.rows[tid] = row
        self.changed.add(tid)
        if row.phase != lc.WAITING:
            self.hot.add(tid)

    def _left(self, tid: int) -> None:
        """A task this queue's own write took out of it (terminal, moved, unassigned)."""
        self._drop(tid)
        self.changed.add(tid)
        self.hot.discard(tid)

    def _kept_lease(self, lease: Lease) -> None:
        rows = [l for l in self.lease_rows or () if l.id != lease.id]
        self.lease_rows = sorted([*rows, lease], key=lambda l: l.id)

    def _wrote_lease(self, lease_id: int, won: bool) -> None:
        """Apply a lease write's columns to the kept lease rows (this queue is their only
        writer); a lost or unknown one makes the next round read them."""
        old = next((l for l in self.lease_rows or () if l.id == lease_id), None)
        values = self.store.written if won else None
        if old is None or values is None:
            self.leases_stale = True
            return
        self._kept_lease(replace(old, **{k: v for k, v in values.items() if k in LEASE_COLUMNS}))

    def _move(self, e: MoveTask) -> tuple[bool, bool]:
        """The compare-and-set that moves a ClusterBusy task to another cluster's queue, then
        both wake-ups. A crash after the write leaves a Waiting task there that its queue's
        periodic re-read finds; a lost write (aborted, moved meanwhile) changes nothing."""
        won = self.store.move_task(e.task_id, e.from_cluster_id, e.to_cluster_id, e.message, e.topology)
        if won:
            self._left(e.task_id)
            log.info(
                "task %s: %s -> %s/%s on %s: %s", e.task_id, lc.CLUSTER_BUSY, lc.WAITING, e.topology, e.to_cluster, e.message,
                extra={"falcon_task_id": e.task_id, "cluster": e.to_cluster, "topology": e.topology},
            )
            metrics.task_transition(e.to_cluster, e.topology, lc.WAITING)
            self.port.hint(e.to_cluster, e.topology)
            self.port.hint(self.cluster_name, self.topology, create=False)
        return won, won

    def _submit(self, e: SubmitJob) -> tuple[bool, bool]:
        try:
            res = self.port.submit_job(self.cluster_name, e.manifest, e.service)
        except Exception as exc:  # the ClusterActor did not answer: a refusal for now, with a budget
            res = {"error_kind": ErrorKind.TRANSIENT.value, "error": f"{type(exc).__name__}: {exc}"[:500]}
        if "error_kind" in res:
            kind = ErrorKind(res["error_kind"])
            # the decision reads it: a refusal for good fails the task at once, another one is
            # retried until submit_budget_s has passed in Dispatching
            self.submit_errors[e.task_id] = SubmitError(kind, res["error"])
            log.info("queue %s: Job submit for task %s refused (%s): %s", self.label, e.task_id, kind, res["error"])
            return False, kind in PERMANENT_SUBMIT_KINDS
        self.submit_errors.pop(e.task_id, None)
        fields: dict[str, Any] = {"job_uid": res["uid"]}
        if e.first:
            fields["dispatched_at"] = self.clock.now()
        if self.store.update_task(e.task_id, (e.phase,), e.message, **fields):
            self._wrote_task(e.task_id, self.store.written)
        else:
            self.must_read = True  # it moved meanwhile (aborted): the next round reads it
        return True, True

    def _transitioned(self, e: Transition) -> None:
        """One log line and the metrics of a won transition."""
        task = self.qtasks.get(e.task_id)  # the value the decision saw (phase, actor, phase_since)
        log.info(
            "task %s: %s -> %s: %s",
            e.task_id,
            task.phase if task else "?",
            e.to,
            e.message,
            extra={
                "falcon_task_id": e.task_id,
                "cluster": self.cluster_name,
                "topology": self.topology,
                "actor": task.actor if task else "",
                "status": str(e.to.status),
                "reason": str(e.to.reason),
            },
        )
        metrics.task_transition(self.cluster_name, self.topology, e.to)
        if e.to == lc.RECOVERING:
            metrics.recovery(self.cluster_name, self.topology)
        if task is None:
            return
        now = self.clock.now()
        if task.phase.status == Status.PENDING and task.phase.reason and task.phase_since is not None:
            seconds = (now - task.phase_since).total_seconds()
            metrics.pending_reason_time(self.cluster_name, self.topology, str(task.phase.reason), seconds)
        at = self.store.moved_at or now
        if task.phase == lc.WAITING and task.phase_since is not None:
            self.trails[task.id] = [(lc.WAITING, task.phase_since), (e.to, at)]
        elif task.id in self.trails:
            self.trails[task.id].append((e.to, at))
        if e.to == lc.RUNNING:
            metrics.time_to_running(self.cluster_name, self.topology, (now - task.created_at).total_seconds())
            self.started.add(task.id)  # the next observe puts its start into the history
        elif task.phase == lc.RUNNING and e.to.status in lc.TERMINAL and self.history is not None:
            self.history = [eta.ended(x, now) if x.task_id == task.id else x for x in self.history]

    def _cluster_id(self) -> str:
        assert self.last_state is not None
        return self.last_state.cluster.id

    # ---- operator surface -----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The queue as an operator reads it: waiting in pick order, slot holder, running, pools."""
        with self.lock:
            state, view = self.last_state, self.last_view
        out: dict[str, Any] = {
            "cluster": self.cluster_name,
            "topology": self.topology,
            "waiting": [],
            "acquiring": [],
            "recovering": [],
            "running": [],
            "aborting": [],
            "leases": [],
            "last_granted": "",
            "db_statements": self.store.statements,
        }
        if state is None:
            return out
        now = self.clock.now()

        def row(t: QueueTask) -> dict[str, Any]:
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

        for pos, t in enumerate(scheduling.queue_order(state.waiting, state.last_granted), start=1):
            out["waiting"].append(dict(row(t), position=pos))
        out["acquiring"] = [row(t) for t in state.held if t.phase in lc.ACQUIRING_PHASES]
        out["recovering"] = [dict(row(t), attempt=t.attempt) for t in state.held if t.phase == lc.RECOVERING]
        out["running"] = [dict(row(t), attempt=t.attempt) for t in state.held if t.phase == lc.RUNNING]
        out["aborting"] = [row(t) for t in state.held if t.phase == lc.ABORTING]
        out["last_granted"] = state.last_granted
        for l in state.leases:
            pool = view.pools.get(l.name) if view else None
            out["leases"].append(
                {
                    "name": l.name,
                    "state": str(l.state),
                    "task_id": l.task_id,
                    "supply_mode": str(l.supply_mode),
                    "operation": l.operation,
                    "created_at": l.created_at.isoformat(),
                    "idle_since": l.idle_since.isoformat() if l.idle_since else None,
                    "pool_status": str(pool.status) if pool else None,
                    "nodes_ready": pool.ready if pool else 0,
                    "delete_attempts": l.delete_attempts,
                }
            )
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
        pools = ",".join(f"{l.name}:{l.state}" for l in state.leases) or "-"
        return f"QueueActor({self.cluster_name}/{self.topology}: waiting={by['W']} running={by['R']}{holder} pools={pools})"
