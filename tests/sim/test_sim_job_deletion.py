"""Deleting a Job in the sim with each propagationPolicy, as the apiserver and the garbage collector
do it: Foreground (deletionTimestamp + foregroundDeletion finalizer, pods first), Background (the
Job at once, its pods terminate over ``pod_termination``) and Orphan (the pods stay).

Each test has a fleet of its own: one zonal cluster, no authentication, one single-host pool of
4 chips, so a second Job needing the TPU can only run once the first Job's pod is gone. The
fleet runs on a ``ManualClock``: the termination's grace passes when the test moves it, so
"not before ``pod_termination``" and "at once" are asserted exactly.
"""

from __future__ import annotations

import json

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1
from kubernetes import client as k8s
from kubernetes import watch

from tests.harness.sim import advance_until, gke_client, private_fleet_config, virtual_fleet, wait_operation

PROJECT, ZONE, NAME = "proj-del", "us-east5-b", "del-1"
LOCATION = f"projects/{PROJECT}/locations/{ZONE}"
PARENT = f"{LOCATION}/clusters/{NAME}"
NS = "falcon-del"
POOL = "falcon-del-pool"
TERMINATION = 1.0  # pod_termination: long enough to look at a terminating pod several times
TIMINGS = {"node_pool_create": 0.1, "node_register": 0.1, "pod_start": 0.05, "pod_termination": TERMINATION}


@pytest.fixture
def fleet():
    config = private_fleet_config(
        [{"name": NAME, "project": PROJECT, "location": ZONE, "chips": 16}], **TIMINGS
    )
    with virtual_fleet(config) as running:
        yield running


@pytest.fixture
def apis(fleet):
    gke = gke_client(fleet, credentials=AnonymousCredentials())
    api = k8s.ApiClient(k8s.Configuration(host=fleet.endpoints["clusters"][NAME]["kubernetes"]))
    batch, core = k8s.BatchV1Api(api), k8s.CoreV1Api(api)
    pool = container_v1.NodePool(
        name=POOL,
        initial_node_count=1,
        config=container_v1.NodeConfig(machine_type="ct6e-standard-4t", labels={"managed-by": "falcon"}),
    )
    done = wait_operation(gke, LOCATION, gke.create_node_pool(parent=PARENT, node_pool=pool), fleet=fleet)
    assert not done.error.message, done.error.message
    advance_until(
        fleet, lambda: core.list_node(label_selector=f"cloud.google.com/gke-nodepool={POOL}").items, 60, "the node"
    )
    return batch, core


def job_body(name: str, run: str = "30", backoff: int = 6) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "backoffLimit": backoff,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"cloud.google.com/gke-nodepool": POOL},
                    "containers": [
                        {
                            "name": "main",
                            "image": "us-docker.pkg.dev/p/r/train:1",
                            "env": [{"name": "FALCON_SIM_RUN_SECONDS", "value": run}],
                            "resources": {"limits": {"google.com/tpu": "4"}},
                        }
                    ],
                }
            },
        },
    }


def pods_of(core, job: str) -> list:
    return core.list_namespaced_pod(NS, label_selector=f"job-name={job}").items


def running_pod(fleet, batch, core, job: str, run: str = "30"):
    batch.create_namespaced_job(NS, job_body(job, run=run))
    return advance_until(
        fleet,
        lambda: next((p for p in pods_of(core, job) if p.status.phase == "Running"), None),
        60,
        f"a Running pod of {job}",
    )[0]


def job_events(batch, name: str, since: str) -> list[tuple[str, bool]]:
    """(type, has deletionTimestamp) of the Job's watch events after ``since``, up to DELETED."""
    seen = []
    w = watch.Watch()
    for ev in w.stream(
        batch.list_namespaced_job,
        NS,
        resource_version=since,
        field_selector=f"metadata.name={name}",
        timeout_seconds=2,
        _request_timeout=30,  # the fleet's clock stands still: a missing DELETED fails, not hangs
    ):
        seen.append((ev["type"], ev["object"].metadata.deletion_timestamp is not None))
        if ev["type"] == "DELETED":
            w.stop()
    return seen


def record(fleet, name: str) -> dict:
    return next(j for j in fleet.stats()["clusters"][NAME]["jobs"] if j["name"] == name)


def test_timing_defaults_and_is_validated():
    from pydantic import ValidationError

    from falcon_ray.sim.fleet import Timings

    assert Timings().pod_termination == 0.2
    with pytest.raises(ValidationError):
        Timings(pod_termination=-1)


def test_foreground_marks_the_job_deletes_its_pods_then_the_job(fleet, apis):
    batch, core = apis
    pod = running_pod(fleet, batch, core, "fg")
    since = batch.list_namespaced_job(NS).metadata.resource_version

    started = fleet.clock.monotonic()
    raw = batch.delete_namespaced_job("fg", NS, propagation_policy="Foreground", _preload_content=False)
    answered = json.loads(raw.data)
    assert raw.status == 200 and answered["kind"] == "Job"
    assert answered["metadata"]["deletionTimestamp"] and answered["metadata"]["finalizers"] == [
        "foregroundDeletion"
    ]

    job = batch.read_namespaced_job("fg", NS)  # right after the delete: still there, marked
    assert job.metadata.deletion_timestamp is not None
    assert job.metadata.finalizers == ["foregroundDeletion"]
    (listed,) = [j for j in batch.list_namespaced_job(NS).items if j.metadata.name == "fg"]
    assert listed.metadata.deletion_timestamp is not None

    terminating = core.read_namespaced_pod(pod.metadata.name, NS)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.status.phase == "Running"

    # the terminating pod keeps the node's 4 chips: another Job's pod cannot be placed yet
    batch.create_namespaced_job(NS, job_body("fg-next"))
    fleet.advance(TERMINATION / 2)
    assert [p.status.phase for p in pods_of(core, "fg-next")] == ["Pending"]
    assert [p.metadata.name for p in pods_of(core, "fg")] == [pod.metadata.name]  # no replacement
    assert batch.read_namespaced_job("fg", NS).metadata.deletion_timestamp is not None

    advance_until(fleet, lambda: not pods_of(core, "fg"), 60, "the pod of fg to go")
    assert fleet.clock.monotonic() - started == pytest.approx(TERMINATION)  # the grace, not less, not more

    def gone():
        try:
            batch.read_namespaced_job("fg", NS)
        except k8s.ApiException as e:
            return e.status == 404
        return False

    _, waited = advance_until(fleet, gone, 60, "Job fg to be removed")
    assert waited == 0  # with its pods
    assert pods_of(core, "fg") == []  # and the Job controller made no replacement on the way
    advance_until(
        fleet,
        lambda: [p.status.phase for p in pods_of(core, "fg-next")] == ["Running"],
        60,
        "the next Job's pod to run once the TPU is free",
    )

    events = job_events(batch, "fg", since)
    assert events[0] == ("MODIFIED", True)
    assert events[-1][0] == "DELETED"
    assert all(marked for _, marked in events), events  # every event after the delete shows it

    rec = record(fleet, "fg")
    assert len(rec["deleted_at"]) == 1 and len(rec["gone_at"]) == 1
    assert rec["gone_at"][0] - rec["deleted_at"][0] == pytest.approx(TERMINATION)


def test_foreground_removes_a_job_with_only_finished_pods_at_once(fleet, apis):
    batch, core = apis
    batch.create_namespaced_job(NS, job_body("done", run="0.05"))
    advance_until(
        fleet, lambda: [p.status.phase for p in pods_of(core, "done")] == ["Succeeded"], 60, "the pod to succeed"
    )
    started = fleet.clock.monotonic()
    batch.delete_namespaced_job("done", NS, propagation_policy="Foreground")
    assert pods_of(core, "done") == []  # an ended pod goes at once

    def gone():
        try:
            batch.read_namespaced_job("done", NS)
        except k8s.ApiException as e:
            return e.status == 404
        return False

    advance_until(fleet, gone, 60, "Job done to be removed")
    assert fleet.clock.monotonic() - started == 0  # at once: no grace to wait out


def test_background_removes_the_job_at_once_and_the_pod_terminates(fleet, apis):
    batch, core = apis
    pod = running_pod(fleet, batch, core, "bg")
    since = core.list_namespaced_pod(NS).metadata.resource_version

    started = fleet.clock.monotonic()
    answer = batch.delete_namespaced_job("bg", NS, propagation_policy="Background")
    assert answer["kind"] == "Status" and answer["status"] == "Success"  # the Job is gone: a Status
    with pytest.raises(k8s.ApiException) as err:
        batch.read_namespaced_job("bg", NS)
    assert err.value.status == 404

    terminating = core.read_namespaced_pod(pod.metadata.name, NS)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 1
    assert terminating.status.phase == "Running"
    batch.create_namespaced_job(NS, job_body("bg-next"))
    fleet.advance(TERMINATION / 2)
    still = core.read_namespaced_pod(pod.metadata.name, NS)  # still there half-way through
    assert still.metadata.deletion_timestamp is not None and still.status.phase == "Running"
    assert [p.status.phase for p in pods_of(core, "bg-next")] == ["Pending"]  # its TPU is held

    advance_until(fleet, lambda: not pods_of(core, "bg"), 60, "the pod of bg to go")
    assert fleet.clock.monotonic() - started == pytest.approx(TERMINATION)  # the grace, not less, not more
    advance_until(
        fleet,
        lambda: [p.status.phase for p in pods_of(core, "bg-next")] == ["Running"],
        60,
        "the next Job's pod to run once the TPU is free",
    )

    seen = []
    w = watch.Watch()
    for ev in w.stream(
        core.list_namespaced_pod,
        NS,
        resource_version=since,
        field_selector=f"metadata.name={pod.metadata.name}",
        timeout_seconds=2,
        _request_timeout=30,  # the fleet's clock stands still: a missing DELETED fails, not hangs
    ):
        seen.append(ev)
        if ev["type"] == "DELETED":
            w.stop()
    assert [e["type"] for e in seen] == ["MODIFIED", "MODIFIED", "DELETED"]
    assert all(e["object"].metadata.deletion_timestamp is not None for e in seen)
    last = seen[-1]["object"]
    assert last.status.phase == "Failed"
    assert last.status.container_statuses[0].state.terminated.exit_code == 143

    rec = record(fleet, "bg")
    assert len(rec["gone_at"]) == 1 and rec["gone_at"][0] == rec["deleted_at"][0]  # the Job went at once


def test_orphan_leaves_the_pods_running_without_their_owner(fleet, apis):
    batch, core = apis
    pod = running_pod(fleet, batch, core, "orph")
    batch.delete_namespaced_job("orph", NS, propagation_policy="Orphan")
    with pytest.raises(k8s.ApiException) as err:
        batch.read_namespaced_job("orph", NS)
    assert err.value.status == 404
    fleet.advance(TERMINATION * 10)  # ten graces; the pod's own run is 30 s
    (kept,) = pods_of(core, "orph")
    assert kept.metadata.name == pod.metadata.name
    assert kept.status.phase == "Running" and kept.metadata.deletion_timestamp is None
    assert not kept.metadata.owner_references  # the garbage collector took its ownerReference off
