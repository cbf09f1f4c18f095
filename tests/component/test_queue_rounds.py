"""A QueueReconciler decides once per round (issue 23): each round observes, calls the
pure decision once, and acts; rule 8's Messages come from the last round's decision, not
from a second one. Counted through the real QueueReconciler on SQLite with the fake port
and clock, by wrapping the decision function it calls."""

from __future__ import annotations

from collections import Counter

import pytest

from falcon_ray import reconcile
from falcon_ray.model import ClusterView, JobView, PoolView, ReservationView
from falcon_ray.reconcile import RefreshMessages
from tests.harness.fakes import QueueBench

RES = ReservationView(count=4, in_use=0)


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """A bench whose queue's decision calls and observed rounds are counted."""
    bench = QueueBench(f"sqlite:///{tmp_path / 'q.db'}")
    calls: Counter = Counter()
    plan, decide = reconcile.plan, reconcile.decide

    def counted_plan(*args, **kwargs):
        calls["plan"] += 1
        return plan(*args, **kwargs)

    def counted_decide(*args, **kwargs):
        calls["decide"] += 1
        return decide(*args, **kwargs)

    monkeypatch.setattr(reconcile, "plan", counted_plan)
    monkeypatch.setattr(reconcile, "decide", counted_decide)
    observe = bench.queue.observe

    def counted_observe(*args, **kwargs):
        observed = observe(*args, **kwargs)
        calls["rounds"] += observed is not None
        return observed

    monkeypatch.setattr(bench.queue, "observe", counted_observe)
    refresh = bench.store.refresh_messages

    def counted_refresh(updates):
        calls["message writes"] += 1
        return refresh(updates)

    monkeypatch.setattr(bench.store, "refresh_messages", counted_refresh)
    return bench, calls


def test_each_round_calls_the_decision_once_and_writes_the_messages_once_per_step(counted):
    bench, calls = counted
    first, second, third = bench.submit(), bench.submit(actor="bob"), bench.submit(actor="carol")
    name = f"falcon-t{first}-2x2"
    pools = {name: PoolView(name, "RUNNING", 1, 1)}
    job = {first: JobView(first, f"falcon-task-{first}", "falcon-jobs", "uid-1", "Running", 1, 1, 1)}
    views = [ClusterView(reservation=RES), ClusterView(pools=pools, reservation=RES), ClusterView(pools=pools, jobs=job, reservation=RES)]
    steps = 0
    for view in views:
        rounds_before = bench.queue.rounds
        bench.step(view)
        steps += 1
        assert bench.queue.rounds > rounds_before  # every step moved something
    assert bench.phase(first) == "Running"
    assert calls["rounds"] > steps  # some steps ran more than one round
    assert calls["plan"] == calls["rounds"]  # one decision per round
    assert calls["decide"] == 0  # and no second decision for rule 8
    assert 1 <= calls["message writes"] <= steps  # rule 8: at most one write per step
    assert bench.phase(second) == "Pending/Provisioning"  # the slot went on when the first ran
    # the Message as the last round decided it: bob, picked in that step, holds the slot ahead
    assert bench.task(third).message.startswith("Queue position #2, 1 task(s) ahead (bob: bob-2x2)")


def test_rule_8_is_the_last_rounds_decision(counted, monkeypatch):
    bench, calls = counted
    bench.submit(), bench.submit(actor="bob")
    kept: list[reconcile.Plan] = []
    counted_plan = reconcile.plan

    def keep(*args, **kwargs):
        kept.append(counted_plan(*args, **kwargs))
        return kept[-1]

    monkeypatch.setattr(reconcile, "plan", keep)
    bench.step(ClusterView(reservation=RES))
    assert len(kept) == calls["rounds"] > 1
    (group,) = kept[-1].messages()
    (refresh,) = group.effects
    assert isinstance(refresh, RefreshMessages)
    for tid, _, text in refresh.updates:  # what the last round decided is what the rows say
        assert bench.task(tid).message == text
