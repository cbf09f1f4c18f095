"""The start estimate in Waiting messages, checked against when tasks really started.

A steady queue on a QueueBench (SQLite, fake clock, no Ray): a reservation of one slice,
so one task runs at a time and each hands its pool to the next; a pool takes 120 s to
create, a Job's pods 10 to 40 s to start, and each task runs about half its own
``timeout_seconds`` (300 s or 900 s alternating, each drawn within +-10%; seeded). At every tick the estimate the queue's decision makes for
every Waiting task is recorded; when all have run, each estimate is compared with the
task's real start (its Running event). The report is printed (``pytest -s``) and the
worst error must stay within 2 minutes plus 15% of the wait (the runs alone vary by
10%), and the mean within 5% of the mean wait.
"""

from __future__ import annotations

import datetime as dt
import random
import shutil
import statistics

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray import scheduling
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import ClusterView, JobView, PoolView, ReservationView
from falcon_ray.reconcile import eta
from falcon_ray.store.migrate import upgrade
from tests.harness.fakes import QueueBench

CREATE_S, TICK_S = 120, 10


class OneSliceWorld:
    """What the cluster does with what the queue asked for (through the FakePort's calls)."""

    def __init__(self, b: QueueBench) -> None:
        self.b = b
        self.pools: dict[str, float] = {}  # name -> created at (seconds on the bench clock)
        self.jobs: dict[int, float] = {}  # task id -> submitted at
        self.run_s: dict[int, float] = {}
        self.pod_s: dict[int, float] = {}

    def now(self) -> float:
        return (self.b.clock() - self.b.clock.now().replace(hour=0, minute=0, second=0)).total_seconds()

    def view(self) -> ClusterView:
        now = self.now()
        for call in self.b.port.calls:
            if call[0] == "ensure_pool":
                self.pools.setdefault(call[1], now)
            elif call[0] == "delete_pool":
                self.pools.pop(call[1], None)
            elif call[0] == "submit_job":
                self.jobs.setdefault(int(call[1].rsplit("-", 1)[1]), now)
        self.b.port.calls.clear()
        pools = {}
        for name, at in self.pools.items():
            up = now - at >= CREATE_S
            pools[name] = PoolView(name, "RUNNING" if up else "PROVISIONING", int(up), int(up))
        jobs = {}
        for tid, at in self.jobs.items():
            age = now - at
            pod = self.pod_s[tid]
            phase = "Pending" if age < pod else "Running" if age < pod + self.run_s[tid] else "Succeeded"
            ready = int(phase == "Running")
            jobs[tid] = JobView(tid, f"falcon-task-{tid}", "falcon-jobs", f"uid-{tid}", phase, ready, ready, 1)
        return ClusterView(pools=pools, jobs=jobs, reservation=ReservationView(count=1, in_use=len(self.pools)))


@pytest.fixture
def bench(tmp_path_factory, tmp_path) -> QueueBench:
    template = tmp_path_factory.mktemp("template") / "q.db"
    upgrade(f"sqlite:///{template}", with_jobs_table=True)
    shutil.copy(template, tmp_path / "q.db")
    return QueueBench(f"sqlite:///{tmp_path / 'q.db'}", migrate=False, node_pool_timeout_s=600)


def _estimates(b: QueueBench) -> dict[int, float]:
    """The estimate the queue's last decision made, per Waiting task (absolute seconds)."""
    q = b.queue.last_state
    assert q is not None
    holders = [t for t in q.tasks if t.phase in lc.ACQUIRING_PHASES]
    running = [t for t in q.tasks if t.phase == lc.RUNNING]
    order = scheduling.pick_order([t for t in q.tasks if t.phase == lc.WAITING], q.last_granted)
    pools = eta.Pools(
        idle=[x for x in q.leases if x.state == LeaseState.IDLE],
        held={x.task_id: x for x in q.leases if x.state in lc.LEASE_HELD and x.task_id is not None},
    )
    return eta.estimate(b.clock(), q.history, holders, running, order, q.cluster.default_reservation, pools)


def test_steady_queue_estimates_match_real_starts(bench):
    world, rng = OneSliceWorld(bench), random.Random(7)
    ids = []
    for i in range(12):
        timeout = 600 if i % 2 == 0 else 1800
        tid = bench.submit("alice", supply_mode="reservation", timeout_seconds=timeout)
        world.run_s[tid], world.pod_s[tid] = timeout / 2 * rng.uniform(0.9, 1.1), rng.uniform(10, 40)
        ids.append(tid)
    predictions: list[tuple[int, float, float]] = []  # (task, at, predicted start), seconds
    first_latest: dict[int, float] = {}  # the first latest start the snapshot showed, epoch seconds
    shown, texts, t0 = set(), {t: [] for t in ids}, world.now()
    for _ in range(2000):
        bench.step(world.view(), advance=TICK_S)
        now = world.now()
        for tid, seconds in _estimates(bench).items():
            predictions.append((tid, now, now + seconds))
        for w in bench.queue.snapshot()["waiting"]:
            if w["eta"] is not None:
                assert w["eta"]["latest_at"] >= w["eta"]["expected_at"]
                if w["id"] not in first_latest and len(bench.queue.scores) < eta.MIN_SCORES:
                    # before the queue has scored enough starts the bound is the prior's: a range, not a point
                    width = w["eta"]["latest_at"] - w["eta"]["expected_at"]
                    assert width >= eta.PRIOR_SCORE * eta.SCALE_S - 0.2, (w["id"], width)
                first_latest.setdefault(w["id"], w["eta"]["latest_at"])
        for t in ids:
            row = bench.task(t)
            if row.phase == lc.WAITING and (not texts[t] or texts[t][-1] != row.message):
                texts[t].append(row.message)
        shown |= {t for t in ids if "expected to start around" in bench.task(t).message and "UTC at the latest" in bench.task(t).message}
        if all(bench.task(t).terminal for t in ids):
            break
    assert all(bench.phase(t) == "Succeeded" for t in ids), [bench.phase(t) for t in ids]
    # the range: each task the snapshot gave a latest start reached Running by it, and the
    # queue scored each first estimate against its start
    epoch = {t: next(e.at for e in bench.store.events(t) if e.status == "Running").replace(tzinfo=dt.UTC).timestamp() for t in ids}
    assert first_latest and all(epoch[t] <= x for t, x in first_latest.items()), first_latest
    assert len(bench.queue.scores) == len(first_latest)
    day = bench.clock.now().replace(hour=0, minute=0, second=0)
    started = {
        t: next((e.at - day).total_seconds() for e in bench.store.events(t) if e.status == "Running") for t in ids
    }
    errors = [abs(pred - started[t]) for t, _, pred in predictions]
    bounds = [120.0 + 0.15 * (started[t] - at) for t, at, _ in predictions]
    mae, worst = statistics.mean(errors), max(errors)
    waits = [started[t] - at for t, at, _ in predictions]
    print(
        f"\nETA on a steady one-slice queue: {len(errors)} estimates of {len({p[0] for p in predictions})} tasks, "
        f"waits up to {max(waits) / 60:.0f} min; mean absolute error {mae:.0f} s, worst {worst:.0f} s"
    )
    assert len({p[0] for p in predictions}) >= 8, "history should allow estimates from the third start on"
    assert shown >= {p[0] for p in predictions} - {ids[-1]}, "the estimate is in the Waiting messages"
    over = [(t, at, pred, started[t]) for (t, at, pred), e, bd in zip(predictions, errors, bounds, strict=True) if e > bd]
    assert not over, over[:5]
    assert mae <= 0.05 * statistics.mean(waits), (mae, statistics.mean(waits))
    # few Message writes: each position change, and about one per rounding step of the countdown
    for n, t in enumerate(ids):
        wait_min = (started[t] - t0) / 60
        assert len(texts[t]) <= 2 * n + wait_min / 5 + 3, (t, len(texts[t]), wait_min, texts[t][-5:])
    print(f"Waiting Message texts per task: {[len(texts[t]) for t in ids]}")

    # the history a restarted queue reads back from the event log is the one it kept
    kept = bench.queue.last_state.history.samples
    bench.restart()
    bench.step(world.view(), advance=TICK_S)
    read = bench.queue.last_state.history.samples
    assert len(kept) == 12 and [(x.task_id, x.acquire_s, x.ran_s) for x in read] == [
        (x.task_id, x.acquire_s, x.ran_s) for x in kept
    ]


def test_no_estimate_without_history(bench):
    world = OneSliceWorld(bench)
    for _ in range(3):
        tid = bench.submit("alice", supply_mode="reservation", timeout_seconds=600)
        world.run_s[tid], world.pod_s[tid] = 300, 20
    bench.step(world.view(), advance=TICK_S)
    waiting = [t for t in bench.queue.last_state.tasks if t.phase == lc.WAITING]
    assert waiting and all("expected to start" not in t.message for t in waiting)
    assert _estimates(bench) == {}
    assert all(w["eta"] is None for w in bench.queue.snapshot()["waiting"])
