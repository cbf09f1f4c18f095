"""render: node-pool requests, Jobs and Services for every catalogue shape and supply mode."""

from __future__ import annotations

import datetime as dt
import json
import re

import kubernetes_validate
import pytest
from google.cloud import container_v1

from falcon_ray import render, tpu
from falcon_ray.config import Settings
from falcon_ray.model import Cluster
from falcon_ray.spec import SupplyMode, TaskSpec

S = Settings()

K8S_VERSION = "1.33"
SHAPES = sorted(tpu.CATALOGUE.values(), key=lambda s: (s.tpu_type, s.chips))
SHAPE_IDS = [f"{s.tpu_type}-{s.topology}" for s in SHAPES]
GKE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def make_cluster(**overrides) -> Cluster:
    now = dt.datetime(2026, 1, 1)
    values = dict(
        id="c-1",
        name="edge-a",
        project="proj-a",
        location="us-east5-b",
        tpu_type="v6e",
        gcs_bucket="falcon-artifacts",
        default_reservation="res-a",
        status="active",
        namespace="falcon-jobs",
        service_account="falcon-runner",
        created_at=now,
        updated_at=now,
    )
    values.update(overrides)
    return Cluster(**values)


def make_spec(shape: tpu.SliceShape, **overrides) -> TaskSpec:
    values = dict(
        tpu_type=shape.tpu_type,
        topology=shape.topology,
        image="us-docker.pkg.dev/proj/repo/train:1.0",
        command=["python3", "-m", "train"],
        args=["--steps", "10"],
        env={"MODEL": "gemma"},
    )
    values.update(overrides)
    return TaskSpec(**values)


CLUSTER = make_cluster()


# --- names ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("task_id", [0, 7, 42, 10**18])
def test_node_pool_name_is_a_valid_deterministic_gke_name(shape, task_id):
    name = render.node_pool_name(task_id, shape.topology)
    assert name == render.node_pool_name(task_id, shape.topology)
    assert name.startswith("falcon-")
    assert len(name) <= 40 and GKE_NAME.match(name), name


def test_node_pool_name_example_and_distinctness():
    assert render.node_pool_name(42, "2x4") == "falcon-t42-2x4"
    names = {render.node_pool_name(i, s.topology) for i in range(50) for s in SHAPES}
    assert len(names) == len({(i, s.topology) for i in range(50) for s in SHAPES})
    with pytest.raises(ValueError):
        render.node_pool_name(-1, "2x4")


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("task_id", [7, 10**18])
def test_pool_names_after_capacity_refusals_differ_and_stay_valid(shape, task_id):
    """Each create asked again after a stockout has its own name (the refused pool may still
    be being deleted under the old one), within GKE's 40 characters, with the Falcon prefix."""
    names = [render.node_pool_name(task_id, shape.topology, n) for n in range(0, 120)]
    assert len(set(names)) == len(names)
    assert names[0] == render.node_pool_name(task_id, shape.topology)
    for n, name in enumerate(names[1:], start=1):
        assert name.endswith(f"-r{n}") and name.startswith(render.POOL_NAME_PREFIX)
        assert len(name) <= 40 and GKE_NAME.match(name), name
    assert render.node_pool_name(42, "2x4", 3) == "falcon-t42-2x4-r3"


def test_job_name_is_dns_1123_and_pod_hostnames_fit():
    assert render.job_name(42) == "falcon-task-42"
    assert render.job_name(42, 2) == "falcon-task-42-a2"  # one name per attempt
    assert render.job_attempt({"falcon.dev/attempt": "2"}) == 2 and render.job_attempt({}, "falcon-task-42-a3") == 3
    assert render.job_attempt({}, "falcon-task-42") == 0 and render.job_attempt({"falcon.dev/attempt": "x"}) == 0
    name = render.job_name(10**18)
    assert DNS_1123_LABEL.match(name) and len(name) <= 63
    assert all(len(h.split(".")[0]) <= 63 for h in render.worker_hostnames(10**18, 64))


def test_label_value_is_always_label_safe():
    for text in ["edge-a.2x4", "edge a/2x4", "-x-", "", "é" * 80, "a" * 100, "cluster.with.dots.4x4x4"]:
        value = render.label_value(text)
        assert len(value) <= 63
        assert value == "" or re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", value), value
    assert render.label_value("edge-a.2x4") == "edge-a.2x4"
    assert render.label_value("a" * 100) != render.label_value("a" * 99)


# --- supply modes ----------------------------------------------------------------------


def test_idle_seconds_defaults_follow_the_original():
    s = Settings()
    assert s.idle_seconds("reservation") == 600
    assert s.idle_seconds("on-demand") == 600
    assert s.idle_seconds("flex-start") == 6 * 3600
    with pytest.raises(ValueError):
        s.idle_seconds("spot")


def test_idle_seconds_and_workload_policy_come_from_settings():
    s = Settings(reservation_idle_s=60, on_demand_idle_s=70, flex_start_idle_s=80, v7x_workload_policy="wp-{topology}")
    assert [s.idle_seconds(m) for m in SupplyMode] == [60, 70, 80]
    assert s.workload_policy("2x2x2") == "wp-2x2x2"


# --- node pools ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(SupplyMode))
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_node_pool_request_matches_the_catalogue(shape, mode):
    spec = make_spec(shape)
    name = render.node_pool_name(42, shape.topology)
    pool = render.node_pool_request(
        spec, CLUSTER, mode, name, 42, idle_seconds=S.idle_seconds(mode), workload_policy=S.workload_policy(shape.topology)
    )
    cfg = pool["config"]
    flex = mode == SupplyMode.FLEX_START
    assert pool["name"] == name
    assert cfg["machineType"] == shape.machine_type
    assert pool["initialNodeCount"] == (0 if flex else shape.hosts)
    assert pool["autoscaling"] == {
        "enabled": True,
        "totalMinNodeCount": 0,
        "totalMaxNodeCount": shape.hosts,
        "locationPolicy": "ANY",
    }
    assert pool["locations"] == ["us-east5-b"]
    assert cfg["resourceLabels"] == {"managed-by": "falcon", "falcon-task": "42", "falcon-installation": "default"}
    assert cfg["labels"]["managed-by"] == "falcon"
    assert cfg["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert cfg["consolidationDelay"] == f"{S.idle_seconds(mode)}s"
    # placement
    if not shape.multi_host:
        assert "placementPolicy" not in pool
    elif shape.tpu_type == "v7x":
        assert pool["placementPolicy"] == {"policyName": f"falcon-{shape.topology}"}
    else:
        assert pool["placementPolicy"] == {"type": "COMPACT", "tpuTopology": shape.topology}
    # supply
    if mode == SupplyMode.RESERVATION:
        assert cfg["reservationAffinity"] == {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": ["res-a"],
        }
    else:
        assert cfg["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    assert cfg.get("flexStart", False) is flex
    assert ("maxRunDuration" in cfg) is flex
    assert pool["management"]["autoRepair"] is not flex

    # The real client accepts it, and what it would send keeps every value.
    proto = container_v1.NodePool.from_json(json.dumps(pool))
    assert proto.config.machine_type == shape.machine_type
    assert proto.autoscaling.total_max_node_count == shape.hosts
    assert proto.config.consolidation_delay.total_seconds() == S.idle_seconds(mode)
    assert json.loads(container_v1.NodePool.to_json(proto))["name"] == name


def test_node_pool_request_idle_seconds_and_workload_policy_overrides():
    v7x = tpu.lookup("v7x", "2x2x2")
    pool = render.node_pool_request(
        make_spec(v7x), CLUSTER, "flex-start", "falcon-t1-2x2x2", 1, idle_seconds=123, workload_policy="wp-8"
    )
    assert pool["config"]["consolidationDelay"] == "123s"
    assert pool["placementPolicy"] == {"policyName": "wp-8"}
    assert pool["config"]["maxRunDuration"] == "604800s"


def test_node_pool_request_regional_cluster_needs_a_zone_and_reservation_needs_a_name():
    shape = tpu.lookup("v6e", "2x4")
    regional = make_cluster(location="us-east5")
    # without locations GKE would put initialNodeCount nodes in every node zone: never sent
    with pytest.raises(ValueError, match="no zone is known"):
        render.node_pool_request(make_spec(shape), regional, "on-demand", "falcon-t1-2x4", 1, idle_seconds=600)
    pool = render.node_pool_request(
        make_spec(shape), regional, "on-demand", "falcon-t1-2x4", 1, idle_seconds=600,
        node_zones=("us-east5-c", "us-east5-a"),
    )
    assert pool["locations"] == ["us-east5-a"]  # the first node zone in sorted order
    with pytest.raises(ValueError, match="default_reservation"):
        render.node_pool_request(
            make_spec(shape), make_cluster(default_reservation=""), "reservation", "falcon-t1-2x4", 1, idle_seconds=600
        )


def test_v7x_node_pool_request_needs_a_workload_policy_name():
    v7x = tpu.lookup("v7x", "2x2x2")
    with pytest.raises(ValueError, match="workload policy"):
        render.node_pool_request(make_spec(v7x), CLUSTER, "flex-start", "falcon-t1-2x2x2", 1, idle_seconds=600)


# --- Jobs ------------------------------------------------------------------------------


def container_of(job: dict) -> dict:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_job_manifest_matches_the_catalogue(shape):
    spec = make_spec(shape, cpu="8", memory="64Gi", working_dir="/workspace")
    pool = render.node_pool_name(42, shape.topology)
    job = render.job_manifest(42, spec, CLUSTER, pool, "edge-a.2x4")
    meta, jspec = job["metadata"], job["spec"]
    pod = jspec["template"]["spec"]
    container = container_of(job)
    env = env_of(container)

    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    assert meta["name"] == "falcon-task-42" and meta["namespace"] == "falcon-jobs"
    labels = {
        "managed-by": "falcon",
        "falcon.dev/task-id": "42",
        "falcon.dev/queue": "edge-a.2x4",
        "falcon.dev/installation": "default",
        "falcon.dev/attempt": "0",
    }
    assert meta["labels"] == labels and jspec["template"]["metadata"]["labels"] == labels
    assert jspec["backoffLimit"] == 0
    # Kubernetes retries nothing; the Job's Failed condition says whether the fleet took a pod
    rules = jspec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert rules[1] == {"action": "FailJob", "onExitCodes": {"containerName": "task", "operator": "NotIn", "values": [0]}}
    assert "ttlSecondsAfterFinished" not in jspec and "activeDeadlineSeconds" not in jspec
    assert jspec["completions"] == jspec["parallelism"] == shape.hosts
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": shape.accelerator,
        "cloud.google.com/gke-tpu-topology": shape.topology,
        "cloud.google.com/gke-nodepool": pool,
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container["resources"]["limits"] == {
        "google.com/tpu": str(shape.chips_per_host),
        "cpu": "8",
        "memory": "64Gi",
    }
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod["serviceAccountName"] == "falcon-runner"
    assert pod["automountServiceAccountToken"] is False
    assert container["workingDir"] == "/workspace"
    assert env["MODEL"]["value"] == "gemma" and env["FALCON_TASK_ID"]["value"] == "42"
    assert env["FALCON_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    if shape.multi_host:
        assert jspec["completionMode"] == "Indexed"
        assert pod["subdomain"] == "falcon-task-42"
        assert env["TPU_WORKER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        )
        hosts = env["TPU_WORKER_HOSTNAMES"]["value"].split(",")
        assert hosts == [f"falcon-task-42-{i}.falcon-task-42" for i in range(shape.hosts)]
    else:
        assert "completionMode" not in jspec and "subdomain" not in pod
        assert "TPU_WORKER_HOSTNAMES" not in env
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    "shape", [s for s in SHAPES if s.multi_host], ids=lambda s: f"{s.tpu_type}-{s.topology}"
)
def test_headless_service_selects_the_jobs_pods(shape):
    svc = render.headless_service(42, make_spec(shape), CLUSTER)
    assert svc["metadata"] == {
        "name": "falcon-task-42",
        "namespace": "falcon-jobs",
        "labels": {"managed-by": "falcon", "falcon.dev/task-id": "42", "falcon.dev/installation": "default"},
    }
    assert svc["spec"]["clusterIP"] == "None"
    # every attempt's pods: the Job's name changes per attempt, the task's labels do not
    assert svc["spec"]["selector"] == {"falcon.dev/task-id": "42", "falcon.dev/installation": "default"}
    kubernetes_validate.validate(svc, K8S_VERSION, strict=True)


def test_job_manifest_mounts_the_task_log_subtree_with_gcs_fuse():
    job = render.job_manifest(42, make_spec(tpu.lookup("v6e", "2x4")), CLUSTER, "falcon-t42-2x4", "q")
    pod = job["spec"]["template"]
    assert pod["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true"}
    (volume,) = pod["spec"]["volumes"]
    assert volume["csi"] == {
        "driver": "gcsfuse.csi.storage.gke.io",
        "volumeAttributes": {
            "bucketName": "falcon-artifacts",
            "mountOptions": "implicit-dirs,only-dir=logs/42",
        },
    }
    container = container_of(job)
    assert container["volumeMounts"] == [{"name": volume["name"], "mountPath": render.LOG_MOUNT_PATH}]
    assert container["command"] == ["/bin/sh", "-c", render.LOG_WRAPPER_SCRIPT, render.WRAPPER_ARGV0]
    assert container["args"] == ["python3", "-m", "train", "--steps", "10"]
    assert env_of(container)["FALCON_LOG_DIR"]["value"] == render.LOG_MOUNT_PATH
    assert job["metadata"]["annotations"]["falcon.dev/log-path"] == "gs://falcon-artifacts/logs/42/"


def test_log_path():
    assert render.log_path(CLUSTER, 42, "falcon-task-42-0-abcde") == (
        "gs://falcon-artifacts/logs/42/falcon-task-42-0-abcde.log"
    )
    assert render.log_path(make_cluster(gcs_bucket="gs://b/"), 1, "p") == "gs://b/logs/1/p.log"
    assert render.log_path(make_cluster(gcs_bucket=""), 1, "p") is None


def test_no_bucket_means_no_volume_and_no_wrapper():
    job = render.job_manifest(7, make_spec(tpu.lookup("v6e", "2x2")), make_cluster(gcs_bucket=""), "p", "q")
    pod = job["spec"]["template"]
    container = container_of(job)
    assert "volumes" not in pod["spec"] and "annotations" not in pod["metadata"]
    assert container["command"] == ["python3", "-m", "train"] and container["args"] == ["--steps", "10"]
    assert "volumeMounts" not in container and "FALCON_LOG_DIR" not in env_of(container)
    assert job["metadata"]["annotations"] == {"falcon.dev/log-capture": "off"}


def test_args_only_spec_runs_the_image_entrypoint_unwrapped():
    spec = make_spec(tpu.lookup("v6e", "2x2"), command=[], args=["--steps", "10"])
    job = render.job_manifest(7, spec, CLUSTER, "p", "q")
    container = container_of(job)
    assert "command" not in container and container["args"] == ["--steps", "10"]
    assert "volumes" not in job["spec"]["template"]["spec"]
    assert job["metadata"]["annotations"] == {"falcon.dev/log-capture": "off"}
    assert not render.logs_captured(spec, CLUSTER)


def test_rendering_is_deterministic():
    spec = make_spec(tpu.lookup("v7x", "2x2x4"))
    a = render.job_manifest(9, spec, CLUSTER, "p", "q")
    assert json.dumps(a, sort_keys=True) == json.dumps(
        render.job_manifest(9, spec, CLUSTER, "p", "q"), sort_keys=True
    )


def test_log_wrapper_avoids_kubelet_expansion_syntax():
    # The kubelet expands $(VAR) and collapses $$ in command and args.
    assert "$(" not in render.LOG_WRAPPER_SCRIPT and "$$" not in render.LOG_WRAPPER_SCRIPT
