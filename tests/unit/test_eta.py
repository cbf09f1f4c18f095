"""The start estimate by itself (``reconcile.eta``): acquisition-bound and capacity-bound
queues, too little history, and the rounding that keeps a Message steady."""

from __future__ import annotations

import datetime as dt

from falcon_ray import lifecycle as lc
from falcon_ray.model import QueueHistory, QueueTask, StartSample
from falcon_ray.reconcile import eta
from falcon_ray.spec import SupplyMode, parse_spec

NOW = dt.datetime(2026, 12, 1, 12, 0, 0)


def task(tid: int, phase, age_s: float = 0.0, timeout: int = 1200, mode: str = "flex-start") -> QueueTask:
    spec = parse_spec({"tpu_type": "v6e", "topology": "2x2", "image": "i:1", "command": ["r"],
                       "supply_mode": mode, "timeout_seconds": timeout})  # fmt: skip
    since = NOW - dt.timedelta(seconds=age_s)
    return QueueTask(tid, f"t{tid}", "alice", phase, since, None, spec, None, None, "", phase_since=since)


def history(acquire_s: float, busy_s: float = 0.0, ran_s: float | None = None, n: int = 3, timeout: float = 1200) -> QueueHistory:
    out = []
    for i in range(n):
        picked = NOW - dt.timedelta(hours=5 - i)
        running = picked + dt.timedelta(seconds=acquire_s + busy_s)
        out.append(StartSample(100 + i, SupplyMode.FLEX_START, picked, running, busy_s, timeout, ran_s))
    return QueueHistory(tuple(out))


def test_acquisition_bound_queue_starts_one_acquisition_after_another():
    holder = task(1, lc.PROVISIONING, age_s=100)
    waiting = [task(2, lc.WAITING), task(3, lc.WAITING)]
    got = eta.estimate(NOW, history(300), [holder], [], waiting, "")
    assert got == {2: 500.0, 3: 800.0}  # the holder has 200 s to go, then 300 s each


def test_capacity_bound_queue_waits_for_running_tasks_to_end_by_their_own_timeouts():
    holder = task(1, lc.CLUSTER_BUSY, age_s=50)
    running = [task(9, lc.RUNNING, age_s=100, timeout=600)]  # runs half its timeout: 200 s to go
    got = eta.estimate(NOW, history(30, busy_s=400, ran_s=600), [holder], running, [task(2, lc.WAITING, timeout=2000)], "")
    # the holder starts at 200 + 30 and runs 600 s; task 2 starts when it ends, + 30
    assert got == {2: 200 + 30 + 600 + 30}


def test_no_estimate_without_enough_history():
    assert eta.estimate(NOW, history(300, n=2), [], [], [task(2, lc.WAITING)], "") == {}
    # capacity-bound without ended runs: no basis
    assert eta.estimate(NOW, history(30, busy_s=400), [task(1, lc.CLUSTER_BUSY)], [], [task(2, lc.WAITING)], "") == {}


def test_sample_from_events_leaves_out_the_capacity_wait():
    from falcon_ray.model import TaskEvent

    at = [NOW + dt.timedelta(seconds=s) for s in (0, 10, 20, 620, 650, 1250)]
    steps = [("Pending", ""), ("Pending", "Waiting"), ("Pending", "ClusterBusy"), ("Pending", "Dispatching"),
             ("Running", ""), ("Succeeded", "")]  # fmt: skip
    events = [TaskEvent(1, a, st, rs, "") for a, (st, rs) in zip(at, steps, strict=True)]
    s = eta.sample_from_events(1, events, SupplyMode.RESERVATION, 1200)
    assert s is not None and s.capacity_wait_s == 600 and s.acquire_s == 30 and s.ran_s == 600


def test_rounding_offers_both_neighbours_nearest_first():
    assert eta.choices(20) == (0, 60) and eta.fmt_eta(0) == "<1m"
    assert eta.choices(1420) == (1500, 1200) and eta.fmt_eta(1500) == "~25m"
    assert eta.choices(8000) == (7200, 9000) and eta.fmt_eta(9000) == "~2h30m"
