"""The QueueActor's brain: one pure function from what is observed to what to do.

Contract
--------
``decide(queue, view, now, settings) -> list[EffectGroup]``. ``queue`` is what the
database says (the queue's live tasks, its node-pool leases, the last granted
actor); ``view`` is what the edge cluster says (node pools and their nodes, pool
operations the ClusterActor runs, Jobs, reservation use). The function reads no
clock and does no I/O. Each returned group is a short sequence of effects for one
task or one lease; the actor carries a group out in order and stops that group at
the first failure, then decides again on the next tick from fresh observations.
Every effect is idempotent (deterministic names, compare-and-set writes), so
repeating a group after a crash is harmless.

The rules, in the order they are applied (original design, sections 4-9):

1. Aborting tasks: delete the Job, hand the pool to keep-or-delete, then Aborted.
2. Finished tasks (Job Complete / Failed, or dispatched_at + timeout passed):
   keep-or-delete the pool, write the terminal status, then delete the Job. The
   terminal write comes before the Job delete because the Job is the only record
   of the outcome: a crash in between leaves a Job whose task is terminal, which
   rule 7 deletes.
3. Dispatching: submit the Job (409 adopts), Running once every pod is ready.
4. The acquisition slot: at most one task of the queue is Provisioning,
   ClusterBusy, WaitingForNode or Dispatching. It takes an idle pool of its
   topology if one appears (abandoning its own create to keep-or-delete), else
   the supply decision: reservation headroom or ClusterBusy (never a silent
   fallback), a lease row with the pool name, the create; NodePoolTimeout when
   the control plane is not RUNNING in time; WaitingForNode while nodes register
   (kept unless another topology waits on the cluster and the timeout passed);
   the create-visibility grace for flex-start pools that still read as 404.
5. The pick: when the slot is free, the pick rule chooses among Waiting tasks; an
   idle pool goes straight to Dispatching (hand-over).
6. Idle pools nobody waits for, and pools of a cluster out of service, are
   deleted; Deleting leases are followed until GKE says the pool is gone (never
   before the create-visibility grace), and a delete that keeps failing is
   reported in the last holder's Message.
7. Jobs of this queue whose task is no longer live are deleted.
8. Waiting tasks get their position and the tasks ahead, written only when the
   text changes, in one batched statement.

Keep-or-delete: a pool that a task releases is kept (Idle) while more tasks of its
topology wait for a pool than there are idle pools, otherwise deleted.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from falcon_ray import lifecycle as lc
from falcon_ray import messages, render, scheduling
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState, Phase, Reason
from falcon_ray.spec import SupplyMode, TaskSpec
from falcon_ray.store.repository import Cluster, Lease

# ---- observations -----------------------------------------------------------------


@dataclass(frozen=True)
class QueueTask:
    id: int
    name: str
    actor: str
    phase: Phase
    created_at: dt.datetime
    dispatched_at: dt.datetime | None
    spec: TaskSpec
    node_pool_name: str | None
    job_uid: str | None
    message: str


@dataclass(frozen=True)
class PoolView:
    name: str
    status: str  # GKE NodePool status: PROVISIONING, RUNNING, RECONCILING, ERROR, STOPPING, ...
    registered: int  # nodes of the pool that exist as Kubernetes Nodes
    ready: int  # ... of which Ready
    status_message: str = ""  # GKE's statusMessage (why a pool is in ERROR)


@dataclass(frozen=True)
class OpView:
    kind: str  # create | delete
    state: str  # queued | running | done | failed
    attempts: int = 0
    error_kind: str = ""  # errors.ErrorKind value of the last failure
    error: str = ""  # the API's own message


@dataclass(frozen=True)
class JobView:
    task_id: int
    name: str
    namespace: str
    uid: str
    phase: str  # Pending | Running | Succeeded | Failed | Deleted
    active: int
    ready: int
    expected: int
    message: str = ""


@dataclass(frozen=True)
class ReservationView:
    count: int
    in_use: int


@dataclass(frozen=True)
class ClusterView:
    """The ClusterActor's answer for one queue. ``synced`` is False until its first
    full list of pools and Jobs has completed (e.g. right after a restart): then an
    absent pool or Job proves nothing and nothing is concluded from absence."""

    pools: dict[str, PoolView] = field(default_factory=dict)
    ops: dict[str, OpView] = field(default_factory=dict)
    jobs: dict[int, JobView] = field(default_factory=dict)
    reservation: ReservationView | None = None
    reservation_error: tuple[str, str] | None = None  # (ErrorKind value, the API's message) of the last read
    synced: bool = True
    error: str = ""


@dataclass(frozen=True)
class QueueState:
    cluster: Cluster
    topology: str
    tasks: tuple[QueueTask, ...]
    leases: tuple[Lease, ...]
    last_granted: str
    other_topology_waiting: bool = False
    alternatives_exist: bool = False  # another active cluster of the same TPU type
    submit_errors: dict[int, tuple[str, str]] = field(default_factory=dict)  # task -> (kind, message)
    phase_age_s: dict[int, float] = field(default_factory=dict)  # task -> seconds in its current phase (>=)
    # last holders of pools whose delete keeps failing: task -> (its terminal phase, its message)
    terminal_messages: dict[int, tuple[Phase, str]] = field(default_factory=dict)

    @property
    def cluster_active(self) -> bool:
        return self.cluster.status == "active"


# ---- effects ------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    task_id: int
    expect: tuple[Phase, ...]
    to: Phase
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UpdateTask:
    task_id: int
    expect: tuple[Phase, ...]
    message: str | None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RefreshMessages:
    updates: tuple[tuple[int, Phase, str], ...]


@dataclass(frozen=True)
class SetLastGranted:
    actor: str


@dataclass(frozen=True)
class CreateLease:
    task_id: int
    name: str
    supply_mode: str


@dataclass(frozen=True)
class EnsurePool:
    name: str
    request: dict[str, Any]


@dataclass(frozen=True)
class MoveLease:
    lease_id: int
    name: str
    expect: tuple[LeaseState, ...]
    to: LeaseState
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DeletePool:
    name: str


@dataclass(frozen=True)
class SubmitJob:
    task_id: int
    manifest: dict[str, Any]
    service: dict[str, Any] | None
    first: bool  # dispatched_at is not set yet: the timeout clock starts now


@dataclass(frozen=True)
class DeleteJob:
    task_id: int
    namespace: str
    name: str


@dataclass(frozen=True)
class Unassign:
    task_id: int
    message: str


Effect = (
    Transition | UpdateTask | RefreshMessages | SetLastGranted | CreateLease | EnsurePool | MoveLease | DeletePool
    | SubmitJob | DeleteJob | Unassign
)


@dataclass(frozen=True)
class EffectGroup:
    what: str  # e.g. "task 42: finish", for logs
    effects: tuple[Effect, ...]


# ---- helpers ----------------------------------------------------------------------------

HELD = (LeaseState.REQUESTED, LeaseState.CREATING, LeaseState.READY, LeaseState.IN_USE)
POOL_UP = ("RUNNING", "RECONCILING", "RUNNING_WITH_ERROR")


def _fmt_limit(seconds: float) -> str:
    return f"{int(seconds // 60)}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


queue_label = render.queue_label


class _Decider:
    def __init__(self, q: QueueState, v: ClusterView, now: dt.datetime, s: Settings) -> None:
        self.q, self.v, self.now, self.s = q, v, now, s
        self.lang = s.lang
        self.groups: list[EffectGroup] = []
        self.lease_by_task = {l.task_id: l for l in q.leases if l.state in HELD and l.task_id is not None}
        self.idle = [l for l in q.leases if l.state == LeaseState.IDLE]
        self.claimed: set[int] = set()
        ready = {
            tid for tid, l in self.lease_by_task.items() if l.state in (LeaseState.READY, LeaseState.IN_USE)
        }
        # tasks that would take an idle pool now: Waiting ones, and acquiring ones whose own
        # pool is not ready yet (they switch to an idle pool, original section 5)
        self.demand = {
            t.id
            for t in q.tasks
            if t.phase == lc.WAITING or (t.phase in lc.ACQUIRING_PHASES and t.phase != lc.DISPATCHING and t.id not in ready)
        }
        self.kept = 0  # pools kept idle this tick

    def msg(self, key: str, **kw: object) -> str:
        return messages.text(key, self.lang, **kw)

    def add(self, what: str, *effects: Effect) -> None:
        if effects:
            self.groups.append(EffectGroup(what, tuple(effects)))

    # keep-or-delete ----------------------------------------------------------------
    def release(self, lease: Lease, holder: int | None) -> list[Effect]:
        """The deprovisioning decision for a pool its task no longer needs."""
        if lease.state not in (LeaseState.REQUESTED, LeaseState.CREATING, LeaseState.READY, LeaseState.IN_USE):
            return []
        st = LeaseState(lease.state)
        want = len(self.demand - {holder}) - (len([l for l in self.idle if l.id not in self.claimed]) + self.kept)
        if self.q.cluster_active and want > 0 and st != LeaseState.REQUESTED:
            self.kept += 1
            return [MoveLease(lease.id, lease.name, (st,), LeaseState.IDLE, {"task_id": None})]
        return [
            MoveLease(lease.id, lease.name, (st,), LeaseState.DELETING, {"task_id": holder}),
            DeletePool(lease.name),
        ]

    def job_of(self, t: QueueTask) -> JobView | None:
        j = self.v.jobs.get(t.id)
        return j if j and j.phase != "Deleted" else None

    def delete_job(self, t: QueueTask) -> list[Effect]:
        j = self.v.jobs.get(t.id)
        if j is None or j.phase == "Deleted":
            return []
        return [DeleteJob(t.id, j.namespace, j.name)]

    # rule 1 -------------------------------------------------------------------------
    def aborting(self, t: QueueTask) -> None:
        text = self.msg("aborting")
        if t.message != text:  # what an operator sees if the cleanup below has to be retried
            self.add(f"task {t.id}: aborting message", UpdateTask(t.id, (lc.ABORTING,), text))
        effects: list[Effect] = list(self.delete_job(t))
        lease = self.lease_by_task.get(t.id)
        if lease is not None:
            effects += self.release(lease, t.id)
        effects.append(Transition(t.id, (lc.ABORTING,), lc.ABORTED, self.msg("aborted")))
        self.add(f"task {t.id}: abort", *effects)

    # rule 2 -------------------------------------------------------------------------
    def finish(self, t: QueueTask, to: Phase, message: str) -> None:
        effects: list[Effect] = []
        lease = self.lease_by_task.get(t.id)
        if lease is not None:
            effects += self.release(lease, t.id)
        effects.append(Transition(t.id, (t.phase,), to, message))
        effects += self.delete_job(t)
        self.add(f"task {t.id}: finish {to}", *effects)

    def timed_out(self, t: QueueTask) -> bool:
        return t.dispatched_at is not None and self.now >= t.dispatched_at + dt.timedelta(
            seconds=t.spec.timeout_seconds
        )

    def executing(self, t: QueueTask) -> None:
        """Dispatching or Running."""
        job = self.job_of(t)
        expected = t.spec.shape.hosts
        if job is not None and job.phase == "Succeeded":
            return self.finish(t, lc.SUCCEEDED, self.msg("succeeded"))
        if job is not None and job.phase == "Failed":
            detail = job.message or f"Job {job.name} failed"
            return self.finish(t, lc.failed(Reason.JOB_FAILED), self.msg("job_failed", detail=detail))
        if self.timed_out(t):
            return self.finish(t, lc.failed(Reason.TIMEOUT), self.msg("timeout", seconds=t.spec.timeout_seconds))
        if t.phase == lc.RUNNING:
            if job is None:
                if self.v.synced and t.id not in self.v.jobs:
                    return self.finish(
                        t,
                        lc.failed(Reason.JOB_FAILED),
                        self.msg("job_failed", detail=f"Job {render.job_name(t.id)} disappeared from the cluster"),
                    )
                return None
            text = self.msg("running", active=job.ready, expected=expected)
            if text != t.message:
                self.add(f"task {t.id}: running message", UpdateTask(t.id, (lc.RUNNING,), text))
            return None
        # Dispatching
        err = self.q.submit_errors.get(t.id)
        if err is not None and job is None:
            return self.finish(t, lc.failed(Reason.JOB_SUBMIT_FAILED), self.msg("job_submit_failed", detail=err[1]))
        lease = self.lease_by_task.get(t.id)
        if job is None:
            pool = t.node_pool_name or (lease.name if lease else None)
            if pool is None:  # cannot happen through decide(); be safe: go back through acquisition
                return None
            effects: list[Effect] = []
            if lease is not None and lease.state == LeaseState.READY:
                effects.append(MoveLease(lease.id, lease.name, (LeaseState.READY,), LeaseState.IN_USE))
            q = queue_label(self.q.cluster.name, self.q.topology)
            manifest = render.job_manifest(t.id, t.spec, self.q.cluster, pool, q, self.s.installation)
            service = (
                render.headless_service(t.id, t.spec, self.q.cluster, self.s.installation)
                if t.spec.shape.multi_host
                else None
            )
            effects.append(SubmitJob(t.id, manifest, service, first=t.dispatched_at is None))
            return self.add(f"task {t.id}: submit Job", *effects)
        if lease is not None and lease.state == LeaseState.READY:
            self.add(f"task {t.id}: lease in use", MoveLease(lease.id, lease.name, (LeaseState.READY,), LeaseState.IN_USE))
        if job.ready >= expected:
            return self.add(
                f"task {t.id}: running",
                Transition(
                    t.id,
                    (lc.DISPATCHING,),
                    lc.RUNNING,
                    self.msg("running", active=job.ready, expected=expected),
                    {"job_uid": job.uid},
                ),
            )
        text = self.msg("dispatching_pods", job=job.name, active=job.ready, expected=expected)
        if text != t.message:
            self.add(f"task {t.id}: dispatch message", UpdateTask(t.id, (lc.DISPATCHING,), text, {"job_uid": job.uid}))
        return None

    # rule 4 -------------------------------------------------------------------------
    def free_idle(self) -> Lease | None:
        for l in self.idle:
            if l.id not in self.claimed:
                return l
        return None

    def claim_idle(self, t: QueueTask, idle: Lease) -> list[Effect]:
        self.claimed.add(idle.id)
        self.demand.discard(t.id)
        return [
            MoveLease(idle.id, idle.name, (LeaseState.IDLE,), LeaseState.READY, {"task_id": t.id, "idle_since": None}),
            Transition(
                t.id,
                (t.phase,),
                lc.DISPATCHING,
                self.msg("dispatching", pool=idle.name),
                {"node_pool_name": idle.name},
            ),
        ]

    def fail_acquire(self, t: QueueTask, lease: Lease | None, to: Phase, message: str) -> None:
        effects: list[Effect] = []
        if lease is not None:
            st = LeaseState(lease.state)
            effects += [
                MoveLease(lease.id, lease.name, (st,), LeaseState.DELETING, {"task_id": t.id}),
                DeletePool(lease.name),
            ]
        effects.append(Transition(t.id, (t.phase,), to, message))
        self.add(f"task {t.id}: acquisition failed", *effects)

    def acquire(self, t: QueueTask) -> None:
        lease = self.lease_by_task.get(t.id)
        cluster = self.q.cluster
        shape = t.spec.shape
        idle = self.free_idle()
        if t.phase == lc.DISPATCHING:
            return self.executing(t)
        if idle is not None and (lease is None or lease.state in (LeaseState.REQUESTED, LeaseState.CREATING)):
            effects = self.claim_idle(t, idle)
            if lease is not None:
                effects = self.release(lease, t.id) + effects
            return self.add(f"task {t.id}: switch to idle pool {idle.name}", *effects)
        mode = scheduling.supply_mode_for(t.spec, cluster.default_reservation)
        if lease is None and self.v.error:
            # the ClusterActor cannot reach GKE (credentials, IAM, endpoint): say so, and give
            # up like a create that never came back once the node-pool timeout has passed
            age = self.q.phase_age_s.get(t.id, 0.0)
            if age > self.s.node_pool_timeout_s:
                detail = f"GKE API of cluster {cluster.name} unreachable for {int(age)}s: {self.v.error}"
                limit = _fmt_limit(self.s.node_pool_timeout_s)
                return self.fail_acquire(t, None, lc.failed(Reason.NODE_POOL_TIMEOUT), self.msg("node_pool_timeout", limit=limit, detail=detail))
            text = self.msg("cluster_unreachable", cluster=cluster.name, detail=self.v.error)
            if text != t.message:
                self.add(f"task {t.id}: cluster unreachable", UpdateTask(t.id, (t.phase,), text))
            return None
        if lease is None:
            if mode == SupplyMode.RESERVATION:
                if not cluster.default_reservation:
                    return self.fail_acquire(
                        t,
                        None,
                        lc.failed(Reason.NODE_POOL_FAILED),
                        self.msg("node_pool_failed", detail=f"cluster {cluster.name} has no reservation configured"),
                    )
                r = self.v.reservation
                err = self.v.reservation_error
                if err is not None and err[0] in ("not_found", "permanent"):
                    return self.fail_acquire(
                        t,
                        None,
                        lc.failed(Reason.NODE_POOL_FAILED),
                        self.msg(
                            "node_pool_failed",
                            detail=f"cannot read reservation {cluster.default_reservation}: {err[1]}",
                        ),
                    )
                if r is None:
                    if err is not None:  # transient: keep trying, but say why nothing happens
                        text = self.msg("reservation_unreadable", reservation=cluster.default_reservation, detail=err[1])
                        if text != t.message:
                            self.add(f"task {t.id}: reservation unreadable", UpdateTask(t.id, (t.phase,), text))
                    return None  # not read yet; the ClusterActor fetches it for the next tick
                head = scheduling.reservation_headroom(r.count, r.in_use, shape.hosts)
                if not head.enough:
                    text = self.msg(
                        "cluster_busy",
                        remaining=head.remaining_slices,
                        needed=head.needed_slices,
                        reservation=cluster.default_reservation,
                    )
                    if t.phase != lc.CLUSTER_BUSY:
                        return self.add(f"task {t.id}: cluster busy", Transition(t.id, (t.phase,), lc.CLUSTER_BUSY, text))
                    if text != t.message:
                        self.add(f"task {t.id}: busy message", UpdateTask(t.id, (lc.CLUSTER_BUSY,), text))
                    return None
            name = render.node_pool_name(t.id, self.q.topology)
            request = self._pool_request(t, mode, name)
            text = self.msg("provisioning", pool=name, supply=mode.value)
            move: Effect
            if t.phase == lc.PROVISIONING:
                move = UpdateTask(t.id, (lc.PROVISIONING,), text, {"node_pool_name": name})
            else:
                move = Transition(t.id, (t.phase,), lc.PROVISIONING, text, {"node_pool_name": name})
            return self.add(f"task {t.id}: create pool {name}", CreateLease(t.id, name, mode.value), move, EnsurePool(name, request))
        st = LeaseState(lease.state)
        if st in (LeaseState.READY, LeaseState.IN_USE):
            return self.add(
                f"task {t.id}: pool ready",
                Transition(t.id, (t.phase,), lc.DISPATCHING, self.msg("dispatching", pool=lease.name), {"node_pool_name": lease.name}),
            )
        # Requested / Creating
        op = self.v.ops.get(lease.name)
        pool = self.v.pools.get(lease.name)
        age = (self.now - lease.created_at).total_seconds()
        limit = self.s.node_pool_timeout_s
        if op is not None and op.kind == "create" and op.state == "failed":
            return self.fail_acquire(t, lease, lc.failed(Reason.NODE_POOL_FAILED), self.msg("node_pool_failed", detail=op.error))
        if pool is not None and pool.status == "ERROR":
            if op is not None and op.kind == "create" and op.state in ("queued", "running"):
                return None  # the operation's own error (the API's message) arrives with its result
            detail = (op.error if op else "") or pool.status_message or f"node pool {lease.name} is in ERROR"
            return self.fail_acquire(t, lease, lc.failed(Reason.NODE_POOL_FAILED), self.msg("node_pool_failed", detail=detail))
        effects: list[Effect] = []
        if st == LeaseState.REQUESTED and ((op is not None and op.state in ("running", "done")) or pool is not None):
            effects.append(MoveLease(lease.id, lease.name, (LeaseState.REQUESTED,), LeaseState.CREATING))
            st = LeaseState.CREATING
        if pool is not None and pool.status in POOL_UP:
            if pool.registered >= shape.hosts and pool.ready >= shape.hosts:
                effects += [
                    MoveLease(lease.id, lease.name, (st,), LeaseState.READY, {"ready_at": self.now}),
                    Transition(t.id, (t.phase,), lc.DISPATCHING, self.msg("dispatching", pool=lease.name), {"node_pool_name": lease.name}),
                ]
                return self.add(f"task {t.id}: nodes ready", *effects)
            if self.q.other_topology_waiting and age > limit:
                return self.fail_acquire(
                    t,
                    lease,
                    lc.failed(Reason.NODE_POOL_TIMEOUT),
                    self.msg(
                        "node_pool_timeout",
                        limit=_fmt_limit(limit),
                        detail=f"{pool.registered}/{shape.hosts} node(s) registered and another topology is waiting",
                    ),
                )
            text = self.msg("waiting_for_node", pool=lease.name, registered=pool.registered, expected=shape.hosts, ready=pool.ready)
            if t.phase != lc.WAITING_FOR_NODE:
                effects.append(Transition(t.id, (t.phase,), lc.WAITING_FOR_NODE, text))
            elif text != t.message:
                effects.append(UpdateTask(t.id, (lc.WAITING_FOR_NODE,), text))
            return self.add(f"task {t.id}: waiting for nodes", *effects)
        # control plane not RUNNING (or not visible) yet
        if age > limit:
            detail = f"control plane {pool.status if pool else 'not visible'} after {int(age)}s"
            if op is not None and op.error:
                detail += f"; last error: {op.error}"
            return self.fail_acquire(t, lease, lc.failed(Reason.NODE_POOL_TIMEOUT), self.msg("node_pool_timeout", limit=_fmt_limit(limit), detail=detail))
        if op is None and pool is None and self.v.synced:
            # The ClusterActor does not know this create (it restarted): ask again; a 409 adopts.
            effects.append(EnsurePool(lease.name, self._pool_request(t, SupplyMode(lease.supply_mode), lease.name)))
        if pool is None and op is not None and op.state == "done" and lease.supply_mode == SupplyMode.FLEX_START:
            text = self.msg("flex_not_visible", pool=lease.name)
            if text != t.message:
                effects.append(UpdateTask(t.id, (t.phase,), text))
        elif op is not None and op.error_kind in ("incompatible_operation", "too_many_operations") and op.state != "done":
            text = self.msg("cluster_busy_ops", cluster=cluster.name, detail=op.error)
            if text != t.message:
                effects.append(UpdateTask(t.id, (t.phase,), text))
        self.add(f"task {t.id}: creating {lease.name}", *effects)
        return None

    def _pool_request(self, t: QueueTask, mode: SupplyMode, name: str) -> dict[str, Any]:
        idle_s = {
            SupplyMode.RESERVATION: self.s.reservation_idle_s,
            SupplyMode.ON_DEMAND: self.s.on_demand_idle_s,
            SupplyMode.FLEX_START: self.s.flex_start_idle_s,
        }[mode]
        policy = self.s.v7x_workload_policy.format(topology=t.spec.topology) if t.spec.tpu_type == "v7x" else None
        return render.node_pool_request(
            t.spec,
            self.q.cluster,
            mode.value,
            name,
            t.id,
            idle_seconds=idle_s,
            workload_policy=policy,
            installation=self.s.installation,
        )

    # rule 5 -------------------------------------------------------------------------
    def pick(self, waiting: Sequence[QueueTask]) -> None:
        if not self.q.cluster_active or not waiting:
            return
        nxt = scheduling.pick_next(waiting, self.q.last_granted)
        assert nxt is not None
        idle = self.free_idle()
        if idle is not None:
            self.add(f"task {nxt.id}: picked, hand-over of {idle.name}", SetLastGranted(nxt.actor), *self.claim_idle(nxt, idle))
            return
        mode = scheduling.supply_mode_for(nxt.spec, self.q.cluster.default_reservation)
        self.add(
            f"task {nxt.id}: picked",
            SetLastGranted(nxt.actor),
            Transition(nxt.id, (lc.WAITING,), lc.PROVISIONING, self.msg("picked", supply=mode.value)),
        )

    # rule 6 -------------------------------------------------------------------------
    def leases(self, live_ids: set[int]) -> None:
        for lease in self.q.leases:
            st = LeaseState(lease.state)
            if st in HELD and (lease.task_id is None or lease.task_id not in live_ids):
                # its task ended without releasing it (a crash between two writes)
                self.add(f"lease {lease.name}: orphaned by task {lease.task_id}", *self.release(lease, lease.task_id))
            elif st == LeaseState.IDLE and lease.id not in self.claimed:
                available = len([l for l in self.idle if l.id not in self.claimed])
                if not self.q.cluster_active or len(self.demand) < available:
                    self.claimed.add(lease.id)  # take it out of the pool of idle ones
                    self.add(
                        f"lease {lease.name}: idle, nobody waits",
                        MoveLease(lease.id, lease.name, (LeaseState.IDLE,), LeaseState.DELETING),
                        DeletePool(lease.name),
                    )
            elif st == LeaseState.DELETING:
                self.deleting(lease)

    def deleting(self, lease: Lease) -> None:
        op = self.v.ops.get(lease.name)
        pool = self.v.pools.get(lease.name)
        age = (self.now - lease.created_at).total_seconds()
        if pool is None and self.v.synced and (op is None or op.state in ("done",)):
            if age >= self.s.create_visibility_grace_s or lease.supply_mode != SupplyMode.FLEX_START:
                self.add(f"lease {lease.name}: deleted", MoveLease(lease.id, lease.name, (LeaseState.DELETING,), LeaseState.DELETED))
                return
        effects: list[Effect] = []
        if op is None or op.kind != "delete":
            effects.append(DeletePool(lease.name))
        elif op.attempts > lease.delete_attempts:
            effects.append(
                MoveLease(
                    lease.id,
                    lease.name,
                    (LeaseState.DELETING,),
                    LeaseState.DELETING,
                    {"delete_attempts": op.attempts, "last_error": op.error[:1000]},
                )
            )
            holder = lease.task_id
            if op.attempts >= self.s.pool_delete_report_after and holder is not None and holder in self.q.terminal_messages:
                suffix = self.msg("pool_not_deleted", pool=lease.name, detail=op.error or "retrying")
                phase, base = self.q.terminal_messages[holder]
                if suffix.strip() not in base:
                    effects.append(UpdateTask(holder, (phase,), base + suffix))
        self.add(f"lease {lease.name}: deleting", *effects)

    # rule 8 -------------------------------------------------------------------------
    def positions(self, waiting: Sequence[QueueTask], holders: Sequence[QueueTask]) -> None:
        order = scheduling.pick_order(waiting, self.q.last_granted)
        ahead: list[QueueTask] = list(holders)
        updates = []
        for t in order:
            if ahead:
                names = ", ".join(f"{a.actor}: {a.name or a.id}" for a in ahead[:5])
                if len(ahead) > 5:
                    names += f", ... {len(ahead) - 5} more"
                text = self.msg("waiting", position=len(ahead) + 1, ahead=len(ahead), tasks=names)
            else:
                text = self.msg("waiting_first", cluster=self.q.cluster.name, topology=self.q.topology)
            if text != t.message:
                updates.append((t.id, lc.WAITING, text))
            ahead.append(t)
        if updates:
            self.add("waiting messages", RefreshMessages(tuple(updates)))


def decide(q: QueueState, view: ClusterView, now: dt.datetime, settings: Settings) -> list[EffectGroup]:
    d = _Decider(q, view, now, settings)
    live_ids = {t.id for t in q.tasks}
    waiting = [t for t in q.tasks if t.phase == lc.WAITING]
    acquiring = [t for t in q.tasks if t.phase in lc.ACQUIRING_PHASES]

    for t in q.tasks:
        if t.phase == lc.ABORTING:
            d.aborting(t)
    for t in q.tasks:
        if t.phase == lc.RUNNING:
            d.executing(t)
    if not q.cluster_active and waiting and q.alternatives_exist:
        for t in waiting:
            d.add(
                f"task {t.id}: re-rank",
                Unassign(t.id, d.msg("requeued", cluster=q.cluster.name, status=q.cluster.status)),
            )
        waiting = []
    for t in acquiring:
        d.acquire(t)
    if not acquiring:
        d.pick(waiting)
        picked = {e.task_id for g in d.groups for e in g.effects if isinstance(e, Transition) and e.expect == (lc.WAITING,)}
        holders = [t for t in waiting if t.id in picked]
        waiting = [t for t in waiting if t.id not in picked]
    else:
        holders = acquiring
    d.leases(live_ids)
    for task_id, job in view.jobs.items():
        if task_id not in live_ids and job.phase != "Deleted":
            d.add(f"job {job.name}: task no longer live", DeleteJob(task_id, job.namespace, job.name))
    d.positions(waiting, holders)
    return d.groups
