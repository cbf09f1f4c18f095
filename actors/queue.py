"""QueueActor: one per (cluster, topology); the single writer of its tasks.

Contract
--------
Hard state lives in the database: the queue's tasks (``jobs`` rows with this
cluster and topology), its node-pool leases and the last granted actor. Soft state
is rebuilt on every tick: the ClusterActor's view of pools, operations and Jobs.
The actor itself keeps only two caches, both safe to lose: parsed specs, and the
last Job-submission error per task (a lost one is rediscovered by submitting again).

Each tick -- every ``queue_tick_s``, on a hint from the poller, or on a watch event
-- observes the database and the cluster, calls ``reconcile.decide`` (pure), and
carries out the effect groups it returns. A group stops at its first failed or
lost effect; the next tick decides again. Every method is idempotent, so Ray may
restart the actor at any line: ``__init__`` is the recovery path, there is no other.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import ray

from actors import names
from actors.ticker import Ticker, TickerActor
from falcon_ray import lifecycle as lc
from falcon_ray import metrics, reconcile
from falcon_ray.config import Settings
from falcon_ray.errors import ErrorKind
from falcon_ray.lifecycle import Status
from falcon_ray.reconcile import (
    ClusterView,
    CreateLease,
    DeleteJob,
    DeletePool,
    EnsurePool,
    MoveLease,
    QueueState,
    QueueTask,
    RefreshMessages,
    SetLastGranted,
    SubmitJob,
    Transition,
    Unassign,
    UpdateTask,
)
from falcon_ray.spec import SpecError, parse_spec
from falcon_ray.store import Store, utcnow

log = logging.getLogger("falcon.queue")
IDLE_TICK_FACTOR = 5
# A refused Job does not become acceptable by retrying: a 404 is a missing namespace, a 409
# on a name Falcon cannot adopt is someone else's object.
PERMANENT_SUBMIT = (
    ErrorKind.PERMANENT.value,
    ErrorKind.QUOTA_OR_STOCKOUT.value,
    ErrorKind.ALREADY_EXISTS.value,
    ErrorKind.NOT_FOUND.value,
)


@ray.remote
class QueueActor(TickerActor):
    def __init__(self, cluster_name: str, topology: str, settings: Settings, db_url: str) -> None:
        self.s = settings
        self.cluster_name = cluster_name
        self.topology = topology
        self.label = reconcile.queue_label(cluster_name, topology)
        self.store = Store(db_url)
        self.db_url = db_url
        self.specs: dict[int, Any] = {}
        self.submit_errors: dict[int, tuple[str, str]] = {}
        self.lock = threading.Lock()
        self.cluster_handle = None
        self.last_state: QueueState | None = None
        self.last_view: ClusterView | None = None
        self.ticks = 0
        self.phase_since: dict[int, tuple[lc.Phase, float]] = {}  # for the time-in-reason histograms
        self.idle_accounted_at = time.monotonic()
        self.ticker = Ticker(f"queue {self.label}", self._tick, self._interval, log)

    # ---- remote surface ---------------------------------------------------------------

    def hint(self) -> None:
        """Something changed for this queue (a new task, an abort, a Job event)."""
        self.ticker.wake()

    # ---- loop ------------------------------------------------------------------------------

    def _interval(self) -> float:
        # an empty queue re-reads less often; a hint (new task, abort, Job event) wakes it at once
        empty = self.last_state is not None and not self.last_state.tasks and not self.last_state.leases
        return self.s.queue_tick_s * (IDLE_TICK_FACTOR if empty else 1)

    def _tick(self) -> None:
        t0 = time.monotonic()
        self.reconcile_once()
        metrics.queue_tick(self.cluster_name, self.topology, time.monotonic() - t0)
        if self.last_state is not None:
            metrics.queue_depth(self.cluster_name, self.topology, self.last_state.tasks)

    def _cluster(self):
        if self.cluster_handle is None:
            self.cluster_handle = names.ensure_cluster(self.cluster_name, self.s, self.db_url)
        return self.cluster_handle

    def _spec(self, task) -> Any:
        spec = self.specs.get(task.id)
        if spec is None:
            try:
                spec = parse_spec(task.spec)
            except SpecError:
                return None
            self.specs[task.id] = spec
        return spec

    def observe(self) -> tuple[QueueState, ClusterView] | None:
        clusters = self.store.list_clusters()
        cluster = next((c for c in clusters if c.name == self.cluster_name), None)
        if cluster is None:
            return None
        live = self.store.live_tasks(cluster.id)
        leases = tuple(l for l in self.store.leases(cluster.id) if l.topology == self.topology)
        mine: list[QueueTask] = []
        other_waiting = False
        for t in live:
            spec = self._spec(t)
            if spec is None:
                continue
            if spec.topology != self.topology:
                if t.status == Status.PENDING.value and t.reason:
                    other_waiting = True
                continue
            mine.append(
                QueueTask(
                    id=t.id,
                    name=t.name,
                    actor=t.actor,
                    phase=t.phase,
                    created_at=t.created_at,
                    dispatched_at=t.dispatched_at,
                    spec=spec,
                    node_pool_name=t.node_pool_name,
                    job_uid=t.job_uid,
                    message=t.message,
                )
            )
        live_ids = {t.id for t in mine}
        now_m = time.monotonic()
        for t in mine:
            if self.phase_since.get(t.id, (None, 0.0))[0] != t.phase:
                self.phase_since[t.id] = (t.phase, now_m)
        for tid in list(self.phase_since):
            if tid not in live_ids:
                del self.phase_since[tid]
        self._account_idle_chips(cluster, leases)
        live_anywhere = {t.id for t in live}
        for tid in list(self.specs):
            if tid not in live_anywhere:
                self.specs.pop(tid, None)
                self.submit_errors.pop(tid, None)
        # last holders of pools whose delete keeps failing (their task is terminal)
        failing = [
            l.task_id
            for l in leases
            if l.state == lc.LeaseState.DELETING.value and l.task_id is not None and l.task_id not in live_ids
            and l.delete_attempts + 1 >= self.s.pool_delete_report_after
        ]
        terminal_messages = {
            t.id: (t.phase, t.message) for t in self.store.get_tasks(failing) if t.terminal
        }
        state = QueueState(
            cluster=cluster,
            topology=self.topology,
            tasks=tuple(mine),
            leases=leases,
            last_granted=self.store.last_granted(cluster.id, self.topology),
            other_topology_waiting=other_waiting,
            alternatives_exist=any(
                c.name != cluster.name and c.tpu_type == cluster.tpu_type and c.active for c in clusters
            ),
            submit_errors=dict(self.submit_errors),
            phase_age_s={tid: now_m - since for tid, (_, since) in self.phase_since.items()},
            terminal_messages=terminal_messages,
        )
        want_reservation = bool(cluster.default_reservation) and any(
            t.phase in lc.ACQUIRING_PHASES or t.phase == lc.WAITING for t in mine
        )
        view = ray.get(
            self._cluster().observe.remote(self.label, [l.name for l in leases], want_reservation), timeout=60
        )
        return state, view

    def _account_idle_chips(self, cluster, leases) -> None:
        """Chip-seconds of this queue's pools that exist but run nothing (Ready, Idle, Deleting)."""
        from falcon_ray import tpu

        now = time.monotonic()
        elapsed, self.idle_accounted_at = now - self.idle_accounted_at, now
        try:
            chips = tpu.lookup(cluster.tpu_type, self.topology).chips
        except tpu.UnknownShape:
            return
        idle = sum(1 for l in leases if l.state in ("Ready", "Idle", "Deleting"))
        if idle:
            metrics.idle_chip_seconds(self.cluster_name, idle * chips * elapsed)

    def reconcile_once(self) -> int:
        """One tick: observe, decide, act; repeated while decisions change state (at most 8 rounds)."""
        applied = 0
        for _ in range(8):
            observed = self.observe()
            if observed is None:
                return applied
            state, view = observed
            with self.lock:
                self.last_state, self.last_view = state, view
            groups = reconcile.decide(state, view, utcnow(), self.s)
            if not groups:
                break
            progressed = self.act(groups)
            applied += progressed
            self.ticks += 1
            if not progressed:
                break
        return applied

    # ---- effects -----------------------------------------------------------------------------

    def act(self, groups: list[reconcile.EffectGroup]) -> int:
        """Carry out each group in order; returns how many groups changed a task's phase or a lease."""
        progressed = 0
        for g in groups:
            try:
                changed = False
                for e in g.effects:
                    ok, moved = self.apply(e)
                    changed = changed or moved
                    if not ok:
                        log.info("queue %s: %s stopped at %s", self.label, g.what, type(e).__name__)
                        break
                if changed:
                    progressed += 1
            except Exception as e:
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
        st = self.store
        if isinstance(e, Transition):
            won = st.transition(e.task_id, e.expect, e.to, e.message, **e.fields)
            if won:
                self._transitioned(e)
            return won, won
        if isinstance(e, UpdateTask):
            return st.update_task(e.task_id, e.expect, e.message, **e.fields) or not e.fields, False
        if isinstance(e, RefreshMessages):
            st.refresh_messages(e.updates)
            return True, False
        if isinstance(e, SetLastGranted):
            st.set_last_granted(self._cluster_id(), self.topology, e.actor)
            return True, False
        if isinstance(e, CreateLease):
            st.create_lease(self._cluster_id(), self.topology, e.name, e.supply_mode, e.task_id)
            metrics.pool_created(self.cluster_name, e.supply_mode)
            return True, True
        if isinstance(e, EnsurePool):
            ray.get(self._cluster().ensure_pool.remote(e.name, e.request), timeout=60)
            return True, False
        if isinstance(e, MoveLease):
            won = st.move_lease(e.lease_id, e.expect, e.to, **e.fields)
            if won:
                metrics.lease_moved(self.cluster_name, self.topology, e.expect[0], e.to)
            return won, won
        if isinstance(e, DeletePool):
            ray.get(self._cluster().delete_pool.remote(e.name), timeout=60)
            return True, False
        if isinstance(e, SubmitJob):
            res = ray.get(self._cluster().submit_job.remote(e.manifest, e.service), timeout=120)
            if "error_kind" in res:
                if res["error_kind"] in PERMANENT_SUBMIT:
                    self.submit_errors[e.task_id] = (res["error_kind"], res["error"])
                    return False, True  # decide again: the task fails with JobSubmitFailed
                raise RuntimeError(f"Job submit for task {e.task_id}: {res['error']}")
            self.submit_errors.pop(e.task_id, None)
            fields: dict[str, Any] = {"job_uid": res["uid"]}
            if e.first:
                fields["dispatched_at"] = utcnow()
            st.update_task(e.task_id, (lc.DISPATCHING,), None, **fields)
            return True, True
        if isinstance(e, DeleteJob):
            ray.get(self._cluster().delete_job.remote(e.namespace, e.name), timeout=60)
            return True, False
        if isinstance(e, Unassign):
            won = st.unassign(e.task_id, e.message)
            return won, won
        raise TypeError(f"unknown effect {e!r}")

    def _transitioned(self, e: Transition) -> None:
        """One log line and the metrics of a won transition."""
        task = next((t for t in (self.last_state.tasks if self.last_state else ()) if t.id == e.task_id), None)
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
        since = self.phase_since.pop(e.task_id, None)
        if since is not None and since[0].status == lc.Status.PENDING and since[0].reason:
            metrics.pending_reason_time(self.cluster_name, self.topology, str(since[0].reason), time.monotonic() - since[1])
        if e.to == lc.RUNNING and task is not None:
            metrics.time_to_running(self.cluster_name, self.topology, (utcnow() - task.created_at).total_seconds())

    def _cluster_id(self) -> str:
        assert self.last_state is not None
        return self.last_state.cluster.id

    # ---- operator surface ----------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The queue as an operator reads it: waiting in pick order, slot holder, running, pools."""
        from falcon_ray import scheduling

        with self.lock:
            state, view = self.last_state, self.last_view
        out: dict[str, Any] = {
            "queue": names.queue_name(self.cluster_name, self.topology),
            "cluster": self.cluster_name,
            "topology": self.topology,
            "last_tick_at": self.ticker.last_step_at,
            "last_error": self.ticker.last_error,
            "waiting": [],
            "acquiring": [],
            "running": [],
            "aborting": [],
            "leases": [],
            "last_granted": "",
            "db_statements": self.store.statements,
        }
        if state is None:
            return out
        now = utcnow()

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
            }

        waiting = [t for t in state.tasks if t.phase == lc.WAITING]
        for pos, t in enumerate(scheduling.pick_order(waiting, state.last_granted), start=1):
            out["waiting"].append(dict(row(t), position=pos))
        out["acquiring"] = [row(t) for t in state.tasks if t.phase in lc.ACQUIRING_PHASES]
        out["running"] = [row(t) for t in state.tasks if t.phase == lc.RUNNING]
        out["aborting"] = [row(t) for t in state.tasks if t.phase == lc.ABORTING]
        out["last_granted"] = state.last_granted
        for l in state.leases:
            pool = view.pools.get(l.name) if view else None
            out["leases"].append(
                {
                    "name": l.name,
                    "state": l.state,
                    "task_id": l.task_id,
                    "supply_mode": l.supply_mode,
                    "created_at": l.created_at.isoformat(),
                    "idle_since": l.idle_since.isoformat() if l.idle_since else None,
                    "pool_status": pool.status if pool else None,
                    "nodes_ready": pool.ready if pool else 0,
                    "delete_attempts": l.delete_attempts,
                }
            )
        return out

    def __repr__(self) -> str:
        state = self.last_state
        if state is None:
            return f"QueueActor({self.cluster_name}/{self.topology}: starting)"
        by = {"W": 0, "A": 0, "R": 0}
        holder = ""
        for t in state.tasks:
            if t.phase == lc.WAITING:
                by["W"] += 1
            elif t.phase in lc.ACQUIRING_PHASES:
                by["A"] += 1
                holder = f" slot={t.id}:{t.phase.reason}"
            elif t.phase == lc.RUNNING:
                by["R"] += 1
        pools = ",".join(f"{l.name}:{l.state}" for l in state.leases) or "-"
        return f"QueueActor({self.cluster_name}/{self.topology}: waiting={by['W']} running={by['R']}{holder} pools={pools})"
