"""Where GKE decides the outcome (docs/sim.md, "Sources"), in virtual time: flex-start pools
that scale from zero only for pending Pods, regional clusters, zonal reservations, a small
reservation shared through the ledger.

Moved from the Ray end-to-end tests (tests/e2e/test_gke_fidelity.py): each scenario is the
product's poller, queues and cluster gateways in ``falcon-ray simulate``'s driver
(``tests/harness/virtual.py``), at production settings and GKE's timings, so which phases a
task went through and who met whose claim is the same at every run. A failure prints the
command that replays it.
"""

from __future__ import annotations

import itertools

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from tests.harness.virtual import cluster, spec, task

FLEX_ONLY = {"clusters": [cluster("edge-a", reservation={"name": "res-a", "count": 4}, chips=64, status="offline"), cluster("edge-b", location="us-central1-b", chips=32)]}
REGIONAL = cluster(
    "edge-r", location="us-central1", node_locations=["us-central1-a", "us-central1-c"],
    reservation={"name": "res-r", "count": 4, "zone": "us-central1-c"}, chips=32,
)  # fmt: skip


def pool_of(run, name: str, cluster_name: str = "edge-b") -> dict:
    (p,) = [p for p in run.stats(cluster_name)["node_pools"] if p["name"].startswith(f"falcon-t{run.id(name)}-")]
    return p


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_flex_start_tasks_submit_their_job_before_the_nodes_and_succeed(scenario, seed):
    """GKE adds a flex-start pool's nodes only for pending Pods that select it: the Job comes
    first. Each task goes Provisioning, then WaitingForNode, then Running, in that order."""
    run = scenario(FLEX_ONLY, [task("flex-single-host", "alice", 0, spec("2x2", 600)), task("flex-multi-host", "bob", 0, spec("4x4", 600))], seed)
    run.assert_clean()
    for name, hosts in (("flex-single-host", 1), ("flex-multi-host", 4)):
        t = run.task(name)
        assert t.status == "Succeeded", t
        pool, job = pool_of(run, name), run.job("edge-b", t.id)
        assert pool["request"].get("initialNodeCount", 0) == 0 and pool["request"]["config"]["flexStart"] is True
        assert pool["first_node_at"] is not None and job["first_created_at"] < pool["first_node_at"]
        seen = run.phases(name)
        path = [p for p in seen if p in ("Pending/Provisioning", "Pending/WaitingForNode", "Running", "Succeeded")]
        assert path == ["Pending/Provisioning", "Pending/WaitingForNode", "Running", "Succeeded"], run.history(name)
        assert len(pool["nodes"]) == hosts  # a multi-host slice came whole


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_flex_start_keeps_waiting_past_the_node_pool_timeout_and_says_how_long_until_aborted(scenario, seed):
    """No capacity for three node-pool timeouts and no other topology waiting: the task keeps
    its pool and waits (its Message says for what and since when); the abort ends it."""
    s = Settings()
    timeout = s.node_pool_timeout_s
    fleet = {"clusters": [FLEX_ONLY["clusters"][0], cluster("edge-b", location="us-central1-b", chips=32, timings={"flex_capacity_wait": 3 * timeout})]}

    def look(run):
        run.seen["row"] = run.task("flex-waits")
        run.seen["creates"] = run.job("edge-b", run.id("flex-waits"))["creates"]

    run = scenario(fleet, [task("flex-waits", "alice", 0, spec("2x2", 600), abort_at=2.5 * timeout)], seed, s, actions=[(2 * timeout, look)])
    t = run.seen["row"]
    assert t.phase == lc.WAITING_FOR_NODE, t  # twice the node-pool timeout
    assert "0/1 expected node(s) registered" in t.message and "(waiting since " in t.message, t.message
    assert run.seen["creates"] == 1
    entered = run.entered("flex-waits", "Pending/WaitingForNode")
    assert entered is not None and entered < timeout, run.history()
    assert run.task("flex-waits").status == "Aborted"
    run.assert_clean()


@pytest.mark.parametrize("seed", [5], ids=lambda s: f"seed{s}")
def test_regional_cluster_runs_reservation_and_flex_start_tasks_in_one_zone_each(scenario, seed):
    tasks = [task("reservation-on-regional", "alice", 0, spec("2x2", 600)), task("flex-on-regional", "bob", 0, spec("2x4", 600, supply_mode="flex-start"))]
    run = scenario({"clusters": [REGIONAL]}, tasks, seed)
    run.assert_clean()
    for name in ("reservation-on-regional", "flex-on-regional"):
        assert run.task(name).status == "Succeeded", run.task(name)
    pool = pool_of(run, "reservation-on-regional", "edge-r")
    assert pool["request"]["locations"] == ["us-central1-c"]  # the reservation's zone
    affinity = pool["request"]["config"]["reservationAffinity"]
    assert affinity["consumeReservationType"] in ("SPECIFIC_RESERVATION", 3) and affinity["values"] == ["res-r"]
    assert pool_of(run, "flex-on-regional", "edge-r")["request"]["locations"] == ["us-central1-a"]  # the first node zone


@pytest.mark.parametrize("seed", [5], ids=lambda s: f"seed{s}")
def test_a_reservation_in_no_zone_of_the_cluster_fails_naming_the_zones_tried(scenario, seed):
    misplaced = {**REGIONAL, "node_locations": ["us-central1-a", "us-central1-b"]}
    run = scenario({"clusters": [misplaced]}, [task("reservation-elsewhere", "alice", 0, spec("2x2", 600))], seed)
    t = run.task("reservation-elsewhere")
    assert (t.status, t.reason) == ("Failed", "NodePoolFailed"), t
    assert "us-central1-a, us-central1-b" in t.message and "res-r" in t.message
    run.assert_clean()


@pytest.mark.parametrize("seed", [3, 4], ids=lambda s: f"seed{s}")
def test_two_topologies_share_a_small_reservation_through_the_ledger(scenario, seed):
    """A 2-host reservation. GKE's own operation (an upgrade) holds the cluster for its
    first 300 s, so a 1-host task's create, claimed in Falcon's ledger at once, is refused
    and retried: GKE counts none of the reservation in use. A 2-host task comes at 60 s
    and meets only that claim (forced, checked at 60 s). It waits in ClusterBusy until the
    first's pool is gone, then creates its own: both succeed, the reservation never held
    more than its two hosts (the second pool was asked for only after the first was
    deleted), and nobody failed for capacity Falcon over-committed."""
    fleet = {"clusters": [cluster("edge-a", reservation={"name": "res-a", "count": 2}, chips=64, faults={"incompatible_op_rate": 1.0})]}
    tasks = [task("small", "alice", 0, spec("2x2", 1800)), task("large", "bob", 60, spec("2x4", 600))]

    def claimed(run):
        run.seen["at_60"] = (run.task("small").phase, run.stats("edge-a")["reservation"]["in_use"], [p["name"] for p in run.stats("edge-a")["node_pools"]])

    actions = [(60, claimed), (300, lambda run: run.cluster("edge-a").set_faults(incompatible_op_rate=0.0))]
    run = scenario(fleet, tasks, seed, actions=actions)
    run.assert_clean()
    # the claim the large one meets, and nothing else: GKE counts no host in use, no Falcon pool exists yet
    assert run.seen["at_60"] == (lc.PROVISIONING, 0, []), (run.seen["at_60"], run.history())
    for name in ("small", "large"):
        assert run.task(name).status == "Succeeded", (run.task(name), run.history())
    assert "Pending/ClusterBusy" in run.phases("large"), run.history()
    assert "Pending/ClusterBusy" not in run.phases("small"), run.history()
    assert not any("NodePoolFailed" in p for p in run.phases("small") + run.phases("large"))
    small_pool, large_pool = pool_of(run, "small", "edge-a"), pool_of(run, "large", "edge-a")
    assert small_pool["error"] is None and large_pool["error"] is None
    assert large_pool["created_at"] >= small_pool["deleted_at"], (small_pool, large_pool)  # never 3 hosts of 2
    busy_from = run.entered("large", "Pending/ClusterBusy")
    assert busy_from is not None and busy_from < 120, run.history()
    assert run.entered("large", "Running") > run.entered("small", "Succeeded"), run.history()


OPS = {"node_pool_create": 600, "node_register": 60}
THREE = [task("one-host", "alice", 0, spec("2x2", 600)), task("two-hosts", "bob", 0, spec("2x4", 600)), task("four-hosts", "carol", 0, spec("4x4", 600))]


@pytest.mark.parametrize("seed", [4], ids=lambda s: f"seed{s}")
def test_creates_of_three_queues_run_side_by_side_on_a_cluster_that_takes_them(scenario, seed):
    """GKE works on several node pools of a cluster at once (docs/sim.md, "Concurrent
    node-pool operations"): three queues' 10-minute creates run together, so every task runs
    within one create (plus registration) of its submission, not one create after another."""
    fleet = {"clusters": [cluster("edge-a", reservation={"name": "res-a", "count": 8}, chips=0, timings=OPS)]}
    run = scenario(fleet, THREE, seed)
    run.assert_clean()
    stats = run.stats("edge-a")
    assert stats["max_concurrent_pool_ops"] == 3 and stats["rejected_pool_ops"] == 0
    for name, _ in (("one-host", 1), ("two-hosts", 2), ("four-hosts", 4)):
        assert run.task(name).status == "Succeeded", run.task(name)
        assert run.entered(name, "Running") < 600 + 60 + 120, run.history(name)  # one create, not three


@pytest.mark.parametrize("seed", [4], ids=lambda s: f"seed{s}")
def test_a_cluster_that_takes_one_operation_at_a_time_costs_a_refusal_not_a_task(scenario, seed):
    """The same three queues on a cluster that refuses a second operation (GKE's older
    behaviour, or a quota of 1): the controller learns the limit from the first refusal that
    names its own operation and sends the rest one by one; every task succeeds, the creates
    follow one another, and GKE refused at most one operation per queue."""
    fleet = {"pool_ops_at_once": 1, "clusters": [cluster("edge-a", reservation={"name": "res-a", "count": 8}, chips=0, timings=OPS)]}
    run = scenario(fleet, THREE, seed)
    report = run.report()
    assert report["invariants"] == dict.fromkeys(report["invariants"], 0), report["invariants"]
    stats = run.stats("edge-a")
    assert 1 <= stats["rejected_pool_ops"] <= 2, stats["rejected_pool_ops"]
    creates = sorted((o["started_at"], o["ended_at"]) for o in stats["pool_ops"] if o["type"] == "CREATE_NODE_POOL")
    assert len(creates) == 3 and all(a[1] <= b[0] for a, b in itertools.pairwise(creates)), creates  # one after another
    starts = sorted(run.entered(name, "Running") for name in ("one-host", "two-hosts", "four-hosts"))
    assert starts[-1] > 3 * 600, starts  # the third waited for two creates before its own
    for name in ("one-host", "two-hosts", "four-hosts"):
        assert run.task(name).status == "Succeeded", run.task(name)
