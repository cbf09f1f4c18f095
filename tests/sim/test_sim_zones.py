"""Regional clusters, node-pool zones and zonal reservations, through the real container_v1 / compute_v1 clients."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1
from kubernetes import client as k8s

from falcon_ray.sim.server import SimFleet
from tests.harness.sim import compute_client, gke_client, poll_until, private_fleet_config, wait_operation

REGION, ZONE_A, ZONE_B = "us-central1", "us-central1-a", "us-central1-b"
REG_LOCATION = f"projects/proj-reg/locations/{REGION}"
REG = f"{REG_LOCATION}/clusters/reg"
ZONAL = "projects/proj-zonal/locations/europe-west4-a/clusters/zonal"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


@pytest.fixture(scope="module")
def fleet():
    config = private_fleet_config(
        [
            {
                "name": "reg",
                "project": "proj-reg",
                "location": REGION,
                "node_locations": [ZONE_A, ZONE_B],
                "reservation": {"name": "res-reg", "count": 2, "zone": ZONE_B},
                "chips": 16,
            },
            {"name": "zonal", "project": "proj-zonal", "location": "europe-west4-a", "chips": 8},
        ]
    )
    with SimFleet(config) as running:
        yield running


@pytest.fixture
def gke(fleet):
    return gke_client(fleet, credentials=AnonymousCredentials())


def tpu_pool(name, locations=None, reservation=None):
    config = container_v1.NodeConfig(machine_type="ct6e-standard-4t")
    if reservation:
        config.reservation_affinity = container_v1.ReservationAffinity(
            consume_reservation_type=container_v1.ReservationAffinity.Type.SPECIFIC_RESERVATION,
            key=RESERVATION_KEY,
            values=[reservation],
        )
    return container_v1.NodePool(name=name, initial_node_count=1, config=config, locations=locations or [])


def delete(gke, name):
    done = wait_operation(gke, REG_LOCATION, gke.delete_node_pool(name=f"{REG}/nodePools/{name}"))
    assert not done.error.message


def test_cluster_get_returns_the_node_locations(gke):
    cluster = gke.get_cluster(name=REG)
    assert cluster.location == REGION and list(cluster.locations) == [ZONE_A, ZONE_B]
    assert list(gke.get_cluster(name=ZONAL).locations) == ["europe-west4-a"]
    listed = gke.list_clusters(parent=REG_LOCATION).clusters
    assert [c.name for c in listed] == ["reg"]


@pytest.mark.parametrize(
    "locations",
    [None, [ZONE_A, ZONE_B], ["us-central1-c"], ["us-east5-a"]],
    ids=["0", "2", "other", "region"],
)
def test_tpu_pool_not_in_exactly_one_node_location_is_refused(gke, locations):
    with pytest.raises(gexc.BadRequest) as err:
        gke.create_node_pool(parent=REG, node_pool=tpu_pool("falcon-zones", locations), retry=None)
    body = err.value.response.json()["error"]
    assert body["code"] == 400 and body["status"] == "INVALID_ARGUMENT"
    assert "zone" in body["message"] and "locations" in body["message"]


def test_tpu_pool_in_one_zone_of_a_regional_cluster_runs_there(fleet, gke):
    core = k8s.CoreV1Api(
        k8s.ApiClient(k8s.Configuration(host=fleet.endpoints["clusters"]["reg"]["kubernetes"]))
    )
    op = gke.create_node_pool(parent=REG, node_pool=tpu_pool("falcon-a", [ZONE_A]))
    assert not wait_operation(gke, REG_LOCATION, op).error.message  # operations answer under the region
    assert list(gke.get_node_pool(name=f"{REG}/nodePools/falcon-a").locations) == [ZONE_A]
    (node,) = poll_until(
        lambda: core.list_node(label_selector="cloud.google.com/gke-nodepool=falcon-a").items, what="node"
    )
    assert node.metadata.labels["topology.kubernetes.io/zone"] == ZONE_A
    assert node.metadata.labels["topology.kubernetes.io/region"] == REGION
    stats = next(p for p in fleet.stats()["clusters"]["reg"]["node_pools"] if p["name"] == "falcon-a")
    assert stats["zone"] == ZONE_A and stats["locations"] == [ZONE_A]
    delete(gke, "falcon-a")


def test_a_cpu_pool_spans_the_node_locations_with_its_count_per_zone(fleet, gke):
    core = k8s.CoreV1Api(
        k8s.ApiClient(k8s.Configuration(host=fleet.endpoints["clusters"]["reg"]["kubernetes"]))
    )
    pool = container_v1.NodePool(
        name="falcon-cpu", initial_node_count=1, config=container_v1.NodeConfig(machine_type="e2-standard-4")
    )
    assert not wait_operation(
        gke, REG_LOCATION, gke.create_node_pool(parent=REG, node_pool=pool)
    ).error.message
    found = poll_until(
        lambda: core.list_node(label_selector="cloud.google.com/gke-nodepool=falcon-cpu").items, what="nodes"
    )
    assert sorted(n.metadata.labels["topology.kubernetes.io/zone"] for n in found) == [ZONE_A, ZONE_B]
    delete(gke, "falcon-cpu")


def test_the_reservation_answers_only_in_its_zone(fleet):
    res = compute_client(fleet, credentials=AnonymousCredentials())
    found = res.get(project="proj-reg", zone=ZONE_B, reservation="res-reg")
    assert found.specific_reservation.count == 2 and found.zone.endswith(f"/zones/{ZONE_B}")
    assert found.specific_reservation.instance_properties.machine_type == "ct6e-standard-4t"
    with pytest.raises(gexc.NotFound) as err:
        res.get(project="proj-reg", zone=ZONE_A, reservation="res-reg", retry=None)
    assert f"The resource 'projects/proj-reg/zones/{ZONE_A}/reservations/res-reg' was not found" in str(
        err.value
    )
    assert list(res.list(project="proj-reg", zone=ZONE_A)) == []


def test_a_reservation_pool_outside_the_reservations_zone_fails_clearly(fleet, gke):
    op = gke.create_node_pool(parent=REG, node_pool=tpu_pool("falcon-res-a", [ZONE_A], "res-reg"))
    done = wait_operation(gke, REG_LOCATION, op)
    assert done.error.code == 5
    assert "res-reg is in zone us-central1-b" in done.error.message
    assert "must be in the reservation's zone" in done.error.message
    pool = gke.get_node_pool(name=f"{REG}/nodePools/falcon-res-a")
    assert pool.status == container_v1.NodePool.Status.ERROR
    assert fleet.stats()["clusters"]["reg"]["reservation"] == {
        "name": "res-reg",
        "zone": ZONE_B,
        "count": 2,
        "in_use": 0,
    }
    delete(gke, "falcon-res-a")

    op = gke.create_node_pool(parent=REG, node_pool=tpu_pool("falcon-res-b", [ZONE_B], "res-reg"))
    assert not wait_operation(gke, REG_LOCATION, op).error.message
    assert fleet.stats()["clusters"]["reg"]["reservation"]["in_use"] == 1
    delete(gke, "falcon-res-b")
