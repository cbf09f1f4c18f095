"""Rule 8: every Waiting task's Message says its queue position and the tasks ahead.

Contract
--------
The order is the pick rule's (``scheduling.pick_order``), behind the slot holders;
a Message is written only when its text changes, and all changed ones go in one
batched statement (``RefreshMessages``).
"""

from __future__ import annotations

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.model import QueueTask
from falcon_ray.reconcile.context import Decision
from falcon_ray.reconcile.effects import RefreshMessages

SHOWN_AHEAD = 5


def waiting_text(d: Decision, t: QueueTask, ahead: list[QueueTask]) -> str:
    """Position and the tasks ahead, and since when it waits: an absolute time, so the text
    changes only when the queue ahead does (no rewrite of every Waiting row each minute)."""
    since = d.msg("waiting_since", at=t.phase_since.strftime("%Y-%m-%d %H:%M")) if t.phase_since else ""
    if not ahead:
        return d.msg("waiting_first", cluster=d.q.cluster.name, topology=d.q.topology) + since
    names = ", ".join(f"{a.actor}: {a.name or a.id}" for a in ahead[:SHOWN_AHEAD])
    if len(ahead) > SHOWN_AHEAD:
        names += f", ... {len(ahead) - SHOWN_AHEAD} more"
    return d.msg("waiting", position=len(ahead) + 1, ahead=len(ahead), tasks=names) + since


def positions(d: Decision) -> None:
    ahead: list[QueueTask] = list(d.holders)
    updates = []
    for t in scheduling.pick_order(d.waiting, d.q.last_granted):
        text = waiting_text(d, t, ahead)
        if text != t.message:
            updates.append((t.id, lc.WAITING, text))
        ahead.append(t)
    if updates:
        d.add("waiting messages", RefreshMessages(tuple(updates)))
