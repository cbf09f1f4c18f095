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
    FAST_TIMINGS,
    InThread,
    advance_until,
    gke_client,
    kube_api_client,
    open_watches,
    wait_operation,
)

NS = "falcon-test"
K = ("proj-sim-k", "europe-west4-a", "sim-k")
PARENT = f"projects/{K[0]}/locations/{K[1]}/clusters/{K[2]}"
ACCEL = "cloud.google.com/gke-tpu-accelerator"
TOPO = "cloud.google.com/gke-tpu-topology"


POD_START = FAST_TIMINGS["pod_start"]  # a bound pod runs this long after its bind (a constant)
BOOKMARK = FAST_TIMINGS["watch_bookmark_interval"]


def _pool(name, hosts, topology):
    pool = container_v1.NodePool(
        name=name,
        initial_node_count=hosts,
        config=container_v1.NodeConfig(machine_type="ct6e-standard-4t", labels={"managed-by": "falcon"}),
    )
    if hosts > 1:
        pool.placement_policy = container_v1.NodePool.PlacementPolicy(type_=1, tpu_topology=topology)
    return pool


@pytest.fixture
def fleet(virtual_sim):
    """This module's fleet: the test fleet on a ``ManualClock``, fresh for each test, so nothing in
    it moves unless the test moves its clock (``advance_to``)."""
    return virtual_sim


@pytest.fixture
def kube(fleet):
    """Batch and Core clients for sim-k, which has a 2-host 2x4 pool and a 1-host 2x2 pool, their
    3 nodes Ready; every effect due at that instant has run."""
    gke = gke_client(fleet)
    for name, hosts, topology in (("falcon-k-2x4", 2, "2x4"), ("falcon-k-2x2", 1, "2x2")):
        op = gke.create_node_pool(parent=PARENT, node_pool=_pool(name, hosts, topology))
        wait_operation(gke, f"projects/{K[0]}/locations/{K[1]}", op, 60, fleet=fleet)
    api = kube_api_client(fleet, "sim-k")
    core = k8s.CoreV1Api(api)
    mine = "cloud.google.com/gke-nodepool in (falcon-k-2x4,falcon-k-2x2)"
    advance_until(fleet, lambda: len(core.list_node(label_selector=mine).items) == 3, 60, "3 nodes")
    fleet.advance(0)
    return k8s.BatchV1Api(api), core


def now(fleet) -> float:
    """The fleet's monotonic time: the instant the test's next request acts at."""
    return fleet.clock.monotonic()


def advance_to(fleet, at: float) -> None:
    """Move the fleet's clock to the instant ``at`` (exactly: ``at`` and the clock's time are
    within a factor of two, so their difference is exact) and settle every effect due there."""
    fleet.advance(at - now(fleet))


def settle(fleet) -> None:
    """Run every effect due at the fleet's present instant (a request's follow-ups), clock still."""
    fleet.advance(0)


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


def finished(batch, name):
    """The Job if it has a Complete or Failed condition, else None."""
    job = batch.read_namespaced_job(name, NS)
    types = {c.type for c in job.status.conditions or [] if c.status == "True"}
    return job if types & {"Complete", "Failed"} else None


def finishes_at(fleet, batch, name, at: float):
    """The Job ``name`` is still unfinished 1 ms of the fleet's time before the instant ``at``
    and finished at ``at``; return it."""
    advance_to(fleet, at - 0.001)
    assert finished(batch, name) is None, f"job {name} finished 1 ms before its instant"
    advance_to(fleet, at)
    job = finished(batch, name)
    assert job is not None, f"job {name} not finished at its instant"
    return job


def pods_of(core, name):
    return core.list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/job-name={name}").items


def status_body(exc: k8s.ApiException) -> dict:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == exc.status
    return body


def test_multi_host_indexed_job_runs_to_complete(kube, fleet):
    batch, core = kube
    t0 = now(fleet)
    created = batch.create_namespaced_job(NS, job_body("train-ok", hosts=2, topology="2x4"))
    assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    assert created.metadata.namespace == NS and created.metadata.generation == 1
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": created.metadata.uid}

    advance_to(fleet, t0 + POD_START - 0.001)
    bound = batch.read_namespaced_job("train-ok", NS)
    assert (bound.status.active, bound.status.ready) == (2, 0)  # both pods bound, neither started yet
    assert {p.status.phase for p in pods_of(core, "train-ok")} == {"Pending"}
    advance_to(fleet, t0 + POD_START)
    running = batch.read_namespaced_job("train-ok", NS)
    assert (running.status.active, running.status.ready) == (2, 2)  # both started at pod_start
    assert running.status.start_time is not None
    pods = pods_of(core, "train-ok")
    assert sorted(p.spec.hostname for p in pods) == ["train-ok-0", "train-ok-1"]
    assert {p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods} == {"0", "1"}
    assert {p.spec.subdomain for p in pods} == {"train-ok"}
    assert len({p.spec.node_name for p in pods}) == 2
    assert all(p.metadata.owner_references[0].uid == created.metadata.uid for p in pods)
    assert all(p.status.phase == "Running" for p in pods)

    job = finishes_at(fleet, batch, "train-ok", t0 + POD_START + 0.3)  # at pod start + its run time
    conditions = {c.type: c for c in job.status.conditions}
    assert set(conditions) == {"SuccessCriteriaMet", "Complete"}
    assert job.status.succeeded == 2 and job.status.failed is None and job.status.active is None
    assert job.status.completion_time is not None and job.status.completed_indexes == "0-1"
    for pod in pods_of(core, "train-ok"):
        assert pod.status.phase == "Succeeded"
        terminated = pod.status.container_statuses[0].state.terminated
        assert (terminated.exit_code, terminated.reason) == (0, "Completed")


def test_failing_job_reaches_backoff_limit(kube, fleet):
    batch, core = kube
    t0 = now(fleet)
    batch.create_namespaced_job(NS, job_body("train-exit3", env={"FALCON_SIM_EXIT_CODE": "3"}))
    job = finishes_at(fleet, batch, "train-exit3", t0 + POD_START + 0.3)
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


def test_backoff_limit_allows_retries_before_failing(kube, fleet):
    batch, core = kube
    t0 = now(fleet)
    batch.create_namespaced_job(
        NS, job_body("train-retry", run="0.1", env={"FALCON_SIM_EXIT_CODE": "1"}, backoff=1)
    )
    first_failed = t0 + POD_START + 0.1
    advance_to(fleet, first_failed)  # the first pod failed; the controller made the retry at once
    job = batch.read_namespaced_job("train-retry", NS)
    assert job.status.failed == 1 and job.status.active == 1 and finished(batch, "train-retry") is None
    job = finishes_at(fleet, batch, "train-retry", first_failed + POD_START + 0.1)  # the retry's run
    assert job.status.failed == 2 and len(pods_of(core, "train-retry")) == 2


@pytest.mark.parametrize("env", [{"FALCON_SIM_OOM": "1"}, {"FALCON_SIM_EXIT_CODE": "137"}])
def test_oom_killed_pods(kube, fleet, env):
    batch, core = kube
    name = "train-oom-" + ("flag" if "FALCON_SIM_OOM" in env else "code")
    t0 = now(fleet)
    batch.create_namespaced_job(NS, job_body(name, env=env))
    job = finishes_at(fleet, batch, name, t0 + POD_START + 0.3)
    assert {c.type for c in job.status.conditions} >= {"Failed"}
    (pod,) = pods_of(core, name)
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")


def test_duplicate_job_is_409_and_not_counted(kube, fleet):
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
    (record,) = [j for j in fleet.stats()["clusters"]["sim-k"]["jobs"] if j["name"] == "train-dup"]
    assert record["creates"] == 1 and record["manifest"] == body


def test_missing_objects_are_404_status(kube, fleet):
    batch, core = kube
    with pytest.raises(k8s.ApiException) as err:
        batch.read_namespaced_job("no-such-job", NS)
    assert err.value.status == 404
    assert status_body(err.value)["reason"] == "NotFound"
    with pytest.raises(k8s.ApiException) as err:
        core.delete_namespaced_pod("no-such-pod", NS)
    assert err.value.status == 404


def test_list_selectors_and_resource_version(kube, fleet):
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


def test_unschedulable_pods_stay_pending_with_a_reason(kube, fleet):
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

    settle(fleet)  # the scheduler's verdict is due at once: the clock does not move for it
    conditions = pending_with_reason()
    assert conditions, pods_of(core, "train-4x4")
    assert conditions[0].reason == "Unschedulable"
    total = len(core.list_node().items)
    assert f"0/{total} nodes are available" in conditions[0].message
    assert "node affinity/selector" in conditions[0].message
    job = batch.read_namespaced_job("train-4x4", NS)
    assert job.status.active == 4 and job.status.ready == 0
    batch.delete_namespaced_job("train-4x4", NS, propagation_policy="Background")
    settle(fleet)
    assert not pods_of(core, "train-4x4")  # unbound pods go with their Job at once, no grace period


def test_delete_propagation(kube, fleet):
    batch, core = kube
    batch.create_namespaced_job(NS, job_body("train-orphan", run="30"))
    settle(fleet)
    assert pods_of(core, "train-orphan")  # the Job controller made its pod at once
    batch.delete_namespaced_job("train-orphan", NS, propagation_policy="Orphan")
    with pytest.raises(k8s.ApiException):
        batch.read_namespaced_job("train-orphan", NS)
    (pod,) = pods_of(core, "train-orphan")
    deleted = core.delete_namespaced_pod(pod.metadata.name, NS)
    assert deleted.metadata.name == pod.metadata.name
    assert pods_of(core, "train-orphan") == []


def test_invalid_jobs_are_422(kube, fleet):
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


def _post_json(kube, fleet, path, body):
    """POST a JSON body as kubectl sends a YAML manifest (numbers stay numbers): (status, answer)."""
    base = fleet.endpoints["clusters"]["sim-k"]["kubernetes"]
    token = kube[0].api_client.configuration.api_key["authorization"]
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_quantities_may_be_json_numbers_and_are_stored_canonically(kube, fleet):
    # The Python client's models only take strings, so this is the wire form kubectl would send.
    batch, core = kube
    jobs = f"/apis/batch/v1/namespaces/{NS}/jobs"
    body = job_body("train-numbers")
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"google.com/tpu": 4, "cpu": 0.5, "memory": "1.5Gi"},
        "requests": {"google.com/tpu": 4, "cpu": 2},
    }
    t0 = now(fleet)
    status, _ = _post_json(kube, fleet, jobs, body)
    assert status == 201
    resources = batch.read_namespaced_job("train-numbers", NS).spec.template.spec.containers[0].resources
    assert resources.limits == {"google.com/tpu": "4", "cpu": "500m", "memory": "1536Mi"}
    assert resources.requests == {"google.com/tpu": "4", "cpu": "2"}
    assert finishes_at(fleet, batch, "train-numbers", t0 + POD_START + 0.3).status.succeeded == 1
    (pod,) = pods_of(core, "train-numbers")
    assert (
        core.read_node(pod.spec.node_name).status.allocatable["google.com/tpu"] == "4"
    )  # it took a TPU host
    for bad in ("4x", True, {"n": 4}):
        body = job_body("train-bad-quantity")
        body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"google.com/tpu": bad}}
        status, answer = _post_json(kube, fleet, jobs, body)
        assert status == 400 and answer["kind"] == "Status", (bad, answer)


def test_a_pod_asking_more_tpu_than_any_node_has_stays_pending_even_as_a_number(kube, fleet):
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
    status, _ = _post_json(kube, fleet, f"/api/v1/namespaces/{NS}/pods", pod)
    assert status == 201
    settle(fleet)  # the scheduler's verdict is due at once
    pending = core.read_namespaced_pod("too-big", NS)
    assert pending.status.conditions, pending.status
    assert (
        pending.status.phase == "Pending"
        and "Insufficient google.com/tpu" in pending.status.conditions[0].message
    )
    core.delete_namespaced_pod("too-big", NS)


def test_admission_denies_images(kube, fleet):
    batch, _ = kube
    fleet.set_faults("sim-k", deny_images=["docker.io/", "evil.example/"])
    with pytest.raises(k8s.ApiException) as err:
        batch.create_namespaced_job(NS, job_body("train-denied", image="docker.io/library/python:3"))
    assert err.value.status == 403
    message = status_body(err.value)["message"]
    assert message.startswith('admission webhook "policy.example.com" denied the request: image')
    assert "docker.io/library/python:3" in message
    assert not [j for j in fleet.stats()["clusters"]["sim-k"]["jobs"] if j["name"] == "train-denied"]
    batch.create_namespaced_job(NS, job_body("train-allowed", run="0.1"))


def test_headless_service_lifecycle(kube, fleet):
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


def test_patch_replace_and_optimistic_concurrency(kube, fleet):
    batch, _ = kube
    t0 = now(fleet)
    job = batch.create_namespaced_job(NS, job_body("train-patch", run="30"))
    settle(fleet)  # the Job controller's writes due at the create are done; the clock stays at t0
    patched = batch.patch_namespaced_job("train-patch", NS, {"metadata": {"labels": {"falcon/abort": "yes"}}})
    assert patched.metadata.labels["falcon/abort"] == "yes"
    assert int(patched.metadata.resource_version) > int(job.metadata.resource_version)
    assert patched.metadata.uid == job.metadata.uid and patched.metadata.generation == 1
    stale = batch.api_client.sanitize_for_serialization(job)  # carries the creation resourceVersion
    with pytest.raises(k8s.ApiException) as err:
        batch.replace_namespaced_job("train-patch", NS, stale)
    assert err.value.status == 409 and status_body(err.value)["reason"] == "Conflict"
    # another writer between a read and its replace: the Job controller, when the pod starts
    read = batch.api_client.sanitize_for_serialization(batch.read_namespaced_job("train-patch", NS))
    advance_to(fleet, t0 + POD_START)
    started = batch.read_namespaced_job("train-patch", NS)
    assert started.status.ready == 1  # the controller wrote the Job's status at the pod's start
    assert int(started.metadata.resource_version) > int(read["metadata"]["resourceVersion"])
    read["spec"]["parallelism"] = 0
    with pytest.raises(k8s.ApiException) as err:
        batch.replace_namespaced_job("train-patch", NS, read)
    assert err.value.status == 409 and status_body(err.value)["reason"] == "Conflict"
    # nothing is due before the pod's end, 30 s of the fleet's clock away, and the clock moves
    # only when the test moves it: no writer can come between this read and its replace
    assert fleet.next_timer() == pytest.approx(30.0)
    fresh = batch.api_client.sanitize_for_serialization(batch.read_namespaced_job("train-patch", NS))
    fresh["spec"]["parallelism"] = 0
    replaced = batch.replace_namespaced_job("train-patch", NS, fresh)
    assert replaced.spec.parallelism == 0 and replaced.metadata.generation == 2
    assert int(replaced.metadata.resource_version) > int(fresh["metadata"]["resourceVersion"])
    batch.delete_namespaced_job("train-patch", NS, propagation_policy="Foreground")


def test_pod_logs(kube, fleet):
    batch, core = kube
    t0 = now(fleet)
    batch.create_namespaced_job(NS, job_body("train-log", run="0.1", env={"FALCON_SIM_EXIT_CODE": "5"}))
    advance_to(fleet, t0 + POD_START)
    (pod,) = pods_of(core, "train-log")
    text = core.read_namespaced_pod_log(pod.metadata.name, NS)
    assert "will run 0.1s and exit 5" in text and "exited" not in text  # started, still running
    finishes_at(fleet, batch, "train-log", t0 + POD_START + 0.1)
    text = core.read_namespaced_pod_log(pod.metadata.name, NS)
    assert "exited with code 5 (Error)" in text


def test_bad_requests_get_status_bodies(kube, fleet):
    base = fleet.endpoints["clusters"]["sim-k"]["kubernetes"]
    token = kube[0].api_client.configuration.api_key["authorization"]
    kube[0].create_namespaced_job(NS, job_body("train-dup", run="0.1"))  # the Job the PATCH cases address

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


def test_a_pod_created_with_a_node_name_is_started_by_that_node(kube, fleet):
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
    t0 = now(fleet)
    core.create_namespaced_pod(NS, pod)
    advance_to(fleet, t0 + POD_START - 0.001)
    assert core.read_namespaced_pod("pinned", NS).status.phase == "Pending"
    advance_to(fleet, t0 + POD_START)  # started by its node at pod_start, and its 0 s run is over
    done = core.read_namespaced_pod("pinned", NS)
    assert done.status.phase == "Succeeded"
    assert done.spec.node_name == node
    core.delete_namespaced_pod("pinned", NS)


# ---- watch ---------------------------------------------------------------------------------------


def test_watch_replays_history_from_a_resource_version_with_bookmarks_and_timeout(kube, fleet):
    # the stream's timeout and bookmarks on the fleet's clock, moved by the test
    batch, _ = kube
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
    open_watches(fleet, "sim-k", 1)
    for _ in range(9):
        fleet.advance(0.1)  # bookmarks every 0.3 s; both Jobs run and finish meanwhile
    fleet.advance(0.099)
    assert watches(fleet) == 1  # open until its timeoutSeconds is up,
    fleet.advance(0.001)
    assert watches(fleet) == 0  # and closed by the server at it
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


def test_watch_without_resource_version_starts_with_the_current_objects(kube, fleet):
    batch, _ = kube
    batch.create_namespaced_job(NS, job_body("watch-now", run="0.1"))
    w = watch.Watch()
    for event in w.stream(
        batch.list_namespaced_job, NS, timeout_seconds=5, field_selector="metadata.name=watch-now"
    ):
        assert event["type"] == "ADDED" and event["object"].metadata.name == "watch-now"
        w.stop()


def test_watch_from_an_expired_resource_version_is_410(kube, fleet):
    batch, _ = kube
    old = batch.list_namespaced_job(NS).metadata.resource_version
    t0 = now(fleet)
    batch.create_namespaced_job(NS, job_body("watch-old", run="0.1"))
    finishes_at(fleet, batch, "watch-old", t0 + POD_START + 0.1)
    fleet.compact_history("sim-k", keep=0)
    with pytest.raises(k8s.ApiException) as err:
        list(watch.Watch().stream(batch.list_namespaced_job, NS, resource_version=old, timeout_seconds=1))
    assert err.value.status == 410 and err.value.reason.startswith("Expired: too old resource version")
    # a fresh list gives a resourceVersion that can be watched again
    fresh = batch.list_namespaced_job(NS).metadata.resource_version
    w = watch.Watch()

    def first_event():
        for event in w.stream(
            batch.list_namespaced_job,
            NS,
            resource_version=fresh,
            allow_watch_bookmarks=True,
            timeout_seconds=5,
        ):
            w.stop()
            return event
        return None

    opened = now(fleet)
    stream = InThread(first_event)
    open_watches(fleet, "sim-k", 1)
    advance_to(fleet, opened + BOOKMARK)  # the first bookmark is due one interval after the watch opened
    event = stream.result()
    assert event["type"] == "BOOKMARK"
    assert int(event["raw_object"]["metadata"]["resourceVersion"]) >= int(fresh)


def test_watch_from_a_future_resource_version_is_refused(kube, fleet):
    batch, _ = kube
    with pytest.raises(k8s.ApiException) as err:
        list(
            watch.Watch().stream(
                batch.list_namespaced_job, NS, resource_version="999999999", timeout_seconds=1
            )
        )
    assert err.value.status == 504 and "Too large resource version" in err.value.reason


def test_watch_drop_fault_cuts_open_streams(kube, fleet):
    # the cut and the timeout on the fleet's clock, moved by the test
    batch, _ = kube
    fleet.set_faults("sim-k", watch_drop_every=0.3)
    cut = InThread(lambda: list(watch.Watch().stream(batch.list_namespaced_job, NS, timeout_seconds=5)))
    open_watches(fleet, "sim-k", 1)
    fleet.advance(0.299)
    assert fleet.stats()["clusters"]["sim-k"]["fault_counts"]["watch_cut"] == 0  # not before its time
    fleet.advance(0.001)
    assert fleet.stats()["clusters"]["sim-k"]["fault_counts"]["watch_cut"] == 1  # cut at it
    with pytest.raises(Exception) as err:
        cut.result()
    assert "ProtocolError" in type(err.value).__name__ or "ended prematurely" in str(err.value)
    fleet.set_faults("sim-k", watch_drop_every=None)
    whole = InThread(lambda: list(watch.Watch().stream(batch.list_namespaced_job, NS, timeout_seconds=1)))
    open_watches(fleet, "sim-k", 1)
    fleet.advance(0.999)
    assert watches(fleet) == 1  # without the fault the stream stays up to its timeout,
    fleet.advance(0.001)
    assert watches(fleet) == 0
    assert whole.result() is not None  # and ends cleanly
    assert fleet.stats()["clusters"]["sim-k"]["fault_counts"]["watch_cut"] == 1


def test_label_changes_move_objects_in_and_out_of_a_filtered_watch(kube, fleet):
    batch, _ = kube
    batch.create_namespaced_job(NS, job_body("watch-move", run="30"))
    settle(fleet)  # the Job controller's writes due at the create are done; the clock stays still
    rv = batch.list_namespaced_job(NS).metadata.resource_version
    batch.patch_namespaced_job("watch-move", NS, {"metadata": {"labels": {"stage": "on"}}})
    batch.patch_namespaced_job("watch-move", NS, {"metadata": {"labels": {"stage": "off"}}})
    stream = InThread(
        lambda: [
            (e["type"], e["object"].metadata.name, e["object"].metadata.labels["stage"])
            for e in watch.Watch().stream(
                batch.list_namespaced_job, NS, resource_version=rv, timeout_seconds=1, label_selector="stage=on"
            )
        ]
    )
    open_watches(fleet, "sim-k", 1)
    fleet.advance(1)  # to the stream's timeoutSeconds: the server ends it
    events = stream.result()
    # the clock stood still: no write of the Job controller came between the two patches
    assert events == [("ADDED", "watch-move", "on"), ("DELETED", "watch-move", "off")]
    batch.delete_namespaced_job("watch-move", NS, propagation_policy="Background")
