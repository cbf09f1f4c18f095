"""Capacity waits and placement in virtual time: more on-demand and flex-start demand than a
cluster's chips (a create beyond them ends as GKE reports a stockout), the capacity budget,
placement by what a cluster can serve, and a ClusterBusy task moving to a cluster that can
start it now.

Moved from the Ray end-to-end tests (tests/e2e/test_capacity.py, test_placement.py): the
product's poller, queues and cluster gateways in ``falcon-ray simulate``'s driver against
the fleet model (``tests/harness/virtual.py``), at production settings (the capacity
backoff of minutes, the six-hour budget) and GKE's timings. A failure prints the command
that replays it.
"""

from __future__ import annotations

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from tests.harness.virtual import cluster, spec, task

HOUR = 3600.0


def refused_pools(run, name: str) -> list[str]:
    tid = run.id(name)
    return [x.name for x in run.store.leases(live_only=False) if x.task_id == tid and x.refused_at is not None]


def eight_chips() -> dict:
    return {"clusters": [cluster("edge-a", reservation={"name": "res-a", "count": 4}, chips=8)]}


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_more_demand_than_chips_waits_and_all_succeed(scenario, seed):
    """An on-demand task holds all 8 chips for 50 minutes; two small on-demand tasks come
    while it runs (checked), then two flex-start ones: the first small one is refused
    (ZONE_RESOURCE_POOL_EXHAUSTED), waits ClusterBusy, is asked again under a new pool name,
    and every task succeeds once the chips are free; no Falcon pool is left."""
    tasks = [task("big-on-demand", "alice", 0, spec("2x4", 3000, supply_mode="on-demand"))]
    tasks += [task(f"small-{i}", "bob", 1200 + i, spec("2x2", 600, supply_mode="on-demand")) for i in range(2)]
    tasks += [task("small-flex", "carol", 1300, spec("2x2", 600, supply_mode="flex-start")), task("big-flex", "dave", 1300, spec("2x4", 600, supply_mode="flex-start"))]

    def look(run):
        run.seen["big"] = run.task("big-on-demand").phase

    run = scenario(eight_chips(), tasks, seed, actions=[(1200, look)])
    assert run.seen["big"] == lc.RUNNING, run.history()  # the smalls meet the full cluster
    stats = run.assert_clean()
    assert all(t.status == "Succeeded" for t in run.tasks()), [(t.name, t.reason, t.message) for t in run.tasks()]
    first = run.task("small-0")
    assert "Pending/ClusterBusy" in run.phases("small-0"), run.history()
    assert run.entered("small-0", "Pending/ClusterBusy") < run.entered("big-on-demand", "Succeeded"), run.history()
    refused = refused_pools(run, "small-0")
    assert refused and refused[0] == f"falcon-t{first.id}-2x2", refused
    # the create that ran used the next attempt's name, never the refused pool's
    assert first.node_pool_name not in refused
    busy = [e.message for e in run.store.events(first.id) if e.reason == "ClusterBusy"]
    assert busy and "ZONE_RESOURCE_POOL_EXHAUSTED" in busy[0] and "(waiting since " in busy[0], busy
    assert stats["edge-a"]["chips_committed"] == 0


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_stockout_past_the_capacity_budget_ends_node_pool_failed_while_the_holder_runs(scenario, seed):
    """A task holds all 8 chips for 8 hours; one that comes after it has waited the
    production ``capacity_budget_s`` (6 h) ends NodePoolFailed with the time waited and
    GKE's words, asked again several times before, while the holder still runs."""
    s = Settings()
    tasks = [
        task("holder", "alice", 0, spec("2x4", 8 * HOUR, supply_mode="on-demand", timeout_seconds=int(9 * HOUR))),
        task("starved", "bob", 1200, spec("2x2", 600, supply_mode="on-demand")),
    ]
    run = scenario(eight_chips(), tasks, seed, s)
    t = run.task("starved")
    assert (t.status, t.reason) == ("Failed", "NodePoolFailed"), (t.status, t.reason, t.message)
    assert "capacity_budget_s=6h" in t.message and "ZONE_RESOURCE_POOL_EXHAUSTED" in t.message, t.message
    assert len(refused_pools(run, "starved")) >= 2  # it was asked again before the budget ran out
    busy_from, ended = run.entered("starved", "Pending/ClusterBusy"), run.entered("starved", "Failed/NodePoolFailed")
    assert s.capacity_budget_s <= ended - busy_from <= s.capacity_budget_s + s.capacity_retry_max_s + 2 * 420.0, run.history()
    assert ended < run.entered("holder", "Succeeded"), "the budget ended before the capacity came back"
    run.assert_clean()
    assert run.task("holder").status == "Succeeded"


def two_clusters(a: dict | None = None, b: dict | None = None) -> dict:
    return {
        "clusters": [
            cluster("edge-a", **{"reservation": {"name": "res-a", "count": 4}, "chips": 64, **(a or {})}),
            cluster("edge-b", **{"location": "us-central1-b", "chips": 32, **(b or {})}),
        ]
    }


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_shape_the_reservation_cannot_serve_runs_on_a_flex_start_cluster_of_its_type(scenario, seed):
    """edge-a's reservation holds ct6e-standard-4t (four chips a VM): a one-chip shape goes
    to edge-b's flex-start, never fails for a pool; the four-chip one runs too."""
    tasks = [task("one-chip", "alice", 60, spec("1x1", 600)), task("four-chip", "bob", 60, spec("2x2", 600))]
    run = scenario(two_clusters(), tasks, seed)
    run.assert_clean()
    t = run.task("one-chip")
    assert run.store.get_cluster("edge-a").reservation_machine_type == "ct6e-standard-4t"
    assert t.status == "Succeeded" and t.cluster_id == run.store.get_cluster("edge-b").id
    assert not any("NodePoolFailed" in r for r in run.phases("one-chip"))
    assert run.task("four-chip").status == "Succeeded"
    ledger = run.store.get_cluster("edge-a")
    assert ledger.reservation_count == 4 and ledger.reservation_in_use is not None  # what clusters list shows


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_shape_no_cluster_can_serve_fails_at_intake_naming_what_each_offers(scenario, seed):
    fleet = {"clusters": [cluster("edge-a", reservation={"name": "res-a", "count": 4}, chips=64)]}
    run = scenario(fleet, [task("one-chip", "alice", 60, spec("1x1", 600))], seed)
    t = run.task("one-chip")
    assert (t.status, t.reason, t.cluster_id) == ("Failed", "NoCandidateCluster", None)
    assert "edge-a: reservation res-a holds ct6e-standard-4t (2x2, 2x4" in t.message, t.message
    assert run.phases("one-chip") == ["Pending", "Failed/NoCandidateCluster"]
    run.assert_clean()


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_cluster_busy_task_moves_to_a_second_reservation_cluster_with_headroom(scenario, seed):
    """Two 2-host reservations; edge-b is in maintenance, so the first two 2-host tasks go to
    edge-a: the second waits ClusterBusy behind the first (checked at 1200 s). edge-b comes
    back: res-b has room now, the second moves there (through Waiting) and runs while the
    first still runs on edge-a."""
    fleet = two_clusters(a={"reservation": {"name": "res-a", "count": 2}}, b={"reservation": {"name": "res-b", "count": 2}})

    def busy(run):
        t = run.task("waits-for-res-a")
        run.seen["busy"] = (t.phase, t.cluster_id, t.message)
        run.seen["first"] = run.task("holds-res-a").phase
        run.store.set_cluster_status("edge-b", "active")  # res-b has room now

    tasks = [task("holds-res-a", "alice", 1, spec("2x4", 3000)), task("waits-for-res-a", "bob", 900, spec("2x4", 600))]
    actions = [(0, lambda run: run.store.set_cluster_status("edge-b", "maintenance")), (1200, busy)]
    run = scenario(fleet, tasks, seed, actions=actions)
    edge_a, edge_b = run.store.get_cluster("edge-a"), run.store.get_cluster("edge-b")
    phase, on, message = run.seen["busy"]
    assert (phase, on) == (lc.CLUSTER_BUSY, edge_a.id) and "reservation res-a" in message, run.seen["busy"]
    assert run.seen["first"] == lc.RUNNING
    done = run.task("waits-for-res-a")
    assert done.status == "Succeeded" and done.cluster_id == edge_b.id
    assert run.task("holds-res-a").cluster_id == edge_a.id
    moved = [e.message for e in run.store.events(done.id) if "Moved from edge-a" in e.message]
    assert moved, run.history()
    # it did not wait for res-a to free up
    assert run.entered("waits-for-res-a", "Running") < run.entered("holds-res-a", "Succeeded"), run.history()
    path = run.phases("waits-for-res-a")
    i = path.index("Pending/ClusterBusy")
    assert path[i + 1] == "Pending/Waiting" and "Succeeded" in path, path
    run.assert_clean()


ON_DEMAND_STOCKOUT = {"start_s": 0, "duration_s": 4 * HOUR, "supply": ["on-demand"]}


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_task_refused_for_capacity_fails_over_to_another_zone_and_runs_there(scenario, seed):
    """edge-a's zone has no on-demand capacity for four hours; edge-b, in another zone, has.
    The task is placed on edge-a (equal queues, the name), GKE refuses its pool there, again
    and again; once the refusals have lasted failover_after_s (1 h) it moves to edge-b, whose
    queue for the topology is empty: it runs there within the next hour instead of waiting
    out the stockout, and says why it moved."""
    fleet = two_clusters(a={"stockouts": [ON_DEMAND_STOCKOUT]})
    run = scenario(fleet, [task("od", "alice", 60, spec("2x2", 600, supply_mode="on-demand"))], seed)
    run.assert_clean()
    done, edge_b = run.task("od"), run.store.get_cluster("edge-b")
    assert (done.status, done.cluster_id) == ("Succeeded", edge_b.id), run.history()
    assert HOUR < run.entered("od", "Running") < 2 * HOUR, run.history()
    path = run.phases("od")
    assert path.index("Pending/ClusterBusy") < path.index("Pending/Waiting", path.index("Pending/ClusterBusy")), path
    moved = [e.message for e in run.store.events(done.id) if e.message.startswith("Moved from edge-a to edge-b")]
    assert len(moved) == 1 and "GKE had no on-demand capacity" in moved[0] and "(us-central1-b)" in moved[0], moved
    assert {x.cluster_id for x in run.store.leases(live_only=False) if x.task_id == done.id and x.refused_at} == {run.store.get_cluster("edge-a").id}


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_failover_tries_each_cluster_once_and_then_waits_where_it_is(scenario, seed):
    """Both zones are out of on-demand capacity for two and a half hours: the task moves from
    edge-a to edge-b once (after an hour of refusals), is refused there too, never goes back, and waits out the stockout on edge-b
    (capacity refusals with backoff, within the budget) and runs when it ends."""
    short = {**ON_DEMAND_STOCKOUT, "duration_s": 2.5 * HOUR}
    fleet = two_clusters(a={"stockouts": [short]}, b={"stockouts": [short]})
    run = scenario(fleet, [task("od", "alice", 60, spec("2x2", 600, supply_mode="on-demand"))], seed)
    run.assert_clean()
    done = run.task("od")
    assert (done.status, done.cluster_id) == ("Succeeded", run.store.get_cluster("edge-b").id), run.history()
    moves = [e.message for e in run.store.events(done.id) if e.message.startswith("Moved from")]
    assert len(moves) == 1 and moves[0].startswith("Moved from edge-a to edge-b"), moves
    assert 2.5 * HOUR <= run.entered("od", "Running") < 3.5 * HOUR, run.history()
    refused_on = {x.cluster_id for x in run.store.leases(live_only=False) if x.task_id == done.id and x.refused_at}
    assert refused_on == {run.store.get_cluster("edge-a").id, run.store.get_cluster("edge-b").id}
