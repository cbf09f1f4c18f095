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
    assert (s.node_pool_timeout_s, s.capacity_budget_s, s.pool_release_limit) == (3600.0, 21600.0, 3)


def test_a_pool_that_never_comes_up_is_given_back_each_hour_then_fails_node_pool_timeout(tmp_path):
    """GKE accepts every create and never brings a control plane up: each hour the pool is
    given back and the task asks again at the head of its queue, three times; the fourth
    slow create ends it NodePoolTimeout, four hours of GKE's time after the first."""
    b = QueueBench(f"sqlite:///{tmp_path / 'q.db'}")
    tid = b.submit(supply_mode="on-demand")
    b.step(ClusterView())
    t0, start, pools = b.clock.monotonic(), b.clock.now(), []
    for _ in range(2000):
        pools += [c[1] for c in b.port.took("ensure_pool")]
        view = ClusterView(pools={pools[-1]: PoolView(pools[-1], "PROVISIONING", 0, 0)}, ops={pools[-1]: OpView("create", "running", 1)})
        b.step(view, advance=STEP_S)
        if b.phase(tid).startswith("Failed"):
            break
    waited = b.clock.monotonic() - t0
    t = b.task(tid)
    assert str(t.phase) == "Failed/NodePoolTimeout", (t.phase, t.message)
    given_back = [(e.at - start).total_seconds() for e in b.store.events(tid) if e.reason == "Waiting"][1:]  # [0]: intake
    assert len(set(pools)) == 4 and len(given_back) == 3, (pools, given_back)
    for n, at in enumerate(given_back, 1):  # each create had its whole hour
        assert n * 3600 <= at <= n * (3600 + 4 * STEP_S), given_back
    assert 4 * 3600 <= waited <= 4 * (3600 + 4 * STEP_S), waited
    assert "(1h)" in t.message or "(60m)" in t.message, t.message
    assert "gave 3 earlier node pool(s) back" in t.message, t.message


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
