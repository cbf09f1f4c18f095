"""The simulated GKE and Compute APIs, driven by the real container_v1 / compute_v1 REST clients."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest
from google.api_core import exceptions as gexc
from google.cloud import container_v1
from kubernetes import client as k8s

from falcon_ray.sim.fleet import parse_fleet
from falcon_ray.sim.server import SimFleet
from tests.harness.sim import (
    SIM_TEST_FLEET,
    compute_client,
    gke_client,
    google_credentials,
    kube_api_client,
    poll_until,
    wait_operation,
)

A = ("proj-sim-a", "us-east5-b", "sim-a")
B = ("proj-sim-b", "us-central1-b", "sim-b")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


def parent(c):
    return f"projects/{c[0]}/locations/{c[1]}/clusters/{c[2]}"


def op_path(c, op_name):
    return f"projects/{c[0]}/locations/{c[1]}/operations/{op_name}"


def wait_done(gke, c, op, timeout=5.0):
    return poll_until(
        lambda: (
            (o := gke.get_operation(name=op_path(c, op.name))).status == container_v1.Operation.Status.DONE
            and o
        ),
        timeout,
        what=f"operation {op.name} DONE",
    )


def advance_to(fleet, at: float) -> None:
    """Move ``fleet``'s clock to its monotonic time ``at`` exactly (``at - now`` added to now is ``at``)."""
    fleet.advance(at - fleet.clock.monotonic())


def tpu_pool(name, hosts=1, topology="2x2", reservation=None, flex=False, labels=None):
    """A v6e pool request shaped like the controller's (proto-plus copies sub-messages: build inside-out)."""
    config = container_v1.NodeConfig(
        machine_type="ct6e-standard-4t", labels=labels or {"managed-by": "falcon"}
    )
    if reservation:
        config.reservation_affinity = container_v1.ReservationAffinity(
            consume_reservation_type=container_v1.ReservationAffinity.Type.SPECIFIC_RESERVATION,
            key=RESERVATION_KEY,
            values=[reservation],
        )
    if flex:
        config.flex_start = True
    pool = container_v1.NodePool(name=name, initial_node_count=0 if flex else hosts, config=config)
    if hosts > 1:
        pool.placement_policy = container_v1.NodePool.PlacementPolicy(
            type_=container_v1.NodePool.PlacementPolicy.Type.COMPACT, tpu_topology=topology
        )
    if flex:
        pool.autoscaling = container_v1.NodePoolAutoscaling(enabled=True, total_max_node_count=hosts)
    return pool


def sim_timings(fleet, cluster, key):
    return fleet.stats()["clusters"][cluster]["timings"][key]


def delete_and_wait(gke, c, name):
    op = gke.delete_node_pool(name=f"{parent(c)}/nodePools/{name}")
    done = wait_done(gke, c, op)
    assert not done.error.message
    with pytest.raises(gexc.NotFound):
        gke.get_node_pool(name=f"{parent(c)}/nodePools/{name}", retry=None)


def raw(fleet, method, path, body=None, token=None):
    """A plain HTTP call to the GKE/Compute port: (status, parsed JSON body)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(fleet.endpoints["gke"] + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def fresh_token():
    import google.auth.transport.requests

    creds = google_credentials()
    creds.refresh(google.auth.transport.requests.Request())
    return creds.token


def test_get_cluster_gives_the_kubernetes_endpoint_and_a_pem_ca(sim):
    gke = gke_client(sim)
    cluster = gke.get_cluster(name=parent(A))
    assert cluster.status == container_v1.Cluster.Status.RUNNING
    assert f"http://{cluster.endpoint}" == sim.endpoints["clusters"]["sim-a"]["kubernetes"]
    pem = base64.b64decode(cluster.master_auth.cluster_ca_certificate).decode()
    assert pem.startswith("-----BEGIN CERTIFICATE-----") and pem.rstrip().endswith(
        "-----END CERTIFICATE-----"
    )
    assert cluster.workload_identity_config.workload_pool == "proj-sim-a.svc.id.goog"


def test_create_pool_operation_runs_then_done_and_nodes_register(virtual_sim):
    sim = virtual_sim  # the create, the registration and the delete on the fleet's clock, moved by the test
    gke = gke_client(sim)
    core = k8s.CoreV1Api(kube_api_client(sim, "sim-a"))
    t0 = sim.clock.monotonic()
    op = gke.create_node_pool(parent=parent(A), node_pool=tpu_pool("falcon-life", hosts=2, topology="2x4"))
    assert op.status == container_v1.Operation.Status.RUNNING
    assert op.operation_type == container_v1.Operation.Type.CREATE_NODE_POOL
    assert op.name.startswith("operation-")
    pool = gke.get_node_pool(name=f"{parent(A)}/nodePools/falcon-life")
    assert pool.status == container_v1.NodePool.Status.PROVISIONING
    assert pool.placement_policy.tpu_topology == "2x4" and pool.initial_node_count == 2

    created = t0 + sim_timings(sim, "sim-a", "node_pool_create")
    advance_to(sim, created - 0.001)
    assert gke.get_operation(name=op_path(A, op.name)).status == container_v1.Operation.Status.RUNNING
    advance_to(sim, created)  # DONE at node_pool_create, not before
    done = gke.get_operation(name=op_path(A, op.name))
    assert done.status == container_v1.Operation.Status.DONE
    assert not done.error.message and done.end_time
    assert (
        gke.get_node_pool(name=f"{parent(A)}/nodePools/falcon-life").status
        == container_v1.NodePool.Status.RUNNING
    )
    assert "falcon-life" in [p.name for p in gke.list_node_pools(parent=parent(A)).node_pools]

    selector = "cloud.google.com/gke-nodepool=falcon-life"
    registered = created + sim_timings(sim, "sim-a", "node_register")
    advance_to(sim, registered - 0.001)
    assert core.list_node(label_selector=selector).items == []
    advance_to(sim, registered)  # the nodes register node_register after the pool is RUNNING
    nodes = core.list_node(label_selector=selector).items
    assert len(nodes) == 2
    for node in nodes:
        labels = node.metadata.labels
        assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
        assert labels["cloud.google.com/gke-tpu-topology"] == "2x4"
        assert labels["managed-by"] == "falcon"
        assert node.status.allocatable["google.com/tpu"] == "4"
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)

    t1 = sim.clock.monotonic()
    delete_op = gke.delete_node_pool(name=f"{parent(A)}/nodePools/falcon-life")
    assert delete_op.operation_type == container_v1.Operation.Type.DELETE_NODE_POOL
    assert (
        gke.get_node_pool(name=f"{parent(A)}/nodePools/falcon-life").status
        == container_v1.NodePool.Status.STOPPING
    )
    deleted = t1 + sim_timings(sim, "sim-a", "node_pool_delete")
    advance_to(sim, deleted - 0.001)
    assert gke.get_operation(name=op_path(A, delete_op.name)).status == container_v1.Operation.Status.RUNNING
    advance_to(sim, deleted)
    assert gke.get_operation(name=op_path(A, delete_op.name)).status == container_v1.Operation.Status.DONE
    with pytest.raises(gexc.NotFound):
        gke.get_node_pool(name=f"{parent(A)}/nodePools/falcon-life", retry=None)
    assert core.list_node(label_selector=selector).items == []


def test_flex_start_pool_is_invisible_for_the_lag_then_runs_with_no_nodes(virtual_sim):
    sim = virtual_sim  # the lag and node registration on the fleet's clock, moved by the test
    gke = gke_client(sim)
    core = k8s.CoreV1Api(kube_api_client(sim, "sim-a"))
    op = gke.create_node_pool(
        parent=parent(A), node_pool=tpu_pool("falcon-flex", hosts=2, topology="2x4", flex=True)
    )
    with pytest.raises(gexc.NotFound):
        gke.get_node_pool(name=f"{parent(A)}/nodePools/falcon-flex", retry=None)
    assert "falcon-flex" not in [p.name for p in gke.list_node_pools(parent=parent(A)).node_pools]

    def listed():
        return next((p for p in gke.list_node_pools(parent=parent(A)).node_pools if p.name == "falcon-flex"), None)

    lag = sim_timings(sim, "sim-a", "flex_visibility_lag")
    sim.advance(lag - 0.001)
    assert listed() is None  # invisible for the whole lag
    sim.advance(0.001)
    pool = listed()  # and visible at its end
    assert pool is not None and pool.config.flex_start is True
    wait_operation(gke, f"projects/{A[0]}/locations/{A[1]}", op, 60, fleet=sim)
    assert (
        gke.get_node_pool(name=f"{parent(A)}/nodePools/falcon-flex").status
        == container_v1.NodePool.Status.RUNNING
    )
    sim.advance(600)  # ten minutes, not a moment past node_register (its tokens live an hour)
    # the autoscaler adds nodes only for pending pods (tests/test_sim_autoscaler.py)
    assert core.list_node(label_selector="cloud.google.com/gke-nodepool=falcon-flex").items == []


def test_operations_on_distinct_pools_run_together_and_a_second_on_one_pool_is_failed_precondition(sim):
    gke = gke_client(sim)
    first = gke.create_node_pool(parent=parent(A), node_pool=tpu_pool("falcon-first"))
    second = gke.create_node_pool(parent=parent(A), node_pool=tpu_pool("falcon-second"))
    with pytest.raises(gexc.BadRequest) as err:
        gke.delete_node_pool(name=f"{parent(A)}/nodePools/falcon-first")
    body = err.value.response.json()["error"]
    assert body["status"] == "FAILED_PRECONDITION" and body["code"] == 400
    assert f"Cluster is running incompatible operation {first.name}" in body["message"]
    wait_done(gke, A, first)
    wait_done(gke, A, second)
    with pytest.raises(gexc.Conflict):
        gke.create_node_pool(parent=parent(A), node_pool=tpu_pool("falcon-first"))
    delete_and_wait(gke, A, "falcon-first")
    delete_and_wait(gke, A, "falcon-second")
    assert sim.stats()["clusters"]["sim-a"]["max_concurrent_pool_ops"] == 3


def test_create_error_fault_ends_in_a_done_operation_with_error_and_an_error_pool(sim):
    gke = gke_client(sim)
    sim.set_faults(
        "sim-b", create_error="Quota 'TPUS_PER_PROJECT' exceeded. Limit: 0.0 in region us-central1."
    )
    op = gke.create_node_pool(parent=parent(B), node_pool=tpu_pool("falcon-quota"))
    assert op.status == container_v1.Operation.Status.RUNNING
    done = wait_done(gke, B, op)
    assert done.error.code == 8 and "TPUS_PER_PROJECT" in done.error.message
    pool = gke.get_node_pool(name=f"{parent(B)}/nodePools/falcon-quota")
    assert pool.status == container_v1.NodePool.Status.ERROR and "TPUS_PER_PROJECT" in pool.status_message
    delete_and_wait(gke, B, "falcon-quota")


def test_create_error_fault_takes_the_code_it_is_given(sim):
    gke = gke_client(sim)
    before = sim.stats()["clusters"]["sim-b"]["fault_counts"]["create_error"]
    sim.set_faults("sim-b", create_error="Internal error while creating the node pool.", create_error_code=13)
    done = wait_done(gke, B, gke.create_node_pool(parent=parent(B), node_pool=tpu_pool("falcon-internal")))
    assert done.error.code == 13 and done.error.message == "Internal error while creating the node pool."
    assert sim.stats()["clusters"]["sim-b"]["fault_counts"]["create_error"] == before + 1
    delete_and_wait(gke, B, "falcon-internal")


def test_stockout_beyond_cluster_chips(sim):
    gke = gke_client(sim)
    op = gke.create_node_pool(parent=parent(B), node_pool=tpu_pool("falcon-big", hosts=4, topology="4x4"))
    done = wait_done(gke, B, op)
    assert done.error.code == 8
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in done.error.message and "does not have enough resources available" in done.error.message
    assert (
        gke.get_node_pool(name=f"{parent(B)}/nodePools/falcon-big").status
        == container_v1.NodePool.Status.ERROR
    )
    delete_and_wait(gke, B, "falcon-big")
    # 8 chips fit exactly; the failed pool held nothing
    op = gke.create_node_pool(parent=parent(B), node_pool=tpu_pool("falcon-fits", hosts=2, topology="2x4"))
    assert not wait_done(gke, B, op).error.message
    delete_and_wait(gke, B, "falcon-fits")


def test_reservation_in_use_count_follows_reservation_pools(sim):
    gke = gke_client(sim)
    res = compute_client(sim)

    def in_use():
        r = res.get(project=A[0], zone=A[1], reservation="res-sim-a")
        assert r.specific_reservation.count == 4 and r.status == "READY"
        assert r.specific_reservation.instance_properties.machine_type == "ct6e-standard-4t"
        return r.specific_reservation.in_use_count

    assert in_use() == 0
    op = gke.create_node_pool(
        parent=parent(A), node_pool=tpu_pool("falcon-res", 2, "2x4", reservation="res-sim-a")
    )
    assert in_use() == 2
    assert not wait_done(gke, A, op).error.message
    op = gke.create_node_pool(
        parent=parent(A), node_pool=tpu_pool("falcon-res2", 4, "4x4", reservation="res-sim-a")
    )
    done = wait_done(gke, A, op)
    assert done.error.code == 8 and "res-sim-a" in done.error.message
    assert in_use() == 2
    delete_and_wait(gke, A, "falcon-res2")
    delete_and_wait(gke, A, "falcon-res")
    assert in_use() == 0
    with pytest.raises(gexc.NotFound):
        res.get(project=A[0], zone=A[1], reservation="no-such-res", retry=None)


def test_unknown_project_cluster_and_bad_requests(sim):
    gke = gke_client(sim)
    with pytest.raises(gexc.Forbidden):
        gke.get_cluster(name="projects/nobody/locations/us-east5-b/clusters/sim-a")
    with pytest.raises(gexc.NotFound):
        gke.get_cluster(name=f"projects/{A[0]}/locations/{A[1]}/clusters/missing")
    with pytest.raises(gexc.NotFound):
        gke.get_operation(name=op_path(A, "operation-1-deadbeef"), retry=None)
    with pytest.raises(gexc.BadRequest):
        gke.create_node_pool(parent=parent(A), node_pool=container_v1.NodePool(name="Bad_Name"))
    with pytest.raises(gexc.BadRequest, match="needs 2 node"):
        gke.create_node_pool(parent=parent(A), node_pool=tpu_pool("falcon-wrong", hosts=3, topology="2x4"))
    token = fresh_token()
    for body in (
        b"{not json",
        b"[1, 2]",
        {"nodePool": "x"},
        {"nodePool": {"name": "ok", "initialNodeCount": "x"}},
        {"nodePool": {"name": "ok", "initialNodeCount": 1, "autoscaling": "x"}},
        {"nodePool": {"name": "ok", "config": {"machineType": 5}}},
        {"nodePool": {"name": "ok", "config": {"labels": {"a": 1}}}},
        {
            "nodePool": {
                "name": "ok",
                "config": {"reservationAffinity": {"consumeReservationType": 3, "values": [7]}},
            }
        },
    ):
        status, answer = raw(sim, "POST", f"/v1/{parent(A)}/nodePools", body, token)
        assert status == 400 and answer["error"]["status"] == "INVALID_ARGUMENT", answer
    status, answer = raw(sim, "GET", "/v1/nothing/here", token=token)
    assert status == 404 and answer["error"]["status"] == "NOT_FOUND"


def test_enum_names_are_accepted_and_returned_without_int_encoding(sim):
    token = fresh_token()
    body = {
        "nodePool": {
            "name": "falcon-names",
            "initialNodeCount": 1,
            "config": {
                "machineType": "ct6e-standard-4t",
                "reservationAffinity": {
                    "consumeReservationType": "SPECIFIC_RESERVATION",
                    "key": RESERVATION_KEY,
                    "values": ["res-sim-a"],
                },
            },
        }
    }
    status, op = raw(sim, "POST", f"/v1/{parent(A)}/nodePools", body, token)
    assert status == 200 and op["status"] == "RUNNING" and op["operationType"] == "CREATE_NODE_POOL"
    status, pool = raw(sim, "GET", f"/v1/{parent(A)}/nodePools/falcon-names", token=token)
    assert pool["status"] == "PROVISIONING" and pool["config"]["reservationAffinity"]["values"] == [
        "res-sim-a"
    ]
    assert sim.stats()["clusters"]["sim-a"]["reservation"]["in_use"] == 1
    gke = gke_client(sim)
    wait_done(gke, A, container_v1.Operation(name=op["name"]))
    delete_and_wait(gke, A, "falcon-names")


def test_api_fault_rates_answer_503_and_429(sim):
    gke = gke_client(sim)
    sim.set_faults("sim-b", api_error_rate=1.0)
    with pytest.raises(gexc.ServiceUnavailable):
        gke.get_cluster(name=parent(B), retry=None)
    with pytest.raises(gexc.ServiceUnavailable):
        gke.list_node_pools(parent=parent(B), retry=None)
    assert gke.get_cluster(name=parent(A)).name == "sim-a"  # faults are per cluster
    sim.set_faults("sim-a", api_error_rate=1.0)
    with pytest.raises(gexc.ServiceUnavailable):
        compute_client(sim).get(project=A[0], zone=A[1], reservation="res-sim-a", retry=None)
    sim.set_faults("sim-b", api_error_rate=0.0, too_many_requests_rate=1.0)
    with pytest.raises(gexc.TooManyRequests) as err:
        gke.create_node_pool(parent=parent(B), node_pool=tpu_pool("falcon-429"), retry=None)
    assert "Too many operations" in str(err.value)
    sim.set_faults("sim-b", too_many_requests_rate=0.0)
    assert gke.get_cluster(name=parent(B)).name == "sim-b"
    with pytest.raises(ValueError):
        sim.set_faults("sim-b", api_error_rate=2)
    with pytest.raises(ValueError):
        sim.set_faults("sim-b", no_such_fault=1)


def test_fault_draws_are_reproducible_with_the_same_seed():
    def outcomes(seed):
        config = parse_fleet({**SIM_TEST_FLEET, "seed": seed, "auth": {"required": False}})
        with SimFleet(config) as fleet:
            fleet.set_faults("sim-a", api_error_rate=0.5)
            from google.auth.credentials import AnonymousCredentials

            gke = gke_client(fleet, credentials=AnonymousCredentials())
            seen = []
            for _ in range(16):
                try:
                    gke.get_cluster(name=parent(A), retry=None)
                    seen.append("ok")
                except gexc.ServiceUnavailable:
                    seen.append("503")
            return seen

    first = outcomes(5)
    assert first == outcomes(5)
    assert "ok" in first and "503" in first


def test_control_endpoint_merges_faults_and_rejects_bad_ones(sim):
    status, faults = raw(sim, "POST", "/sim/clusters/sim-b/faults", {"api_error_rate": 0.25})
    assert status == 200 and faults["api_error_rate"] == 0.25 and faults["deny_images"] == []
    status, faults = raw(sim, "POST", "/sim/clusters/sim-b/faults", {"deny_images": ["evil/"]})
    assert faults["api_error_rate"] == 0.25 and faults["deny_images"] == ["evil/"]
    status, answer = raw(sim, "POST", "/sim/clusters/sim-b/faults", {"api_error_rat": 0.1})
    assert status == 400 and "api_error_rat" in answer["error"]["message"]
    status, timings = raw(sim, "POST", "/sim/clusters/sim-b/timings", {"node_pool_create": 0.5})
    assert status == 200 and timings["node_pool_create"] == 0.5 and timings["node_register"] == 0.2
    status, answer = raw(sim, "POST", "/sim/clusters/nope/faults", {})
    assert status == 404
    status, reset = raw(sim, "POST", "/sim/clusters/sim-b/reset", {})
    assert reset["faults"]["api_error_rate"] == 0.0 and reset["timings"]["node_pool_create"] == 0.3


def test_incompatible_op_fault_refuses_pool_operations_and_is_counted(sim):
    gke = gke_client(sim)
    before = sim.stats()["clusters"]["sim-b"]["fault_counts"]
    sim.set_faults("sim-b", incompatible_op_rate=1.0)
    with pytest.raises(gexc.BadRequest) as err:
        gke.create_node_pool(parent=parent(B), node_pool=tpu_pool("falcon-upgrading"), retry=None)
    assert "incompatible operation" in str(err.value) and "Please wait and try again" in str(err.value)
    assert gke.get_cluster(name=parent(B)).name == "sim-b"  # only pool operations are refused
    sim.set_faults("sim-b", incompatible_op_rate=0.0, api_error_rate=1.0)
    with pytest.raises(gexc.ServiceUnavailable):
        gke.get_cluster(name=parent(B), retry=None)
    sim.set_faults("sim-b", api_error_rate=0.0)
    stats = sim.stats()["clusters"]["sim-b"]
    after = stats["fault_counts"]
    assert after["incompatible_op"] == before["incompatible_op"] + 1
    assert after["api_503"] == before["api_503"] + 1
    # GKE's own operation is not the caller's concurrency
    assert stats["max_concurrent_pool_ops"] <= 1 and stats["rejected_pool_ops"] == 0
