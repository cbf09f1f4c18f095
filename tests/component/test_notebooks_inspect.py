"""The tables the notebooks display, computed by falcon_ray.inspect from the database
alone (no Ray): outcomes per cluster, pools by topology and supply mode, idle pools,
one task's Job and log prefix, and its time in each phase.
"""

from __future__ import annotations

import datetime as dt

from falcon_ray import inspect
from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Reason

T0 = dt.datetime(2026, 3, 1, 12, 0, 0)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def _walk(store, clock, task_id, cluster_id, steps):
    prev = lc.NEW
    for phase, seconds in steps:
        fields = {"cluster_id": cluster_id} if prev == lc.NEW and phase == lc.WAITING else {}
        if phase == lc.DISPATCHING:
            fields["dispatched_at"] = clock()
        assert store.transition(task_id, prev, phase, "", **fields)
        prev = phase
        clock.advance(seconds)


def test_notebook_tables_from_the_database(store):
    clock = Clock()
    store.clock = clock
    a = store.add_cluster("edge-a", "proj-a", "us-east5-b", "v6e", gcs_bucket="gs://logs-a/", default_reservation="res-a")
    b = store.add_cluster("edge-b", "proj-b", "us-central1-b", "v6e")
    spec = {"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["run"]}

    ok = store.submit_task("alice", spec, name="ok")
    oom = store.submit_task("bob", spec, name="oom")
    bad = store.submit_task("carol", "{not json", name="bad")
    live = store.submit_task("dave", spec, name="live")
    clock.advance(1)
    _walk(store, clock, ok, a.id, [(lc.WAITING, 2), (lc.PROVISIONING, 30), (lc.DISPATCHING, 3), (lc.RUNNING, 60), (lc.SUCCEEDED, 0)])
    _walk(store, clock, oom, b.id, [(lc.WAITING, 1), (lc.DISPATCHING, 1), (lc.RUNNING, 5), (lc.failed(Reason.JOB_FAILED), 0)])
    assert store.transition(bad, lc.NEW, lc.failed(Reason.INVALID_SPEC), "not JSON")
    _walk(store, clock, live, a.id, [(lc.WAITING, 4), (lc.PROVISIONING, 0)])

    assert inspect.outcomes_by_cluster(store, dt.timedelta(hours=1)) == [
        {"cluster": "-", "outcome": "Failed/InvalidSpec", "tasks": 1},
        {"cluster": "edge-a", "outcome": "Succeeded", "tasks": 1},
        {"cluster": "edge-b", "outcome": "Failed/JobFailed", "tasks": 1},
    ]
    clock.advance(7200)
    assert inspect.outcomes_by_cluster(store, dt.timedelta(hours=1)) == []
    assert inspect.newest_task_id(store) == live

    info = inspect.task(store, ok)
    assert info["cluster"] == "edge-a" and info["status"] == "Succeeded"
    assert info["job_name"] == f"falcon-task-{ok}"
    assert info["log_prefix"] == f"gs://logs-a/logs/{ok}/"
    assert info["log_path_pattern"] == f"gs://logs-a/logs/{ok}/<pod>.log"
    other = inspect.task(store, live)
    assert other["job_name"] is None and other["log_prefix"] == f"gs://logs-a/logs/{live}/"
    assert inspect.task(store, oom)["log_prefix"] is None  # edge-b has no bucket
    store.record_disruption(ok, 0, "maintenance", "node-0", f"falcon-task-{ok}", "drained")  # as if it had run twice
    again = inspect.task(store, ok)
    assert again["attempt"] == 1 and again["job_name"] == f"falcon-task-{ok}-a1"
    assert [(d["kind"], d["node"]) for d in again["disruptions"]] == [("maintenance", "node-0")]

    phases = {r["phase"]: r["seconds"] for r in inspect.time_in_phases(store, ok)}
    assert phases == {
        "Pending": 1.0,
        "Pending/Waiting": 2.0,
        "Pending/Provisioning": 30.0,
        "Pending/Dispatching": 3.0,
        "Running": 60.0,
        "Succeeded": 0.0,
    }
    live_phases = inspect.time_in_phases(store, live)
    assert [r["phase"] for r in live_phases] == ["Pending", "Pending/Waiting", "Pending/Provisioning"]
    assert live_phases[-1]["seconds"] == 7200.0  # the current phase counts up to now

    # pools: one in use, one idle for 90 s, one deleted (not listed)
    used = store.create_lease(a.id, "2x2", "falcon-t1-2x2", "reservation", live)
    assert store.move_lease(used.id, LeaseState.REQUESTED, LeaseState.CREATING)
    assert store.move_lease(used.id, LeaseState.CREATING, LeaseState.READY)
    assert store.move_lease(used.id, LeaseState.READY, LeaseState.IN_USE)
    idle = store.create_lease(a.id, "2x2", "falcon-t2-2x2", "flex-start", None)
    for src, dst in ((LeaseState.REQUESTED, LeaseState.CREATING), (LeaseState.CREATING, LeaseState.READY),
                     (LeaseState.READY, LeaseState.IN_USE), (LeaseState.IN_USE, LeaseState.IDLE)):  # fmt: skip
        assert store.move_lease(idle.id, src, dst)
    gone = store.create_lease(b.id, "2x4", "falcon-t3-2x4", "on-demand", None)
    assert store.move_lease(gone.id, LeaseState.REQUESTED, LeaseState.DELETING)
    assert store.move_lease(gone.id, LeaseState.DELETING, LeaseState.DELETED)
    clock.advance(90)

    assert {p["pool"] for p in inspect.pools(store)} == {"falcon-t1-2x2", "falcon-t2-2x2"}
    [row] = inspect.idle_pools(store)
    assert row["pool"] == "falcon-t2-2x2" and row["idle_s"] == 90.0 and row["cluster"] == "edge-a"
    assert inspect.pool_counts(store) == [
        {"cluster": "edge-a", "topology": "2x2", "supply_mode": "flex-start", "pools": 1, "in_use": 0, "idle": 1},
        {"cluster": "edge-a", "topology": "2x2", "supply_mode": "reservation", "pools": 1, "in_use": 1, "idle": 0},
    ]


def test_queue_depths_counts_each_list_and_keeps_unreachable_queues():
    snaps = [
        {"queue": "queue/edge-a/2x2", "waiting": [{}, {}], "acquiring": [{}], "running": [{}, {}, {}], "aborting": []},
        {"actor": "queue/edge-b/2x4", "error": "GetTimeoutError: timed out"},
    ]
    assert inspect.queue_depths(snaps) == [
        {"queue": "queue/edge-a/2x2", "waiting": 2, "acquiring": 1, "recovering": 0, "running": 3, "aborting": 0, "error": ""},
        {"queue": "queue/edge-b/2x4", "waiting": 0, "acquiring": 0, "recovering": 0, "running": 0, "aborting": 0, "error": "GetTimeoutError: timed out"},
    ]
