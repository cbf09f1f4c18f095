"""Accounting at /sim/stats, measured on a private fleet so no other test's pools or Jobs leak in.

The fleet runs on a ``ManualClock``: its seconds pass when the test moves it, so idle
chip-seconds and the pools' times are asserted exactly.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1
from kubernetes import client as k8s

from tests.harness.sim import advance_until, gke_client, sim_test_config, virtual_fleet

C = ("proj-sim-k", "europe-west4-a", "sim-k")
PARENT = f"projects/{C[0]}/locations/{C[1]}/clusters/{C[2]}"
CHIPS = 4


@pytest.fixture
def private_fleet():
    with virtual_fleet(sim_test_config(auth={"required": False})) as fleet:
        yield fleet


def wait_op(fleet, gke, op):
    return advance_until(
        fleet,
        lambda: (
            (o := gke.get_operation(name=f"projects/{C[0]}/locations/{C[1]}/operations/{op.name}")).status
            == container_v1.Operation.Status.DONE
            and o
        ),
        60,
        f"operation {op.name}",
    )[0]


def single_host_pool(name):
    return container_v1.NodePool(
        name=name,
        initial_node_count=1,
        config=container_v1.NodeConfig(machine_type="ct6e-standard-4t", labels={"managed-by": "falcon"}),
    )


def idle(fleet):
    return fleet.stats()["clusters"]["sim-k"]["idle_chip_seconds"]


def test_idle_chip_seconds_and_pool_and_job_accounting(private_fleet):
    fleet = private_fleet
    gke = gke_client(fleet, credentials=AnonymousCredentials())
    api = k8s.ApiClient(k8s.Configuration(host=fleet.endpoints["clusters"]["sim-k"]["kubernetes"]))
    batch, core = k8s.BatchV1Api(api), k8s.CoreV1Api(api)

    wait_op(fleet, gke, gke.create_node_pool(parent=PARENT, node_pool=single_host_pool("falcon-idle")))
    advance_until(fleet, lambda: core.list_node().items, 60, "the node")
    first = idle(fleet)
    fleet.advance(0.3)
    assert idle(fleet) - first == pytest.approx(0.3 * CHIPS)  # an idle pool accrues chips x seconds

    run_seconds = 0.8
    manifest = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "busy", "namespace": "ns"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer:1",
                            "env": [{"name": "FALCON_SIM_RUN_SECONDS", "value": str(run_seconds)}],
                            "resources": {"limits": {"google.com/tpu": "4"}},
                        }
                    ],
                }
            },
        },
    }
    batch.create_namespaced_job("ns", manifest)
    advance_until(
        fleet, lambda: [p for p in core.list_namespaced_pod("ns").items if p.status.phase == "Running"], 60, "Running"
    )
    while_running = idle(fleet)
    fleet.advance(0.4)
    assert idle(fleet) == while_running  # a running pod makes the pool busy: not a chip-second more
    advance_until(fleet, lambda: batch.read_namespaced_job("busy", "ns").status.succeeded, 60, "the Job to succeed")

    wait_op(fleet, gke, gke.delete_node_pool(name=f"{PARENT}/nodePools/falcon-idle"))
    stats = fleet.stats()["clusters"]["sim-k"]
    (pool,) = stats["node_pools"]
    assert pool["status"] == "DELETED" and pool["chips"] == CHIPS and pool["supply"] == "on-demand"
    assert pool["created_at"] < pool["ready_at"] < pool["delete_requested_at"] < pool["deleted_at"]
    assert pool["request"] == {
        "name": "falcon-idle",
        "initialNodeCount": 1,
        "config": {"machineType": "ct6e-standard-4t", "labels": {"managed-by": "falcon"}},
    }
    alive = pool["deleted_at"] - pool["ready_at"]
    expected = CHIPS * (alive - run_seconds)
    assert stats["idle_chip_seconds"] == pytest.approx(expected, abs=0.005), (stats["idle_chip_seconds"], expected)
    assert pool["idle_chip_seconds"] == stats["idle_chip_seconds"]
    fleet.advance(3600)
    assert idle(fleet) == stats["idle_chip_seconds"]  # a deleted pool stops accruing

    assert stats["max_concurrent_pool_ops"] == 1 and stats["rejected_pool_ops"] == 0
    assert [(o["type"], o["status"], o["error"]) for o in stats["pool_ops"]] == [
        ("CREATE_NODE_POOL", "DONE", None),
        ("DELETE_NODE_POOL", "DONE", None),
    ]
    (job,) = stats["jobs"]
    assert job["name"] == "busy" and job["namespace"] == "ns" and job["creates"] == 1
    assert job["manifest"] == api.sanitize_for_serialization(manifest)

    over_http = json.loads(urllib.request.urlopen(fleet.endpoints["stats"], timeout=5).read())
    assert over_http["clusters"]["sim-k"]["node_pools"] == fleet.stats()["clusters"]["sim-k"]["node_pools"]
    assert set(over_http["clusters"]) == {"sim-a", "sim-b", "sim-k"}

    # a Job deleted and created again: counted twice, with when it was created and deleted
    batch.delete_namespaced_job("busy", "ns", propagation_policy="Background")
    batch.create_namespaced_job("ns", manifest)
    (job,) = fleet.stats()["clusters"]["sim-k"]["jobs"]
    assert job["creates"] == 2 and len(job["created_at"]) == 2 and len(job["deleted_at"]) == 1
    assert job["created_at"][0] <= job["deleted_at"][0] <= job["created_at"][1]


def test_a_cluster_that_runs_one_operation_at_a_time_refuses_a_second_and_counts_it():
    with virtual_fleet(sim_test_config(auth={"required": False}, pool_ops_at_once=1)) as fleet:
        gke = gke_client(fleet, credentials=AnonymousCredentials())
        op = gke.create_node_pool(parent=PARENT, node_pool=single_host_pool("falcon-one"))
        with pytest.raises(gexc.BadRequest) as err:
            gke.create_node_pool(parent=PARENT, node_pool=single_host_pool("falcon-two"))
        assert f"Cluster is running incompatible operation {op.name}" in err.value.response.json()["error"]["message"]
        wait_op(fleet, gke, op)
        stats = fleet.stats()["clusters"]["sim-k"]
        assert stats["max_concurrent_pool_ops"] == 2 and stats["rejected_pool_ops"] == 1
        assert [p["name"] for p in stats["node_pools"]] == ["falcon-one"]


def test_operations_beyond_the_clusters_quota_are_refused_429_and_counted():
    with virtual_fleet(sim_test_config(auth={"required": False}, pool_ops_at_once=2)) as fleet:
        gke = gke_client(fleet, credentials=AnonymousCredentials())
        ops = [gke.create_node_pool(parent=PARENT, node_pool=single_host_pool(f"falcon-{n}")) for n in ("one", "two")]
        with pytest.raises(gexc.TooManyRequests) as err:
            gke.create_node_pool(parent=PARENT, node_pool=single_host_pool("falcon-three"), retry=None)
        body = err.value.response.json()["error"]
        assert body["status"] == "RESOURCE_EXHAUSTED" and body["code"] == 429
        assert body["message"] == 'Too many operations: cluster "sim-k" hits the concurrent operations quota 2, please try again later.'
        for op in ops:
            wait_op(fleet, gke, op)
        stats = fleet.stats()["clusters"]["sim-k"]
        assert stats["max_concurrent_pool_ops"] == 3 and stats["rejected_pool_ops"] == 1
        assert sorted(p["name"] for p in stats["node_pools"]) == ["falcon-one", "falcon-two"]


def test_pool_stats_tell_when_the_first_node_registered_and_in_which_zone(private_fleet):
    fleet = private_fleet
    fleet.set_timings("sim-k", node_register=0.4)
    gke = gke_client(fleet, credentials=AnonymousCredentials())
    wait_op(fleet, gke, gke.create_node_pool(parent=PARENT, node_pool=single_host_pool("falcon-first")))
    (pool,) = fleet.stats()["clusters"]["sim-k"]["node_pools"]
    assert pool["status"] == "RUNNING" and pool["nodes"] == [] and pool["first_node_at"] is None
    assert pool["zone"] == "europe-west4-a" and pool["locations"] == ["europe-west4-a"]
    assert pool["autoscaling"] is None
    pool, _ = advance_until(
        fleet, lambda: (p := fleet.stats()["clusters"]["sim-k"]["node_pools"][0])["first_node_at"] and p, 60, "first_node_at"
    )
    assert pool["first_node_at"] - pool["ready_at"] == pytest.approx(0.4)  # node_register after the pool is ready
    assert pool["first_node_at"] == fleet.clock.time()  # a wall time: the fleet's, when the node registered (now)
    clusters = fleet.stats()["clusters"]
    assert clusters["sim-k"]["node_locations"] == ["europe-west4-a"]
    assert clusters["sim-a"]["reservation"]["zone"] == "us-east5-b"  # default: the cluster's zone
