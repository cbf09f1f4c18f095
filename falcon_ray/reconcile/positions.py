"""Rule 8: every Waiting task's Message says its queue position, the tasks ahead, and,
when the queue's history allows, when it is expected to start.

Contract
--------
The order is the pick rule's (``scheduling.pick_order``), behind the slot holders;
the start estimate is ``eta.estimate``'s, rounded by ``eta.choices``: a Message that
already shows either rounding of the new estimate is kept, so a steady queue's texts
change once per rounding step, not every tick. A Message is written only when its text
changes, and all changed ones go in one batched statement (``RefreshMessages``).
"""

from __future__ import annotations

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.model import QueueTask
from falcon_ray.reconcile import eta
from falcon_ray.reconcile.context import Decision
from falcon_ray.reconcile.effects import RefreshMessages

SHOWN_AHEAD = 5


def waiting_text(d: Decision, t: QueueTask, ahead: list[QueueTask], start_in: int | None = None) -> str:
    """Position and the tasks ahead, the start estimate (rounded seconds) if there is one,
    and since when it waits: an absolute time, so the text changes only when the queue
    ahead (or the rounded estimate) does, not every minute."""
    since = d.msg("waiting_since", at=t.phase_since.strftime("%Y-%m-%d %H:%M")) if t.phase_since else ""
    expected = d.msg("expected_start", eta=eta.fmt_eta(start_in)) if start_in is not None else ""
    if not ahead:
        return d.msg("waiting_first", cluster=d.q.cluster.name, topology=d.q.topology) + expected + since
    names = ", ".join(f"{a.actor}: {a.name or a.id}" for a in ahead[:SHOWN_AHEAD])
    if len(ahead) > SHOWN_AHEAD:
        names += f", ... {len(ahead) - SHOWN_AHEAD} more"
    return d.msg("waiting", position=len(ahead) + 1, ahead=len(ahead), tasks=names) + expected + since


def start_estimates(d: Decision, order: list[QueueTask]) -> dict[int, float]:
    if not d.q.cluster_active:
        return {}
    running = [t for t in d.q.tasks if t.phase == lc.RUNNING]
    return eta.estimate(d.now, d.q.history, d.holders, running, order, d.q.cluster.default_reservation)


def positions(d: Decision) -> None:
    ahead: list[QueueTask] = list(d.holders)
    order = scheduling.pick_order(d.waiting, d.q.last_granted)
    estimates = start_estimates(d, order)
    updates = []
    for t in order:
        seconds = estimates.get(t.id)
        texts = [waiting_text(d, t, ahead, c) for c in eta.choices(seconds)] if seconds is not None else [waiting_text(d, t, ahead)]
        if t.message not in texts:
            updates.append((t.id, lc.WAITING, texts[0]))
        ahead.append(t)
    if updates:
        d.add("waiting messages", RefreshMessages(tuple(updates)))
