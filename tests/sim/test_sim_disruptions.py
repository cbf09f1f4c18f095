"""GKE disrupting running work in the sim (maintenance, repair, reclaim) and the Job controller's
podFailurePolicy, driven by the real container_v1 and kubernetes clients.

Each test has a fleet of its own (one zonal cluster, no authentication) on a ``ManualClock``:
the notices, drains, repairs and scale-ups pass when the test moves the fleet's clock
(``wait_for`` moves it from timer to timer; its bounds are the fleet's seconds).
"""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1
from kubernetes import client as k8s
from kubernetes import watch
from pydantic import ValidationError

from tests.harness.sim import advance_until, gke_client, private_fleet_config, virtual_fleet, wait_operation

PROJECT, ZONE, NAME = "proj-dis", "us-east5-b", "dis-1"
LOCATION = f"projects/{PROJECT}/locations/{ZONE}"
PARENT = f"{LOCATION}/clusters/{NAME}"
NS = "falcon-dis"
NODEPOOL = "cloud.google.com/gke-nodepool"
TASK = "falcon.dev/task-id"
SCHEDULED = "cloud.google.com/scheduled-maintenance-time"
ACTIVE = "cloud.google.com/active-node-maintenance"
IMPENDING = "cloud.google.com/impending-node-termination"
SHUTDOWN = "Pod was terminated in response to imminent node shutdown."
TIMINGS = {
    "node_pool_create": 0.15,
    "node_register": 0.2,
    "pod_start": 0.05,
    "autoscaler_scale_up": 0.15,
    "flex_capacity_wait": 0.15,
    "flex_visibility_lag": 0.1,
    "maintenance_notice": 0.3,
    "maintenance_duration": 0.6,
    "repair_detect": 0.3,
}


@pytest.fixture
def fleet():
    config = private_fleet_config(
        [{"name": NAME, "project": PROJECT, "location": ZONE, "chips": 64}], **TIMINGS
    )
    with virtual_fleet(config) as running:
        yield running


@pytest.fixture
def apis(fleet):
    api = k8s.ApiClient(k8s.Configuration(host=fleet.endpoints["clusters"][NAME]["kubernetes"]))
    return gke_client(fleet, credentials=AnonymousCredentials()), k8s.BatchV1Api(api), k8s.CoreV1Api(api)


def make_pool(fleet, gke, core, name, hosts=1, topology="2x2", flex=False):
    config = container_v1.NodeConfig(
        machine_type="ct6e-standard-4t", labels={"managed-by": "falcon"}, flex_start=flex or None
    )
    pool = container_v1.NodePool(name=name, initial_node_count=0 if flex else hosts, config=config)
    if flex:
        pool.autoscaling = container_v1.NodePoolAutoscaling(
            enabled=True, total_min_node_count=0, total_max_node_count=hosts
        )
    if hosts > 1:
        pool.placement_policy = container_v1.NodePool.PlacementPolicy(
            type_=container_v1.NodePool.PlacementPolicy.Type.COMPACT, tpu_topology=topology
        )
    done = wait_operation(gke, LOCATION, gke.create_node_pool(parent=PARENT, node_pool=pool), fleet=fleet)
    assert not done.error.message, done.error.message
    if not flex:
        wait_for(fleet, lambda: len(nodes_of(core, name)) == hosts, what=f"{hosts} nodes of {name}")


def wait_for(fleet, probe, timeout=5.0, what="condition"):
    """What ``probe()`` returns once it holds, moving the fleet's clock (``timeout`` of its seconds)."""
    return advance_until(fleet, probe, timeout, what)[0]


def nodes_of(core, pool):
    return core.list_node(label_selector=f"{NODEPOOL}={pool}").items


def job_body(
    name,
    pool,
    *,
    hosts=1,
    run="30",
    disrupt=None,
    exit_code=None,
    backoff=0,
    task=None,
    policy=None,
    restart="Never",
):
    env = [{"name": "FALCON_SIM_RUN_SECONDS", "value": run}]
    if disrupt is not None:
        env.append({"name": "FALCON_SIM_DISRUPT", "value": disrupt})
    if exit_code is not None:
        env.append({"name": "FALCON_SIM_EXIT_CODE", "value": str(exit_code)})
    labels = {"managed-by": "falcon"}
    if task is not None:
        labels[TASK] = str(task)
    spec = {
        "backoffLimit": backoff,
        "template": {
            "metadata": {"labels": dict(labels)},
            "spec": {
                "restartPolicy": restart,
                "nodeSelector": {NODEPOOL: pool},
                "containers": [
                    {
                        "name": "main",
                        "image": "us-docker.pkg.dev/p/r/train:1",
                        "env": env,
                        "resources": {"limits": {"google.com/tpu": "4"}, "requests": {"google.com/tpu": "4"}},
                    }
                ],
            },
        },
    }
    if hosts > 1:
        spec.update(completionMode="Indexed", completions=hosts, parallelism=hosts)
    if policy is not None:
        spec["podFailurePolicy"] = {"rules": policy}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": spec,
    }


ON_DISRUPTION = {"onPodConditions": [{"type": "DisruptionTarget"}]}


def finished(fleet, batch, name, timeout=8.0):
    def probe():
        job = batch.read_namespaced_job(name, NS)
        done = [
            c for c in job.status.conditions or [] if c.type in ("Complete", "Failed") and c.status == "True"
        ]
        return (job, done[0]) if done else None

    return wait_for(fleet, probe, timeout, what=f"Job {name} to finish")


def running(fleet, batch, name, count=1, timeout=5.0):
    return wait_for(
        fleet,
        lambda: (j := batch.read_namespaced_job(name, NS)).status.ready == count and j,
        timeout,
        what=f"{name} ready",
    )


def history(list_fn, rv, *args, seconds=0):
    """Every change after ``rv`` the watch replays (objects as dicts), as ``(type, object)``: the
    history up to now (the fleet's clock does not move while the watch is open)."""
    out = []
    stream = watch.Watch().stream(list_fn, *args, resource_version=rv, timeout_seconds=seconds, _request_timeout=30)
    for ev in stream:
        out.append((ev["type"], ev["raw_object"]))
    return out


def disruption_condition(pod):
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"), None)


def stats(fleet):
    return fleet.stats()["clusters"][NAME]


def events(core, name):
    return {e.reason for e in core.list_namespaced_event("default").items if e.involved_object.name == name}


# ---- maintenance ---------------------------------------------------------------------------------


def test_maintenance_on_a_single_host_pool_notices_drains_and_brings_the_node_back(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "m1")
    (node,) = [n.metadata.name for n in nodes_of(core, "m1")]
    batch.create_namespaced_job(NS, job_body("m1-job", "m1", disrupt="maintenance@0.2"))
    running(fleet, batch, "m1-job")
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    jobs_rv = batch.list_namespaced_job(NS).metadata.resource_version

    notice = wait_for(
        fleet,
        lambda: (n := core.read_node(node)).metadata.labels.get(SCHEDULED) and n, what="notice"
    )
    assert ACTIVE not in notice.metadata.labels and not notice.spec.unschedulable
    assert int(notice.metadata.labels[SCHEDULED]) > 0

    drained = wait_for(
        fleet,
        lambda: (n := core.read_node(node)).metadata.labels.get(ACTIVE) == "ONGOING" and n, what="drain"
    )
    assert drained.spec.unschedulable is True
    assert {(t.key, t.effect) for t in drained.spec.taints} >= {(IMPENDING, "NoSchedule")}
    ready = next(c for c in drained.status.conditions if c.type == "Ready")
    assert (ready.status, ready.message) == ("False", "node is shutting down")

    job, cond = finished(fleet, batch, "m1-job")
    assert (cond.type, cond.reason) == ("Failed", "BackoffLimitExceeded")  # no podFailurePolicy: counted
    assert job.status.failed == 1 and not job.status.active and job.status.ready == 0
    (pod,) = [p for p in core.list_namespaced_pod(NS).items if p.metadata.labels["job-name"] == "m1-job"]
    assert pod.status.phase == "Failed" and pod.spec.node_name == node
    assert (pod.status.reason, pod.status.message) == ("Terminated", SHUTDOWN)
    target = next(c for c in pod.status.conditions if c.type == "DisruptionTarget")
    assert (target.status, target.reason, target.message) == ("True", "TerminationByKubelet", SHUTDOWN)
    term = pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (143, "Error")

    back = wait_for(
        fleet,
        lambda: (n := core.read_node(node)).metadata.labels.get(ACTIVE) is None and n, what="back"
    )
    assert SCHEDULED not in back.metadata.labels and not back.spec.unschedulable
    assert IMPENDING not in {t.key for t in back.spec.taints or []}
    assert next(c for c in back.status.conditions if c.type == "Ready").status == "True"
    assert [n.metadata.name for n in nodes_of(core, "m1")] == [node]

    # the Job watch saw ready/active drop before the Job failed
    steps = [
        (o["status"].get("active"), o["status"].get("ready"))
        for t, o in history(batch.list_namespaced_job, jobs_rv, NS)
        if o["metadata"]["name"] == "m1-job"
    ]
    assert (None, 0) in steps
    pod_changes = [o for t, o in history(core.list_namespaced_pod, rv, NS)]
    assert any(disruption_condition(o) for o in pod_changes)

    assert {"MaintenanceScheduled", "MaintenanceStarted", "MaintenanceCompleted"} <= events(core, node)
    s = stats(fleet)
    assert s["disruption_counts"] == {"maintenance": 1, "repair": 0, "reclaim": 0}
    (rec,) = s["disruptions"]
    assert rec["kind"] == "maintenance" and rec["pool"] == "m1" and rec["nodes"] == [node]
    assert rec["jobs"] == [f"{NS}/m1-job"] and rec["pods"] == [f"{NS}/{pod.metadata.name}"]
    assert rec["trigger"] == "FALCON_SIM_DISRUPT" and rec["at"] <= rec["drained_at"] <= rec["restored_at"]


def test_maintenance_of_a_multi_host_slice_fails_every_pod_and_fail_job_names_the_condition(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "m2", hosts=2, topology="2x4")
    policy = [
        {"action": "FailJob", **ON_DISRUPTION},
        {"action": "Count", "onExitCodes": {"operator": "NotIn", "values": [0]}},
    ]
    batch.create_namespaced_job(
        NS, job_body("m2-job", "m2", hosts=2, disrupt="maintenance@0.1", backoff=6, policy=policy)
    )
    running(fleet, batch, "m2-job", 2)
    job, cond = finished(fleet, batch, "m2-job")
    assert (cond.type, cond.reason) == ("Failed", "PodFailurePolicy")
    assert cond.message.startswith(f"Pod {NS}/m2-job-") and cond.message.endswith(
        " has condition DisruptionTarget matching FailJob rule at index 0"
    )
    assert [c.type for c in job.status.conditions] == ["FailureTarget", "Failed"]
    assert job.status.conditions[0].reason == "PodFailurePolicy"
    pods = [p for p in core.list_namespaced_pod(NS).items if p.metadata.labels["job-name"] == "m2-job"]
    assert len(pods) == 2 and len({p.spec.node_name for p in pods}) == 2
    for pod in pods:
        assert pod.status.phase == "Failed"
        assert any(
            c.type == "DisruptionTarget" and c.reason == "TerminationByKubelet" for c in pod.status.conditions
        )
    for n in nodes_of(core, "m2"):
        assert n.metadata.labels.get(ACTIVE) == "ONGOING" and n.spec.unschedulable
    (rec,) = stats(fleet)["disruptions"]
    assert sorted(rec["nodes"]) == sorted(n.metadata.name for n in nodes_of(core, "m2"))
    assert sorted(rec["pods"]) == sorted(f"{NS}/{p.metadata.name}" for p in pods)


# ---- repair --------------------------------------------------------------------------------------


def test_repair_on_a_single_host_pool_marks_not_ready_then_recreates_the_node(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "r1")
    (node,) = [n.metadata.name for n in nodes_of(core, "r1")]
    batch.create_namespaced_job(NS, job_body("r1-job", "r1", disrupt="repair@0.1"))
    running(fleet, batch, "r1-job")
    pods_rv = core.list_namespaced_pod(NS).metadata.resource_version
    jobs_rv = batch.list_namespaced_job(NS).metadata.resource_version

    unknown = wait_for(
        fleet,
        lambda: (
            next(c for c in core.read_node(node).status.conditions if c.type == "Ready").status == "Unknown"
        ),
        what="Ready=Unknown",
    )
    assert unknown
    not_ready = wait_for(
        fleet,
        lambda: (j := batch.read_namespaced_job("r1-job", NS)).status.ready == 0 and j, what="ready 0"
    )
    assert not_ready.status.active == 1  # the pod still runs as far as the API knows
    taints = {(t.key, t.effect) for t in core.read_node(node).spec.taints}
    assert {
        ("node.kubernetes.io/unreachable", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
    } <= taints

    job, cond = finished(fleet, batch, "r1-job")
    assert (cond.reason, job.status.failed) == ("BackoffLimitExceeded", 1)
    back = wait_for(fleet, lambda: [n.metadata.name for n in nodes_of(core, "r1")] == [node], what="node back")
    assert back
    assert next(c for c in core.read_node(node).status.conditions if c.type == "Ready").status == "True"
    assert not core.read_node(node).spec.unschedulable

    changes = history(core.list_namespaced_pod, pods_rv, NS)
    deleted = [o for t, o in changes if t == "DELETED"]
    assert len(deleted) == 1 and deleted[0]["status"]["phase"] == "Failed"
    target = disruption_condition(deleted[0])
    assert (target["status"], target["reason"], target["message"]) == (
        "True",
        "DeletionByPodGC",
        "PodGC: node no longer exists",
    )
    assert next(c for c in deleted[0]["status"]["conditions"] if c["type"] == "Ready")["status"] == "False"
    steps = [
        (o["status"].get("active"), o["status"].get("ready"))
        for t, o in history(batch.list_namespaced_job, jobs_rv, NS)
    ]
    assert (1, 0) in steps  # readiness dropped first, with the pod still active
    assert {"NodeNotReady", "RemovingNode", "RegisteredNode"} <= events(core, node)
    assert stats(fleet)["disruption_counts"]["repair"] == 1


def test_repair_of_a_multi_host_slice_with_ignore_replaces_every_pod_and_completes(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "r2", hosts=2, topology="2x4")
    names = sorted(n.metadata.name for n in nodes_of(core, "r2"))
    policy = [{"action": "Ignore", **ON_DISRUPTION}]
    batch.create_namespaced_job(
        NS, job_body("r2-job", "r2", hosts=2, run="1", disrupt="repair@0.1", policy=policy)
    )
    running(fleet, batch, "r2-job", 2)
    pods_rv = core.list_namespaced_pod(NS).metadata.resource_version
    job, cond = finished(fleet, batch, "r2-job")
    assert (cond.type, cond.reason) == ("Complete", "CompletionsReached")
    assert job.status.failed is None and job.status.succeeded == 2  # ignored failures are not counted
    deleted = [o for t, o in history(core.list_namespaced_pod, pods_rv, NS) if t == "DELETED"]
    assert len(deleted) == 2
    assert all(disruption_condition(o)["reason"] == "DeletionByPodGC" for o in deleted)
    replacements = [p for p in core.list_namespaced_pod(NS).items if p.status.phase == "Succeeded"]
    assert sorted(
        p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in replacements
    ) == ["0", "1"]
    assert sorted(n.metadata.name for n in nodes_of(core, "r2")) == names  # same names, recreated
    (rec,) = stats(fleet)["disruptions"]
    assert sorted(rec["nodes"]) == names and len(rec["pods"]) == 2


# ---- reclaim -------------------------------------------------------------------------------------


def test_reclaim_of_a_flex_start_node_comes_back_only_through_the_autoscaler(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "f1", flex=True)
    batch.create_namespaced_job(NS, job_body("f1-job", "f1", run="1", disrupt="reclaim@0.1", backoff=1))
    running(fleet, batch, "f1-job")
    (first,) = [n.metadata.name for n in nodes_of(core, "f1")]
    pods_rv = core.list_namespaced_pod(NS).metadata.resource_version
    job, cond = finished(fleet, batch, "f1-job")
    assert (cond.type, job.status.failed, job.status.succeeded) == ("Complete", 1, 1)
    (second,) = [n.metadata.name for n in nodes_of(core, "f1")]
    assert second != first  # a new VM from a scale-up, not the reclaimed one
    deleted = [o for t, o in history(core.list_namespaced_pod, pods_rv, NS) if t == "DELETED"]
    assert len(deleted) == 1 and deleted[0]["spec"]["nodeName"] == first
    target = disruption_condition(deleted[0])
    assert (target["reason"], target["message"]) == ("TerminationByKubelet", SHUTDOWN)
    assert deleted[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    (rec,) = stats(fleet)["disruptions"]
    assert (rec["kind"], rec["supply"], rec["nodes"], rec["restored_at"]) == (
        "reclaim",
        "flex-start",
        [first],
        None,
    )


def test_reclaim_of_a_multi_host_flex_slice_leaves_the_pool_running_without_nodes(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "f2", hosts=2, topology="2x4", flex=True)
    batch.create_namespaced_job(NS, job_body("f2-job", "f2", hosts=2, disrupt="reclaim@0.1"))
    running(fleet, batch, "f2-job", 2, timeout=6)
    job, cond = finished(fleet, batch, "f2-job")
    assert cond.reason == "BackoffLimitExceeded"
    fleet.advance(3600)  # an hour, not a moment past a scale-up's timings: no node comes back
    assert nodes_of(core, "f2") == []
    pool = gke.get_node_pool(name=f"{PARENT}/nodePools/f2")
    assert pool.status == container_v1.NodePool.Status.RUNNING
    (ps,) = [p for p in stats(fleet)["node_pools"] if p["name"] == "f2"]
    assert (ps["hosts"], ps["chips"], ps["nodes"]) == (0, 0, [])


def test_reclaim_of_a_non_flex_pool_is_a_preemption_the_vms_come_back(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "p1")
    (node,) = [n.metadata.name for n in nodes_of(core, "p1")]
    batch.create_namespaced_job(NS, job_body("p1-job", "p1", disrupt="reclaim@0.1"))
    running(fleet, batch, "p1-job")
    finished(fleet, batch, "p1-job")
    wait_for(fleet, lambda: [n.metadata.name for n in nodes_of(core, "p1")] == [node], what="the VM recreated")
    (rec,) = stats(fleet)["disruptions"]
    assert rec["kind"] == "reclaim" and rec["restored_at"] is not None


# ---- the trigger ---------------------------------------------------------------------------------


def test_items_apply_to_successive_runs_of_a_task_across_jobs(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "t1")
    plan = "reclaim@0.1,maintenance@0.1"
    outcomes = []
    for name in ("falcon-task-7", "falcon-task-7-a1", "falcon-task-7-a2"):
        batch.create_namespaced_job(NS, job_body(name, "t1", run="0.6", disrupt=plan, task=7))
        running(fleet, batch, name, timeout=5)
        outcomes.append(finished(fleet, batch, name)[1].type)
    assert outcomes == ["Failed", "Failed", "Complete"]
    recs = stats(fleet)["disruptions"]
    assert [(r["kind"], r["jobs"]) for r in recs] == [
        ("reclaim", [f"{NS}/falcon-task-7"]),
        ("maintenance", [f"{NS}/falcon-task-7-a1"]),
    ]


def test_a_malformed_plan_is_ignored_with_a_warning(fleet, apis, caplog):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "x1")
    caplog.set_level(logging.WARNING, logger="falcon_ray.sim.disruptions")
    batch.create_namespaced_job(NS, job_body("x1-job", "x1", run="0.3", disrupt="explode@1,maintenance"))
    _job, cond = finished(fleet, batch, "x1-job")
    assert cond.type == "Complete"
    assert stats(fleet)["disruption_counts"] == {"maintenance": 0, "repair": 0, "reclaim": 0}
    assert any("malformed FALCON_SIM_DISRUPT" in r.getMessage() for r in caplog.records)


def test_the_random_rate_disrupts_nodes_with_running_pods(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "q1")
    make_pool(fleet, gke, core, "q2")  # no pod: never disrupted
    batch.create_namespaced_job(NS, job_body("q1-job", "q1", run="30", backoff=3))
    running(fleet, batch, "q1-job")
    with pytest.raises(ValidationError):
        fleet.set_faults(NAME, disruption_kinds=["meteor"])
    with pytest.raises(ValidationError):
        fleet.set_faults(NAME, disruption_rate_per_node_hour=-1)
    fleet.set_faults(NAME, disruption_rate_per_node_hour=36000.0 * 5, disruption_kinds=["repair"])
    recs = wait_for(fleet, lambda: stats(fleet)["disruptions"], timeout=3, what="a random disruption")
    fleet.set_faults(NAME, disruption_rate_per_node_hour=0)
    assert recs[0]["kind"] == "repair" and recs[0]["trigger"] == "disruption_rate_per_node_hour"
    assert recs[0]["pool"] == "q1" and recs[0]["jobs"] == [f"{NS}/q1-job"]
    assert all(r["pool"] == "q1" for r in stats(fleet)["disruptions"])


def test_the_disrupt_endpoint_and_the_fleet_method(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "e1")
    (node,) = [n.metadata.name for n in nodes_of(core, "e1")]
    req = urllib.request.Request(
        f"{fleet.endpoints['gke']}/sim/clusters/{NAME}/disrupt",
        data=json.dumps({"kind": "maintenance", "node": node}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        rec = json.loads(resp.read())
    assert (rec["kind"], rec["nodes"], rec["pods"], rec["trigger"]) == ("maintenance", [node], [], "api")
    assert fleet.disrupt(NAME, "repair", node) is None  # already under a disruption


# ---- podFailurePolicy ----------------------------------------------------------------------------


def test_fail_job_on_an_exit_code_not_in_zero(fleet, apis):
    gke, batch, core = apis
    make_pool(fleet, gke, core, "c1")
    policy = [
        {"action": "Ignore", **ON_DISRUPTION},
        {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [0]}},
    ]
    batch.create_namespaced_job(
        NS, job_body("c1-job", "c1", run="0.2", exit_code=3, backoff=6, policy=policy)
    )
    job, cond = finished(fleet, batch, "c1-job")
    (pod,) = [p for p in core.list_namespaced_pod(NS).items if p.metadata.labels["job-name"] == "c1-job"]
    assert (cond.type, cond.reason) == ("Failed", "PodFailurePolicy")
    assert cond.message == (
        f"Container main for pod {NS}/{pod.metadata.name} failed with exit code 3 matching FailJob rule at index 1"
    )
    assert job.status.failed == 1


def test_a_pod_failure_policy_needs_restart_policy_never(fleet, apis):
    _gke, batch, _core = apis
    body = job_body("bad", "none", restart="OnFailure", policy=[{"action": "FailJob", **ON_DISRUPTION}])
    with pytest.raises(k8s.ApiException) as err:
        batch.create_namespaced_job(NS, body)
    assert err.value.status == 422
    message = json.loads(err.value.body)["message"]
    assert message == (
        'Job.batch "bad" is invalid: spec.template.spec.restartPolicy: Invalid value: "OnFailure": '
        'only "Never" is supported when podFailurePolicy is specified'
    )
    zero = job_body(
        "zero", "none", policy=[{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0]}}]
    )
    with pytest.raises(k8s.ApiException) as err:
        batch.create_namespaced_job(NS, zero)
    assert (
        err.value.status == 422
        and "must not be 0 for the In operator" in json.loads(err.value.body)["message"]
    )
    fine = batch.create_namespaced_job(
        NS, job_body("fine", "none", policy=[{"action": "Ignore", **ON_DISRUPTION}])
    )
    assert fine.spec.pod_failure_policy.rules[0].on_pod_conditions[0].status == "True"  # defaulted
    assert fine.spec.pod_replacement_policy == "Failed"
