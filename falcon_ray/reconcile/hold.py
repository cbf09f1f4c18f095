"""Rule 4, the reservation hold: a large slice that waited long for its reservation's room
gets it before the newer tasks of the cluster's other topologies, which fill the room
meanwhile only with runs that end before the slice could start (backfill).

Contract
--------
A reservation's free hosts go to whichever queue of the cluster asks while they are free,
and each queue hands its pools to its own next task, so a slice that needs a large part of
the reservation free at once would wait as long as smaller tasks keep coming (on a 16-host
reservation a v6e 8x8 needs every host). The hold bounds that wait:

- a *waiter* is a ClusterBusy task of another queue of the cluster
  (``QueueState.reservation_waiters``; ClusterBusy holds its queue's slot, so there is at
  most one a queue) whose supply is the reservation, that has been ClusterBusy for
  ``Settings.reservation_hold_after_s`` (null: nothing is ever held), and whose slice needs
  at least half of the reservation's hosts and no more than all of them (``LARGE``: a
  smaller slice finds room whenever a pool of its size ends; a larger one can never be
  served here, ``move.unfit``);
- ``hold_for(q, r, now, settings, task)``: the first waiter in submission order
  (``ReservationWaiter.order``) submitted before ``task`` (``task`` None: any waiter), and
  the room it holds, its slice's hosts; None when there is none;
- the room comes free at the latest at the *shadow* time (``shadow``): the reservation's
  hosts outside Falcon's pools plus those of its pools (``QueueState.reservation_occupants``:
  every reservation pool that holds hosts or is being deleted) in the order their runs must
  end (a Job's submission plus its task's timeout; a pool being created, its row's
  creation plus the node-pool timeout plus the timeout; a pool with no live task, its row's
  last move), each plus ``RELEASE_S`` for its delete, first reaching the held room; from
  the rows alone, so it does not move as time passes (it may be past: then the room is
  due now, and nobody backfills). It is counted from the pools'
  rows, not from GKE's ``inUseCount``, which is read less often and lags the deletes; the
  hosts of nodes outside Falcon's pools (``ReservationView.foreign``: another node pool, or
  another user of a shared reservation) only their owner frees, so they never count as
  coming free. None when without them the room cannot be made: nothing is held back then,
  as holding would gain the waiter nothing;
- the waiter's own ClusterBusy Message says that its room is held and by when it is free at
  the latest (``holding``);
- a reservation task the hold applies to creates a pool when the reservation has room for
  its slice beyond the held room, or when its run ends before the shadow time even if it
  is created now (``ends_in_time``); otherwise it stays ClusterBusy and its Message says
  what is held, for which task and since when. A task submitted before the waiter is not
  held back;
- while the reservation has fewer free hosts than the held room (``short``), a reservation
  pool is handed over only to a task whose run ends before the shadow time, and is not kept
  idle for any other: the queue deletes it, so its hosts come free as the runs end;
- a move's destination offers its free hosts less the room held there for a task
  submitted before the moving one (``Destination.held_hosts``), so a held task is not sent
  to a cluster where it would be held again.

Submission order decides, so holds never wait on one another in a circle; with the
backfill bounded by the shadow time, the waiter starts by then at the latest (the run
limits are enforced: Failed/Timeout), and the hosts free meanwhile run whatever ends in
time. Every function here is pure; ``now`` is given.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from falcon_ray.config import Settings
from falcon_ray.model import (
    Cluster,
    QueueState,
    QueueTask,
    ReservationOccupant,
    ReservationView,
    ReservationWaiter,
)
from falcon_ray.nodepools.ledger import pool_hosts
from falcon_ray.spec import SupplyMode

LARGE = 0.5  # a slice holds room when it needs at least this share of the reservation's hosts
RELEASE_S = 600.0  # after a run's end, its pool's delete and the hosts' return to the reservation


@dataclass(frozen=True)
class Hold:
    waiter: ReservationWaiter
    hosts: int  # the room held: the waiter's slice


def waited_long(w: ReservationWaiter, now: dt.datetime, settings: Settings) -> bool:
    """The waiter has been ClusterBusy for ``reservation_hold_after_s`` (never, with holds off)."""
    after = settings.reservation_hold_after_s
    return after is not None and w.since is not None and (now - w.since).total_seconds() >= after


def hold_over(
    waiters: tuple[ReservationWaiter, ...],
    cluster: Cluster,
    topology: str,
    r: ReservationView | None,
    now: dt.datetime,
    settings: Settings,
    before: tuple[dt.datetime, int] | None = None,
) -> Hold | None:
    """The hold on ``cluster``'s reservation against ``topology``'s tasks submitted after
    ``before`` (None: against any of them). See the module's contract."""
    if settings.reservation_hold_after_s is None or not cluster.default_reservation or r is None:
        return None
    for w in sorted(waiters, key=lambda w: w.order):
        if before is not None and w.order >= before:
            return None  # the rest were submitted later still
        if w.topology == topology or not waited_long(w, now, settings):
            continue
        if (w.supply_mode or SupplyMode.RESERVATION.value) != SupplyMode.RESERVATION.value:
            continue
        hosts = pool_hosts(cluster.tpu_type, w.topology)
        if hosts is not None and LARGE * r.count <= hosts <= r.count:
            return Hold(w, hosts)
    return None


def hold_for(q: QueueState, r: ReservationView | None, now: dt.datetime, settings: Settings, task: QueueTask | None = None) -> Hold | None:
    """The hold that applies to ``task`` of queue ``q`` (None: to any of its tasks)."""
    before = None if task is None else (task.created_at, task.id)
    return hold_over(q.reservation_waiters, q.cluster, q.topology, r, now, settings, before)


def holding(q: QueueState, r: ReservationView | None, now: dt.datetime, settings: Settings, task: QueueTask) -> Hold | None:
    """The hold ``task`` itself has (it is the first waiter), for its Message."""
    h = hold_over(q.reservation_waiters, q.cluster, "", r, now, settings)
    return h if h is not None and h.waiter.task_id == task.id else None


def promise(q: QueueState, r: ReservationView, now: dt.datetime, settings: Settings, task: QueueTask) -> tuple[Hold, dt.datetime] | None:
    """The hold ``task`` has and the latest time its room is free (``shadow``, never before
    ``now``), for the Messages that promise it; None without a hold or such a time."""
    own = holding(q, r, now, settings, task)
    by = None if own is None else shadow(own, r, q.reservation_occupants, q.cluster, now, settings)
    return None if own is None or by is None else (own, max(by, now))


def short(hold: Hold | None, r: ReservationView | None) -> bool:
    """The reservation has fewer free hosts than the held room."""
    return hold is not None and r is not None and r.free < hold.hosts


def freed_by(o: ReservationOccupant, settings: Settings) -> dt.datetime:
    """When the occupant's hosts are back in the reservation at the latest (the contract),
    from its rows alone, so the answer does not move as time passes."""
    release = dt.timedelta(seconds=RELEASE_S)
    if o.task_id is None:
        return o.updated_at + release
    start = o.dispatched_at or o.created_at + dt.timedelta(seconds=settings.node_pool_timeout_s)
    return start + dt.timedelta(seconds=o.timeout_s) + release


def shadow(hold: Hold, r: ReservationView, occupants: tuple[ReservationOccupant, ...], cluster: Cluster, now: dt.datetime, settings: Settings) -> dt.datetime | None:
    """The latest time the held room is free (the contract); None: with the hosts other
    owners hold, it cannot be."""
    pools = sorted((freed_by(o, settings), pool_hosts(cluster.tpu_type, o.topology) or 0) for o in occupants)
    free = r.count - r.foreign - sum(hosts for _, hosts in pools)
    if free >= hold.hosts:
        return now
    for at, hosts in pools:
        free += hosts
        if free >= hold.hosts:
            return at
    return None


def ends_in_time(t: QueueTask, by: dt.datetime | None, now: dt.datetime, settings: Settings, create: bool) -> bool:
    """``t``'s run, started now on a pool it is handed (or ``create``: on one created now),
    ends and gives its hosts back by ``by`` (None: nothing is held back)."""
    if by is None:
        return True
    start = now + dt.timedelta(seconds=settings.node_pool_timeout_s if create else 0.0)
    return start + dt.timedelta(seconds=t.spec.timeout_seconds + RELEASE_S) <= by


__all__ = ["LARGE", "RELEASE_S", "Hold", "ends_in_time", "freed_by", "hold_for", "hold_over", "holding", "shadow", "short"]
