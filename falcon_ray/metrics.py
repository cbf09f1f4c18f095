"""Falcon's Prometheus metrics, recorded through ``ray.util.metrics``.

Contract
--------
Every metric Falcon exports is declared here, once, with its labels; actors call
the small functions below and never touch ``ray.util.metrics`` themselves. Ray's
own metrics export serves them (Ray prefixes each name with ``ray_``), so there is
no extra HTTP server. Outside a Ray worker (unit tests, the CLI) every function is a
cheap no-op, so decisions stay testable without Ray. Names follow Prometheus
conventions: ``_total`` for counters, ``_seconds`` for durations.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_metrics: dict[str, Any] = {}

TIME_BUCKETS = [0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 3600, 7200, 21600, 86400]
POLL_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5]

# name -> (kind, description, tag keys[, buckets])
DEFINITIONS: dict[str, tuple] = {
    "falcon_queue_tasks": ("gauge", "Tasks per queue by state (waiting, acquiring, recovering, running, aborting)", ("cluster", "topology", "state")),
    "falcon_pending_reason_seconds": ("histogram", "Time a task spent in one Pending reason", ("cluster", "topology", "reason"), TIME_BUCKETS),
    "falcon_time_to_running_seconds": ("histogram", "Time from task creation to Running", ("cluster", "topology"), TIME_BUCKETS),
    "falcon_task_transitions_total": ("counter", "Task phase changes written by Falcon", ("cluster", "topology", "status", "reason")),
    "falcon_task_outcomes_total": ("counter", "Tasks that reached a terminal status", ("cluster", "topology", "status", "reason")),
    "falcon_node_pools_alive": ("gauge", "Falcon node pools that exist in the cluster", ("cluster",)),
    "falcon_node_pools_idle": ("gauge", "Falcon node pools kept idle for a waiting task", ("cluster",)),
    "falcon_node_pools_created_total": ("counter", "Node pools created, by supply mode", ("cluster", "supply_mode")),
    "falcon_node_pools_deleted_total": ("counter", "Node pools deleted", ("cluster",)),
    "falcon_node_pools_handed_over_total": ("counter", "Pools kept after a task and reused by the next", ("cluster",)),
    "falcon_reservation_headroom_hosts": ("gauge", "Reservation count - inUseCount, in hosts", ("cluster", "reservation")),
    "falcon_gke_operations_total": ("counter", "Node-pool operations by outcome (done, queued=retried, failed)", ("cluster", "kind", "result", "error_kind")),
    "falcon_watch_relists_total": ("counter", "Job watch full re-lists (start, 410 Gone)", ("cluster",)),
    "falcon_watch_reconnects_total": ("counter", "Job watch reconnects after a dropped stream", ("cluster",)),
    "falcon_poll_duration_seconds": ("histogram", "Duration of one intake poll", (), POLL_BUCKETS),
    "falcon_poll_rows_total": ("counter", "Rows read by intake polls", ()),
    "falcon_orphan_pools_deleted_total": ("counter", "Leaked Falcon pools found by the orphan scan and deleted", ("cluster",)),
    "falcon_idle_tpu_chip_seconds_total": ("counter", "Chip-seconds of Falcon pools with no running Job", ("cluster",)),
    "falcon_disruptions_total": ("counter", "Runs the fleet ended (maintenance, repair, reclaim, ...), by kind", ("cluster", "kind")),
    "falcon_recoveries_total": ("counter", "New attempts started after a disruption", ("cluster", "topology")),
    "falcon_queue_tick_seconds": ("histogram", "Duration of one QueueActor reconcile", ("cluster", "topology"), POLL_BUCKETS),
}


def _in_ray() -> bool:
    try:
        import ray

        return ray.is_initialized()
    except Exception:
        return False


def _get(name: str):
    m = _metrics.get(name)
    if m is not None:
        return m
    if not _in_ray():
        return None
    from ray.util import metrics as rm

    with _lock:
        m = _metrics.get(name)
        if m is None:
            kind, desc, tags, *rest = DEFINITIONS[name]
            if kind == "gauge":
                m = rm.Gauge(name, description=desc, tag_keys=tags)
            elif kind == "counter":
                m = rm.Counter(name, description=desc, tag_keys=tags)
            else:
                m = rm.Histogram(name, description=desc, boundaries=rest[0], tag_keys=tags)
            _metrics[name] = m
    return m


def _set(name: str, value: float, **tags: str) -> None:
    m = _get(name)
    if m is not None:
        m.set(value, tags=tags or None)


def _inc(name: str, value: float = 1.0, **tags: str) -> None:
    m = _get(name)
    if m is not None and value > 0:
        m.inc(value, tags=tags or None)


def _observe(name: str, value: float, **tags: str) -> None:
    m = _get(name)
    if m is not None:
        m.observe(value, tags=tags or None)


# ---- call sites --------------------------------------------------------------------


def queue_depth(cluster: str, topology: str, tasks, waiting: int = 0) -> None:
    """``tasks``: the queue's tasks (or those not Waiting, with the ``waiting`` count)."""
    from falcon_ray import lifecycle as lc

    counts = {"waiting": waiting, "acquiring": 0, "recovering": 0, "running": 0, "aborting": 0}
    for t in tasks:
        if t.phase == lc.WAITING:
            counts["waiting"] += 1
        elif t.phase in lc.ACQUIRING_PHASES:
            counts["acquiring"] += 1
        elif t.phase == lc.RECOVERING:
            counts["recovering"] += 1
        elif t.phase == lc.RUNNING:
            counts["running"] += 1
        elif t.phase == lc.ABORTING:
            counts["aborting"] += 1
    for state, n in counts.items():
        _set("falcon_queue_tasks", n, cluster=cluster, topology=topology, state=state)


def pending_reason_time(cluster: str, topology: str, reason: str, seconds: float) -> None:
    _observe("falcon_pending_reason_seconds", seconds, cluster=cluster, topology=topology, reason=reason)


def time_to_running(cluster: str, topology: str, seconds: float) -> None:
    _observe("falcon_time_to_running_seconds", seconds, cluster=cluster, topology=topology)


def task_transition(cluster: str, topology: str, to) -> None:
    from falcon_ray import lifecycle as lc

    tags = dict(cluster=cluster, topology=topology, status=str(to.status), reason=str(to.reason))
    _inc("falcon_task_transitions_total", **tags)
    if to.status in lc.TERMINAL:
        _inc("falcon_task_outcomes_total", **tags)


def disruption(cluster: str, kind: str) -> None:
    _inc("falcon_disruptions_total", cluster=cluster, kind=kind)


def recovery(cluster: str, topology: str) -> None:
    _inc("falcon_recoveries_total", cluster=cluster, topology=topology)


def lease_moved(cluster: str, topology: str, src, dst) -> None:
    from falcon_ray.lifecycle import LeaseState

    if dst == LeaseState.DELETED:
        _inc("falcon_node_pools_deleted_total", cluster=cluster)
    if src == LeaseState.IDLE and dst in (LeaseState.READY, LeaseState.IN_USE):
        _inc("falcon_node_pools_handed_over_total", cluster=cluster)


def pool_created(cluster: str, supply_mode: str) -> None:
    _inc("falcon_node_pools_created_total", cluster=cluster, supply_mode=supply_mode)


def pools_alive(cluster: str, alive: int, idle: int | None = None) -> None:
    _set("falcon_node_pools_alive", alive, cluster=cluster)
    if idle is not None:
        _set("falcon_node_pools_idle", idle, cluster=cluster)


def reservation_headroom(cluster: str, reservation: str, hosts: int) -> None:
    _set("falcon_reservation_headroom_hosts", hosts, cluster=cluster, reservation=reservation)


def pool_op(cluster: str, kind: str, state: str, error_kind: str) -> None:
    _inc("falcon_gke_operations_total", cluster=cluster, kind=kind, result=state, error_kind=error_kind or "none")


def watch_relist(cluster: str) -> None:
    _inc("falcon_watch_relists_total", cluster=cluster)


def watch_reconnects(cluster: str, n: int) -> None:
    _inc("falcon_watch_reconnects_total", n, cluster=cluster)


def poll(seconds: float, rows: int) -> None:
    _observe("falcon_poll_duration_seconds", seconds)
    _inc("falcon_poll_rows_total", rows)


def orphans(cluster: str, deleted: int) -> None:
    _inc("falcon_orphan_pools_deleted_total", deleted, cluster=cluster)


def idle_chip_seconds(cluster: str, chip_seconds: float) -> None:
    _inc("falcon_idle_tpu_chip_seconds_total", chip_seconds, cluster=cluster)


def queue_tick(cluster: str, topology: str, seconds: float) -> None:
    _observe("falcon_queue_tick_seconds", seconds, cluster=cluster, topology=topology)
