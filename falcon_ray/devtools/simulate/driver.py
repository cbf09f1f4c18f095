"""The controller in virtual time: the real poller, queues and cluster gateways on one schedule.

Contract
--------
``Simulation(fleet, tasks, settings, seed)`` builds, in one process and on one
``VirtualClock``: the database (SQLite in memory unless ``db_url`` is given; the schema
by ``store.migrate.upgrade``; the fleet's clusters registered as ``falcon-ray clusters
add`` would), the fleet model (``fleet.VirtualFleet``), an ``actors.poller.IntakePoller``,
one ``actors.cluster.ClusterGateway`` per cluster (connected to the fleet by its
``connect`` argument) and one ``actors.queue.QueueReconciler`` per (cluster, topology)
that the poller or another queue hints, as the supervisor and ``RayPort`` create them.
They are the product's objects, unmodified; each has its own ``Store``, as each actor
has, and they reach one another through ``SimPort`` (the ``actors.port.Port`` that
calls the other object directly instead of through Ray).

``run()`` plays the tasks (each submitted at ``submit_at`` seconds and aborted at
``abort_at`` as the upper layer does: ``Store.submit_task``, ``Store.request_abort``) and
runs the schedule until every task is terminal and no Falcon pool is left in the fleet,
or ``until_s`` has passed (default: ``DEFAULT_TAIL_S`` after the last submission, longer
than flex-start's seven days: a task that waits for capacity that never comes ends the run
there, live). What runs when:

- every loop a Ticker would run, at the times the Ticker would run it: the queues'
  ``step`` every ``interval()`` and at once on a hint; the gateway's orphan scan and
  gauges at their periods; its operation loop (on a ``schedule.Worker``: it blocks while
  it follows an operation) and its watch loop;
- except the rounds that cannot change anything, left out as follows: the operation loop
  runs only when an operation is due (a queued operation's retry time, or the wake-up of
  ``ensure_pool`` / ``delete_pool`` / a connect), since with no due operation its step
  returns at once; the watch loop runs when the fleet emitted a Job event for it or its
  periodic re-list is due (the in-process watch delivers events as they happen); the
  poller polls at its interval only after something could have put a row in its intake
  (a task submitted or aborted, a queue that changed anything: it may have handed a task
  back) and until a poll finds nothing, on the tick grid of its interval; the gauges
  (metrics, the ledger's figures on the cluster row: no decision reads them) run every
  ``GAUGES_EVERY_S``; an orphan scan is skipped while it would find what the last one
  found, nothing (``_orphans_idle``);
- a queue steps next at the first tick at which ``reconcile.decide``, on what its last
  round observed, asks for something that round did not (``reconcile.due.next_due``: the
  round's own writes are in the rows, so a step before that tick would repeat them), at
  most ``QUIET_MAX_S`` away; at its next tick when its last step lost, was refused or
  failed an effect, failed, or ended at ``MAX_ROUNDS`` still moving. Besides: at once on
  a hint; at its next tick when another queue of its cluster changed what this queue's
  decisions read of that queue's rows (``_visible``, ``_reads``: the reservation's
  ledger, waiters and occupants; which topologies have a Pending task), while it holds a
  ClusterBusy task when a queue of another cluster of its TPU type changed what a move
  there reads, and when the ClusterActor started, failed or ended one of its operations
  (what ``observe`` shows of it is not what the queue last saw); and when the fleet
  changed one of its pools or its reservation's use (or, while it holds a ClusterBusy
  task, another cluster of its TPU type's reservation use), at the first tick at which
  the ClusterActor's cached view is due for a refresh. ``exact=True`` steps every queue at
  every tick instead (docs/simulate.md compares the two).

Determinism: one thread runs at a time (``schedule``), the fleet draws from the seed,
the controller's jitter from Python's ``random`` seeded here, and the clusters' ids are
derived from their names; so the same inputs and seed give the same event log.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import sqlite3
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from actors.cluster import OP_IDLE_WAIT_S, ClusterGateway
from actors.poller import IntakePoller
from actors.queue import MAX_ROUNDS, QueueReconciler
from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.devtools.demo import register_clusters
from falcon_ray.lifecycle import TERMINAL, LeaseState
from falcon_ray.model import OpState
from falcon_ray.nodepools import ledger
from falcon_ray.reconcile import hold
from falcon_ray.reconcile.due import next_due
from falcon_ray.render import POOL_NAME_PREFIX
from falcon_ray.sim.fleet import FleetConfig
from falcon_ray.spec import SupplyMode
from falcon_ray.store import Store
from falcon_ray.store.migrate import upgrade

from .fleet import VirtualFleet
from .schedule import ScheduledLoop, Scheduler, VirtualClock, Worker

log = logging.getLogger("falcon.simulate")
START = dt.datetime(2026, 1, 5)  # a Monday, 00:00 UTC: the generated traces' daily pattern starts here
GAUGES_EVERY_S = 3600.0  # the gauges (metrics and the ledger's figures on the cluster row) decide nothing
ALL_CHANGED = (True,) * 5  # a queue's step that may have changed every part of ``_visible``
DEFAULT_TAIL_S = 8 * 86400.0  # without until_s: the run ends at the latest this long after the last submission
QUIET_MAX_S = 3600.0  # a quiet queue steps at least this often (virtual seconds): a safety net
MONITOR_S = 300.0  # virtual seconds between two looks at the live tasks' Messages
END_CHECK_S = 10.0  # once every task is submitted: virtual seconds between two checks for the end


class SimPort:
    """``actors.port.Port`` in one process: each call goes to the object itself."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def observe(self, cluster: str, queue_label: str, pool_names: list[str], want_reservation: bool):
        return self.sim.gateways[cluster].observe(queue_label, pool_names, want_reservation)

    def claim_reservation(self, cluster: str, name: str, hosts: int) -> bool:
        return self.sim.gateways[cluster].claim_reservation(name, hosts)

    def ensure_pool(self, cluster: str, name: str, request: dict[str, Any], operation: str | None = None) -> str:
        return self.sim.gateways[cluster].ensure_pool(name, request, operation)

    def delete_pool(self, cluster: str, name: str) -> str:
        return self.sim.gateways[cluster].delete_pool(name)

    def submit_job(self, cluster: str, manifest: dict[str, Any], service: dict[str, Any] | None) -> dict[str, Any]:
        return self.sim.gateways[cluster].submit_job(manifest, service)

    def delete_job(self, cluster: str, namespace: str, name: str) -> bool:
        return self.sim.gateways[cluster].delete_job(namespace, name)

    def hint(self, cluster: str, topology: str, create: bool = True) -> None:
        self.sim.hint(cluster, topology, create)


class Simulation:
    def __init__(
        self,
        fleet: FleetConfig,
        tasks: list[dict[str, Any]],
        settings: Settings,
        seed: int,
        db_url: str | None = None,
        until_s: float | None = None,
        progress: Callable[[Simulation], None] | None = None,
        exact: bool = False,
    ) -> None:
        random.seed(seed)
        self.seed = seed
        self.settings = settings
        self.plan = sorted(enumerate(tasks), key=lambda it: (float(it[1].get("submit_at") or 0.0), it[0]))
        self.progress = progress
        self.exact = exact
        self.probes = 0
        self.steps_applied = 0  # queue steps that carried out at least one group of a decision
        # seconds a pool with Ready nodes sat idle while a task of its queue waited in Waiting:
        # each queue's last decision's count (``Plan.ready_pools_left_idle``), held until its next step
        self.ready_pool_idle_s = 0.0
        self._ready_idle: dict[int, tuple[int, float]] = {}  # id(queue) -> (count, since: monotonic)
        self.rounds_cut: dict[int, bool] = {}  # id(queue) -> its last step ended at MAX_ROUNDS, still moving
        self.clock = VirtualClock(START)
        self.t0 = self.clock.monotonic()
        self.scheduler = Scheduler(self.clock)
        self.fleet_config = fleet.model_copy(update={"seed": seed})
        self.fleet = VirtualFleet(self.fleet_config, self.scheduler, on_change=self._fleet_changed)
        self.db_url, self._keeper = _database(db_url, seed)
        self.store = self._store()  # the upper layer's (submits, aborts) and the report's
        self._register_clusters()
        self.port = SimPort(self)
        self.controller_stores: list[Store] = []
        self.messages: list[tuple[float, int, str]] = []  # (seconds, task, Waiting Message) as refreshed
        self.ids: list[int] = []
        self.submitted = 0
        self.observed: dict[int, list[tuple[float, str, str, str]]] = {}
        self.done = False
        self._changed_since_check = True
        self._written = False  # a step, a submit or an abort since the last look at the Messages (_monitor)
        self._scanned: dict[str, tuple[str, ...]] = {}  # cluster -> its Falcon pools at a scan that found nothing
        self._acted: set[str] = set()  # clusters one of whose queues acted since their last orphan scan
        self._op_seen: dict[str, set[str]] = {}  # cluster -> its operations queued or running at the last look
        self._queues_of: dict[str, list[QueueReconciler]] = {}  # cluster -> its queues, in creation order
        self._in_flight: dict[QueueReconciler, tuple[Any, set[str]]] = {}  # queue -> (its last view, that view's queued or running operations)
        self._due_guess: dict[QueueReconciler, int] = {}  # queue -> its last next_due answer (tried first the next time)
        self._visible: dict[int, tuple[Any, ...] | None] = {}  # id(queue) -> what other queues read of it, after its last step
        self._shown_changed: dict[int, tuple[bool, ...]] = {}  # id(queue) -> its last step changed that (each part)
        self._tpu_type = {c.name: c.tpu_type for c in fleet.clusters}
        self._has_reservation = {c.name: c.reservation is not None for c in fleet.clusters}
        self.poller = IntakePoller(settings, self._controller_store(), self.port, self.clock)
        self.poller_loop = self._loop("poller", self.poller.poll_once, self.poller.interval)
        self.poller_loop.next_after = self._poller_next
        self.gateways: dict[str, ClusterGateway] = {}
        self.workers: list[Worker] = []
        for c in self.fleet_config.clusters:
            self.gateways[c.name] = self._gateway(c.name)
        self.queues: dict[tuple[str, str], tuple[QueueReconciler, ScheduledLoop]] = {}
        for index, item in self.plan:
            self.scheduler.at(self.t0 + float(item.get("submit_at") or 0.0), self._submit, index, item)
        self.scheduler.at(self.t0 + MONITOR_S, self._monitor)
        last = max((float(item.get("submit_at") or 0.0) for _, item in self.plan), default=0.0)
        self.until_s = until_s if until_s is not None else last + DEFAULT_TAIL_S
        self.scheduler.at(self.t0 + self.until_s, self._stop)

    # ---- building ---------------------------------------------------------------------------------

    def _store(self) -> Store:
        return Store(self.db_url, clock=self.clock)

    def _controller_store(self) -> Store:
        s = self._store()
        self.controller_stores.append(s)
        refresh = s.refresh_messages

        def recorded(updates):  # the Waiting Messages the upper layer sees, for the start estimates' error
            at = self.clock.monotonic() - self.t0
            self.messages.extend((at, tid, text) for tid, _phase, text in updates)
            return refresh(updates)

        s.refresh_messages = recorded  # type: ignore[method-assign]
        return s

    def _register_clusters(self) -> None:
        register_clusters(self.store, self.fleet_config)
        with self.store.engine.begin() as conn:  # ids from the names: a replayable run
            for c in self.fleet_config.clusters:
                new = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{c.name}.cluster.falcon-simulate"))
                conn.execute(sa.text("UPDATE clusters SET id = :new WHERE name = :name"), {"new": new, "name": c.name})

    def _loop(self, name: str, step: Callable[[], object], interval: Callable[[], float], start_after: float = 0.0) -> ScheduledLoop:
        return ScheduledLoop(name, step, interval, log, start_after=start_after, scheduler=self.scheduler)

    def _gateway(self, name: str) -> ClusterGateway:
        def loops(*args: Any, **kwargs: Any) -> ScheduledLoop:
            kwargs.pop("clock", None)
            return ScheduledLoop(*args, scheduler=self.scheduler, **kwargs)

        # the gateway's four loops run on the schedule, its jitter from the run's seed
        return self._schedule_gateway(name, ClusterGateway(
            name, self.settings, self._controller_store(), self.port, self.clock,
            connect=self.fleet.connect, rng=random.Random(f"{self.seed}/{name}"), loops=loops,
        ))

    def _schedule_gateway(self, name: str, g: ClusterGateway) -> ClusterGateway:
        for ops in g.op_loops:
            ops.worker = Worker(f"simulate {ops.name}")
            self.workers.append(ops.worker)
            ops.next_after = lambda loop, g=g: _next_operation(g, loop.clock.monotonic())
            if not self.exact:
                ops.on_settle = lambda loop, name=name: self._operations_moved(name)
        g.tickers["watch"].next_after = lambda loop, g=g: self._watch_next(g, loop)
        if not self.exact:
            g.tickers["gauges"].next_after = lambda loop: loop.clock.monotonic() + GAUGES_EVERY_S
            g.tickers["orphans"].next_after = lambda loop, name=name: self._orphans_next(name, loop)
        return g

    def _orphans_next(self, cluster: str, loop: ScheduledLoop) -> float | None:
        """The scan's period, skipping the periods in which it would find what it found last
        time, nothing (``_orphans_idle``)."""
        if not isinstance(loop.result, dict) or any(loop.result.values()):
            self._scanned.pop(cluster, None)  # it found something (or failed): scan at the period
        else:
            self._scanned[cluster] = self._orphan_inputs(cluster)
        self._acted.discard(cluster)
        t = loop.clock.monotonic() + self.settings.orphan_scan_interval_s
        if not self._orphans_idle(cluster):
            return t
        self.scheduler.at(t, self._orphans_check, cluster, loop)
        return None

    def _orphan_inputs(self, cluster: str) -> tuple[str, ...]:
        return tuple(sorted(n for n in self.fleet.clusters[cluster].pools.pools if n.startswith(POOL_NAME_PREFIX)))

    def _orphans_idle(self, cluster: str) -> bool:
        """A scan would find nothing: the cluster holds no Falcon pool and no Job; or the last
        scan found nothing, no queue of the cluster acted since (no lease or task left a live
        state, no task ended), the cluster's Falcon pools are the same and all older than the
        create-visibility grace (a younger one could become an orphan by age alone)."""
        c = self.fleet.clusters[cluster]
        pools = self._orphan_inputs(cluster)
        if not pools and not c.store.count("jobs"):
            return True
        if self._scanned.get(cluster) != pools or cluster in self._acted:
            return False
        now = c.wall()
        return all(now - c.pools.pools[n].created_at >= self.settings.create_visibility_grace_s for n in pools)

    def _orphans_check(self, cluster: str, loop: ScheduledLoop) -> None:
        if self._orphans_idle(cluster):
            self.scheduler.at(self.clock.monotonic() + self.settings.orphan_scan_interval_s, self._orphans_check, cluster, loop)
        else:
            loop.wake()

    def _watch_next(self, g: ClusterGateway, loop: ScheduledLoop) -> float | None:
        now = loop.clock.monotonic()
        if g.gke is None or g.watcher is None:
            return now + g.watch_delay  # not connected: the connect back-off
        w = g.watcher
        if w.on_events is None:
            w.on_events = loop.wake
        if w.pending:
            return now
        due = w.resync_due_at()
        return None if due is None else due + 1e-3

    def queue(self, cluster: str, topology: str) -> tuple[QueueReconciler, ScheduledLoop]:
        key = (cluster, topology)
        if key not in self.queues:
            q = QueueReconciler(cluster, topology, self.settings, self._controller_store(), self.port, self.clock)
            q.read_every_step = False  # as the QueueActor runs it
            loop = self._loop(f"queue {cluster}/{topology}", lambda q=q: self._step_queue(q), q.interval)
            loop.on_step = self._queue_stepped
            if not self.exact:
                loop.next_after = lambda loop, q=q: self._queue_next(q, loop)
            self.queues[key] = (q, loop)
            self._queues_of.setdefault(cluster, []).append(q)
        return self.queues[key]

    def _step_queue(self, q: QueueReconciler) -> int:
        """The queue's step; ``rounds_cut`` says whether it ended at ``MAX_ROUNDS`` with its
        last round still moving (what that round decided is not in its observations)."""
        before, failed = q.rounds, True
        now = self.clock.monotonic()
        count, since = self._ready_idle.get(id(q), (0, now))
        self.ready_pool_idle_s += count * (now - since)
        try:
            applied = q.step()
            failed = False
        finally:
            plan = q.last_plan
            self._ready_idle[id(q)] = (plan.ready_pools_left_idle() if plan is not None else 0, now)
            self.rounds_cut[id(q)] = q.rounds - before >= MAX_ROUNDS
            shown, last = _visible(q), self._visible.get(id(q))
            if shown is None or last is None or failed or self.rounds_cut[id(q)]:
                # a failed step's writes, or what a step cut at MAX_ROUNDS decided last, may not be in its observations
                self._shown_changed[id(q)] = ALL_CHANGED
            else:
                self._shown_changed[id(q)] = tuple(a != b for a, b in zip(shown, last, strict=True))
            self._visible[id(q)] = shown
        return applied

    # ---- the port's wake-ups --------------------------------------------------------------------

    def hint(self, cluster: str, topology: str, create: bool) -> None:
        if (cluster, topology) not in self.queues and not create:
            return
        q, loop = self.queue(cluster, topology)
        if create:
            q.rows_changed()
        loop.wake()

    def _queue_stepped(self, loop: ScheduledLoop, applied: object) -> None:
        self._written = True  # a step that moved nothing may still have written a Message
        if isinstance(applied, int):  # not an int: the step failed, and may have changed anything
            if applied == 0:
                return
            self.steps_applied += 1
        self._changed_since_check = True
        self._poke_poller()  # a queue that changed anything may have handed a task back
        cluster, topology = loop.name.split(" ", 1)[1].split("/", 1)
        self._acted.add(cluster)
        if self.exact:
            return
        acting = self.queues[(cluster, topology)][0]
        shown = self._shown_changed.get(id(acting), ALL_CHANGED)
        if not any(shown):
            return
        for (c, t), (q, other) in self.queues.items():
            # the same cluster's queues whose decisions read what this one changed of the
            # rows they share (``_reads``: the reservation's ledger, which topologies wait);
            # a queue with a ClusterBusy task may move it to a cluster of its TPU type where
            # this one changed what a move reads there (``_visible``)
            if other is loop:
                continue
            if c == cluster:
                if self._reads_change(q, shown):
                    other.wake_on_tick()
            elif _holds_busy(q) and self._destination_of(c, cluster):
                there = (shown[POOLS] or shown[WAITERS]) and self._has_reservation[cluster]
                if there or (shown[TOPOLOGY] and t == topology):
                    other.wake_on_tick()

    def _reads_change(self, q: QueueReconciler, shown: tuple[bool, ...]) -> bool:
        """Queue ``q``'s next step reads a part of another queue of its cluster that changed
        (``shown``, by part of ``_visible``): the cluster's ClusterBusy tasks only once its kept
        ones are due for a re-read (``QueueReconciler.waiters_due``), the reservation pools'
        Job submissions only while a waiter it knows of holds room (the hold's shadow)."""
        ledger_read, pending_read = _reads(q)
        if shown[PENDING] and pending_read:
            return True
        if not ledger_read:
            return False
        if shown[POOLS] or (shown[WAITERS] and self.clock.monotonic() >= q.waiters_due):
            return True
        return shown[SHADOW] and self._holding_known(q)

    def _holding_known(self, q: QueueReconciler) -> bool:
        """A waiter the queue last read has waited long enough to hold room (then its step
        reads the reservation's pools: ``QueueReconciler._reservation_occupants``)."""
        state, now = q.last_state, self.clock.now()
        return state is not None and any(hold.waited_long(w, now, self.settings) for w in state.reservation_waiters)

    def _destination_of(self, cluster: str, other: str) -> bool:
        """A ClusterBusy task of ``cluster`` may move to ``other``: another cluster of its TPU type."""
        return cluster != other and self._tpu_type[cluster] == self._tpu_type[other]

    def _fleet_changed(self, cluster: str, pools: set[str], capacity: bool) -> None:
        """The fleet changed what the cluster's ClusterActor observes: the queues of the pools
        that changed (all of the cluster's when the reservation's use changed or a pool's queue
        is not known) step at their first tick at which the actor's cached view is due for a
        refresh, so that they see the change."""
        self._changed_since_check = True
        if self.exact:
            return
        g = self.gateways[cluster]
        owners = {g.pool_owner(p) for p in pools}
        every = capacity or None in owners
        due = g.view_listed_at + self.settings.pool_refresh_s
        for (c, topology), (q, loop) in self.queues.items():
            if c == cluster and (every or topology in owners):
                loop.wake_on_tick(due)
            elif (capacity or self._has_reservation[cluster]) and _holds_busy(q) and self._destination_of(c, cluster):
                # the reservation's room there is what a move reads: its use, and its pools'
                # registered nodes, which the ledger stops counting as claimed
                loop.wake_on_tick(due)

    def _operations_moved(self, cluster: str) -> None:
        """The operation loop gave control back: a queue whose operation it started, failed or
        followed to its end (what ``observe`` shows of it is not what the queue last saw)
        steps at its next tick, as a queue stepped at every tick would see it."""
        g = self.gateways[cluster]
        names = set(self._op_seen.get(cluster, ()))
        for q in self._queues_of.get(cluster, ()):  # the running one is out of the FIFO
            if q.last_view is not None:
                names.update(self._in_flight_of(q))
        views = g.op_views(names)
        self._op_seen[cluster] = {n for n, v in views.items() if v.state in (OpState.QUEUED, OpState.RUNNING)}
        for name, v in views.items():
            topology = g.pool_owner(name)
            if topology is None or (cluster, topology) not in self.queues:
                continue
            q, loop = self.queues[(cluster, topology)]
            if q.last_view is None or q.last_view.ops.get(name) != v:
                loop.wake_on_tick()

    def _in_flight_of(self, q: QueueReconciler) -> set[str]:
        """The operations queued or running in the queue's last view (worked out once per view)."""
        view = q.last_view
        seen = self._in_flight.get(q)
        if seen is None or seen[0] is not view:
            seen = self._in_flight[q] = (view, {n for n, v in view.ops.items() if v.state in (OpState.QUEUED, OpState.RUNNING)})
        return seen[1]

    def _queue_next(self, q: QueueReconciler, loop: ScheduledLoop) -> float | None:
        """A queue's next step: the first tick at which ``decide``, on what its last round
        observed, asks for something that round did not (``reconcile.due.next_due``; that
        round's own writes are in the rows, the earlier rounds' in its observations: a
        step's rounds go on while they move something), at most ``QUIET_MAX_S`` away. A
        queue that lost, was refused or failed an effect (its next round reads), whose
        step failed, ended at ``MAX_ROUNDS`` still moving or has not observed yet steps at
        its next tick. The search starts from what the step decided last (``last_plan``,
        when it decided at this instant) and tries the queue's last answer first."""
        now = self.clock.monotonic()
        tick = q.interval()
        state, view = q.last_state, q.last_view
        if not isinstance(loop.result, int) or state is None or view is None or q.mirror.must_read or self.rounds_cut.get(id(q)):
            return now + tick
        self.probes += 1
        horizon = max(1, int(QUIET_MAX_S // tick))
        if now < q.waiters_due and _reads(q)[0]:  # its next step re-reads the cluster's ClusterBusy tasks then
            horizon = min(horizon, max(1, -int(-(q.waiters_due - now - 1e-9) // tick)))
        plan, at = q.last_plan, self.clock.now()
        done = plan.decided() if plan is not None and plan.now == at else None
        k = next_due(state, view, at, self.settings, tick, horizon, done=done, guess=self._due_guess.get(q))
        self._due_guess[q] = k
        return now + k * tick

    # ---- the poller's cadence -------------------------------------------------------------------

    def _poller_next(self, loop: ScheduledLoop) -> float | None:
        self._written = True
        counts = loop.result if isinstance(loop.result, dict) else {}
        found = counts.get("new", 0) + counts.get("aborting", 0)
        return loop.clock.monotonic() + self.poller.interval() if found or loop.last_error else None

    def _poke_poller(self) -> None:
        """Poll at the next tick of the poll interval (the loop is idle until something may have changed)."""
        if not self.poller_loop.running:
            self.poller_loop.wake_on_tick()

    # ---- the upper layer --------------------------------------------------------------------------

    def _submit(self, index: int, item: dict[str, Any]) -> None:
        spec = item["spec"]
        timeout = spec.get("timeout_seconds") if isinstance(spec, dict) else None
        tid = self.store.submit_task(
            item["actor"], spec, name=item.get("name") or "", timeout_seconds=timeout if isinstance(timeout, int) else None
        )
        self.ids.append(tid)
        self.submitted += 1
        self._written = True
        if self.submitted == len(self.plan):
            self.scheduler.at(self.clock.monotonic() + END_CHECK_S, self._end_check)
        if item.get("abort_at") is not None:
            self.scheduler.at(self.t0 + float(item["abort_at"]), self._abort, tid)
        self._poke_poller()

    def _abort(self, tid: int) -> None:
        self._written = True
        if self.store.request_abort(tid):
            self._poke_poller()

    # ---- watching the run -------------------------------------------------------------------------

    def _monitor(self) -> None:
        """Every ``MONITOR_S``: each live task's Message as the upper layer would see it, for
        the stuck judge (read only when a step, a submit or an abort could have written one
        since the last look: a look in between would see nothing new)."""
        if self._written:
            self._written = False
            at = round((self.clock.now() - START).total_seconds(), 3)  # as the event log stamps this instant
            for t in self.store.live_tasks():
                seen = self.observed.setdefault(t.id, [])
                key = (str(t.status), str(t.reason or ""), t.message or "")
                if not seen or seen[-1][1:] != key:
                    seen.append((at, *key))
        if self.progress is not None:
            self.progress(self)
        self.scheduler.at(self.clock.monotonic() + MONITOR_S, self._monitor)

    def _end_check(self) -> None:
        """The end: every task over and no Falcon pool left (looked at only after a queue
        acted or the fleet changed since the last look)."""
        if self._changed_since_check:
            self._changed_since_check = False
            if not self.falcon_pools_alive() and not self.store.live_tasks():
                self._stop()
                return
        self.scheduler.at(self.clock.monotonic() + END_CHECK_S, self._end_check)

    def falcon_pools_alive(self) -> int:
        return sum(
            1
            for c in self.fleet.clusters.values()
            for p in c.pools.pools.values()
            if p.deleted_at is None and p.name.startswith(POOL_NAME_PREFIX)
        )

    def _stop(self) -> None:
        self.done = True

    @property
    def simulated_s(self) -> float:
        return self.clock.monotonic() - self.t0

    @property
    def queue_steps(self) -> dict[str, int]:
        """The queues' steps so far (``run``), and those that carried out a decision (``applied``)."""
        return {"run": sum(loop.steps for _q, loop in self.queues.values()), "applied": self.steps_applied}

    def run(self) -> None:
        try:
            while not self.done and self.scheduler.next_at() is not None:
                self.scheduler.run_next()
        finally:
            self.close()

    def close(self) -> None:
        for g in self.gateways.values():
            g.shutdown()
        for w in self.workers:
            w.close()
        self.workers = []

    def dispose(self) -> None:
        for s in [*self.controller_stores, self.store]:
            s.dispose()
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None


POOLS, WAITERS, SHADOW, PENDING, TOPOLOGY = range(5)  # the parts of ``_visible``


def _reads(q: QueueReconciler) -> tuple[bool, bool]:
    """Whether the queue's next decisions read its cluster's other queues' rows, by part of
    ``_visible``: the reservation's ledger, waiters and occupants (a ClusterBusy or
    Recovering task, a Provisioning one that has no pool yet, a Waiting task with the slot
    free, a ready or idle pool that may be kept or handed over), and whether another
    topology has a Pending task (an idle reservation pool kept alive, a task waiting for its
    nodes). A queue that has not observed yet reads both."""
    state = q.last_state
    if state is None:
        return True, True
    pooled = {x.task_id for x in state.leases if x.task_id is not None}
    acquiring = [t for t in state.held if t.phase in lc.ACQUIRING_PHASES]
    reads_ledger = (
        any(t.phase in (lc.CLUSTER_BUSY, lc.RECOVERING) for t in state.held)
        or any(t.phase == lc.PROVISIONING and t.id not in pooled for t in acquiring)
        or (bool(state.waiting) and not acquiring)
        or any(x.state in (LeaseState.READY, LeaseState.IDLE) for x in state.leases)
    )
    reads_pending = any(t.phase == lc.WAITING_FOR_NODE for t in state.held) or any(
        x.state == LeaseState.IDLE and x.supply_mode == SupplyMode.RESERVATION for x in state.leases
    )
    return reads_ledger, reads_pending


def _visible(q: QueueReconciler) -> tuple[Any, ...] | None:
    """What the other queues' decisions read of this queue after its step, in five parts
    (None: it has not observed).

    Read by the cluster's other queues (``_reads``) and, the first two, by a move to the
    cluster: ``POOLS``, its reservation pools as the ledger and the reservation hold count
    them (which hold hosts, which are being deleted, whose task); ``WAITERS``, its
    ClusterBusy task and since when (the hold's waiters); ``SHADOW``, its reservation
    pools' tasks' Job submissions (the hold's shadow); ``PENDING``, whether it has a
    Pending task (``other_topology_waiting``). ``TOPOLOGY``, read only by a move of the
    same topology to the cluster: its ready idle pools' supply modes and how many tasks
    claim its slot.

    A step that changed none of these changed nothing another queue decides on; what it
    changed in the fleet comes back through ``_fleet_changed`` and ``_operations_moved``."""
    state = q.last_state
    if state is None:
        return None
    held = state.held
    reserving = [x for x in state.leases if x.supply_mode == SupplyMode.RESERVATION]
    tasks_on = {x.task_id for x in reserving if x.task_id is not None}
    return (
        tuple((x.name, ledger.holds_reservation(x), x.state == LeaseState.DELETING, x.task_id) for x in reserving),
        tuple((t.id, t.phase_since) for t in held if t.phase == lc.CLUSTER_BUSY),
        tuple((t.id, t.dispatched_at) for t in held if t.id in tasks_on),
        bool(state.waiting) or any(t.phase.status == lc.Status.PENDING for t in held),
        (
            tuple(sorted(x.supply_mode for x in state.leases if x.state == LeaseState.IDLE and x.ready_at is not None)),
            len(state.waiting) + sum(1 for t in held if t.phase in lc.ACQUIRING_PHASES),
        ),
    )


def _holds_busy(q: QueueReconciler) -> bool:
    state = q.last_state
    return state is not None and any(t.phase == lc.CLUSTER_BUSY for t in state.held)


def _next_operation(g: ClusterGateway, now: float) -> float | None:
    """When the operation loop can next do anything: when its first queued operation is due
    (its retry time), never before the loop's own idle wait; None with nothing queued (a
    new operation, a connect wake it)."""
    due = g.next_operation_due()
    return None if due is None else max(due, now + OP_IDLE_WAIT_S)


def _database(db_url: str | None, seed: int) -> tuple[str, sqlite3.Connection | None]:
    """The run's database: ``db_url``, else SQLite in memory (shared by the run's connections,
    kept alive by one connection held open for the run)."""
    if db_url:
        upgrade(db_url, with_jobs_table=True)
        return db_url, None
    # SQLAlchemy warns that it picks SingletonThreadPool for a mode=memory URL: one connection
    # per thread and engine is what the run wants (the shared cache makes them one database)
    warnings.filterwarnings("ignore", message="Selection of the SingletonThreadPool", category=sa.exc.SADeprecationWarning)
    name = f"falcon-simulate-{seed}-{uuid.uuid4().hex[:8]}"
    keeper = sqlite3.connect(f"file:{name}?mode=memory&cache=shared", uri=True, check_same_thread=False)
    url = f"sqlite:///file:{name}?mode=memory&cache=shared&uri=true"
    upgrade(url, with_jobs_table=True)
    return url, keeper


def is_terminal(status: str) -> bool:
    return status in {str(s) for s in TERMINAL}
