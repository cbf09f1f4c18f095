"""Rules 6 and 7: pools and Jobs nobody needs any more.

Contract
--------
``leases(d)``: a held lease whose task is no longer live (a crash between two writes)
goes through keep-or-delete; an idle pool whose create its task abandoned is followed
until the create finishes (then it may be handed over) or fails or times out (then it
is deleted); an idle pool is deleted when fewer tasks would take one than there are
idle pools and its keep-alive window has passed (``kept_alive``), when the cluster left
service, or, for a reservation pool, when the reservation hold keeps the task next in line
for it out of the held room (``hold``; ``Decision.reservation_pool_wanted``); a Deleting lease is
followed until GKE says the pool is gone (never before the create-visibility grace
for flex-start pools, which may read as 404 for a while after their create), and a
delete that keeps failing is counted on the lease and, past
``pool_delete_report_after`` attempts, reported in its last holder's Message.
``kept_alive(settings, lease, now, ...)``: the keep-alive rule, a function of its arguments
alone: a pool that was Ready once and that nobody waits for stays Idle until its window
(``keep_window``: its supply mode's ``Settings.keep_idle_s``, or, with
``keep_idle_reacquire_factor``, that many times what the pool took to get, capped),
counted from the lease's ``idle_since`` (``now`` for a pool going Idle in this call), has
passed; never on a cluster out of service, and never while a task of another topology of
the cluster waits for a reservation pool (its hosts count against the reservation that
task may need) or for a pool kept by the factor (its chips count against the capacity
that task needs).
``nodes_last_for(lease, pool, now, run_s)``: a flex-start pool is handed only to a task
whose whole run fits in what is left of its oldest node's ``maxRunDuration`` (seven
days), as GKE deletes the VMs then; a task it does not fit creates its own pool.
``stale_jobs(d)``: a Job of this queue whose task is no longer live is deleted (once: a
Job whose delete is under way is left to finish).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from falcon_ray import render, tpu
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LEASE_HELD, LeaseState
from falcon_ray.model import OP_IN_FLIGHT, JobPhase, Lease, OpKind, OpState, PoolStatus, PoolView
from falcon_ray.reconcile.effects import (
    DeleteJob,
    DeletePool,
    Effect,
    MarkReady,
    MoveLease,
    RecordOperation,
    UpdateTask,
)
from falcon_ray.spec import SupplyMode

if TYPE_CHECKING:  # context.py asks kept_alive when a pool goes Idle
    from falcon_ray.reconcile.context import Decision

HANDOVER_START_S = 600.0  # nodes_last_for: a handed-over task's Job starts within this

def leases(d: Decision) -> None:
    for lease in d.queue.leases:
        if lease.state in LEASE_HELD and (lease.task_id is None or not d.is_live(lease.task_id)):
            d.add(f"lease {lease.name}: orphaned by task {lease.task_id}", *d.release(lease, lease.task_id))
        elif lease.state == LeaseState.IDLE:
            if lease.ready_at is None and idle_create_ended(d, lease):
                continue
            if lease.id not in d.claimed:
                idle_unwanted(d, lease)
        elif lease.state == LeaseState.DELETING:
            deleting(d, lease)


def idle_create_ended(d: Decision, lease: Lease) -> bool:
    """An idle pool whose create was abandoned: True when it was deleted here. Late, as a
    held create (``acquire``): ``node_pool_timeout_s`` after GKE accepted it (``accepted_at``;
    a create accepted after its task left gets its operation's name recorded once, and that
    write's ``updated_at`` dates the acceptance), or ``create_queue_limit_s`` after the row
    while it still waits its turn among the cluster's node-pool operations."""
    op, pool = d.cluster.ops.get(lease.name), d.cluster.pools.get(lease.name)
    failed = (op is not None and op.kind == OpKind.CREATE and op.state == OpState.FAILED) or (
        pool is not None and pool.status == PoolStatus.ERROR
    )
    queued = op is not None and op.state in OP_IN_FLIGHT and not op.accepted
    if queued:
        late = (d.now - lease.created_at).total_seconds() > d.settings.create_queue_limit_s
    elif lease.accepted_at is None and op is not None and op.operation and op.operation != lease.operation:
        d.add(f"lease {lease.name}: idle, create accepted", RecordOperation(lease.id, op.operation))
        late = False
    else:
        started = lease.accepted_at or (lease.updated_at if lease.operation else lease.created_at)
        late = (d.now - started).total_seconds() > d.settings.node_pool_timeout_s
    if failed or (late and not (pool is not None and pool.status.up)):
        d.claimed.add(lease.id)  # gone: nobody may take or wait for it
        why = "its create failed" if failed else "its create did not finish in time"
        d.add(f"lease {lease.name}: idle, {why}", *d.delete_lease(lease, None))
        return True
    if pool is not None and pool.status.up:
        hosts = tpu.lookup(d.queue.cluster.tpu_type, lease.topology).hosts
        if render.scales_from_zero(lease.supply_mode) or (pool.registered >= hosts and pool.ready >= hosts):
            d.add(f"lease {lease.name}: abandoned create finished", MarkReady(lease.id))
    return False


def idle_unwanted(d: Decision, lease: Lease) -> None:
    q = d.queue
    held = lease.supply_mode == SupplyMode.RESERVATION and not d.reservation_pool_wanted()  # its hosts go to a held room
    if not held and q.cluster_active and len(d.demand) >= d.unclaimed_idle():
        return
    if not held and kept_alive(d.settings, lease, d.now, active=q.cluster_active, other_topology_waiting=q.other_topology_waiting):
        return
    d.claimed.add(lease.id)  # take it out of the pool of idle ones
    d.add(
        f"lease {lease.name}: idle, nobody waits",
        MoveLease(lease.id, lease.name, (LeaseState.IDLE,), LeaseState.DELETING),
        DeletePool(lease.name),
    )


def keep_window(settings: Settings, lease: Lease) -> tuple[float, bool]:
    """How long an idle pool nobody waits for may be kept (seconds), and whether a task of
    another topology of the cluster waiting gives it up at once: its supply mode's fixed
    window, or, for a pool on capacity GKE finds (flex-start, on-demand),
    ``keep_idle_reacquire_factor`` times what the pool took to get (its lease's row to its
    nodes Ready), capped at ``keep_idle_max_s``, whichever is longer. A reservation's hosts
    are there for the next create, so such a pool earns nothing: kept, it only keeps other
    topologies out of the reservation."""
    fixed = settings.keep_idle_s(lease.supply_mode)
    factor = settings.keep_idle_reacquire_factor
    if factor > 0 and settings.idle_pool_handover and lease.ready_at is not None and lease.supply_mode != SupplyMode.RESERVATION:
        took = max(0.0, (lease.ready_at - lease.created_at).total_seconds())
        earned = min(factor * took, settings.keep_idle_max_s)
        if earned > fixed:
            return earned, True
    return fixed, lease.supply_mode == SupplyMode.RESERVATION


def kept_alive(settings: Settings, lease: Lease, now: dt.datetime, *, active: bool, other_topology_waiting: bool) -> bool:
    """Whether an idle pool nobody waits for is kept for now (the module's keep-alive rule)."""
    window, yields = keep_window(settings, lease)
    if window <= 0 or not active or lease.ready_at is None:
        return False
    if yields and other_topology_waiting:
        return False
    since = lease.idle_since if lease.state == LeaseState.IDLE and lease.idle_since is not None else now
    return (now - since).total_seconds() < window


def nodes_last_for(lease: Lease, pool: PoolView | None, now: dt.datetime, run_s: float) -> bool:
    """Whether a task handed this pool could run ``run_s`` (its timeout) on the nodes it has:
    GKE deletes a flex-start pool's VMs ``maxRunDuration`` after they came, and a task handed
    the pool starts on them. Its run, plus ``HANDOVER_START_S`` for its start, must end before
    the oldest node's. A pool with no node (flex-start scales from zero) gets fresh ones,
    and the other supply modes have no limit."""
    if lease.supply_mode != SupplyMode.FLEX_START or pool is None or pool.nodes_since is None:
        return True
    left = render.FLEX_START_MAX_RUN_SECONDS - (now - pool.nodes_since).total_seconds()
    return left >= run_s + HANDOVER_START_S


def deleting(d: Decision, lease: Lease) -> None:
    op, pool = d.cluster.ops.get(lease.name), d.cluster.pools.get(lease.name)
    if pool is None and d.cluster.synced and (op is None or op.state == OpState.DONE):
        young = (d.now - lease.created_at).total_seconds() < d.settings.create_visibility_grace_s
        if not (young and lease.supply_mode == SupplyMode.FLEX_START):
            d.add(f"lease {lease.name}: deleted", MoveLease(lease.id, lease.name, (LeaseState.DELETING,), LeaseState.DELETED))
            return
    effects: list[Effect] = []
    if op is None or op.kind != OpKind.DELETE:
        effects.append(DeletePool(lease.name))
    else:
        if op.operation and op.operation != lease.operation:
            effects.append(RecordOperation(lease.id, op.operation))
        if op.attempts > lease.delete_attempts:
            effects += delete_failing(d, lease, op.attempts, op.error)
    d.add(f"lease {lease.name}: deleting", *effects)


def delete_failing(d: Decision, lease: Lease, attempts: int, error: str) -> list[Effect]:
    effects: list[Effect] = [
        MoveLease(
            lease.id,
            lease.name,
            (LeaseState.DELETING,),
            LeaseState.DELETING,
            {"delete_attempts": attempts, "last_error": error[:1000]},
        )
    ]
    holder = lease.task_id
    if attempts >= d.settings.pool_delete_report_after and holder is not None and holder in d.queue.terminal_messages:
        suffix = d.msg("pool_not_deleted", pool=lease.name, detail=error or "retrying")
        phase, base = d.queue.terminal_messages[holder]
        if suffix.strip() not in base:
            effects.append(UpdateTask(holder, (phase,), base + suffix))
    return effects


def stale_jobs(d: Decision) -> None:
    for task_id, job in d.cluster.jobs.items():  # a Job whose delete is under way is not asked again
        if job.phase != JobPhase.DELETED and not job.deleting and not d.is_live(task_id):
            d.add(f"job {job.name}: task no longer live", DeleteJob(task_id, job.namespace, job.name))
