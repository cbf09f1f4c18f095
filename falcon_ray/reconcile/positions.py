"""Rule 8: every Waiting task's Message says its queue position, the tasks ahead, and,
when the queue's history allows, when it is expected to start.

Contract
--------
The order is the pick rule's (``scheduling.queue_order``), behind the slot holders;
the start estimate is ``eta.estimate``'s, rounded by ``eta.choices``: a Message that
already shows either rounding of the new estimate is kept, so a steady queue's texts
change once per rounding step, not every tick. A Message is written only when its text
changes, and all changed ones go in one batched statement (``RefreshMessages``).
"""

from __future__ import annotations

from falcon_ray import lifecycle as lc
from falcon_ray.model import QueueTask
from falcon_ray.reconcile import eta
from falcon_ray.reconcile.context import Decision
from falcon_ray.reconcile.effects import RefreshMessages

SHOWN_AHEAD = 5


def _since(d: Decision, at) -> str:
    """The "waiting since" part; tasks that entered Waiting in the same minute share it."""
    key = at.replace(second=0, microsecond=0)
    text = d.since_texts.get(key)
    if text is None:
        text = d.since_texts[key] = d.msg("waiting_since", at=at.strftime("%Y-%m-%d %H:%M"))
    return text


def waiting_text(d: Decision, t: QueueTask, ahead: list[QueueTask], start_in: int | None = None, shown: str | None = None) -> str:
    """Position and the tasks ahead, the start estimate (rounded seconds) if there is one,
    and since when it waits: an absolute time, so the text changes only when the queue
    ahead (or the rounded estimate) does, not every minute. ``shown``: the first
    ``SHOWN_AHEAD`` of ``ahead`` as the text lists them, when the caller has it already."""
    since = _since(d, t.phase_since) if t.phase_since else ""
    expected = d.msg("expected_start", eta=eta.fmt_eta(start_in)) if start_in is not None else ""
    if not ahead:
        return d.msg("waiting_first", cluster=d.q.cluster.name, topology=d.q.topology) + expected + since
    names = shown if shown is not None else ", ".join(f"{a.actor}: {a.name or a.id}" for a in ahead[:SHOWN_AHEAD])
    if len(ahead) > SHOWN_AHEAD:
        names += f", ... {len(ahead) - SHOWN_AHEAD} more"
    return d.msg("waiting", position=len(ahead) + 1, ahead=len(ahead), tasks=names) + expected + since


def start_estimates(d: Decision, order: list[QueueTask]) -> dict[int, float]:
    if not d.q.cluster_active:
        return {}
    running = d.running
    return eta.estimate(d.now, d.q.history, d.holders, running, order, d.q.cluster.default_reservation)


def positions(d: Decision) -> None:
    """The texts are built lazily: a task whose Message shows the first rounding of its
    estimate needs no other, and past ``SHOWN_AHEAD`` the names listed are the same."""
    ahead: list[QueueTask] = list(d.holders)
    order = d.waiting_order()
    estimates = start_estimates(d, order)
    updates = []
    shown: str | None = None
    for t in order:
        if shown is None and len(ahead) >= SHOWN_AHEAD:
            shown = ", ".join(f"{a.actor}: {a.name or a.id}" for a in ahead[:SHOWN_AHEAD])
        seconds = estimates.get(t.id)
        rounded = eta.choices(seconds) if seconds is not None else (None,)
        first = waiting_text(d, t, ahead, rounded[0], shown)
        if t.message != first and not any(t.message == waiting_text(d, t, ahead, c, shown) for c in rounded[1:]):
            updates.append((t.id, lc.WAITING, first))
        ahead.append(t)
    if updates:
        d.add("waiting messages", RefreshMessages(tuple(updates)))
