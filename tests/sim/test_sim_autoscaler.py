"""The simulated cluster autoscaler, driven by the real container_v1 and kubernetes clients.

Each test has a fleet of its own (one zonal cluster of 8 chips) on a ``ManualClock``: the
autoscaler's timings pass when the test moves the fleet's clock, so they are asserted exactly.
"""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1
from kubernetes import client as k8s

from tests.harness.sim import advance_until, gke_client, private_fleet_config, virtual_fleet, wait_operation

PROJECT, ZONE, NAME = "proj-as", "us-east5-b", "as-1"
LOCATION = f"projects/{PROJECT}/locations/{ZONE}"
PARENT = f"{LOCATION}/clusters/{NAME}"
NS = "falcon-as"
SCALE_UP, FLEX_WAIT, REGISTER = 0.15, 0.4, 0.1
NODEPOOL = "cloud.google.com/gke-nodepool"


@pytest.fixture
def fleet():
    config = private_fleet_config(
        [{"name": NAME, "project": PROJECT, "location": ZONE, "chips": 8}],
        autoscaler_scale_up=SCALE_UP,
        flex_capacity_wait=FLEX_WAIT,
        node_register=REGISTER,
        node_pool_create=0.15,
        node_pool_delete=0.1,
    )
    with virtual_fleet(config) as running:
        yield running


def clients(fleet):
    api = k8s.ApiClient(k8s.Configuration(host=fleet.endpoints["clusters"][NAME]["kubernetes"]))
    return gke_client(fleet, credentials=AnonymousCredentials()), k8s.CoreV1Api(api)


def pool_request(name, *, flex=False, initial=0, min_nodes=0, max_nodes=1, topology=None):
    """A v6e pool with autoscaling on, shaped as the controller renders it (flex-start: 0 nodes)."""
    config = container_v1.NodeConfig(machine_type="ct6e-standard-4t", labels={"managed-by": "falcon"})
    if flex:
        config.flex_start = True
    pool = container_v1.NodePool(
        name=name,
        initial_node_count=initial,
        config=config,
        autoscaling=container_v1.NodePoolAutoscaling(
            enabled=True, total_min_node_count=min_nodes, total_max_node_count=max_nodes
        ),
    )
    if topology:
        pool.placement_policy = container_v1.NodePool.PlacementPolicy(
            type_=container_v1.NodePool.PlacementPolicy.Type.COMPACT, tpu_topology=topology
        )
    return pool


def create(fleet, gke, request):
    done = wait_operation(gke, LOCATION, gke.create_node_pool(parent=PARENT, node_pool=request), fleet=fleet)
    assert not done.error.message, done.error.message
    return done


def tpu_pod(name, pool, run="0.5"):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {NODEPOOL: pool},
            "containers": [
                {
                    "name": "main",
                    "image": "trainer:1",
                    "env": [{"name": "FALCON_SIM_RUN_SECONDS", "value": run}],
                    "resources": {"limits": {"google.com/tpu": "4"}},
                }
            ],
        },
    }


def nodes(core, pool):
    return sorted(n.metadata.name for n in core.list_node(label_selector=f"{NODEPOOL}={pool}").items)


def pool_stats(fleet, name):
    return next(p for p in fleet.stats()["clusters"][NAME]["node_pools"] if p["name"] == name)


def test_flex_pool_gets_a_node_only_once_a_pending_pod_selects_it(fleet):
    gke, core = clients(fleet)
    create(fleet, gke, pool_request("falcon-flex", flex=True))
    core.create_namespaced_pod(NS, tpu_pod("elsewhere", "no-such-pool"))  # selects another pool
    fleet.advance(3600)  # an hour, not a moment past the flex wait
    assert nodes(core, "falcon-flex") == []  # RUNNING with no node: no pending pod selects it
    assert pool_stats(fleet, "falcon-flex")["first_node_at"] is None

    core.create_namespaced_pod(NS, tpu_pod("wants-flex", "falcon-flex"))
    (node,), waited = advance_until(fleet, lambda: nodes(core, "falcon-flex"), 60, "the flex node")
    assert waited == pytest.approx(SCALE_UP + FLEX_WAIT + REGISTER)  # waited for capacity too, and no longer
    assert core.read_node(node).metadata.labels["cloud.google.com/gke-flex-start"] == "true"
    pod, _ = advance_until(
        fleet,
        lambda: (p := core.read_namespaced_pod("wants-flex", NS)).status.phase == "Running" and p,
        60,
        "the pod to run on the new node",
    )
    assert pod.spec.node_name == node
    stats = pool_stats(fleet, "falcon-flex")
    assert stats["hosts"] == 1 and stats["chips"] == 4 and stats["first_node_at"] is not None
    assert core.read_namespaced_pod("elsewhere", NS).status.phase == "Pending"


def test_multi_host_flex_pool_grows_by_the_whole_slice(fleet):
    gke, core = clients(fleet)
    create(fleet, gke, pool_request("falcon-slice", flex=True, max_nodes=2, topology="2x4"))
    core.create_namespaced_pod(NS, tpu_pod("host-0", "falcon-slice"))  # one pod still needs the slice
    found, _ = advance_until(fleet, lambda: nodes(core, "falcon-slice"), 60, "the slice's nodes")
    assert len(found) == 2  # both hosts register together
    assert fleet.stats()["clusters"][NAME]["chips_committed"] == 8


def test_multi_host_autoscaling_max_must_be_the_slice(fleet):
    from google.api_core import exceptions as gexc

    gke, _ = clients(fleet)
    with pytest.raises(gexc.BadRequest, match="max node count must be 2"):
        gke.create_node_pool(
            parent=PARENT,
            node_pool=pool_request("falcon-4x", initial=2, max_nodes=4, topology="2x4"),
            retry=None,
        )


def test_flex_scale_up_with_no_chips_free_keeps_waiting(fleet):
    gke, core = clients(fleet)
    on_demand = container_v1.NodePool(
        name="falcon-hog",
        initial_node_count=2,
        config=container_v1.NodeConfig(machine_type="ct6e-standard-4t"),
        placement_policy=container_v1.NodePool.PlacementPolicy(type_=1, tpu_topology="2x4"),
    )
    create(fleet, gke, on_demand)  # takes all 8 chips
    create(fleet, gke, pool_request("falcon-wait", flex=True))
    core.create_namespaced_pod(NS, tpu_pod("patient", "falcon-wait"))
    fleet.advance(3600)  # an hour of retried scale-ups, not three
    assert nodes(core, "falcon-wait") == []
    pool = gke.get_node_pool(name=f"{PARENT}/nodePools/falcon-wait")
    assert pool.status == container_v1.NodePool.Status.RUNNING and not pool.status_message  # never fails
    assert core.read_namespaced_pod("patient", NS).status.phase == "Pending"

    wait_operation(gke, LOCATION, gke.delete_node_pool(name=f"{PARENT}/nodePools/falcon-hog"), fleet=fleet)
    advance_until(fleet, lambda: nodes(core, "falcon-wait"), 60, "the flex node once chips are free")
    advance_until(
        fleet,
        lambda: core.read_namespaced_pod("patient", NS).status.phase in ("Running", "Succeeded"),
        60,
        "the pod to run",
    )


def test_empty_nodes_are_removed_after_the_timeout_but_not_below_min(fleet):
    scale_down = 0.4
    fleet.set_timings(NAME, autoscaler_scale_down=scale_down)
    gke, core = clients(fleet)
    create(fleet, gke, pool_request("falcon-min1", initial=2, min_nodes=1, max_nodes=2))
    advance_until(fleet, lambda: len(nodes(core, "falcon-min1")) == 2, 60, "2 nodes")
    fleet.advance(scale_down / 2)
    assert len(nodes(core, "falcon-min1")) == 2  # not empty for long enough yet
    _, waited = advance_until(fleet, lambda: len(nodes(core, "falcon-min1")) == 1, 60, "scale-down to min")
    assert scale_down / 2 <= waited <= scale_down / 2 + 0.05  # at the timeout, not before, not much after
    fleet.advance(3600)
    assert len(nodes(core, "falcon-min1")) == 1  # min 1 holds
    assert fleet.stats()["clusters"][NAME]["chips_committed"] == 4


def test_busy_nodes_stay_and_an_autoscaled_pool_scales_from_zero_again(fleet):
    fleet.set_timings(NAME, autoscaler_scale_down=0.3)
    gke, core = clients(fleet)
    create(fleet, gke, pool_request("falcon-busy", initial=2, min_nodes=0, max_nodes=2))
    advance_until(fleet, lambda: len(nodes(core, "falcon-busy")) == 2, 60, "2 nodes")
    core.create_namespaced_pod(NS, tpu_pod("long", "falcon-busy", run="1.0"))
    pod, _ = advance_until(
        fleet, lambda: (p := core.read_namespaced_pod("long", NS)).status.phase == "Running" and p, 60, "Running"
    )
    advance_until(fleet, lambda: nodes(core, "falcon-busy") == [pod.spec.node_name], 60, "only the busy node")
    advance_until(fleet, lambda: nodes(core, "falcon-busy") == [], 60, "scale-down to 0 after the pod")
    assert fleet.stats()["clusters"][NAME]["chips_committed"] == 0
    pool = gke.get_node_pool(name=f"{PARENT}/nodePools/falcon-busy")
    assert pool.status == container_v1.NodePool.Status.RUNNING

    core.create_namespaced_pod(NS, tpu_pod("again", "falcon-busy"))
    _, waited = advance_until(fleet, lambda: len(nodes(core, "falcon-busy")) == 1, 60, "scale-up from zero")
    assert waited == pytest.approx(SCALE_UP + REGISTER)  # no flex-start wait
