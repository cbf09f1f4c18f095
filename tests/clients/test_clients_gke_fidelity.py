"""falcon_ray.gcp and render against a simulated fleet that models what GKE and Compute
document: a reservation shared from another project (read in its owner's project, consumed
through ``projects/P/reservations/R``), a bogus zone in ``locations`` refused, and TPU7x
workload policies (``resourcePolicies.get``; a pool naming a missing one is refused)."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
from google.auth.credentials import AnonymousCredentials

from falcon_ray import render
from falcon_ray.errors import CloudError, ErrorKind
from falcon_ray.gcp import ComputeApi, GkeApi, ResourcePolicyApi
from falcon_ray.model import Cluster
from falcon_ray.sim.server import SimFleet
from falcon_ray.spec import TaskSpec
from tests.harness.sim import poll_until, private_fleet_config

_TASK_IDS = itertools.count(930_000)
RETRY = dict(initial=0.02, maximum=0.1, timeout=3.0, request_timeout=5.0)


@pytest.fixture(scope="module")
def fleet():
    config = private_fleet_config(
        [
            {
                "name": "shared-a",
                "project": "proj-consumer",
                "location": "us-east5-b",
                "tpu_type": "v6e",
                "reservation": {"name": "res-shared", "count": 4, "project": "proj-owner"},
            },
            {
                "name": "v7x-r",
                "project": "proj-v7",
                "location": "us-central1",
                "node_locations": ["us-central1-c", "us-central1-a"],
                "tpu_type": "v7x",
                "chips": 64,
                "workload_policies": [{"name": "falcon-2x2x2", "accelerator_topology": "2x2x2"}],
            },
        ]
    )
    with SimFleet(config) as running:
        yield running


def apis(fleet):
    creds = AnonymousCredentials()
    return (
        GkeApi(endpoint=fleet.endpoints["gke"], credentials=creds, **RETRY),
        ComputeApi(endpoint=fleet.endpoints["compute"], credentials=creds, **RETRY),
        ResourcePolicyApi(endpoint=fleet.endpoints["compute"], credentials=creds, **RETRY),
    )


def cluster(name: str, project: str, location: str, tpu_type: str, reservation: str = "") -> Cluster:
    now = dt.datetime(2026, 1, 1)
    return Cluster(
        id=name, name=name, project=project, location=location, tpu_type=tpu_type, gcs_bucket="",
        default_reservation=reservation, status="active", namespace="falcon-jobs", service_account="falcon-job",
        created_at=now, updated_at=now,
    )


def create_and_wait(gke: GkeApi, c: Cluster, request: dict):
    op = gke.create_node_pool(c.project, c.location, c.name, request)
    return poll_until(lambda: (i := gke.get_operation(c.project, c.location, op)).done and i, timeout=10, what=op)


def delete_and_wait(gke: GkeApi, c: Cluster, name: str) -> None:
    op = gke.delete_node_pool(c.project, c.location, c.name, name)
    if op:
        poll_until(lambda: gke.get_operation(c.project, c.location, op).done, timeout=10, what=op)


def v6e_request(c: Cluster, **kw) -> tuple[str, dict]:
    task = next(_TASK_IDS)
    spec = TaskSpec(tpu_type="v6e", topology="2x4", image="busybox", command=["true"])
    name = render.node_pool_name(task, "2x4")
    return name, render.node_pool_request(spec, c, "reservation", name, task, idle_seconds=600, **kw)


def test_a_shared_reservation_is_read_in_its_owners_project(fleet):
    _, compute, _ = apis(fleet)
    info = compute.reservation("proj-owner", "us-east5-b", "res-shared")
    assert (info.name, info.count, info.machine_type) == ("res-shared", 4, "ct6e-standard-4t")
    with pytest.raises(CloudError) as e:  # not in the consumer's project
        compute.reservation("proj-consumer", "us-east5-b", "res-shared")
    assert e.value.kind == ErrorKind.NOT_FOUND


@pytest.mark.parametrize("form", ["projects/proj-owner/reservations/res-shared", "projects/proj-owner/zones/us-east5-b/reservations/res-shared"])
def test_a_pool_consumes_a_shared_reservation_through_its_full_path(fleet, form):
    gke, compute, _ = apis(fleet)
    c = cluster("shared-a", "proj-consumer", "us-east5-b", "v6e", form)
    name, request = v6e_request(c)
    assert request["config"]["reservationAffinity"]["values"] == ["projects/proj-owner/reservations/res-shared"]
    assert request["locations"] == ["us-east5-b"]
    assert "oauthScopes" in request["config"]
    before = compute.reservation("proj-owner", "us-east5-b", "res-shared").in_use
    done = create_and_wait(gke, c, request)
    assert done.error is None, done.error
    assert compute.reservation("proj-owner", "us-east5-b", "res-shared").in_use == before + 2
    assert gke.get_node_pool(c.project, c.location, c.name, name).raw["config"]["oauthScopes"] == [
        "https://www.googleapis.com/auth/cloud-platform"
    ]
    delete_and_wait(gke, c, name)


def test_a_bare_name_means_the_clusters_own_project_and_is_not_found(fleet):
    gke, _, _ = apis(fleet)
    c = cluster("shared-a", "proj-consumer", "us-east5-b", "v6e", "res-shared")
    name, request = v6e_request(c)
    done = create_and_wait(gke, c, request)
    assert done.error is not None and done.error.kind == ErrorKind.NOT_FOUND
    assert "projects/proj-consumer/zones/us-east5-b/reservations/res-shared" in done.error.message
    delete_and_wait(gke, c, name)


def test_what_splitting_the_path_at_its_first_slash_sent_is_refused(fleet):
    """The old request: locations ["projects"] and the value "P/reservations/R"."""
    gke, _, _ = apis(fleet)
    c = cluster("shared-a", "proj-consumer", "us-east5-b", "v6e", "projects/proj-owner/reservations/res-shared")
    _, request = v6e_request(c)
    bogus_zone = {**request, "locations": ["projects"]}
    with pytest.raises(CloudError) as e:
        gke.create_node_pool(c.project, c.location, c.name, bogus_zone)
    assert e.value.kind == ErrorKind.PERMANENT and "locations" in e.value.message
    affinity = {**request["config"]["reservationAffinity"], "values": ["proj-owner/reservations/res-shared"]}
    bogus_value = {**request, "config": {**request["config"], "reservationAffinity": affinity}}
    with pytest.raises(CloudError) as e:
        gke.create_node_pool(c.project, c.location, c.name, bogus_value)
    assert e.value.kind == ErrorKind.PERMANENT


def test_workload_policies_are_read_through_compute(fleet):
    _, _, policies = apis(fleet)
    found = policies.get("proj-v7", "us-central1", "falcon-2x2x2")
    assert found["name"] == "falcon-2x2x2"
    assert found["workloadPolicy"]["acceleratorTopology"] == "2x2x2"
    assert found["workloadPolicy"]["type"] == "HIGH_THROUGHPUT"
    assert policies.get("proj-v7", "us-central1", "falcon-2x2x4") is None
    assert policies.get("proj-v7", "europe-west4", "falcon-2x2x2") is None
    v7x = cluster("v7x-r", "proj-v7", "us-central1", "v7x")
    assert render.workload_policy_problem("falcon-2x2x2", "2x2x2", v7x, found) is None
    assert "gcloud compute resource-policies create workload-policy falcon-2x2x4" in render.workload_policy_problem(
        "falcon-2x2x4", "2x2x4", v7x, None
    )


@pytest.mark.parametrize(("topology", "ok"), [("2x2x2", True), ("2x2x4", False)])
def test_a_v7x_pool_on_a_regional_cluster_names_one_zone_and_an_existing_policy(fleet, topology, ok):
    gke, _, _ = apis(fleet)
    c = cluster("v7x-r", "proj-v7", "us-central1", "v7x")
    task = next(_TASK_IDS)
    spec = TaskSpec(tpu_type="v7x", topology=topology, image="busybox", command=["true"])
    name = render.node_pool_name(task, topology)
    zones = tuple(gke.get_cluster(c.project, c.location, c.name).locations)
    request = render.node_pool_request(
        spec, c, "on-demand", name, task, idle_seconds=600, workload_policy=f"falcon-{topology}", node_zones=zones
    )
    assert request["locations"] == ["us-central1-a"]  # the first node zone in sorted order
    assert request["placementPolicy"] == {"policyName": f"falcon-{topology}"}
    if ok:
        assert create_and_wait(gke, c, request).error is None
        pool = gke.get_node_pool(c.project, c.location, c.name, name)
        assert pool.locations == ("us-central1-a",)
        delete_and_wait(gke, c, name)
    else:
        with pytest.raises(CloudError) as e:
            gke.create_node_pool(c.project, c.location, c.name, request)
        assert e.value.kind == ErrorKind.NOT_FOUND and "resourcePolicies/falcon-2x2x4" in e.value.message
