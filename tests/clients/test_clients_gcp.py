"""falcon_ray.gcp against the simulated fleet: the real GKE and Compute clients, no mocks.

Credentials come from ``google.auth.default()``, which the ``sim_fleet`` fixture points at
the simulator's metadata server; only the endpoints differ from production.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from falcon_ray import render, scheduling, tpu
from falcon_ray.errors import CloudError, ErrorKind
from falcon_ray.gcp import ComputeApi, GkeApi, OperationInfo
from falcon_ray.spec import TaskSpec
from falcon_ray.store.repository import Cluster
from tests.harness.sim import poll_until

# Task ids for pool names: distinct from other modules' and unique within the session.
_TASK_IDS = itertools.count(910_000)


def registry_cluster(fleet, name: str) -> Cluster:
    """The registry row the controller would hold for a simulated cluster."""
    cfg = fleet.config.cluster(name)
    now = dt.datetime(2026, 1, 1)
    return Cluster(
        id=name,
        name=name,
        project=cfg.project,
        location=cfg.location,
        tpu_type=cfg.tpu_type,
        gcs_bucket=cfg.gcs_bucket or "",
        default_reservation=cfg.reservation.name if cfg.reservation else "",
        status="active",
        namespace="falcon-jobs",
        service_account="falcon-runner",
        created_at=now,
        updated_at=now,
    )


def gke_api(fleet, **retry) -> GkeApi:
    settings = dict(initial=0.02, maximum=0.1, timeout=3.0, request_timeout=5.0)
    settings.update(retry)
    return GkeApi(endpoint=fleet.endpoints["gke"], **settings)


def pool_request(cluster: Cluster, topology: str, mode: str) -> tuple[int, str, dict]:
    task_id = next(_TASK_IDS)
    spec = TaskSpec(tpu_type="v6e", topology=topology, image="busybox", command=["true"])
    name = render.node_pool_name(task_id, topology)
    return task_id, name, render.node_pool_request(spec, cluster, mode, name, task_id, idle_seconds=600)


def create(api: GkeApi, c: Cluster, request: dict) -> str:
    """Create, waiting out an operation another test may still have running on the cluster."""

    def attempt():
        try:
            return api.create_node_pool(c.project, c.location, c.name, request)
        except CloudError as e:
            if e.kind == ErrorKind.INCOMPATIBLE_OPERATION:
                return None
            raise

    return poll_until(attempt, timeout=10, what="a free operation slot")


def wait_done(api: GkeApi, c: Cluster, operation: str) -> OperationInfo:
    return poll_until(
        lambda: (info := api.get_operation(c.project, c.location, operation)).done and info,
        timeout=10,
        what=f"operation {operation}",
    )


def delete(api: GkeApi, c: Cluster, name: str) -> None:
    def attempt():
        try:
            return api.delete_node_pool(c.project, c.location, c.name, name) or "gone"
        except CloudError as e:
            if e.kind == ErrorKind.INCOMPATIBLE_OPERATION:
                return None
            raise

    op = poll_until(attempt, timeout=10, what="a free operation slot")
    if op != "gone":
        assert wait_done(api, c, op).error is None


def test_get_cluster_returns_the_kubernetes_endpoint_and_ca(sim):
    api = gke_api(sim)
    endpoint = api.get_cluster("proj-sim-k", "europe-west4-a", "sim-k")
    assert f"http://{endpoint.endpoint}" == sim.endpoints["clusters"]["sim-k"]["kubernetes"]
    assert endpoint.ca_certificate_pem.startswith("-----BEGIN CERTIFICATE-----")


def test_unknown_cluster_is_not_found(sim):
    with pytest.raises(CloudError) as info:
        gke_api(sim).get_cluster("proj-sim-k", "europe-west4-a", "no-such-cluster")
    assert info.value.kind == ErrorKind.NOT_FOUND and info.value.status_code == 404
    assert "POST" not in info.value.message and "GET http" not in info.value.message


@pytest.mark.parametrize(("topology", "mode"), [("2x4", "reservation"), ("2x2", "on-demand")])
def test_create_a_pool_follow_its_operation_then_delete_it(sim, topology, mode):
    api = gke_api(sim)
    c = registry_cluster(sim, "sim-a")
    task_id, name, request = pool_request(c, topology, mode)
    op = create(api, c, request)
    assert op.startswith("operation-")
    first = api.get_operation(c.project, c.location, op)
    assert first.operation_type == "CREATE_NODE_POOL" and first.status in ("PENDING", "RUNNING", "DONE")
    done = wait_done(api, c, op)
    assert done.status == "DONE" and done.error is None and name in done.target

    pool = api.get_node_pool(c.project, c.location, c.name, name)
    assert pool is not None and pool.status == "RUNNING"
    assert pool.machine_type == tpu.lookup("v6e", topology).machine_type
    assert pool.initial_node_count == tpu.lookup("v6e", topology).hosts
    assert pool.resource_labels == {"managed-by": "falcon", "falcon-task": str(task_id), "falcon-installation": "default"}
    assert pool.managed_by_falcon and pool.locations == (c.location,)
    assert name in {p.name for p in api.list_node_pools(c.project, c.location, c.name)}

    # A second create of the same deterministic name is ALREADY_EXISTS (the caller adopts).
    with pytest.raises(CloudError) as again:
        create(api, c, request)
    assert again.value.kind == ErrorKind.ALREADY_EXISTS

    delete(api, c, name)
    assert api.get_node_pool(c.project, c.location, c.name, name) is None
    assert api.delete_node_pool(c.project, c.location, c.name, name) is None  # already gone


def test_flex_start_pool_is_invisible_for_a_while_after_create(sim):
    sim.set_timings("sim-a", flex_visibility_lag=0.8)
    api = gke_api(sim)
    c = registry_cluster(sim, "sim-a")
    _, name, request = pool_request(c, "2x2", "flex-start")
    assert request["initialNodeCount"] == 0 and request["config"]["flexStart"] is True
    op = create(api, c, request)
    assert api.get_node_pool(c.project, c.location, c.name, name) is None  # the visibility gap
    assert name not in {p.name for p in api.list_node_pools(c.project, c.location, c.name)}
    pool = poll_until(
        lambda: api.get_node_pool(c.project, c.location, c.name, name), timeout=5, what="flex pool"
    )
    assert pool.raw["config"]["flexStart"] is True
    wait_done(api, c, op)
    delete(api, c, name)


def test_a_second_operation_on_a_pool_whose_create_runs_is_an_incompatible_operation(sim):
    """GKE takes operations on distinct pools together (docs/sim.md, "Concurrent node-pool
    operations"); a delete of a pool whose create still runs is refused, naming that create."""
    sim.set_timings("sim-a", node_pool_create=1.0)
    api = gke_api(sim)
    c = registry_cluster(sim, "sim-a")
    _, first_name, first = pool_request(c, "2x2", "on-demand")
    _, second_name, second = pool_request(c, "2x2", "on-demand")
    op = create(api, c, first)
    other = create(api, c, second)  # another pool: accepted while the first create runs
    with pytest.raises(CloudError) as info:
        api.delete_node_pool(c.project, c.location, c.name, first_name)
    err = info.value
    assert err.kind == ErrorKind.INCOMPATIBLE_OPERATION and err.retryable
    assert err.status_code == 400 and f"incompatible operation {op}" in err.message
    wait_done(api, c, op)
    wait_done(api, c, other)
    delete(api, c, first_name)
    delete(api, c, second_name)


def test_stockout_is_reported_by_the_operation_with_the_apis_message(sim):
    api = gke_api(sim)
    c = registry_cluster(sim, "sim-b")  # 8 chips: a 4x4 slice (16 chips) cannot fit
    _, name, request = pool_request(c, "4x4", "on-demand")
    done = wait_done(api, c, create(api, c, request))
    assert done.error is not None
    assert done.error.kind == ErrorKind.STOCKOUT and not done.error.retryable
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in done.error.message
    assert f"'projects/{c.project}/zones/" in done.error.message  # GKE names the zone by its path
    pool = api.get_node_pool(c.project, c.location, c.name, name)
    assert pool is not None and pool.status == "ERROR"
    delete(api, c, name)


def test_quota_error_keeps_its_message(sim):
    quota = "Quota 'TPUS_PER_PROJECT' exceeded. Limit: 8.0 in region us-central1."
    sim.set_faults("sim-b", create_error=quota)
    api = gke_api(sim)
    c = registry_cluster(sim, "sim-b")
    _, name, request = pool_request(c, "2x2", "on-demand")
    done = wait_done(api, c, create(api, c, request))
    assert done.error.kind == ErrorKind.QUOTA_EXCEEDED
    assert done.error.message == quota and done.error.status_code == 429
    delete(api, c, name)


def test_reservation_mode_beyond_the_reservation_is_exhausted(sim):
    api = gke_api(sim)
    c = registry_cluster(sim, "sim-a")  # res-sim-a holds 4 hosts; 4x8 needs 8
    _, name, request = pool_request(c, "4x8", "reservation")
    done = wait_done(api, c, create(api, c, request))
    assert done.error.kind == ErrorKind.STOCKOUT and "res-sim-a" in done.error.message
    delete(api, c, name)


def test_reservation_read(sim):
    compute = ComputeApi(endpoint=sim.endpoints["compute"], initial=0.02, maximum=0.1, timeout=3.0)
    info = compute.reservation("proj-sim-a", "us-east5-b", "res-sim-a")
    assert (info.name, info.count, info.status) == ("res-sim-a", 4, "READY")
    assert info.machine_type == "ct6e-standard-4t"  # specificReservation.instanceProperties.machineType
    assert 0 <= info.in_use <= info.count and info.available == info.count - info.in_use
    with pytest.raises(CloudError) as missing:
        compute.reservation("proj-sim-a", "us-east5-b", "no-such-reservation")
    assert missing.value.kind == ErrorKind.NOT_FOUND


def test_reservation_in_use_follows_reservation_pools(sim):
    api = gke_api(sim)
    compute = ComputeApi(endpoint=sim.endpoints["compute"], initial=0.02, maximum=0.1, timeout=3.0)
    c = registry_cluster(sim, "sim-a")
    before = compute.reservation(c.project, c.location, c.default_reservation).in_use
    _, name, request = pool_request(c, "2x4", "reservation")
    wait_done(api, c, create(api, c, request))
    assert compute.reservation(c.project, c.location, c.default_reservation).in_use == before + 2
    assert scheduling.reservation_headroom(4, before + 2, 2).remaining_slices == (4 - before - 2) // 2
    delete(api, c, name)


def test_transient_errors_are_retried_within_the_budget(sim):
    sim.set_faults("sim-b", api_error_rate=0.5)
    api = gke_api(sim, timeout=10.0)
    c = registry_cluster(sim, "sim-b")
    for _ in range(10):  # each read survives a coin-flip 503 by retrying
        assert api.list_node_pools(c.project, c.location, c.name) is not None


def test_persistent_failures_surface_as_their_kind(sim):
    c = registry_cluster(sim, "sim-b")
    sim.set_faults("sim-b", api_error_rate=1.0)
    with pytest.raises(CloudError) as unavailable:
        gke_api(sim, timeout=0.3).list_node_pools(c.project, c.location, c.name)
    assert unavailable.value.kind == ErrorKind.TRANSIENT and unavailable.value.status_code == 503
    sim.set_faults("sim-b", api_error_rate=0.0, too_many_requests_rate=1.0)
    with pytest.raises(CloudError) as throttled:
        gke_api(sim, timeout=0.3).get_node_pool(c.project, c.location, c.name, "falcon-t1-2x2")
    assert throttled.value.kind == ErrorKind.TOO_MANY_OPERATIONS and throttled.value.status_code == 429
    # a create is refused by 429 before anything happens, so it is retried too (and fails here)
    _, _, request = pool_request(c, "2x2", "on-demand")
    with pytest.raises(CloudError) as create_throttled:
        gke_api(sim, timeout=0.3).create_node_pool(c.project, c.location, c.name, request)
    assert create_throttled.value.kind == ErrorKind.TOO_MANY_OPERATIONS


def test_invalid_request_is_permanent(sim):
    api = gke_api(sim)
    c = registry_cluster(sim, "sim-b")
    _, _, request = pool_request(c, "2x4", "on-demand")
    request["initialNodeCount"] = 3  # 2x4 needs 2 hosts
    with pytest.raises(CloudError) as info:
        api.create_node_pool(c.project, c.location, c.name, request)
    assert info.value.kind == ErrorKind.PERMANENT and info.value.status_code == 400
    assert "needs 2 node" in info.value.message


def test_importing_the_adapter_loads_one_compute_service_and_the_package_stays_whole():
    """Every ClusterActor process imports falcon_ray.gcp: it loads nothing of compute_v1 until
    the first ComputeApi, which must not pay for compute_v1's other 100-odd services; other
    code of the process still sees the whole package."""
    import subprocess
    import sys

    code = (
        "import sys, falcon_ray.gcp as g\n"
        "assert not [m for m in sys.modules if m.startswith('google.cloud.compute_v1')], 'compute_v1 loaded at import'\n"
        "assert g.ComputeApi.CLIENT is None\n"
        "g.ComputeApi(endpoint='http://127.0.0.1:9', credentials=__import__('google.auth.credentials').auth.credentials.AnonymousCredentials())\n"
        "loaded = {m for m in sys.modules if m.startswith('google.cloud.compute_v1.services.')}\n"
        "assert 'google.cloud.compute_v1.services.reservations' in loaded, loaded\n"
        "assert not any(m.startswith('google.cloud.compute_v1.services.instances') for m in loaded), loaded\n"
        "assert g.ComputeApi.CLIENT.__name__ == 'ReservationsClient'\n"
        "from google.cloud import compute_v1\n"
        "assert compute_v1.Instance.__name__ == 'Instance'\n"  # the first other name loads the rest
        "assert compute_v1.ReservationsClient is g.ComputeApi.CLIENT\n"
        "from google.cloud.compute_v1 import InstancesClient\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_threads_that_build_their_first_compute_client_at_once_all_get_it():
    """A restarted ClusterActor's actor call and its watch loop may both build the first
    ComputeApi: the soak saw 'module google.cloud.compute_v1 has no attribute
    ReservationsClient' from one of them while the other ran the package's __init__.
    Eight threads start together, half building a ComputeApi, half reading names of the
    package; unlocked, 5 or 6 of the 8 failed in every one of 5 runs."""
    import subprocess
    import sys

    code = (
        "import threading, falcon_ray.gcp as g\n"
        "from google.auth.credentials import AnonymousCredentials\n"
        "n = 8; barrier = threading.Barrier(n); errors = []\n"
        "def build(i):\n"
        "    barrier.wait()\n"
        "    try:\n"
        "        if i % 2:\n"
        "            g.ComputeApi(endpoint='http://127.0.0.1:9', credentials=AnonymousCredentials())\n"
        "        else:\n"
        "            from google.cloud import compute_v1\n"
        "            assert compute_v1.ReservationsClient.__name__ == 'ReservationsClient'\n"
        "            assert compute_v1.Instance.__name__ == 'Instance'\n"
        "    except Exception as e:\n"
        "        errors.append(repr(e))\n"
        "threads = [threading.Thread(target=build, args=(i,)) for i in range(n)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print(errors or 'ok')\n"
    )
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == "ok", (out.stdout[-2000:], out.stderr[-2000:])
