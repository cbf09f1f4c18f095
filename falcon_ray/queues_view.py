"""The text of ``falcon-ray queues`` (and of each ``--watch`` frame): a pure function of
the QueueActors' snapshots.

Contract
--------
``render(snaps, in_phase)`` returns the text for a list of ``QueueActor.snapshot()``
dicts (or ``{"actor", "error"}`` rows for a queue that did not answer): per queue, the
slot holder with its phase, the waiting tasks in pick order with their position, the
running and aborting tasks, each with its time in phase, then the queue's node pools
and their state. ``in_phase`` maps task id -> seconds in the current Status/Reason
(from the event log, or from ``PhaseClock`` when no database is at hand); a waiting
task without an entry shows its time since submission. ``frame`` adds the header line
of a watch frame. Nothing here reads Ray, the database or the clock.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _clip(text: Any, width: int) -> str:
    text = " ".join(str(text if text not in (None, "") else "-").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(rows: list[list[str]], heads: list[str], indent: str = "  ") -> list[str]:
    size = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    out = [indent + "  ".join(h.ljust(size[i]) for i, h in enumerate(heads)).rstrip()]
    out += [indent + "  ".join(c.ljust(size[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    return out


def _phase(t: dict[str, Any]) -> str:
    status, reason = t.get("status") or "", t.get("reason") or ""
    return f"{status}/{reason}" if reason else status


def _task_row(kind: str, pos: str, t: dict[str, Any], in_phase: dict, fallback: float | None, width: int) -> list[str]:
    tid = t.get("id")
    return [
        kind,
        pos,
        f"#{tid}",
        _clip(t.get("actor"), 12),
        _clip(t.get("name"), 24),
        _phase(t),
        _dur(in_phase.get(tid, fallback)),
        _clip(t.get("node_pool"), 24),
        _clip(t.get("message"), width),
    ]


def render(
    snaps: Sequence[dict[str, Any]], in_phase: dict[int, float] | None = None, message_width: int = 60
) -> str:
    in_phase = in_phase or {}
    if not snaps:
        return "no queues (no controller in this namespace, or nothing submitted yet)"
    lines: list[str] = []
    for q in snaps:
        if lines:
            lines.append("")
        lines += _queue_lines(q, in_phase, message_width)
    return "\n".join(lines)


# the task lists of a queue's snapshot, in the order they are shown, with each row's kind
_TASK_LISTS = (("acquiring", "SLOT"), ("waiting", "WAIT"), ("recovering", "RECOVER"), ("running", "RUN"), ("aborting", "ABORT"))


def _queue_lines(q: dict[str, Any], in_phase: dict, message_width: int) -> list[str]:
    """One queue: its heading, its live tasks and its node pools."""
    name = q.get("queue") or q.get("actor") or "?"
    if "error" in q:
        return [f"{name}: NOT ANSWERING: {q['error']}"]
    leases = q.get("leases") or []
    lines = [_queue_heading(q, name, len(leases))]
    rows: list[list[str]] = []
    for key, kind in _TASK_LISTS:
        for t in q.get(key) or []:
            pos, fallback = (str(t.get("position", "")), t.get("waiting_s")) if key == "waiting" else ("", None)
            rows.append(_task_row(kind, pos, t, in_phase, fallback, message_width))
    if rows:
        lines += _table(rows, ["", "POS", "TASK", "ACTOR", "NAME", "PHASE", "IN PHASE", "POOL", "MESSAGE"])
    else:
        lines.append("  no live tasks")
    if leases:
        lines += _table([_pool_row(l) for l in leases], ["", "NAME", "STATE", "TASK", "SUPPLY", "GKE", "NODES", "IDLE SINCE"])
    return lines


def _queue_heading(q: dict[str, Any], name: str, pools: int) -> str:
    counts = {"waiting": len(q.get("waiting") or []), "slot": len(q.get("acquiring") or []),
              "running": len(q.get("running") or []), "aborting": len(q.get("aborting") or []),
              "recovering": len(q.get("recovering") or [])}  # fmt: skip
    head = f"{name}  waiting {counts['waiting']}, slot {counts['slot']}, running {counts['running']}"
    if counts["recovering"]:
        head += f", recovering {counts['recovering']}"
    if counts["aborting"]:
        head += f", aborting {counts['aborting']}"
    head += f", pools {pools}  (last granted: {q.get('last_granted') or '-'})"
    if q.get("last_error"):
        head += f"  last tick error: {_clip(q['last_error'], 80)}"
    return head


def _pool_row(l: dict[str, Any]) -> list[str]:
    return [
        "POOL",
        _clip(l.get("name"), 32),
        _clip(l.get("state"), 10),
        f"#{l['task_id']}" if l.get("task_id") else "-",
        _clip(l.get("supply_mode"), 12),
        _clip(l.get("pool_status"), 14),
        str(l.get("nodes_ready", 0)),
        _clip(l.get("idle_since"), 24) if l.get("state") == "Idle" else "-",
    ]


def frame(
    snaps: Sequence[dict[str, Any]],
    in_phase: dict[int, float] | None,
    namespace: str,
    at: dt.datetime,
    interval: float,
    n: int,
) -> str:
    """One ``--watch`` frame: a header line (namespace, time, frame number), then ``render``."""
    stamp = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    head = f"falcon-ray queues  namespace {namespace}  {stamp}  (#{n}, every {interval:g}s, Ctrl-C to stop)"
    return head + "\n" + render(snaps, in_phase)


class PhaseClock:
    """Time in phase as seen by one watcher, for when no database is at hand: a task's
    clock starts the first time it is seen in its current phase (so it undercounts
    until the phase changes once under watch)."""

    def __init__(self) -> None:
        self.since: dict[int, tuple[str, float]] = {}

    def observe(self, snaps: Sequence[dict[str, Any]], now: float) -> dict[int, float]:
        seen: dict[int, tuple[str, float]] = {}
        for q in snaps:
            for key in ("acquiring", "recovering", "running", "aborting"):  # a waiting task shows its waiting time
                for t in q.get(key) or []:
                    tid, phase = t.get("id"), _phase(t)
                    prev = self.since.get(tid)
                    seen[tid] = prev if prev and prev[0] == phase else (phase, now)
        self.since = seen
        return {tid: now - at for tid, (_, at) in seen.items()}
