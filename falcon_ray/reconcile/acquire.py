"""Rule 4: the task that holds the queue's acquisition slot, decided by its lease's state.

Contract
--------
At most one task of a queue is Provisioning, ClusterBusy, WaitingForNode or
Dispatching, besides the flex-start tasks whose capacity wait has parked
(``Decision.parked``, ``capacity_waits_per_queue``) and the ready pools handed over past the
slot (``pick.hand_over_ready``). ``acquire(d, t)`` moves each one step:

- an idle pool of its topology appears: it switches to it (abandoning its own create
  to keep-or-delete); in WaitingForNode short of Ready nodes, it switches to an idle pool
  whose every node is Ready (its own pool and Job deleted) -- ``switch_to_idle``;
- no lease yet (or just picked: ``create_at_pick``, in the pick's group when the create
  needs no other step first): the cluster must be reachable; an idle pool whose create an aborted
  task started is waited for (it is handed over once ready) rather than a second pool
  made, unless the task passes it over for its own reservation's room (``Decision.passes_over``); before all that, a task that GKE refused for capacity waits out its backoff
  (``capacity.backing_off``); otherwise the supply decision is made (reservation
  headroom, or ClusterBusy; never a silent fallback; a reservation of another machine
  type, or another cluster that can start a ClusterBusy task now: ``move``), then the
  lease row with the pool's name (of the next attempt after refusals) is written before
  the create is asked for -- ``no_pool_yet``;
- Requested / Creating: a create refused for capacity, or a pool in ERROR for it, is a
  wait (ClusterBusy, ``capacity.refused``); any other refused create or pool in ERROR
  fails it (NodePoolFailed); the control plane RUNNING with every node Ready makes it
  Dispatching, its Job submitted in the same group when nothing stands in the way
  (``pool_came_up``); nodes still registering keep it WaitingForNode (a pool holding part
  of its nodes while another topology waits is given back: ``capacity.contested``); a
  control plane not RUNNING within ``node_pool_timeout_s`` of GKE's acceptance is GKE's
  slowness: the pool is given back and the task goes to the head of its queue, and only
  past ``pool_release_limit`` does it fail (NodePoolTimeout, ``capacity.create_too_slow``)
  -- ``creating``;
- Ready / InUse: Dispatching -- ``pool_ready``; a flex-start pool waiting for its nodes
  that fails for capacity is a wait as above (WaitingForNode -> ClusterBusy);
- Dispatching: ``finish.execute``.

Every timer here is measured from a durable record: the lease's ``created_at`` for a
create, the refused lease rows for a capacity wait, and for a cluster or reservation that
cannot be read the task's event log (``phase_since``), from the outage's first failed
answer when that is later (``Decision.failing_s``; the ClusterActor's memory: a restarted one
counts the outage from its own first failure).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from falcon_ray import lifecycle as lc
from falcon_ray import limits, render, scheduling
from falcon_ray.lifecycle import LeaseState, Phase, Reason
from falcon_ray.limits import Wait
from falcon_ray.model import (
    CAPACITY_KINDS,
    OP_IN_FLIGHT,
    SWITCHED,
    Lease,
    OpKind,
    OpState,
    OpView,
    PoolStatus,
    PoolView,
    QueueTask,
)
from falcon_ray.reconcile import capacity, dispatch, finish, hold, move
from falcon_ray.reconcile.context import Decision, fmt_limit, stamp
from falcon_ray.reconcile.effects import (
    ClaimReservation,
    CreateLease,
    Effect,
    EnsurePool,
    MoveLease,
    RecordDisruption,
    RecordOperation,
    Transition,
    UpdateTask,
)
from falcon_ray.spec import SupplyMode


def acquire(d: Decision, t: QueueTask) -> None:
    if t.phase == lc.DISPATCHING:
        finish.execute(d, t)
        return
    lease = d.lease_by_task.get(t.id)
    if capacity.release_unfinished(d, t, lease) or switch_to_idle(d, t, lease):
        return
    if lease is None:
        no_pool_yet(d, t)
    elif t.phase == lc.WAITING_FOR_NODE and lease.state == LeaseState.IN_USE:
        if not pool_lost_capacity(d, t, lease) and not capacity.contested(d, t, lease, d.cluster.pools.get(lease.name)):
            dispatch.waiting_for_pods(d, t, lease)  # its Job is on a pool that scales from zero
    elif lease.state in (LeaseState.READY, LeaseState.IN_USE):
        pool_ready(d, t, lease)
    else:
        creating(d, t, lease)


def fail(d: Decision, t: QueueTask, lease: Lease | None, to: Phase, message: str) -> None:
    effects: list[Effect] = d.delete_lease(lease, t.id) if lease is not None else []
    d.add(f"task {t.id}: acquisition failed", *effects, Transition(t.id, (t.phase,), to, message))


def to_dispatching(d: Decision, t: QueueTask, pool: str) -> Transition:
    return Transition(t.id, (t.phase,), lc.DISPATCHING, d.msg("dispatching", pool=pool), {"node_pool_name": pool})


def dispatch_with_job(d: Decision, t: QueueTask, pool: str) -> list[Effect]:
    """The Dispatching move and the Job's submit, in that order in one group: the move
    writes the Message of the accepted Job (and, the first time, ``dispatched_at``), so an
    accepted submit writes nothing more (``SubmitJob.recorded``)."""
    submit = dispatch.submit_effect(d, t, pool)
    fields: dict[str, Any] = {"node_pool_name": pool}
    if submit.first:
        fields["dispatched_at"] = d.now
    text = submit.message or d.msg("dispatching", pool=pool)
    return [Transition(t.id, (t.phase,), lc.DISPATCHING, text, fields), dataclasses.replace(submit, recorded=True)]


def claim_idle(d: Decision, t: QueueTask, idle: Lease, leaving: str = "") -> list[Effect]:
    """Take an idle pool for ``t``: the hand-over (original, section 5). When nothing stands
    between the task and its Job (no Job of it in the cluster, no refused submit to wait
    out), the Job is submitted in the same group (Idle -> InUse), as the next round's
    ``dispatch.dispatching`` would; otherwise the pool is Ready and that round decides.
    ``leaving``: the pool of its own the task leaves for this one (its Job, if any, goes
    with it): the next round submits the next attempt's Job, whose timeout clock starts
    afresh, and the move's Message says so."""
    d.claimed.add(idle.id)
    d.demand.discard(t.id)
    fields = {"task_id": t.id, "idle_since": None}
    if not leaving and d.job_of(t) is None and t.id not in d.queue.submit_errors:
        return [
            MoveLease(idle.id, idle.name, (LeaseState.IDLE,), LeaseState.IN_USE, fields),
            *dispatch_with_job(d, t, idle.name),
        ]
    move = to_dispatching(d, t, idle.name)
    if leaving:
        text = d.msg("switched_to_idle", pool=idle.name, own=leaving)
        move = Transition(t.id, (t.phase,), lc.DISPATCHING, text, {**capacity.OFF_POOL, "node_pool_name": idle.name})
    return [MoveLease(idle.id, idle.name, (LeaseState.IDLE,), LeaseState.READY, fields), move]


def switch_to_idle(d: Decision, t: QueueTask, lease: Lease | None) -> bool:
    """An idle pool of the topology comes free while ``t`` waits for GKE: take it.

    - its own create has not finished (no lease, Requested, Creating): any idle pool (the
      one with the most Ready nodes), its own create going to keep-or-delete;
    - its pool is up and short of Ready nodes (WaitingForNode; a pool that scales from zero
      has its Job already): only an idle pool whose every node is Ready, a hand-over that
      needs nothing from GKE. Its own pool and Job are deleted (the pool held the nodes
      that came, if any, and another idle pool is not wanted for a task that has one), and
      a ``switched`` row gives the Job on the new pool a name the old Job never had; the
      next round submits it once the old one is gone (``earlier_attempt_left``)."""
    if lease is None or lease.state in (LeaseState.REQUESTED, LeaseState.CREATING):
        idle = d.free_idle(t)
        if idle is None:
            return False
        effects = claim_idle(d, t, idle)
        if lease is not None:
            effects = d.release(lease, t.id) + effects
        d.add(f"task {t.id}: switch to idle pool {idle.name}", *effects)
        return True
    if not d.waits_for_gke(t):
        return False
    idle = d.free_idle(t, ready=True)
    if idle is None:
        return False
    record: list[Effect] = []
    if lease.state == LeaseState.IN_USE or d.job_of(t) is not None:  # a Job may be on it, or be about to
        record.append(RecordDisruption(t.id, t.attempt, SWITCHED, "", render.job_name(t.id, t.attempt), lease.name))
    leave = [*record, *d.delete_job(t), *d.delete_lease(lease, t.id)]
    d.add(f"task {t.id}: switch to ready idle pool {idle.name}", *leave, *claim_idle(d, t, idle, leaving=lease.name))
    return True


def pool_lost_capacity(d: Decision, t: QueueTask, lease: Lease) -> bool:
    """A pool waiting for its nodes that GKE put in ERROR for capacity: a capacity wait."""
    pool = d.cluster.pools.get(lease.name)
    if pool is None or pool.status != PoolStatus.ERROR or pool.error_kind not in CAPACITY_KINDS:
        return False
    capacity.refused(d, t, lease, pool.status_message or f"node pool {lease.name} is in ERROR")
    return True


def pool_ready(d: Decision, t: QueueTask, lease: Lease) -> None:
    d.add(f"task {t.id}: pool ready", to_dispatching(d, t, lease.name))


# ---- no lease yet: reachability, supply, create ----------------------------------------------


def no_pool_yet(d: Decision, t: QueueTask) -> None:
    if capacity.wait_of(d, t) is not None and move.move(d, t):  # refused here, startable elsewhere now
        return
    if capacity.backing_off(d, t):  # first: a backoff needs nothing from GKE
        return
    if d.cluster.error:
        unreachable(d, t)
        return
    pending = d.finishing_idle()
    if pending is not None and d.passes_over(t, pending):
        pending = None  # another supply's pool waits for that supply's capacity once created; t has room of its own now
    if pending is not None:  # a pool an aborted task started: wait for its create, not a second pool
        d.claimed.add(pending.id)
        d.say(t, d.msg("waiting_for_abandoned_pool", pool=pending.name), "waiting for an abandoned pool")
        return
    mode = scheduling.supply_mode_for(t.spec, d.queue.cluster.default_reservation)
    if mode == SupplyMode.RESERVATION and not reservation_allows(d, t):
        return
    create_pool(d, t, mode)


def unreachable(d: Decision, t: QueueTask) -> None:
    """The ClusterActor cannot reach GKE (credentials, IAM, endpoint): say so, and give up
    like a create that never came back once the node-pool timeout has passed. While the
    ClusterActor is still building its clients with no failed attempt (``connecting``: its
    own start) it only says so: the controller's slowness is not the task's failure."""
    cluster, age = d.queue.cluster.name, d.failing_s(t, d.cluster.error_since)
    # the ClusterActor still starting is the controller's own time, never the task's failure
    if not d.cluster.connecting and gave_up_creating(d, t, f"GKE API of cluster {cluster} unreachable for {int(age)}s: {d.cluster.error}", age):
        return
    d.say(t, d.msg("cluster_unreachable", cluster=cluster, detail=d.cluster.error) + d.waited(t), "cluster unreachable")


def reservation_allows(d: Decision, t: QueueTask) -> bool:
    """Reservation supply: True when a slice fits now; otherwise fail, wait or say why."""
    name = d.queue.cluster.default_reservation
    failed = lc.failed(Reason.NODE_POOL_FAILED)
    if not name:
        fail(d, t, None, failed, d.msg("node_pool_failed", detail=f"cluster {d.queue.cluster.name} has no reservation configured"))
        return False
    r, err = d.cluster.reservation, d.cluster.reservation_error
    if err is not None and err.final:
        fail(d, t, None, failed, d.msg("node_pool_failed", detail=f"cannot read reservation {name}: {err.message}"))
        return False
    if r is None:  # not read yet (the ClusterActor fetches it for the next tick), or failing for now
        if err is not None and gave_up_creating(d, t, f"reservation {name} unreadable: {err.message}", d.failing_s(t, err.since)):
            return False
        if err is not None:
            text = d.msg("reservation_unreadable", reservation=name, detail=err.message) + d.waited(t)
            d.say(t, text, "reservation unreadable")
        return False
    if move.unfit(d, t):  # it holds another machine type: placed elsewhere, or failed
        return False
    head = scheduling.reservation_headroom(r.count, r.in_use, t.spec.shape.hosts, claimed=r.claimed)
    held = d.held_back(t, create=True)  # room an older task of another topology waits for (hold)
    beyond = head if held is None else scheduling.reservation_headroom(r.count, r.in_use, t.spec.shape.hosts, claimed=r.claimed + held.hosts)
    if beyond.enough:
        return True
    if move.move(d, t):  # another cluster can start it now with the same supply
        return False
    text = d.msg("cluster_busy", remaining=head.remaining_slices, needed=head.needed_slices, reservation=name)
    if held is not None:
        w = held.waiter
        text += d.msg("reservation_held", hosts=held.hosts, reservation=name, task=w.task_id, topology=w.topology, since=stamp(w.since or d.now))
    elif (promised := hold.promise(d.queue, r, d.now, d.settings, t)) is not None:
        text += d.msg("reservation_holding", hosts=promised[0].hosts, by=stamp(promised[1]))
    # the limit is for a reservation without room; a task the hold keeps out of free room never fails of it
    if held is None and t.phase == lc.CLUSTER_BUSY and limits.passed(Wait.RESERVATION, d.settings, d.phase_age_s(t)):
        limit = fmt_limit(limits.seconds(Wait.RESERVATION, d.settings) or 0)
        fail(d, t, None, failed, d.msg("node_pool_failed", detail=d.msg("reservation_wait_over", limit=limit) + text))
        return False
    if t.phase == lc.CLUSTER_BUSY:
        text += d.waited(t)
    if t.phase != lc.CLUSTER_BUSY:
        d.add(f"task {t.id}: cluster busy", Transition(t.id, (t.phase,), lc.CLUSTER_BUSY, text))
    else:
        d.say(t, text, "busy message")
    return False


def gave_up_creating(d: Decision, t: QueueTask, detail: str, blocked: float) -> bool:
    """No lease yet and the cluster or its reservation cannot be read: once the task has
    waited on that for the create's limit (``Decision.failing_s``: a ClusterBusy task that waited
    hours for reservation room before one read failed has waited seconds on the failure), it
    fails NodePoolTimeout."""
    if not limits.passed(Wait.CREATE, d.settings, blocked):
        return False
    text = d.msg("node_pool_timeout", limit=fmt_limit(limits.seconds(Wait.CREATE, d.settings) or 0), detail=detail)
    fail(d, t, None, lc.failed(Reason.NODE_POOL_TIMEOUT), text)
    return True


def pool_zone(d: Decision, mode: SupplyMode) -> str | None:
    """A TPU slice lives in one zone: the reservation's for reservation supply, else the
    operator's choice for the cluster, its own zone, or its first node zone."""
    c = d.queue.cluster
    if mode == SupplyMode.RESERVATION:
        return d.cluster.reservation_zone or render.reservation_parts(c.default_reservation)[0] or render.cluster_zone(c)
    return c.zone or render.cluster_zone(c) or next(iter(d.cluster.zones), None)


def pool_request(d: Decision, t: QueueTask, mode: SupplyMode, name: str) -> dict[str, Any]:
    return render.node_pool_request(
        t.spec,
        d.queue.cluster,
        mode,
        name,
        t.id,
        idle_seconds=d.settings.idle_seconds(mode),
        workload_policy=d.settings.workload_policy(t.spec.topology) if t.spec.tpu_type == "v7x" else None,
        installation=d.settings.installation,
        zone=pool_zone(d, mode),
        oauth_scopes=d.settings.node_oauth_scopes,
        service_account=d.settings.node_service_account,
        node_zones=d.cluster.zones,
    )


def provisioning_text(d: Decision, t: QueueTask, pool: str, mode: SupplyMode) -> str:
    return capacity.retry_text(d, t, pool, mode.value) or d.msg("provisioning", pool=pool, supply=mode.value)


def fresh_pool_name(d: Decision, t: QueueTask) -> str:
    """The pool name of the task's next create: by its capacity refusals so far, and never
    the name of a lease row that exists already. A row of that name in Deleting or Deleted
    (a move whose commit landed but whose answer was lost, the task's own move never made)
    would otherwise be adopted as this create's lease, and the queue would create and
    delete the same pool round after round (found by the database-outage soak)."""
    attempt = capacity.attempt(d, t)
    name = render.node_pool_name(t.id, d.queue.topology, attempt)
    while name in d.queue.pool_names:
        attempt += 1
        name = render.node_pool_name(t.id, d.queue.topology, attempt)
    return name


def create_at_pick(d: Decision, t: QueueTask, mode: SupplyMode, *first: Effect) -> bool:
    """The pick of a task whose next step is a plain create (no reservation to check, no
    capacity refusal to wait out, the cluster reachable, no abandoned create to wait for):
    its Waiting -> Provisioning move names the pool, in the pick's group (``first``), as
    the next round's ``no_pool_yet`` would. False (nothing added) otherwise."""
    if mode == SupplyMode.RESERVATION or capacity.wait_of(d, t) is not None or d.cluster.error or d.finishing_idle() is not None:
        return False
    create_pool(d, t, mode, *first)
    return True


def create_pool(d: Decision, t: QueueTask, mode: SupplyMode, *first: Effect) -> None:
    name = fresh_pool_name(d, t)
    text = provisioning_text(d, t, name, mode)
    move: Effect
    if t.phase == lc.PROVISIONING:
        move = UpdateTask(t.id, (lc.PROVISIONING,), text, {"node_pool_name": name})
    else:
        move = Transition(t.id, (t.phase,), lc.PROVISIONING, text, {"node_pool_name": name})
    # reservation capacity is taken only through the ledger: a refused claim stops the group
    claim: list[Effect] = [ClaimReservation(name, t.spec.shape.hosts)] if mode == SupplyMode.RESERVATION else []
    create = EnsurePool(name, pool_request(d, t, mode, name))
    d.add(f"task {t.id}: create pool {name}", *first, *claim, CreateLease(t.id, name, mode), move, create)


# ---- Requested / Creating ---------------------------------------------------------------------


def create_failed(d: Decision, t: QueueTask, lease: Lease, op: OpView | None, pool: PoolView | None) -> bool:
    """GKE refused the create, or the pool is in ERROR: for capacity a wait, else
    NodePoolFailed with GKE's own words."""
    failed_op = op is not None and op.kind == OpKind.CREATE and op.state == OpState.FAILED
    if failed_op and op.no_capacity:
        capacity.refused(d, t, lease, op.error)
        return True
    if failed_op:
        fail(d, t, lease, lc.failed(Reason.NODE_POOL_FAILED), d.msg("node_pool_failed", detail=op.error))
        return True
    if pool is None or pool.status != PoolStatus.ERROR:
        return False
    if op is not None and op.kind == OpKind.CREATE and op.state in (OpState.QUEUED, OpState.RUNNING):
        return True  # the operation's own error (the API's message) arrives with its result
    # GKE's reason for the ERROR first: the operation's last error may be a retried call's
    detail = pool.status_message or (op.error if op else "") or f"node pool {lease.name} is in ERROR"
    if pool.error_kind in CAPACITY_KINDS or (op is not None and op.error_kind in CAPACITY_KINDS):
        capacity.refused(d, t, lease, detail)
    else:
        fail(d, t, lease, lc.failed(Reason.NODE_POOL_FAILED), d.msg("node_pool_failed", detail=detail))
    return True


def confirm_create(d: Decision, lease: Lease, op: OpView | None, pool: PoolView | None) -> tuple[LeaseState, list[Effect]]:
    """Requested -> Creating once GKE accepted the create, with when (``accepted_at``: the
    create's timeout counts from it) and the operation's name, in the move's one write."""
    effects: list[Effect] = []
    st = lease.state
    accepted = op is not None and op.accepted  # the pool is not the create's until GKE answered
    record = op is not None and bool(op.operation) and op.operation != lease.operation
    if st == LeaseState.REQUESTED and (accepted or pool is not None):
        fields: dict[str, Any] = {"accepted_at": d.now}
        if record and op is not None:
            fields["operation"] = op.operation
        effects.append(MoveLease(lease.id, lease.name, (LeaseState.REQUESTED,), LeaseState.CREATING, fields))
        return LeaseState.CREATING, effects
    if record and op is not None:
        effects.append(RecordOperation(lease.id, op.operation))
    return st, effects


def create_started(d: Decision, lease: Lease, st: LeaseState) -> dt.datetime:
    """Where the create's timeout (``Wait.CREATE``) counts from: GKE's acceptance, recorded
    on the lease (now, when it is being recorded in this group); a row written before the
    column existed, or a create the cluster cannot be asked about, from the row itself."""
    if st == LeaseState.CREATING and lease.state == LeaseState.REQUESTED:
        return d.now
    return lease.accepted_at or lease.created_at


def creating(d: Decision, t: QueueTask, lease: Lease) -> None:
    op, pool = d.cluster.ops.get(lease.name), d.cluster.pools.get(lease.name)
    if create_failed(d, t, lease, op, pool):
        return
    st, effects = confirm_create(d, lease, op, pool)
    if pool is not None and pool.status.up:
        nodes_coming(d, t, lease, st, pool, effects)
        return
    if st == LeaseState.REQUESTED and (not d.cluster.error or d.cluster.connecting):  # not accepted yet: it waits its turn
        create_queued(d, t, lease, op, effects)
        return
    age = (d.now - create_started(d, lease, st)).total_seconds()
    if limits.passed(Wait.CREATE, d.settings, age):
        limit = limits.seconds(Wait.CREATE, d.settings) or 0.0
        detail = f"control plane {pool.status if pool else 'not visible'} {int(age)}s after GKE accepted the create"
        if op is not None and op.error:
            detail += f"; last error: {op.error}"
        if st != LeaseState.REQUESTED:  # GKE has it and is slow: not the task's failure
            capacity.create_too_slow(d, t, lease, detail)
            return
        detail = f"GKE API of cluster {d.queue.cluster.name} unreachable for {int(age)}s: {d.cluster.error}"
        fail(d, t, lease, lc.failed(Reason.NODE_POOL_TIMEOUT), d.msg("node_pool_timeout", limit=fmt_limit(limit), detail=detail))
        return
    d.add(f"task {t.id}: creating {lease.name}", *effects, *control_plane_pending(d, t, lease, op, pool))


def create_queued(d: Decision, t: QueueTask, lease: Lease, op: OpView | None, effects: list[Effect]) -> None:
    """The create is not accepted yet: it waits in the ClusterActor's FIFO behind the
    cluster's other node-pool operations (``pool_ops_at_once`` run at a time), or GKE
    refused it because one runs. Not the task's time: ``Wait.CREATE`` starts at GKE's
    acceptance. Its own limit (``Wait.CREATE_QUEUED``, from the lease row) ends it
    NodePoolFailed with a Message that puts it on the cluster's load."""
    cluster, since = d.queue.cluster.name, lease.created_at.strftime("%H:%M:%S")
    waited = (d.now - lease.created_at).total_seconds()
    if limits.passed(Wait.CREATE_QUEUED, d.settings, waited):
        limit = fmt_limit(limits.seconds(Wait.CREATE_QUEUED, d.settings) or 0)
        detail = d.msg("create_queue_over", pool=lease.name, cluster=cluster, limit=limit, since=since)
        fail(d, t, lease, lc.failed(Reason.NODE_POOL_FAILED), d.msg("node_pool_failed", detail=detail))
        return
    if op is not None and op.busy:
        text = d.msg("create_refused_busy", pool=lease.name, cluster=cluster, detail=op.error, since=since)
    else:
        # the view holds this queue's own operations only: the other queues' are not counted
        own = sum(1 for n, o in d.cluster.ops.items() if n != lease.name and o.state in OP_IN_FLIGHT)
        ahead = d.msg("create_queued_own", count=own) if own else ""
        text = d.msg("create_queued", pool=lease.name, cluster=cluster, ahead=ahead, since=since)
    retry = capacity.retry_text(d, t, lease.name, lease.supply_mode.value)
    if retry is not None:  # asked again after capacity refusals: say that too
        text = f"{retry}; {text}"
    effects += ensure_again(d, t, lease, op, d.cluster.pools.get(lease.name))
    d.add(f"task {t.id}: create of {lease.name} queued", *effects, *d.say_effect(t, text))


def nodes_coming(d: Decision, t: QueueTask, lease: Lease, st: LeaseState, pool: PoolView, effects: list[Effect]) -> None:
    """The control plane is RUNNING: Dispatching once every node is Ready, else WaitingForNode."""
    hosts = t.spec.shape.hosts
    if pool.registered >= hosts and pool.ready >= hosts:
        d.add(f"task {t.id}: nodes ready", *effects, *pool_came_up(d, t, lease, st))
        return
    if render.scales_from_zero(lease.supply_mode):
        dispatch.start_on_empty_pool(d, t, lease, st, pool, effects)
        return
    if capacity.contested(d, t, lease, pool):
        return
    if t.phase == lc.WAITING_FOR_NODE and st == lease.state and capacity.nodes_not_delivered(d, t, lease, pool):
        return
    text = d.msg("waiting_for_node", pool=lease.name, registered=pool.registered, expected=hosts, ready=pool.ready)
    if t.phase == lc.WAITING_FOR_NODE:
        text += d.waited(t)
    if t.phase != lc.WAITING_FOR_NODE:
        effects.append(Transition(t.id, (t.phase,), lc.WAITING_FOR_NODE, text))
    else:
        effects += d.say_effect(t, text)
    d.add(f"task {t.id}: waiting for nodes", *effects)


def pool_came_up(d: Decision, t: QueueTask, lease: Lease, st: LeaseState) -> list[Effect]:
    """Every node Ready: Dispatching. When nothing stands between the task and its Job (no
    Job of it in the cluster, no refused submit to wait out) the Job is submitted in the
    same group (Creating -> InUse), as the next round's ``dispatch.dispatching`` would;
    otherwise the pool is Ready and that round decides."""
    ready = {"ready_at": d.now}
    if d.job_of(t) is None and t.id not in d.queue.submit_errors:
        return [
            MoveLease(lease.id, lease.name, (st,), LeaseState.IN_USE, ready),
            *dispatch_with_job(d, t, lease.name),
        ]
    return [MoveLease(lease.id, lease.name, (st,), LeaseState.READY, ready), to_dispatching(d, t, lease.name)]


def ensure_again(d: Decision, t: QueueTask, lease: Lease, op: OpView | None, pool: PoolView | None) -> list[Effect]:
    """The ClusterActor does not know this create (it restarted) and GKE shows no pool: ask
    again, following the operation GKE accepted before if the lease recorded one; a 409 adopts."""
    if op is not None or pool is not None or not d.cluster.synced:
        return []
    return [EnsurePool(lease.name, pool_request(d, t, lease.supply_mode, lease.name), operation=lease.operation)]


def control_plane_pending(d: Decision, t: QueueTask, lease: Lease, op: OpView | None, pool: PoolView | None) -> list[Effect]:
    """Not RUNNING (or not visible) yet: ask again if the ClusterActor forgot, say why it waits."""
    effects = ensure_again(d, t, lease, op, pool)
    if pool is None and op is not None and op.state == OpState.DONE and lease.supply_mode == SupplyMode.FLEX_START:
        effects += d.say_effect(t, d.msg("flex_not_visible", pool=lease.name) + d.waited(t))
    elif op is not None and op.busy:
        effects += d.say_effect(t, d.msg("cluster_busy_ops", cluster=d.queue.cluster.name, detail=op.error) + d.waited(t))
    elif t.phase == lc.PROVISIONING:
        text = capacity.retry_text(d, t, lease.name, lease.supply_mode.value)
        effects += d.say_effect(t, text or d.msg("provisioning", pool=lease.name, supply=lease.supply_mode.value) + d.waited(t))
    return effects
