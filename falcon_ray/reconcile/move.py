"""Rule 4, placement checks of the slot holder: its reservation cannot serve it, or another
cluster can start it now.

Contract
--------
Called by ``acquire.reservation_allows`` for a reservation task that has no lease (so
nothing was claimed or created for it yet on this cluster), and by ``acquire.no_pool_yet``
for a task in a capacity wait (GKE refused its pool for capacity, of any supply mode):

- ``unfit(d, t)``: the reservation, as just read, holds another machine type than the
  task's slice, or fewer VMs in all than the slice has hosts (it could never fit, whatever
  frees up). With another active cluster of the TPU type the task goes back to the
  poller (Pending, no cluster), which places it where its shape can be served;
  without one it fails NodePoolFailed with the reason instead of a create GKE refuses.
- ``move(d, t)``: the task is ClusterBusy and ``scheduling.move_target`` finds another
  active cluster of its TPU type that can start it with the same supply mode on what is
  there now: a ready idle pool (its queue for the topology empty), or reservation headroom
  by that cluster's ledger for it and every task that queue already has (it queues behind
  them, and its Message says how many), or, after GKE refused its on-demand or flex-start pool here for
  capacity for ``failover_after_s`` (a stockout that lasts), or did not deliver its
  flex-start nodes within ``capacity_budget_s``, and its budget here is not spent (a
  non-delivery starts it afresh), one in another zone that has not refused it before (the failover; its Message says what GKE refused here, how often
  and since when). One ``MoveTask``: a compare-and-set on the phase and the
  cluster, its event row, wake-ups for both queues. The task is Waiting there and that
  queue's pick takes it; nothing is left behind here (no lease, no pool name).
"""

from __future__ import annotations

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.lifecycle import Reason
from falcon_ray.model import QueueTask
from falcon_ray.reconcile import capacity
from falcon_ray.reconcile.context import Decision, stamp
from falcon_ray.reconcile.effects import MoveTask, Transition, Unassign
from falcon_ray.spec import SupplyMode


def unfit(d: Decision, t: QueueTask) -> bool:
    """The reservation holds another machine type, or fewer VMs in all than one slice needs:
    the task can never start here. Back to the poller when another active cluster of its TPU
    type exists, else Failed/NodePoolFailed naming what the reservation holds."""
    r, c = d.cluster.reservation, d.queue.cluster
    shape = t.spec.shape
    if r is None:
        return False
    if r.machine_type and r.machine_type != shape.machine_type:
        fields = dict(cluster=c.name, reservation=c.default_reservation, held=r.machine_type, machine_type=shape.machine_type)
        detail = d.msg("offer_reservation", cluster=c.name, reservation=c.default_reservation, machine_type=r.machine_type,
                       topologies=", ".join(scheduling.reservation_topologies(c.tpu_type, r.machine_type)) or "-")
        cannot_serve(d, t, d.msg("requeued_unfit", **fields), detail)
        return True
    if scheduling.too_small(r.count, shape.hosts):
        fields = dict(cluster=c.name, reservation=c.default_reservation, count=r.count, hosts=shape.hosts, topology=d.queue.topology)
        cannot_serve(d, t, d.msg("requeued_too_small", **fields), d.msg("offer_reservation_size", **fields))
        return True
    return False


def cannot_serve(d: Decision, t: QueueTask, requeued: str, detail: str) -> None:
    if d.queue.alternatives_exist:
        d.add(f"task {t.id}: reservation cannot serve its shape", Unassign(t.id, requeued, t.phase))
    else:
        failed = lc.failed(Reason.NODE_POOL_FAILED)
        d.add(f"task {t.id}: reservation cannot serve its shape", Transition(t.id, (t.phase,), failed, d.msg("node_pool_failed", detail=detail)))


def move(d: Decision, t: QueueTask) -> bool:
    if t.phase != lc.CLUSTER_BUSY or t.id in d.lease_by_task or not d.queue.destinations:
        return False
    wait = capacity.wait_of(d, t)
    target = scheduling.move_target(t.spec, d.queue.cluster, d.queue.destinations, t.id, refused=_fails_over(d, wait))
    if target is None:
        return False
    c, origin = target.cluster, d.queue.cluster
    mode = scheduling.supply_mode_for(t.spec, origin.default_reservation)
    common = dict(origin=origin.name, reservation=origin.default_reservation, cluster=c.name, topology=d.queue.topology)
    if wait is not None and mode != SupplyMode.RESERVATION:  # GKE had no capacity for it here
        reason = d.msg("moved_why_idle") if mode in target.idle_pools else d.msg("moved_why_empty", zone=scheduling.pool_zone(c))
        text = d.msg("moved_after_refusal", supply=mode.value, refusals=wait.refusals, since=stamp(wait.first_at), why=reason, **common)
    elif target.claimants:  # reservation room for it and the tasks queued there
        text = d.msg("moved_to_reservation_queued", target_reservation=c.default_reservation, ahead=target.claimants, **common)
    elif mode in target.idle_pools:
        text = d.msg("moved_to_idle", **common)
    else:
        text = d.msg("moved_to_reservation", target_reservation=c.default_reservation, **common)
    d.add(f"task {t.id}: move to {c.name}", MoveTask(t.id, origin.id, c.id, c.name, d.queue.topology, text))
    return True


def _fails_over(d: Decision, wait: capacity.CapacityWait | None) -> bool:
    """The capacity wait is a shortage of the zone that lasts (refused for
    ``failover_after_s``, or nodes not delivered within a whole budget), and its budget
    here is not spent (past it the task ends where it is)."""
    after = d.settings.failover_after_s
    if wait is None or after is None:
        return False
    waited = (d.now - wait.first_at).total_seconds()
    return (waited >= after or capacity.not_delivered(d, wait)) and not capacity.budget_spent(d, waited)


__all__ = ["move", "unfit"]
