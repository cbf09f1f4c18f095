"""The public inspection API: live queue and cluster state for the CLI and notebooks.

Contract
--------
Read-only. ``connect`` attaches to a running controller's Ray cluster; ``queues``
and ``clusters`` ask every live QueueActor / ClusterActor for its ``snapshot()``
(bounded by a timeout, so a hung actor shows as an error row instead of hanging
the caller); ``timeline`` and ``outcomes`` read the task event log from the
database. ``falcon-ray queues`` and the notebooks call these functions and hold no
logic of their own.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import ray

from actors import names
from falcon_ray.store import Store, utcnow


def connect(address: str | None = "auto", namespace: str = "falcon") -> None:
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace, log_to_driver=False)


def _snapshots(prefix: str, namespace: str, timeout: float) -> list[dict[str, Any]]:
    refs = {}
    for name in names.list_falcon_actors(namespace):
        if name.startswith(prefix):
            h = names.lookup(name, namespace)
            if h is not None:
                refs[name] = h.snapshot.remote()
    out = []
    for name, ref in sorted(refs.items()):
        try:
            out.append(ray.get(ref, timeout=timeout))
        except Exception as e:
            out.append({"actor": name, "error": f"{type(e).__name__}: {e}"[:300]})
    return out


def queues(namespace: str = "falcon", timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every QueueActor's snapshot: waiting (pick order, with position), acquiring, running, leases."""
    return _snapshots("queue/", namespace, timeout)


def clusters(namespace: str = "falcon", timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every ClusterActor's snapshot: pools, operations, Jobs, reservation, last successful calls."""
    return _snapshots("cluster/", namespace, timeout)


def timeline(store: Store, task_id: int) -> list[dict[str, Any]]:
    """The task's events in order, each with the seconds spent before the next one."""
    events = store.events(task_id)
    out = []
    for i, e in enumerate(events):
        end = events[i + 1].at if i + 1 < len(events) else None
        out.append(
            {
                "at": e.at,
                "status": e.status,
                "reason": e.reason,
                "message": e.message,
                "seconds": round((end - e.at).total_seconds(), 3) if end else None,
            }
        )
    return out


def outcomes(store: Store, since: dt.timedelta = dt.timedelta(days=1)) -> dict[str, int]:
    """Terminal outcomes by ``Status/Reason`` over a window of the event log."""
    counts: dict[str, int] = {}
    for e in store.events_since(utcnow() - since):
        if e.status in ("Succeeded", "Failed", "Aborted"):
            key = f"{e.status}/{e.reason}" if e.reason else e.status
            counts[key] = counts.get(key, 0) + 1
    return counts
