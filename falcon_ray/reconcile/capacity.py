"""Rule 4, capacity: a create that GKE refuses for capacity is a wait with backoff and a budget.

Contract
--------
GKE answers a node-pool create with "no capacity right now" (a stockout:
ZONE_RESOURCE_POOL_EXHAUSTED, a reservation that is short, for any supply mode) as a
failed operation and a pool in ERROR. Capacity comes back, so the task does not fail:

- ``refused(d, t, lease, detail)``: the refused pool goes through the normal delete
  path (a pool in ERROR must be deleted), its lease row records when and why
  (``refused_at``, ``refusal``), and the task waits in ClusterBusy with GKE's words and
  the time it has waited -- or ends NodePoolFailed once ``capacity_budget_s`` has passed
  since its first refusal;
- ``backing_off(d, t)``: a task with no pool whose last refusal is more recent than the
  backoff (``Settings.capacity_retry_after_s``: first, x factor, capped) keeps waiting;
  past the budget it fails. Once the backoff has passed the create is asked again under
  the pool name of the next attempt (``render.node_pool_name(..., attempt)``), so it
  never meets the refused pool that is still being deleted;
- ``wait_of(d, t)``: the task's capacity wait, read from the refused lease rows
  (``QueueState.refused``, Deleted ones included), never from memory: a restarted
  QueueActor continues the same backoff and the same budget.

- ``nodes_not_delivered(d, t, lease, pool)``: a task in WaitingForNode whose pool GKE
  created but whose nodes do not come (a flex-start slice the zone cannot give) is in a
  capacity wait too, from its first refusal or else its entering WaitingForNode, under the
  same budget. Once spent, its Job and pool are deleted and the lease row records the
  non-delivery as a refusal (now). Without another active cluster of its TPU type the
  task ends NodePoolFailed at once; with one it goes to ClusterBusy, where the next round
  moves it there if that cluster can start it now (``move.move``), else it waits out the
  backoff and asks once more here, with the budget now counted from that refusal, so a
  second non-delivery (or a refusal past the budget) ends it NodePoolFailed. The Message
  says the capacity was not delivered, never that the task failed.

- ``create_too_slow(d, t, lease, detail)``: a create GKE accepted whose control plane is
  not RUNNING past ``node_pool_timeout_s`` (GKE's creates vary, TPU slices take longer) is
  given back the same way; past ``pool_release_limit`` it ends NodePoolTimeout.
- ``contested(d, t, lease, pool)``: a task in WaitingForNode whose pool holds part of its
  nodes (some registered, not all) for longer than ``contested_wait_s`` counted from
  the pool's first node (``PoolView.nodes_since``: when it began to hold capacity), while
  a task of another topology waits on the cluster, gives the pool back: its Job and pool
  are deleted, a ``released`` row records it (its attempt's Job name stays behind) and it
  goes back to Waiting at the head of its queue (``QueueTask.priority``). A pool whose
  nodes are all registered is never given back (its capacity has come), nor one with no
  node (it holds nothing). After ``pool_release_limit`` releases the next one ends
  it NodePoolFailed with a Message that says the capacity did not come in time, the
  fleet's fault. A release whose move back to Waiting was not made (a crash after its row)
  is finished without a second row.

A wait for reservation headroom (``acquire.reservation_allows``) is not a refusal and
has no limit; the budget is checked when GKE refuses, while a backoff runs, and while a
pool's nodes do not come.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from dataclasses import dataclass

from falcon_ray import lifecycle as lc
from falcon_ray import limits, messages, render, scheduling
from falcon_ray.lifecycle import LeaseState, Reason
from falcon_ray.limits import Wait
from falcon_ray.model import RELEASED, Lease, PoolView, QueueTask
from falcon_ray.reconcile.context import Decision, fmt_duration, fmt_limit, stamp
from falcon_ray.reconcile.effects import DeletePool, Effect, MoveLease, RecordDisruption, Transition

# the fields of a task that leaves its pool: no pool, no Job, and the timeout clock of its
# next Job starts afresh (a Job submitted before, on a pool the autoscaler then emptied, set it)
OFF_POOL = {"node_pool_name": None, "job_uid": None, "dispatched_at": None}


@dataclass(frozen=True)
class CapacityWait:
    refusals: int
    first_at: dt.datetime
    last_at: dt.datetime
    last_message: str


def wait_of(d: Decision, t: QueueTask) -> CapacityWait | None:
    """The task's refusals so far, from its refused lease rows (None: never refused)."""
    rows = sorted((l for l in d.queue.refused if l.task_id == t.id and l.refused_at is not None), key=lambda l: l.refused_at)
    if not rows:
        return None
    return CapacityWait(len(rows), rows[0].refused_at, rows[-1].refused_at, rows[-1].refusal)  # type: ignore[arg-type]


@functools.cache
def _not_delivered_pattern(lang: str) -> re.Pattern[str]:
    return messages.pattern("nodes_not_delivered", lang)


def not_delivered(d: Decision, w: CapacityWait) -> bool:
    """The wait's last refusal is a pool whose nodes GKE did not deliver within the budget
    (``nodes_not_delivered``'s row): the task has waited a whole budget for this zone."""
    return _not_delivered_pattern(d.settings.lang).match(w.last_message) is not None


def attempt(d: Decision, t: QueueTask) -> int:
    """The attempt number of the task's next create: how many were refused for capacity."""
    w = wait_of(d, t)
    return w.refusals if w else 0


def refused(d: Decision, t: QueueTask, lease: Lease, detail: str) -> None:
    """GKE refused ``lease``'s create for capacity: delete the pool, record it, wait or give up."""
    w = wait_of(d, t)
    refusals = (w.refusals if w else 0) + 1
    first = w.first_at if w else d.now
    mark = {"task_id": t.id, "refused_at": d.now, "refusal": detail[:1000]}
    effects: list[Effect] = [
        *d.delete_job(t),  # a flex-start Job waiting for nodes that will not come now
        MoveLease(lease.id, lease.name, (lease.state,), LeaseState.DELETING, mark),
        DeletePool(lease.name),
    ]
    waited = (d.now - first).total_seconds()
    if budget_spent(d, waited):
        effects.append(give_up(d, t, refusals, waited, detail))
    else:
        retry_at = d.now + dt.timedelta(seconds=d.settings.capacity_retry_after_s(refusals))
        text = wait_text(d, t, refusals, detail, retry_at, first)
        effects.append(Transition(t.id, (t.phase,), lc.CLUSTER_BUSY, text, OFF_POOL))
    d.add(f"task {t.id}: create of {lease.name} refused for capacity", *effects)


def backing_off(d: Decision, t: QueueTask) -> bool:
    """True while the task waits out the backoff after a refusal (or was failed here)."""
    w = wait_of(d, t)
    if w is None:
        return False
    retry_at = w.last_at + dt.timedelta(seconds=d.settings.capacity_retry_after_s(w.refusals))
    if d.now >= retry_at:
        return False
    waited = (d.now - w.first_at).total_seconds()
    if budget_spent(d, waited):
        d.add(f"task {t.id}: capacity budget spent", give_up(d, t, w.refusals, waited, w.last_message))
        return True
    text = wait_text(d, t, w.refusals, w.last_message, retry_at, w.first_at)
    if t.phase != lc.CLUSTER_BUSY:  # a crash between the refused lease's move and the task's
        d.add(f"task {t.id}: capacity wait", Transition(t.id, (t.phase,), lc.CLUSTER_BUSY, text, {"node_pool_name": None}))
    else:
        d.say(t, text, "capacity wait")
    return True


def wait_text(d: Decision, t: QueueTask, refusals: int, detail: str, retry_at: dt.datetime, since: dt.datetime) -> str:
    """GKE's words, the refusal count, when the create is asked again and since when it
    waits: instants, so the Message changes with the next refusal, not with the clock."""
    supply = scheduling.supply_mode_for(t.spec, d.queue.cluster.default_reservation).value
    text = d.msg("capacity_wait", supply=supply, refusals=refusals, detail=detail, retry=stamp(retry_at))
    return text + d.msg("waiting_since", at=stamp(since))


def retry_text(d: Decision, t: QueueTask, pool: str, supply: str) -> str | None:
    """The Provisioning Message of a create asked again after refusals (None: a first create)."""
    w = wait_of(d, t)
    if w is None:
        return None
    text = d.msg("capacity_retrying", pool=pool, supply=supply, refusals=w.refusals, detail=w.last_message)
    return text + d.msg("waiting_since", at=stamp(w.first_at))


def budget_spent(d: Decision, waited_s: float) -> bool:
    """The capacity wait's budget (``limits``: Wait.CAPACITY) is used up."""
    budget = limits.seconds(Wait.CAPACITY, d.settings)
    return budget is not None and waited_s >= budget


def budget_text(d: Decision) -> str:
    """The capacity budget as a Message shows it (hours and minutes from an hour up)."""
    budget = limits.seconds(Wait.CAPACITY, d.settings) or 0.0
    return fmt_duration(budget) if budget >= 3600 else fmt_limit(budget)


def give_up(d: Decision, t: QueueTask, refusals: int, waited_s: float, detail: str) -> Transition:
    limit = budget_text(d)
    text = d.msg("capacity_budget_spent", limit=limit, waited=fmt_duration(waited_s), refusals=refusals, detail=detail)
    return Transition(t.id, (t.phase,), lc.failed(Reason.NODE_POOL_FAILED), d.msg("node_pool_failed", detail=text))


def nodes_wait_since(d: Decision, t: QueueTask) -> dt.datetime | None:
    """When the task's wait for capacity began, for a task in WaitingForNode: its first
    refusal, else its entering the phase (event log); None when neither is known."""
    w = wait_of(d, t)
    starts = [x for x in (w.first_at if w else None, t.phase_since) if x is not None]
    return min(starts) if starts else None


def nodes_not_delivered(d: Decision, t: QueueTask, lease: Lease, pool: PoolView | None) -> bool:
    """WaitingForNode, its pool short of Ready nodes: GKE has not delivered the capacity, a
    capacity wait like a refusal, under the same ``capacity_budget_s`` (``Wait.NODES``),
    and ends as the module's contract says. True when it was decided here."""
    hosts = t.spec.shape.hosts
    since = nodes_wait_since(d, t)
    if since is None or (pool is not None and pool.ready >= hosts):
        return False
    waited = (d.now - since).total_seconds()
    if not budget_spent(d, waited):
        return False
    registered = pool.registered if pool else 0
    detail = d.msg("nodes_not_delivered", pool=lease.name, registered=registered, expected=hosts, supply=lease.supply_mode.value,
                   limit=budget_text(d), waited=fmt_duration(waited))
    mark = {"task_id": t.id, "refused_at": d.now, "refusal": detail[:1000]}
    effects: list[Effect] = [
        *d.delete_job(t),
        MoveLease(lease.id, lease.name, (lease.state,), LeaseState.DELETING, mark),
        DeletePool(lease.name),
    ]
    if d.queue.alternatives_exist:
        text = d.msg("nodes_not_delivered_moving", detail=detail)
        move = Transition(t.id, (t.phase,), lc.CLUSTER_BUSY, text, OFF_POOL)
    else:
        move = Transition(t.id, (t.phase,), lc.failed(Reason.NODE_POOL_FAILED), d.msg("node_pool_failed", detail=detail))
    # the task's move first, as in Decision.finish: a live task whose Job is gone gets a new one
    d.add(f"task {t.id}: nodes of {lease.name} not delivered", move, *effects)
    return True


def contested(d: Decision, t: QueueTask, lease: Lease, pool: PoolView | None) -> bool:
    """WaitingForNode on a pool that holds part of its nodes past ``contested_wait_s``
    (from its first node) while another topology waits: give the pool back and go to the
    head of the queue, or, past ``pool_release_limit``, end NodePoolFailed. True when
    it was decided here."""
    hosts = t.spec.shape.hosts
    if t.phase != lc.WAITING_FOR_NODE or not d.queue.other_topology_waiting:
        return False
    if pool is None or pool.nodes_since is None or not 0 < pool.registered < hosts:
        return False
    held = (d.now - pool.nodes_since).total_seconds()
    if not limits.passed(Wait.NODES_CONTESTED, d.settings, held):
        return False
    limit = fmt_limit(limits.seconds(Wait.NODES_CONTESTED, d.settings) or 0)
    detail = d.msg(
        "released_detail", pool=lease.name, registered=pool.registered, expected=hosts, limit=limit,
        since=stamp(pool.nodes_since), cluster=d.queue.cluster.name,
    )  # fmt: skip
    text = d.msg("capacity_not_delivered", detail=detail, n=len(t.releases))
    give_back_or_fail(d, t, lease, detail, Transition(t.id, (t.phase,), lc.failed(Reason.NODE_POOL_FAILED), text))
    return True


def create_too_slow(d: Decision, t: QueueTask, lease: Lease, detail: str) -> None:
    """GKE accepted the create and its control plane is not RUNNING past
    ``node_pool_timeout_s``: GKE is slow, not the task. Give the pool back and go to the
    head of the queue (a new create is a new draw of GKE's time), or, past
    ``pool_release_limit``, end NodePoolTimeout with what GKE showed."""
    limit = fmt_limit(limits.seconds(Wait.CREATE, d.settings) or 0)
    text = d.msg("node_pool_timeout", limit=limit, detail=detail + d.msg("released_before", n=len(t.releases)))
    failed = Transition(t.id, (t.phase,), lc.failed(Reason.NODE_POOL_TIMEOUT), text)
    give_back_or_fail(d, t, lease, d.msg("create_slow_detail", pool=lease.name, limit=limit, detail=detail), failed)


def give_back_or_fail(d: Decision, t: QueueTask, lease: Lease, detail: str, failed: Transition) -> None:
    """Give the pool back (``give_back``) while the task has releases left of
    ``pool_release_limit``; past it, ``failed`` ends the task, its Job and pool deleted
    (the terminal write first, as in Decision.finish: a live task whose Job is gone gets a
    new one)."""
    if len(t.releases) < d.settings.pool_release_limit:
        give_back(d, t, lease, detail, record=True)
        return
    d.add(f"task {t.id}: gave up on {lease.name} ({failed.to})", failed, *d.delete_job(t), *d.delete_lease(lease, t.id))


def release_unfinished(d: Decision, t: QueueTask, lease: Lease | None) -> bool:
    """A release whose row was written and whose move back to Waiting was not (a crash, a
    lost compare-and-set): the task is still in the phase it entered before the row. Finish
    it without a second row. True when it was decided here."""
    last = t.disruptions[-1] if t.disruptions else None
    if last is None or last.kind != RELEASED or t.phase not in (lc.WAITING_FOR_NODE, lc.PROVISIONING):
        return False
    if t.phase_since is not None and t.phase_since >= last.at:
        return False  # released before, picked again since: a new wait
    give_back(d, t, lease, last.detail, record=False)
    return True


def give_back(d: Decision, t: QueueTask, lease: Lease | None, detail: str, record: bool) -> None:
    """Job and pool deleted, then Waiting (a Waiting task holds neither); the ``released``
    row first, so the next Job (on a new pool) has a name no Job of this pool had."""
    effects: list[Effect] = []
    n = len(t.releases)
    if record:
        effects.append(RecordDisruption(t.id, t.attempt, RELEASED, "", render.job_name(t.id, t.attempt), detail))
        n += 1
    effects += d.delete_job(t)
    if lease is not None:
        effects += d.delete_lease(lease, t.id)
    text = d.msg("released_text", detail=detail, n=n, limit=d.settings.pool_release_limit)
    back = Transition(t.id, (t.phase,), lc.WAITING, text, OFF_POOL)
    d.add(f"task {t.id}: gave its pool back", *effects, back)
