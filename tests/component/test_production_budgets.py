"""Budgets at their production values, in virtual time: a queue on a ManualClock
(tests/harness/fakes.py ``QueueBench``, ``Settings()`` defaults) waits out a 10-minute
node-pool timeout and a 6-hour capacity budget in a fraction of a second."""

from __future__ import annotations

import re

from falcon_ray.config import Settings
from falcon_ray.model import ClusterView, OpView, PoolView
from tests.harness.fakes import QueueBench

STOCKOUT = "GCE_STOCKOUT: ZONE_RESOURCE_POOL_EXHAUSTED: the zone does not have enough resources"
STEP_S = 30.0


def test_the_production_settings_are_the_ones_exercised():
    s = Settings()
    assert (s.node_pool_timeout_s, s.capacity_budget_s) == (600.0, 21600.0)


def test_a_pool_that_never_comes_up_fails_at_the_ten_minute_node_pool_timeout(tmp_path):
    b = QueueBench(f"sqlite:///{tmp_path / 'q.db'}")
    tid = b.submit(supply_mode="on-demand")
    b.step(ClusterView())
    (call,) = b.port.took("ensure_pool")
    name = call[1]
    t0 = b.clock.monotonic()
    provisioning = ClusterView(pools={name: PoolView(name, "PROVISIONING", 0, 0)}, ops={name: OpView("create", "running", 1)})
    for _ in range(200):
        b.step(provisioning, advance=STEP_S)
        if b.phase(tid).startswith("Failed"):
            break
    waited = b.clock.monotonic() - t0
    assert b.phase(tid) == "Failed/NodePoolTimeout", (b.phase(tid), b.task(tid).message)
    assert 600 <= waited <= 600 + 4 * STEP_S, waited


def test_a_stockout_is_retried_for_the_six_hours_of_the_capacity_budget_then_fails(tmp_path):
    b = QueueBench(f"sqlite:///{tmp_path / 'q.db'}")
    s = b.settings
    tid = b.submit(supply_mode="on-demand")
    b.step(ClusterView())
    t0, refusals, asked = b.clock.monotonic(), 0, []
    for _ in range(2000):
        asked += [c[1] for c in b.port.took("ensure_pool")]
        if asked:
            name = asked.pop()
            view = ClusterView(pools={name: PoolView(name, "ERROR", 0, 0, STOCKOUT, "stockout")},
                               ops={name: OpView("create", "failed", 1, "stockout", STOCKOUT)})  # fmt: skip
            refusals += 1
            if refusals == 1:
                t0 = b.clock.monotonic()  # the budget counts from the first refusal
            b.step(view)
        else:
            b.step(ClusterView(), advance=STEP_S)
        if b.phase(tid).startswith("Failed"):
            break
    waited = b.clock.monotonic() - t0
    t = b.task(tid)
    assert str(t.phase) == "Failed/NodePoolFailed", (t.phase, t.message)
    assert s.capacity_budget_s <= waited <= s.capacity_budget_s + 2 * STEP_S, waited
    # 60 s, then doubling to the 30-minute ceiling: 60+120+240+480+960+1800*9 ~ 6 h
    assert 10 <= refusals <= 16, refusals
    assert re.search(rf"over {refusals} refusal\(s\)", t.message) and "ZONE_RESOURCE_POOL_EXHAUSTED" in t.message, t.message
