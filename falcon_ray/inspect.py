"""The public inspection API: live queue and cluster state for the CLI and notebooks.

Contract
--------
Read-only. ``connect`` attaches to a running controller's Ray cluster; ``queues``
and ``clusters`` ask every live QueueActor / ClusterActor for its ``snapshot()``
(``queues`` only those of the cluster and topology asked for, chosen by actor name
before any is asked; bounded by a timeout, so a hung actor shows as an error row
instead of hanging the caller); ``timeline`` and ``outcomes`` read the task event log from the
database. ``falcon-ray queues`` and the notebooks call these functions and hold no
logic of their own. ``ApiSource`` is what the read API (``falcon_ray.api``) reads: the
Store's rows and these snapshots; a read that fails raises ``api.Unavailable``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from falcon_ray.clock import SYSTEM, Clock
from falcon_ray.store import Store


def connect(address: str | None = None, namespace: str | None = None) -> str:
    """Join the controller's Ray; returns the namespace to read. Unset values come from
    ``FALCON_RAY_ADDRESS`` / ``FALCON_NAMESPACE``, else a running ``falcon-ray demo``
    (``falcon_ray.discovery``), else ``auto`` and ``falcon``."""
    import ray

    from falcon_ray import discovery

    where = discovery.resolve(address, namespace)
    if not ray.is_initialized():
        discovery.prepare_ray_auth(where["record"])
        ray.init(address=where["address"], namespace=where["namespace"], log_to_driver=False)
    return where["namespace"]


def _asked(ask: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a snapshot call that ask for something (a plain call passes none)."""
    return {k: v for k, v in ask.items() if v is not None}


def queue_named(name: str, cluster: str | None = None, topology: str | None = None) -> bool:
    """Whether the actor ``name`` is a QueueActor (``queue/<cluster>/<topology>``) of
    ``cluster`` and ``topology`` (None: any)."""
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != "queue":
        return False
    return (cluster is None or parts[1] == cluster) and (topology is None or parts[2] == topology)


def _snapshots(
    prefix: str, namespace: str, timeout: float, keep: Callable[[str], bool] | None = None, **ask: Any
) -> list[dict[str, Any]]:
    import ray  # Ray and the actors only where live actors are read

    from actors import names

    ask = _asked(ask)
    refs = {}
    for name in names.list_falcon_actors(namespace):
        if name.startswith(prefix) and (keep is None or keep(name)):
            h = names.lookup(name, namespace)
            if h is not None:
                refs[name] = h.snapshot.remote(**ask)
    out = []
    for name, ref in sorted(refs.items()):
        try:
            out.append(ray.get(ref, timeout=timeout))
        except Exception as e:
            out.append({"actor": name, "error": f"{type(e).__name__}: {e}"[:300]})
    return out


def queue(namespace: str, cluster: str, topology: str, timeout: float = 10.0, **ask: Any) -> dict[str, Any] | None:
    """One QueueActor's snapshot; None when it does not exist, an error row when it did not
    answer. ``ask``: the part of the waiting list wanted (``QueueReconciler.snapshot``:
    ``waiting_offset`` and ``waiting_limit``, or ``task_id``)."""
    import ray

    from actors import names

    name = names.queue_name(cluster, topology)
    h = names.lookup(name, namespace)
    if h is None:
        return None
    try:
        return ray.get(h.snapshot.remote(**_asked(ask)), timeout=timeout)
    except Exception as e:
        return {"actor": name, "error": f"{type(e).__name__}: {e}"[:300]}


def queues(
    namespace: str = "falcon", timeout: float = 10.0, cluster: str | None = None, topology: str | None = None, **ask: Any
) -> list[dict[str, Any]]:
    """Every QueueActor's snapshot (of ``cluster`` and ``topology`` when given; the others are
    not asked): waiting (pick order, with position and start range: ``eta``
    {"expected_at", "latest_at"} in epoch seconds, or None; ``ask``: a page of it, as
    ``queue``), acquiring, running, leases."""
    keep = None if cluster is None and topology is None else (lambda name: queue_named(name, cluster, topology))
    return _snapshots("queue/", namespace, timeout, keep, **ask)


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


def outcomes(store: Store, since: dt.timedelta = dt.timedelta(days=1), clock: Clock = SYSTEM) -> dict[str, int]:
    """Terminal outcomes by ``Status/Reason`` over a window of the event log."""
    counts: dict[str, int] = {}
    for e in store.events_since(clock.now() - since):
        if e.status in ("Succeeded", "Failed", "Aborted"):
            key = f"{e.status}/{e.reason}" if e.reason else e.status
            counts[key] = counts.get(key, 0) + 1
    return counts


# ---- tables for the notebooks (rows of plain values; the notebooks only display them) ----


def open_store(url: str | None = None, namespace: str | None = None) -> Store:
    """The controller's database: ``url``, else ``FALCON_DB_URL``, else the database of a
    running ``falcon-ray demo`` (in ``namespace`` if given), else the default SQLite file."""
    from falcon_ray import discovery

    return Store(discovery.resolve(namespace=namespace, db_url=url)["db_url"])


def queue_depths(snaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per queue snapshot: how many tasks wait, hold the slot, recover, run, abort."""
    return [
        {
            "queue": q.get("queue") or q.get("actor"),
            "waiting": len(q.get("waiting", [])),
            "acquiring": len(q.get("acquiring", [])),
            "recovering": len(q.get("recovering", [])),
            "running": len(q.get("running", [])),
            "aborting": len(q.get("aborting", [])),
            "error": q.get("error", ""),
        }
        for q in snaps
    ]


def _age_s(t: dt.datetime | None, now: dt.datetime) -> float | None:
    return round((now - t).total_seconds(), 1) if t else None


def pools(store: Store) -> list[dict[str, Any]]:
    """Every live node-pool lease: cluster, topology, supply mode, state, holder, age and idle age."""
    by_id = {c.id: c.name for c in store.list_clusters()}
    now = store.clock()
    return [
        {
            "cluster": by_id.get(l.cluster_id, l.cluster_id),
            "topology": l.topology,
            "supply_mode": l.supply_mode,
            "pool": l.name,
            "state": l.state,
            "task_id": l.task_id,
            "age_s": _age_s(l.created_at, now),
            "idle_s": _age_s(l.idle_since, now) if l.state == "Idle" else None,
            "delete_attempts": l.delete_attempts,
        }
        for l in sorted(store.leases(), key=lambda l: (l.cluster_id, l.topology, l.name))
    ]


def idle_pools(store: Store) -> list[dict[str, Any]]:
    """The live pools kept idle (for a waiting task, or within a keep-alive window), longest idle first."""
    return sorted((p for p in pools(store) if p["state"] == "Idle"), key=lambda p: -(p["idle_s"] or 0))


def pool_counts(store: Store) -> list[dict[str, Any]]:
    """Live pools per (cluster, topology, supply mode): total, in use, idle."""
    counts: dict[tuple[str, str, str], dict[str, Any]] = {}
    for p in pools(store):
        key = (p["cluster"], p["topology"], p["supply_mode"])
        row = counts.setdefault(
            key, {"cluster": key[0], "topology": key[1], "supply_mode": key[2], "pools": 0, "in_use": 0, "idle": 0}
        )
        row["pools"] += 1
        row["in_use"] += p["state"] == "InUse"
        row["idle"] += p["state"] == "Idle"
    return [counts[k] for k in sorted(counts)]


def _recorded_ledger(c) -> dict[str, Any]:
    """The ledger the ClusterActor last wrote on the cluster row (when its actor does not answer)."""
    if c.reservation_count is None:
        return {}
    used, claimed = c.reservation_in_use or 0, c.reservation_claimed or 0
    return {
        "count": c.reservation_count,
        "in_use": used,
        "claimed": claimed,
        "free": max(0, c.reservation_count - used - claimed),
        "machine_type": c.reservation_machine_type,
    }


def fleet(store: Store, namespace: str = "falcon", timeout: float = 10.0) -> list[dict[str, Any]]:
    """One row per registered cluster: registry status, connection, the reservation's ledger
    (machine type, count, in use, claimed by Falcon, free: live from its ClusterActor, else
    as last recorded on the cluster row), pools."""
    snaps = {s.get("cluster") or s.get("actor", "").removeprefix("cluster/"): s for s in clusters(namespace, timeout)}
    live = pools(store)
    out = []
    for c in store.list_clusters():
        snap = snaps.get(c.name, {})
        res = snap.get("reservation") or _recorded_ledger(c)
        mine = [p for p in live if p["cluster"] == c.name]
        out.append(
            {
                "cluster": c.name,
                "registry_status": c.status,
                "tpu_type": c.tpu_type,
                "connected": snap.get("connected"),
                "error": snap.get("error") or snap.get("connect_error") or "",
                "reservation": c.default_reservation or None,
                "reservation_machine_type": res.get("machine_type") or c.reservation_machine_type or None,
                "reservation_count": res.get("count"),
                "reservation_in_use": res.get("in_use"),
                "reservation_claimed": res.get("claimed"),  # by Falcon's pools, not yet counted by GKE
                "reservation_free": res.get("free"),
                "reservation_headroom": res["count"] - res["in_use"] if res else None,
                "falcon_pools": len(mine),
                "idle_pools": sum(1 for p in mine if p["state"] == "Idle"),
                "jobs": len(snap.get("jobs") or {}),
                "ops_queued": snap.get("ops_queued"),
            }
        )
    return out


def outcomes_by_cluster(store: Store, since: dt.timedelta = dt.timedelta(days=1)) -> list[dict[str, Any]]:
    """Terminal outcomes per cluster and ``Status/Reason`` over a window of the event log.

    A task that failed before it was given a cluster (an invalid spec, say) counts under ``-``."""
    ends = [e for e in store.events_since(store.clock() - since) if e.status in ("Succeeded", "Failed", "Aborted")]
    tasks = {t.id: t for t in store.get_tasks({e.task_id for e in ends})}
    by_id = {c.id: c.name for c in store.list_clusters()}
    counts: dict[tuple[str, str], int] = {}
    for e in ends:
        t = tasks.get(e.task_id)
        cluster = by_id.get(t.cluster_id or "", "-") if t else "-"
        key = (cluster, f"{e.status}/{e.reason}" if e.reason else e.status)
        counts[key] = counts.get(key, 0) + 1
    return [{"cluster": k[0], "outcome": k[1], "tasks": n} for k, n in sorted(counts.items())]


def newest_task_id(store: Store) -> int | None:
    recent = store.recent_tasks(1)
    return recent[0].id if recent else None


def task(store: Store, task_id: int) -> dict[str, Any]:
    """One task as an operator asks about it: state, cluster, pool, Job name and where its logs go."""
    from falcon_ray import render

    t = store.get_task(task_id)
    if t is None:
        raise KeyError(f"no task {task_id}")
    cluster = next((c for c in store.list_clusters() if c.id == t.cluster_id), None) if t.cluster_id else None
    bucket = render.bucket_name(cluster) if cluster else ""
    disruptions = store.disruptions([t.id]).get(t.id, ())
    return {
        "id": t.id,
        "name": t.name,
        "actor": t.actor,
        "status": t.status,
        "reason": t.reason,
        "message": t.message,
        "cluster": cluster.name if cluster else None,
        "node_pool": t.node_pool_name,
        "job_name": render.job_name(t.id, len(disruptions)) if t.dispatched_at or t.job_uid else None,
        "attempt": len(disruptions),  # 0: the first run; one more per run the fleet ended
        "disruptions": [
            {"attempt": d.attempt, "kind": d.kind, "node": d.node, "job": d.job, "detail": d.detail, "at": d.at}
            for d in disruptions
        ],
        "log_prefix": f"gs://{bucket}/logs/{t.id}/" if bucket else None,
        "log_path_pattern": render.log_path(cluster, t.id, "<pod>") if cluster else None,
        "created_at": t.created_at,
        "dispatched_at": t.dispatched_at,
        "finished_at": t.finished_at,
    }


def time_in_phases(store: Store, task_id: int) -> list[dict[str, Any]]:
    """Seconds the task spent in each ``Status/Reason``, in order of first entry; a live
    task's current phase counts up to now, a terminal one counts zero."""
    events = store.events(task_id)
    now = store.clock()
    totals: dict[str, float] = {}
    for i, e in enumerate(events):
        label = f"{e.status}/{e.reason}" if e.reason else e.status
        if i + 1 < len(events):
            end = events[i + 1].at
        else:
            end = e.at if e.status in ("Succeeded", "Failed", "Aborted") else now
        totals[label] = totals.get(label, 0.0) + max(0.0, (end - e.at).total_seconds())
    return [{"phase": k, "seconds": round(v, 3)} for k, v in totals.items()]


class ApiSource:
    """The read API's data (``falcon_ray.api.Source``): the rows of ``store``, the snapshots
    of the actors in ``namespace`` (each call bounded by ``timeout``). Read-only."""

    def __init__(self, store: Store, namespace: str, timeout: float = 5.0) -> None:
        self.store, self.namespace, self.timeout = store, namespace, timeout

    def _read(self, what: str, read):
        from falcon_ray.api import Unavailable

        try:
            return read()
        except Exception as e:
            raise Unavailable(f"{what}: {type(e).__name__}: {e}") from None

    def get_task(self, task_id: int):
        return self._read("database", lambda: self.store.get_task(task_id))

    def clusters(self):
        return self._read("database", self.store.list_clusters)

    def since(self, task):
        return self._read("database", lambda: self.store.phase_entered([task.id]).get((task.id, task.phase)))

    def disruptions(self, task_id: int):
        return self._read("database", lambda: self.store.disruptions([task_id]).get(task_id, ()))

    def leases(self):
        return self._read("database", self.store.leases)

    def queue(self, cluster: str, topology: str, task_id: int | None = None):
        return self._read("Ray", lambda: queue(self.namespace, cluster, topology, self.timeout, task_id=task_id))

    def queues(self, offset: int = 0, limit: int | None = None, cluster: str | None = None, topology: str | None = None):
        return self._read(
            "Ray", lambda: queues(self.namespace, self.timeout, cluster, topology, waiting_offset=offset or None, waiting_limit=limit)
        )

    def cluster_snapshots(self):
        def read():
            return {s.get("cluster") or s.get("actor", "").removeprefix("cluster/"): s for s in clusters(self.namespace, self.timeout)}

        return self._read("Ray", read)
