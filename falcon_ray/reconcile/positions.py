"""Rule 8: every Waiting task's Message says its queue position, the tasks ahead, and,
when the queue's history allows, when it is expected to start and by when at the latest.

Contract
--------
The order is the pick rule's (``scheduling.queue_order``), behind the slot holders;
the start range is ``eta.ranges``': the expected start shown as the absolute time
``eta.choices`` rounds it to, the latest start as ``eta.latest_choices`` rounds it up,
neither coarser than the range is wide. A Message that already shows either rounding
of the expected start and one of the latest start's choices (a few steps later at most)
is kept, so a Message changes when the range moves by a rounding step, not as
time passes. A Message is written only when its text changes, and all changed ones go in
one batched statement (``RefreshMessages``). A task whose start deadline comes before the
latest start shown (the expected one without a range) is told so (``deadline.warning``).
A task without a start estimate whose queue's slot holder waits for its reservation's room
with a promise (the hold's ``shadow``: the run limits of the tasks on the hosts) is told
which task it waits behind and by when those hosts are free at the latest.
The decision keeps the range of each task
(``Decision.ranges``, ``eta.Range``) for the queue, which calibrates the range with it
and shows it in its snapshot.
"""

from __future__ import annotations

import datetime as dt

from falcon_ray import lifecycle as lc
from falcon_ray.model import QueueTask
from falcon_ray.reconcile import deadline, eta, hold
from falcon_ray.reconcile.context import Decision, stamp
from falcon_ray.reconcile.effects import RefreshMessages

SHOWN_AHEAD = 5


def _since(d: Decision, at) -> str:
    """The "waiting since" part; tasks that entered Waiting in the same minute share it."""
    text = d.since_texts.get(at)
    if text is None:
        key = at.replace(second=0, microsecond=0)
        text = d.since_texts.get(key)
        if text is None:
            text = d.since_texts[key] = d.msg("waiting_since", at=stamp(at))
        d.since_texts[at] = text
    return text


def waiting_text(
    d: Decision, t: QueueTask, ahead: list[QueueTask], start_at: tuple[dt.datetime, dt.datetime] | None = None, shown: str | None = None
) -> str:
    """Position and the tasks ahead, the start estimate (a rounded time) if there is one,
    and since when it waits: absolute times, so the text changes only when the queue
    ahead (or the rounded estimate) does, not every minute. ``shown``: the first
    ``SHOWN_AHEAD`` of ``ahead`` as the text lists them, when the caller has it already."""
    since = _since(d, t.phase_since) if t.phase_since else ""
    return _head(d, ahead, shown) + _expected(d, start_at) + deadline.warning(d, t, start_at) + since


def _head(d: Decision, ahead: list[QueueTask], shown: str | None) -> str:
    """The position part: the same for every task with as many ahead."""
    if not ahead:
        return d.msg("waiting_first", cluster=d.queue.cluster.name, topology=d.queue.topology)
    names = shown if shown is not None else ", ".join(f"{a.actor}: {a.name or a.id}" for a in ahead[:SHOWN_AHEAD])
    if len(ahead) > SHOWN_AHEAD:
        names += f", ... {len(ahead) - SHOWN_AHEAD} more"
    return d.msg("waiting", position=len(ahead) + 1, ahead=len(ahead), tasks=names)


def _expected(d: Decision, start_at: tuple[dt.datetime, dt.datetime] | None) -> str:
    """The range part: (expected, latest), each a whole minute."""
    if start_at is None:
        return ""
    text = d.expected_texts.get(start_at)
    if text is None:
        expected, latest = start_at
        text = d.expected_texts[start_at] = d.msg("expected_start", at=eta.fmt_at(expected), latest=eta.fmt_latest(expected, latest))
    return text


def _warned(d: Decision, t: QueueTask, start_at: tuple[dt.datetime, dt.datetime] | None) -> str:
    """The deadline part: said when the start deadline comes before the latest start shown."""
    if t.start_deadline is None:
        return ""
    return deadline.warning(d, t, *(start_at or (None, None)))


def behind_reservation(d: Decision) -> str:
    """What the queue waits behind when its slot holder waits for the reservation's room
    and the hold can say by when the room is free at the latest; "" otherwise."""
    r = d.cluster.reservation
    if r is None or not d.queue.reservation_waiters:
        return ""
    for h in d.holders:
        promised = hold.promise(d.queue, r, d.now, d.settings, h) if h.phase == lc.CLUSTER_BUSY else None
        if promised is not None:
            own, by = promised
            name = d.queue.cluster.default_reservation
            return d.msg("waiting_behind_reservation", task=h.id, hosts=own.hosts, reservation=name, by=stamp(by))
    return ""


def start_estimates(d: Decision, order: list[QueueTask]) -> dict[int, eta.Range]:
    if not d.queue.cluster_active:
        return {}
    idle = [l for l in d.idle if l.id not in d.claimed]
    hosts = order[0].spec.shape.hosts if order else 0
    pools = eta.Pools(
        idle=idle,
        held=d.lease_by_task,
        handover=d.settings.idle_pool_handover,
        # a pool whose nodes went (or never came) is handed over cold: it waits for capacity again
        cold=frozenset(l.id for l in idle if l.ready_at is not None and d.ready_nodes(l.name) < hosts),
    )
    per_supply = d.settings.slot_per_supply and not d.settings.strict_slot
    default_reservation = d.queue.cluster.default_reservation
    return eta.ranges(d.now, d.queue.history, d.holders, d.running, order, default_reservation, pools, per_supply, d.queue.last_granted)


def positions(d: Decision) -> None:
    """Each task's text is its position part, its range part and its "since" part; the
    other roundings of its range are tried only when the Message it shows has the same
    position and "since" parts (after a hand-over every position moves, so none has)."""
    ahead: list[QueueTask] = list(d.holders)
    order = d.waiting_order()
    estimates = d.ranges = start_estimates(d, order)
    updates = []
    shown: str | None = None
    behind: str | None = None  # worked out for the first task without an estimate
    for t in order:
        if shown is None and len(ahead) >= SHOWN_AHEAD:
            shown = ", ".join(f"{a.actor}: {a.name or a.id}" for a in ahead[:SHOWN_AHEAD])
        r = estimates.get(t.id)
        pair: tuple[dt.datetime, dt.datetime] | None = None
        if r is not None:
            width = r.latest - r.expected
            near, late = eta.choices(d.now, r.expected, width), eta.latest_choices(d.now, r.latest, width)
            pair = (near[0], late[0])
        head = _head(d, ahead, shown)
        if t.disruptions:  # taken off a pool: which attempt it waits for, or which pool it gave back
            head = d.requeued_text(t) + head
        since = _since(d, t.phase_since) if t.phase_since else ""
        shows = t.message
        if pair is None and behind is None:
            behind = behind_reservation(d)
        first = head + (_expected(d, pair) if pair is not None else behind or "") + _warned(d, t, pair) + since
        if shows != first and not (
            pair is not None
            and len(shows) > len(head) + len(since)
            and shows.startswith(head)
            and shows.endswith(since)
            and shows[len(head) : len(shows) - len(since)] in {_expected(d, (e, x)) + _warned(d, t, (e, x)) for e in near for x in late}
        ):
            updates.append((t.id, lc.WAITING, first))
        ahead.append(t)
    if updates:
        d.add("waiting messages", RefreshMessages(tuple(updates)))
