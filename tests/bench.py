"""Benchmarks that print figures (`make bench`); nothing here asserts a speed.

1. Database statements one task's whole lifecycle costs: every Falcon actor counts the
   statements its Store executes; the figure is the count over one task's life minus
   what the same actors spend idling (polls and ticks) over the same time.
2. Intake poll cost against a growing pile of finished rows (1,000 vs 100,000): the
   poll reads only live rows through ``ix_jobs_status_cluster``, so it stays flat.
3. Wall time of one task from submit to Succeeded on the simulated fleet.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import ray

from actors import names
from falcon_ray.demo import DemoRun, demo_settings
from falcon_ray.store import Store
from falcon_ray.store import tables as t
from falcon_ray.store.migrate import upgrade
from tests.harness.e2e import make_fleet, spec

SPEC = spec("2x2", 1)
FLEET = make_fleet(with_b=False, seed=1)


def _statements(run: DemoRun) -> int:
    total = 0
    for name in names.list_falcon_actors(run.settings.namespace):
        h = names.lookup(name, run.settings.namespace)
        total += ray.get(h.snapshot.remote(), timeout=30)["db_statements"]
    return total


def bench_lifecycle(db_url: str | None = None) -> dict[str, float]:
    run = DemoRun(FLEET, demo_settings(), db_url).start()
    try:
        warm = run.submit("warmup", SPEC, "warmup")  # start every actor first
        assert run.wait_done(60), "warm-up task did not finish"
        time.sleep(2)
        s0, t0 = _statements(run), time.monotonic()
        time.sleep(6)
        idle_rate = (_statements(run) - s0) / (time.monotonic() - t0)
        s1, t1 = _statements(run), time.monotonic()
        tid = run.submit("alice", SPEC, "measured")
        assert run.wait_done(60), "task did not finish"
        # wait for the lease to reach Deleted: that bookkeeping is part of the lifecycle too
        run.wait(lambda: all(l.state == "Deleted" for l in run.store.leases(live_only=False)), 20)
        wall = time.monotonic() - t1
        used = _statements(run) - s1
        status = run.store.get_task(tid).status
        events = len(run.store.events(tid))
        del warm
    finally:
        run.stop()
    return {
        "status": status,
        "statements_in_window": used,
        "idle_statements_per_s": round(idle_rate, 1),
        "window_s": round(wall, 1),
        "statements_for_the_task": round(used - idle_rate * wall),
        "events": events,
    }


def bench_poll(rows: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{d}/poll.db"
        upgrade(url, with_jobs_table=True)
        store = Store(url)
        now = store.clock()
        batch = [
            dict(name="", actor="a", spec="{}", status="Succeeded", reason="", message="", created_at=now, updated_at=now)
            for _ in range(10_000)
        ]
        with store.engine.begin() as c:
            for _ in range(rows // 10_000 or 1):
                c.execute(t.jobs.insert(), batch[: min(rows, 10_000)])
        for i in range(20):
            store.submit_task("b", "{}", name=f"live-{i}")
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            store.intake(500)
            times.append(time.perf_counter() - t0)
        store.dispose()
    return {"finished_rows": rows, "poll_median_ms": round(statistics.median(times) * 1000, 3)}


def main() -> None:
    print("== intake poll cost vs finished rows (SQLite)")
    for rows in (1_000, 100_000):
        print("  ", bench_poll(rows))
    print("== one task's lifecycle on the simulated fleet (SQLite)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print("  ", bench_lifecycle())
    if len(sys.argv) > 1:
        print(f"== one task's lifecycle on {sys.argv[1].split('@')[-1]}")
        print("  ", bench_lifecycle(sys.argv[1]))
    ray.shutdown()


if __name__ == "__main__":
    main()
