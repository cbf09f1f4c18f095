"""Rules 3 and 5: waiting tasks of a cluster out of service go back to the poller; the
pick gives a free slot to the next waiting task.

Contract
--------
``rerank(d)``: when the cluster is in maintenance or offline and another active
cluster of its TPU type exists, every Waiting task is unassigned (Pending, no
cluster) so the poller ranks it again; they leave the queue's waiting list.
``pick(d)``: when no task holds the slot (one between its pick and Running; a flex-start
task whose capacity wait has parked does not hold it, up to ``capacity_waits_per_queue``
such waits: ``Decision.slot_free``) and the cluster is active, the pick rule
(``scheduling.pick_next`` on the heads of the highest priority: no pass over the
waiting list) chooses; its move out of Waiting (to Provisioning or Dispatching) is
what records its actor as the last granted (``store.queues``); an
idle pool goes straight to the chosen task (hand-over: Dispatching), otherwise it
becomes Provisioning, with its pool's lease and create in the same group when the create
needs no other step first (``acquire.create_at_pick``). The chosen task joins ``d.holders`` and leaves the waiting list (``d.leave``).
With ``slot_per_supply`` (and not ``strict_slot``) each supply mode has its own slot: the
pick rule chooses among the heads whose supply's slot is free, once per supply mode in a
call, so a task waiting for reservation room never holds back one that would create a
flex-start or on-demand pool (other capacity), nor the other way round; the heads are
still those of the highest priority and each actor's oldest (FIFO per actor).
Then, unless ``strict_slot`` (the original's one task between pick and Running), idle
pools whose every node is Ready go to the next tasks by the pick rule whoever holds the
slot (``hand_over_ready``): a hand-over acquires nothing from GKE, so it never waits
behind a task that does.
"""

from __future__ import annotations

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.model import QueueTask
from falcon_ray.reconcile.acquire import claim_idle, create_at_pick
from falcon_ray.reconcile.context import Decision
from falcon_ray.reconcile.effects import Transition, Unassign
from falcon_ray.spec import SupplyMode


def rerank(d: Decision) -> None:
    q = d.queue
    if q.cluster_active or not d.waiting_count() or not q.alternatives_exist:
        return
    for t in sorted((t for t in d.waiting if t.id not in d.left), key=lambda t: t.id):  # the queue's order
        d.add(f"task {t.id}: re-rank", Unassign(t.id, d.msg("requeued", cluster=q.cluster.name, status=q.cluster.status)))
    d.leave_all()


def pick(d: Decision) -> None:
    if not d.queue.cluster_active or not d.waiting_count():
        return
    last = d.queue.last_granted
    s = d.settings
    if s.strict_slot or not s.slot_per_supply:
        if d.slot_free():  # the slot: one task between its pick and Running starts a create
            nxt = scheduling.pick_next(d.waiting_heads(), last)
            assert nxt is not None
            last = grant(d, nxt)
    else:  # a slot per supply mode: the pick rule chooses among the heads whose supply's slot is free
        taken: set[SupplyMode] = set()
        while d.waiting_count():
            heads = [h for h in d.waiting_heads() if (m := d.supply_of(h)) not in taken and d.slot_free(m)]
            nxt = scheduling.pick_next(heads, last)
            if nxt is None:
                break
            others_acquire = bool(taken) or not d.slot_free()  # a task of another supply acquires (or was just granted)
            taken.add(d.supply_of(nxt))
            last = grant(d, nxt, own_supply=others_acquire)
    if not s.strict_slot:
        hand_over_ready(d, last)


def grant(d: Decision, nxt: QueueTask, own_supply: bool = False) -> str:
    """``nxt`` takes the slot: an idle pool goes to it (hand-over), else it becomes
    Provisioning (with its lease and create when nothing comes first). Returns its actor,
    the last granted. ``own_supply``: it took its supply's slot while a task of another
    supply acquires, so an idle pool of another supply goes to it only with every node
    Ready (one short of nodes would acquire that supply's capacity)."""
    idle = d.free_idle(nxt)
    if idle is not None and own_supply and idle.supply_mode != d.supply_of(nxt):
        idle = d.free_idle(nxt, ready=True)
    if idle is not None:
        d.add(f"task {nxt.id}: picked, hand-over of {idle.name}", *claim_idle(d, nxt, idle))
    else:
        mode = d.supply_of(nxt)
        if not create_at_pick(d, nxt, mode):
            text = d.msg("picked", supply=mode.value)
            d.add(f"task {nxt.id}: picked", Transition(nxt.id, (lc.WAITING,), lc.PROVISIONING, text))
    d.holders.append(nxt)
    d.leave(nxt)
    return nxt.actor


def hand_over_ready(d: Decision, last: str) -> None:
    """The slot serializes acquiring new capacity, not reuse: while idle pools of the
    topology whose every node is Ready are free, the next task by the pick rule takes one
    (Dispatching), whoever holds the slot. The pick rule still chooses which task: the first
    that cannot take such a pool ends the hand-overs of this round."""
    while d.waiting_count():
        nxt = scheduling.pick_next(d.waiting_heads(), last)
        idle = d.free_idle(nxt, ready=True) if nxt is not None else None
        if nxt is None or idle is None:
            return
        d.add(f"task {nxt.id}: picked, hand-over of ready pool {idle.name}", *claim_idle(d, nxt, idle))
        d.holders.append(nxt)
        d.leave(nxt)
        last = nxt.actor
