"""The simulated Kubernetes API of one cluster, driven by the real kubernetes client (BatchV1Api / CoreV1Api)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from google.cloud import container_v1
from kubernetes import client as k8s
from kubernetes import watch

from tests.harness.sim import (
    InThread,
    advance_until,
    gke_client,
    kube_api_client,
    open_watches,
    poll_until,
    wait_operation,
)

NS = "falcon-test"
K = ("proj-sim-k", "europe-west4-a", "sim-k")
PARENT = f"projects/{K[0]}/locations/{K[1]}/clusters/{K[2]}"
ACCEL = "cloud.google.com/gke-tpu-accelerator"
TOPO = "cloud.google.com/gke-tpu-topology"


def _create_pool(gke, name, hosts, topology):
    pool = container_v1.NodePool(
        name=name,
        initial_node_count=hosts,
        config=container_v1.NodeConfig(machine_type="ct6e-standard-4t", labels={"managed-by": "falcon"}),
    )
    if hosts > 1:
        pool.placement_policy = container_v1.NodePool.PlacementPolicy(type_=1, tpu_topology=topology)
    op = gke.create_node_pool(parent=PARENT, node_pool=pool)
    poll_until(
        lambda: (
            gke.get_operation(name=f"projects/{K[0]}/locations/{K[1]}/operations/{op.name}").status
            == container_v1.Operation.Status.DONE
        ),
        what=f"pool {name}",
    )


@pytest.fixture(scope="module")
def kube(sim_fleet):
    """Batch and Core clients for sim-k, which has a 2-host 2x4 pool and a 1-host 2x2 pool."""
    sim_fleet.reset_faults()
    gke = gke_client(sim_fleet)
    _create_pool(gke, "falcon-k-2x4", 2, "2x4")
    _create_pool(gke, "falcon-k-2x2", 1, "2x2")
    api = kube_api_client(sim_fleet, "sim-k")
    core = k8s.CoreV1Api(api)
    mine = "cloud.google.com/gke-nodepool in (falcon-k-2x4,falcon-k-2x2)"
    poll_until(lambda: len(core.list_node(label_selector=mine).items) == 3, what="3 nodes")
    yield k8s.BatchV1Api(api), core
    for name in ("falcon-k-2x2", "falcon-k-2x4"):
        op = gke.delete_node_pool(name=f"{PARENT}/nodePools/{name}")
        poll_until(
            lambda op=op: (
                gke.get_operation(name=f"projects/{K[0]}/locations/{K[1]}/operations/{op.name}").status
                == container_v1.Operation.Status.DONE
            ),
            what=f"delete {name}",
        )


@pytest.fixture
def vkube(virtual_sim):
    """Batch and Core clients for sim-k of a fleet on a ``ManualClock``, with a 1-host 2x2 pool."""
    gke = gke_client(virtual_sim)
    pool = container_v1.NodePool(
        name="falcon-k-2x2",
        initial_node_count=1,
        config=container_v1.NodeConfig(machine_type="ct6e-standard-4t", labels={"managed-by": "falcon"}),
    )
    wait_operation(gke, f"projects/{K[0]}/locations/{K[1]}", gke.create_node_pool(parent=PARENT, node_pool=pool), 60, fleet=virtual_sim)
    api = kube_api_client(virtual_sim, "sim-k")
    core = k8s.CoreV1Api(api)
    advance_until(virtual_sim, lambda: core.list_node().items, 60, "the node")
    return k8s.BatchV1Api(api), core


def watches(fleet) -> int:
    """sim-k's open watches, as the fleet holds them once ``advance`` returned."""
    return fleet.stats()["clusters"]["sim-k"]["kubernetes"]["open_watches"]


def job_body(
    name, hosts=1, topology="2x2", run="0.3", env=None, backoff=0, image="us-docker.pkg.dev/p/r/train:1"
):
    env_list = [{"name": "FALCON_SIM_RUN_SECONDS", "value": run}]
    env_list += [{"name": k, "value": v} for k, v in (env or {}).items()]
    spec = {
        "backoffLimit": backoff,
        "template": {
            "metadata": {"labels": {"managed-by": "falcon", "falcon/task": name}},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {ACCEL: "tpu-v6e-slice", TOPO: topology},
                "containers": [
                    {
                        "name": "main",
                        "image": image,
                        "env": env_list,
                        "resources": {"limits": {"google.com/tpu": "4"}, "requests": {"google.com/tpu": "4"}},
                    }
                ],
            },
        },
    }
    if hosts > 1:
        spec.update(completionMode="Indexed", completions=hosts, parallelism=hosts)
        spec["template"]["spec"]["subdomain"] = name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": {"managed-by": "falcon", "falcon/task": name}},
        "spec": spec,
    }


def wait_finished(batch, name, timeout=5.0):
    def finished():
        job = batch.read_namespaced_job(name, NS)
        types = {c.type for c in job.status.conditions or [] if c.status == "True"}
        return job if types & {"Complete", "Failed"} else None

    return poll_until(finished, timeout, what=f"job {name} to finish")


def pods_of(core, name):
    return core.list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/job-name={name}").items


def status_body(exc: k8s.ApiException) -> dict:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == exc.status
    return body


def test_multi_host_indexed_job_runs_to_complete(kube, sim):
    batch, core = kube
    created = batch.create_namespaced_job(NS, job_body("train-ok", hosts=2, topology="2x4"))
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    assert created.metadata.namespace == NS and created.metadata.generation == 1
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": created.metadata.uid}

    running = poll_until(
        lambda: (
            (j := batch.read_namespaced_job("train-ok", NS)).status.active == 2 and j.status.ready == 2 and j
        ),
        what="2 ready pods",
    )
    assert running.status.start_time is not None
    pods = pods_of(core, "train-ok")
    assert sorted(p.spec.hostname for p in pods) == ["train-ok-0", "train-ok-1"]
    assert {p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods} == {"0", "1"}
    assert {p.spec.subdomain for p in pods} == {"train-ok"}
    assert len({p.spec.node_name for p in pods}) == 2
    assert all(p.metadata.owner_references[0].uid == created.metadata.uid for p in pods)
    assert all(p.status.phase == "Running" for p in pods)

    job = wait_finished(batch, "train-ok")
    conditions = {c.type: c for c in job.status.conditions}
    assert set(conditions) == {"SuccessCriteriaMet", "Complete"}
    assert job.status.succeeded == 2 and job.status.failed is None and job.status.active is None
    assert job.status.completion_time is not None and job.status.completed_indexes == "0-1"
    for pod in pods_of(core, "train-ok"):
        assert pod.status.phase == "Succeeded"
        terminated = pod.status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason) == (0, "Completed")


def test_failing_job_reaches_backoff_limit(kube, sim):
    batch, core = kube
    batch.create_namespaced_job(NS, job_body("train-exit3", env={"FALCON_SIM_EXIT_CODE": "3"}))
    job = wait_finished(batch, "train-exit3")
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert (
        failed.reason == "BackoffLimitExceeded"
        and failed.message == "Job has reached the specified backoff limit"
    )
    assert "FailureTarget" in {c.type for c in job.status.conditions}
    assert job.status.failed == 1 and job.status.completion_time is None
    (pod,) = pods_of(core, "train-exit3")
    terminated = pod.status.container_statuses[0].state.terminated
    assert pod.status.phase == "Failed" and (terminated.exit_code, terminated.reason) == (3, "Error")


def test_backoff_limit_allows_retries_before_failing(kube, sim):
    batch, core = kube
    batch.create_namespaced_job(
        NS, job_body("train-retry", run="0.1", env={"FALCON_SIM_EXIT_CODE": "1"}, backoff=1)
    )
    job = wait_finished(batch, "train-retry")
    assert job.status.failed == 2 and len(pods_of(core, "train-retry")) == 2


@pytest.mark.parametrize("env", [{"FALCON_SIM_OOM": "1"}, {"FALCON_SIM_EXIT_CODE": "137"}])
def test_oom_killed_pods(kube, sim, env):
    batch, core = kube
    name = "train-oom-" + ("flag" if "FALCON_SIM_OOM" in env else "code")
    batch.create_namespaced_job(NS, job_body(name, env=env))
    job = wait_finished(batch, name)
    assert {c.type for c in job.status.conditions} >= {"Failed"}
    (pod,) = pods_of(core, name)
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")


def test_duplicate_job_is_409_and_not_counted(kube, sim):
    batch, _ = kube
    body = job_body("train-dup", run="0.1")
    batch.create_namespaced_job(NS, body)
    with pytest.raises(k8s.ApiException) as err:
        batch.create_namespaced_job(NS, body)
    assert err.value.status == 409
    status = status_body(err.value)
    assert (
        status["reason"] == "AlreadyExists" and status["message"] == 'jobs.batch "train-dup" already exists'
    )
    (record,) = [j for j in sim.stats()["clusters"]["sim-k"]["jobs"] if j["name"] == "train-dup"]
    assert record["creates"] == 1 and record["manifest"] == body


def test_missing_objects_are_404_status(kube, sim):
    batch, core = kube
    with pytest.raises(k8s.ApiException) as err:
        batch.read_namespaced_job("no-such-job", NS)
    assert err.value.status == 404
    assert status_body(err.value)["reason"] == "NotFound"
    with pytest.raises(k8s.ApiException) as err:
        core.delete_namespaced_pod("no-such-pod", NS)
    assert err.value.status == 404


def test_list_selectors_and_resource_version(kube, sim):
    batch, _ = kube
    for name, tier in (("sel-a", "x"), ("sel-b", "y"), ("sel-c", None)):
        body = job_body(name, run="0.1")
        if tier:
            body["metadata"]["labels"]["tier"] = tier
        batch.create_namespaced_job(NS, body)

    def names(**kw):
        listed = batch.list_namespaced_job(NS, **kw)
        assert int(listed.metadata.resource_version) > 0
        return sorted(j.metadata.name for j in listed.items if j.metadata.name.startswith("sel-"))

    assert names(label_selector="tier=x") == ["sel-a"]
    assert names(label_selector="tier!=x") == ["sel-b", "sel-c"]
    assert names(label_selector="tier") == ["sel-a", "sel-b"]
    assert names(label_selector="!tier") == ["sel-c"]
    assert names(label_selector="tier in (x,y),managed-by=falcon") == ["sel-a", "sel-b"]
    assert names(label_selector="tier notin (x)") == ["sel-b", "sel-c"]
    assert names(field_selector="metadata.name=sel-b") == ["sel-b"]
    page = batch.list_namespaced_job(NS, label_selector="tier", limit=1)
    assert len(page.items) == 1 and page.metadata._continue
    rest = batch.list_namespaced_job(NS, label_selector="tier", limit=1, _continue=page.metadata._continue)
    assert [rest.items[0].metadata.name] != [page.items[0].metadata.name]
    with pytest.raises(k8s.ApiException) as err:
        batch.list_namespaced_job(NS, label_selector="tier in (x")
    assert err.value.status == 400 and "unable to parse requirement" in status_body(err.value)["message"]


def test_unschedulable_pods_stay_pending_with_a_reason(kube, sim):
    batch, core = kube
    batch.create_namespaced_job(NS, job_body("train-4x4", hosts=4, topology="4x4"))

    def pending_with_reason():
        pods = pods_of(core, "train-4x4")
        conditions = [c for p in pods for c in p.status.conditions or [] if c.type == "PodScheduled"]
        return (
            len(pods) == 4
            and len(conditions) == 4
            and all(c.status == "False" for c in conditions)
            and conditions
        )

    conditions = poll_until(pending_with_reason, what="4 unschedulable pods")
    assert conditions[0].reason == "Unschedulable"
    total = len(core.list_node().items)
    assert f"0/{total} nodes are available" in conditions[0].message
    assert "node affinity/selector" in conditions[0].message
    job = batch.read_namespaced_job("train-4x4", NS)
    assert job.status.active == 4 and job.status.ready == 0
    batch.delete_namespaced_job("train-4x4", NS, propagation_policy="Background")
    poll_until(lambda: not pods_of(core, "train-4x4"), what="pods to be deleted with their Job")


def test_delete_propagation(kube, sim):
    batch, core = kube
    batch.create_namespaced_job(NS, job_body("train-orphan", run="30"))
    poll_until(lambda: pods_of(core, "train-orphan"), what="a pod")
    batch.delete_namespaced_job("train-orphan", NS, propagation_policy="Orphan")
    with pytest.raises(k8s.ApiException):
        batch.read_namespaced_job("train-orphan", NS)
    (pod,) = pods_of(core, "train-orphan")
    deleted = core.delete_namespaced_pod(pod.metadata.name, NS)
    assert deleted.metadata.name == pod.metadata.name
    assert pods_of(core, "train-orphan") == []


def test_invalid_jobs_are_422(kube, sim):
    batch, _ = kube
    body = job_body("train-bad")
    body["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    with pytest.raises(k8s.ApiException) as err:
        batch.create_namespaced_job(NS, body)
    status = status_body(err.value)
    assert err.value.status == 422 and status["reason"] == "Invalid"
    assert "spec.template.spec.restartPolicy" in status["message"]
    body = job_body("train-bad")
    body["spec"].update(completionMode="Indexed")
    with pytest.raises(k8s.ApiException) as err:
        batch.create_namespaced_job(NS, body)
    assert err.value.status == 422 and "spec.completions" in status_body(err.value)["message"]


def _post_json(kube, sim, path, body):
    """POST a JSON body as kubectl sends a YAML manifest (numbers stay numbers): (status, answer)."""
    base = sim.endpoints["clusters"]["sim-k"]["kubernetes"]
    token = kube[0].api_client.configuration.api_key["authorization"]
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_quantities_may_be_json_numbers_and_are_stored_canonically(kube, sim):
    # The Python client's models only take strings, so this is the wire form kubectl would send.
    batch, core = kube
    jobs = f"/apis/batch/v1/namespaces/{NS}/jobs"
    body = job_body("train-numbers")
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"google.com/tpu": 4, "cpu": 0.5, "memory": "1.5Gi"},
        "requests": {"google.com/tpu": 4, "cpu": 2},
    }
    status, _ = _post_json(kube, sim, jobs, body)
    assert status == 201
    resources = batch.read_namespaced_job("train-numbers", NS).spec.template.spec.containers[0].resources
    assert resources.limits == {"google.com/tpu": "4", "cpu": "500m", "memory": "1536Mi"}
    assert resources.requests == {"google.com/tpu": "4", "cpu": "2"}
    assert wait_finished(batch, "train-numbers").status.succeeded == 1
    (pod,) = pods_of(core, "train-numbers")
    assert (
        core.read_node(pod.spec.node_name).status.allocatable["google.com/tpu"] == "4"
    )  # it took a TPU host
    for bad in ("4x", True, {"n": 4}):
        body = job_body("train-bad-quantity")
        body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"google.com/tpu": bad}}
        status, answer = _post_json(kube, sim, jobs, body)
        assert status == 400 and answer["kind"] == "Status", (bad, answer)


def test_a_pod_asking_more_tpu_than_any_node_has_stays_pending_even_as_a_number(kube, sim):
    _, core = kube
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "too-big", "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "trainer:1", "resources": {"limits": {"google.com/tpu": 8}}}
            ],
        },
    }
    status, _ = _post_json(kube, sim, f"/api/v1/namespaces/{NS}/pods", pod)
    assert status == 201
    pending = poll_until(
        lambda: (p := core.read_namespaced_pod("too-big", NS)).status.conditions and p, what="a verdict"
    )
    assert (
        pending.status.phase == "Pending"
        and "Insufficient google.com/tpu" in pending.status.conditions[0].message
    )
    core.delete_namespaced_pod("too-big", NS)


def test_admission_denies_images(kube, sim):
    batch, _ = kube
    sim.set_faults("sim-k", deny_images=["docker.io/", "evil.example/"])
    with pytest.raises(k8s.ApiException) as err:
        batch.create_namespaced_job(NS, job_body("train-denied", image="docker.io/library/python:3"))
    assert err.value.status == 403
    message = status_body(err.value)["message"]
    assert message.startswith('admission webhook "policy.example.com" denied the request: image')
    assert "docker.io/library/python:3" in message
    assert not [j for j in sim.stats()["clusters"]["sim-k"]["jobs"] if j["name"] == "train-denied"]
    batch.create_namespaced_job(NS, job_body("train-allowed", run="0.1"))


def test_headless_service_lifecycle(kube, sim):
    _, core = kube
    body = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "train-svc", "namespace": NS},
        "spec": {"clusterIP": "None", "selector": {"job-name": "train-svc"}},
    }
    created = core.create_namespaced_service(NS, body)
    assert created.spec.cluster_ip == "None" and created.metadata.uid
    assert core.read_namespaced_service("train-svc", NS).spec.selector == {"job-name": "train-svc"}
    with pytest.raises(k8s.ApiException) as err:
        core.create_namespaced_service(NS, body)
    assert err.value.status == 409
    core.delete_namespaced_service("train-svc", NS)
    with pytest.raises(k8s.ApiException):
        core.read_namespaced_service("train-svc", NS)


def test_patch_replace_and_optimistic_concurrency(kube, sim):
    batch, _ = kube
    job = batch.create_namespaced_job(NS, job_body("train-patch", run="30"))
    patched = batch.patch_namespaced_job("train-patch", NS, {"metadata": {"labels": {"falcon/abort": "yes"}}})
    assert patched.metadata.labels["falcon/abort"] == "yes"
    assert int(patched.metadata.resource_version) > int(job.metadata.resource_version)
    assert patched.metadata.uid == job.metadata.uid and patched.metadata.generation == 1
    stale = batch.api_client.sanitize_for_serialization(job)  # carries the creation resourceVersion
    with pytest.raises(k8s.ApiException) as err:
        batch.replace_namespaced_job("train-patch", NS, stale)
    assert err.value.status == 409 and status_body(err.value)["reason"] == "Conflict"
    fresh = batch.api_client.sanitize_for_serialization(batch.read_namespaced_job("train-patch", NS))
    fresh["spec"]["parallelism"] = 0
    replaced = batch.replace_namespaced_job("train-patch", NS, fresh)
    assert replaced.spec.parallelism == 0 and replaced.metadata.generation == 2
    batch.delete_namespaced_job("train-patch", NS, propagation_policy="Foreground")


def test_pod_logs(kube, sim):
    batch, core = kube
    batch.create_namespaced_job(NS, job_body("train-log", run="0.1", env={"FALCON_SIM_EXIT_CODE": "5"}))
    wait_finished(batch, "train-log")
    (pod,) = pods_of(core, "train-log")
    text = core.read_namespaced_pod_log(pod.metadata.name, NS)
    assert "exited with code 5" in text


def test_bad_requests_get_status_bodies(kube, sim):
    base = sim.endpoints["clusters"]["sim-k"]["kubernetes"]
    token = kube[0].api_client.configuration.api_key["authorization"]

    def call(method, path, data=None, ctype="application/json"):
        req = urllib.request.Request(base + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token}")
        req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    odd_selector = job_body("train-odd")
    odd_selector["spec"]["template"]["spec"]["nodeSelector"] = "tpu please"
    cases = [
        ("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", b"{broken", 400),
        ("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", b"[]", 400),
        ("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", b'{"metadata": {"name": "x"}}', 422),
        ("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", b'{"kind": "Pod", "metadata": {"name": "x"}}', 400),
        (
            "POST",
            f"/apis/batch/v1/namespaces/{NS}/jobs",
            b'{"metadata": {"name": "x", "namespace": "other"}}',
            400,
        ),
        ("GET", f"/apis/batch/v1/namespaces/{NS}/jobs?watch=true&resourceVersion=abc", None, 400),
        ("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", json.dumps(odd_selector).encode(), 400),
        (
            "POST",
            f"/api/v1/namespaces/{NS}/pods",
            b'{"metadata": {"name": "p"}, "spec": {"containers": "x"}}',
            400,
        ),
        ("PATCH", f"/api/v1/namespaces/{NS}/pods/none", b"{}", 404),
        ("GET", f"/apis/batch/v1/namespaces/{NS}/jobs?fieldSelector=nonsense", None, 400),
        ("GET", "/apis/batch/v1/namespaces/x/widgets", None, 404),
        ("GET", "/api/v1/namespaces/x/jobs", None, 404),
        ("PATCH", f"/apis/batch/v1/namespaces/{NS}/jobs/train-dup", b"{}", 415),
        ("PUT", "/api/v1/nodes", b"{}", 405),
    ]
    for method, path, data, expected in cases:
        status, body = call(method, path, data)
        assert status == expected, (method, path, body)
        assert body["kind"] == "Status" and body["code"] == expected, body
    status, body = call(
        "PATCH",
        f"/apis/batch/v1/namespaces/{NS}/jobs/train-dup",
        json.dumps([{"op": "add", "path": "/metadata/labels/x", "value": "1"}]).encode(),
        "application/json-patch+json",
    )
    assert status == 200 and body["metadata"]["labels"]["x"] == "1"


def test_a_pod_created_with_a_node_name_is_started_by_that_node(kube, sim):
    _, core = kube
    node = core.list_node(label_selector=f"{TOPO}=2x2").items[0].metadata.name
    pod = {
        "metadata": {"name": "pinned", "namespace": NS},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "x", "env": [{"name": "FALCON_SIM_RUN_SECONDS", "value": "0"}]}
            ],
        },
    }
    core.create_namespaced_pod(NS, pod)
    done = poll_until(lambda: (p := core.read_namespaced_pod("pinned", NS)).status.phase == "Succeeded" and p)
    assert done.spec.node_name == node
    core.delete_namespaced_pod("pinned", NS)


# ---- watch ---------------------------------------------------------------------------------------


def test_watch_replays_history_from_a_resource_version_with_bookmarks_and_timeout(vkube, virtual_sim):
    sim = virtual_sim  # the stream's timeout and bookmarks on the fleet's clock, moved by the test
    batch, _ = vkube
    rv = batch.list_namespaced_job(NS).metadata.resource_version
    batch.create_namespaced_job(NS, job_body("watch-a", run="0.1"))
    batch.create_namespaced_job(NS, job_body("watch-b", run="0.1"))
    w = watch.Watch()
    stream = InThread(
        lambda: list(
            w.stream(
                batch.list_namespaced_job,
                NS,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=1,
                label_selector="falcon/task in (watch-a,watch-b)",
            )
        )
    )
    open_watches(sim, "sim-k", 1)
    for _ in range(9):
        sim.advance(0.1)  # bookmarks every 0.3 s; both Jobs run and finish meanwhile
    sim.advance(0.099)
    assert watches(sim) == 1  # open until its timeoutSeconds is up,
    sim.advance(0.001)
    assert watches(sim) == 0  # and closed by the server at it
    events = stream.result()
    typed = [(e["type"], e["raw_object"]["metadata"].get("name")) for e in events]
    assert typed[0] == ("ADDED", "watch-a")
    for name in ("watch-a", "watch-b"):
        assert typed.index(("ADDED", name)) < typed.index(("MODIFIED", name))
    bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
    assert len(bookmarks) == 4 and events[-1]["type"] == "BOOKMARK"  # at 0.3, 0.6 and 0.9 s, and one at the end
    versions = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)
    assert w.resource_version == events[-1]["raw_object"]["metadata"]["resourceVersion"]
    finished = [e for e in events if e["type"] == "MODIFIED" and e["object"].status.succeeded]
    assert {e["object"].metadata.name for e in finished} == {"watch-a", "watch-b"}


def test_watch_without_resource_version_starts_with_the_current_objects(kube, sim):
    batch, _ = kube
    batch.create_namespaced_job(NS, job_body("watch-now", run="0.1"))
    w = watch.Watch()
    for event in w.stream(
        batch.list_namespaced_job, NS, timeout_seconds=5, field_selector="metadata.name=watch-now"
    ):
        assert event["type"] == "ADDED" and event["object"].metadata.name == "watch-now"
        w.stop()


def test_watch_from_an_expired_resource_version_is_410(kube, sim):
    batch, _ = kube
    old = batch.list_namespaced_job(NS).metadata.resource_version
    batch.create_namespaced_job(NS, job_body("watch-old", run="0.1"))
    wait_finished(batch, "watch-old")
    sim.compact_history("sim-k", keep=0)
    with pytest.raises(k8s.ApiException) as err:
        list(watch.Watch().stream(batch.list_namespaced_job, NS, resource_version=old, timeout_seconds=1))
    assert err.value.status == 410 and err.value.reason.startswith("Expired: too old resource version")
    # a fresh list gives a resourceVersion that can be watched again
    fresh = batch.list_namespaced_job(NS).metadata.resource_version
    w = watch.Watch()
    for event in w.stream(
        batch.list_namespaced_job, NS, resource_version=fresh, allow_watch_bookmarks=True, timeout_seconds=5
    ):
        assert event["type"] == "BOOKMARK" and int(event["raw_object"]["metadata"]["resourceVersion"]) >= int(
            fresh
        )
        w.stop()


def test_watch_from_a_future_resource_version_is_refused(kube, sim):
    batch, _ = kube
    with pytest.raises(k8s.ApiException) as err:
        list(
            watch.Watch().stream(
                batch.list_namespaced_job, NS, resource_version="999999999", timeout_seconds=1
            )
        )
    assert err.value.status == 504 and "Too large resource version" in err.value.reason


def test_watch_drop_fault_cuts_open_streams(vkube, virtual_sim):
    sim = virtual_sim  # the cut and the timeout on the fleet's clock, moved by the test
    batch, _ = vkube
    sim.set_faults("sim-k", watch_drop_every=0.3)
    cut = InThread(lambda: list(watch.Watch().stream(batch.list_namespaced_job, NS, timeout_seconds=5)))
    open_watches(sim, "sim-k", 1)
    sim.advance(0.299)
    assert sim.stats()["clusters"]["sim-k"]["fault_counts"]["watch_cut"] == 0  # not before its time
    sim.advance(0.001)
    assert sim.stats()["clusters"]["sim-k"]["fault_counts"]["watch_cut"] == 1  # cut at it
    with pytest.raises(Exception) as err:
        cut.result()
    assert "ProtocolError" in type(err.value).__name__ or "ended prematurely" in str(err.value)
    sim.set_faults("sim-k", watch_drop_every=None)
    whole = InThread(lambda: list(watch.Watch().stream(batch.list_namespaced_job, NS, timeout_seconds=1)))
    open_watches(sim, "sim-k", 1)
    sim.advance(0.999)
    assert watches(sim) == 1  # without the fault the stream stays up to its timeout,
    sim.advance(0.001)
    assert watches(sim) == 0
    assert whole.result() is not None  # and ends cleanly
    assert sim.stats()["clusters"]["sim-k"]["fault_counts"]["watch_cut"] == 1


def test_label_changes_move_objects_in_and_out_of_a_filtered_watch(kube, sim):
    batch, _ = kube
    batch.create_namespaced_job(NS, job_body("watch-move", run="30"))
    rv = batch.list_namespaced_job(NS).metadata.resource_version
    batch.patch_namespaced_job("watch-move", NS, {"metadata": {"labels": {"stage": "on"}}})
    batch.patch_namespaced_job("watch-move", NS, {"metadata": {"labels": {"stage": "off"}}})
    w = watch.Watch()
    events = []
    for event in w.stream(
        batch.list_namespaced_job, NS, resource_version=rv, timeout_seconds=5, label_selector="stage=on"
    ):
        events.append(
            (event["type"], event["object"].metadata.name, event["object"].metadata.labels["stage"])
        )
        if event["type"] == "DELETED":
            w.stop()
    # the Job controller may change the Job's status between the two patches (a loaded
    # machine): a MODIFIED with the label still on, in between, is what GKE would send too
    assert events[0] == ("ADDED", "watch-move", "on") and events[-1] == ("DELETED", "watch-move", "off"), events
    assert all(e == ("MODIFIED", "watch-move", "on") for e in events[1:-1]), events
    batch.delete_namespaced_job("watch-move", NS, propagation_policy="Background")
