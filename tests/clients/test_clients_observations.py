"""kube's pure parts: how a Job object becomes a JobObservation, and which pod failure is reported."""

from __future__ import annotations

import pickle

import pytest

from falcon_ray.kube import JobObservation, _failure_of_pod, _pod_info


def job(status: dict | None = None, completions: int = 2, labels: dict | None = None) -> dict:
    return {
        "metadata": {
            "name": "falcon-task-5",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "41",
            "labels": {"managed-by": "falcon", "falcon.dev/task-id": "5"} if labels is None else labels,
        },
        "spec": {"completions": completions},
        "status": status or {},
    }


def cond(kind: str, reason: str = "", message: str = "", status: str = "True") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("status", "phase", "message"),
    [
        ({}, "Pending", ""),
        ({"active": 2, "ready": 1}, "Pending", ""),
        ({"active": 2, "ready": 2}, "Running", ""),
        ({"active": 2}, "Running", ""),  # a server without status.ready: judged by active
        ({"succeeded": 2, "conditions": [cond("SuccessCriteriaMet"), cond("Complete")]}, "Succeeded", ""),
        (
            {
                "failed": 1,
                "conditions": [cond("FailureTarget", "BackoffLimitExceeded", "Job has reached the limit")],
            },
            "Failed",
            "BackoffLimitExceeded: Job has reached the limit",
        ),
        (
            {"failed": 1, "conditions": [cond("Failed", "DeadlineExceeded", "too long")]},
            "Failed",
            "DeadlineExceeded: too long",
        ),
        ({"active": 2, "ready": 2, "conditions": [cond("Failed", status="False")]}, "Running", ""),
    ],
)
def test_phase_from_status(status, phase, message):
    obs = JobObservation.from_job(job(status))
    assert (obs.phase, obs.message) == (phase, message)
    assert (obs.task_id, obs.name, obs.uid, obs.namespace, obs.resource_version, obs.expected) == (
        5,
        "falcon-task-5",
        "u-1",
        "ns",
        "41",
        2,
    )


def test_deleted_and_foreign_jobs():
    gone = JobObservation.from_job(job({"succeeded": 2, "conditions": [cond("Complete")]}), deleted=True)
    assert gone.phase == "Deleted" and gone.terminal
    assert JobObservation.from_job(job(labels={"falcon.dev/task-id": "x"})).task_id is None
    assert JobObservation.from_job(job(labels={})).task_id is None
    assert JobObservation.from_job({"metadata": {"name": "bare"}}).expected == 1


def test_observations_are_picklable_values():
    obs = JobObservation.from_job(job({"active": 2, "ready": 2}))
    assert pickle.loads(pickle.dumps(obs)) == obs
    assert hash(obs) == hash(pickle.loads(pickle.dumps(obs)))


def pod(name: str, terminated: dict | None = None, phase: str = "Failed", **status) -> dict:
    containers = []
    if terminated is not None:
        containers.append({"name": "task", "state": {"terminated": terminated}})
    return {"metadata": {"name": name}, "status": {"phase": phase, "containerStatuses": containers, **status}}


def test_the_earliest_failed_container_is_reported():
    first = pod("p-0", {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-01-01T00:00:01Z"})
    later = pod("p-1", {"exitCode": 1, "reason": "Error", "finishedAt": "2026-01-01T00:00:09Z"})
    fine = pod(
        "p-2", {"exitCode": 0, "reason": "Completed", "finishedAt": "2026-01-01T00:00:00Z"}, "Succeeded"
    )
    failures = [f for p in (later, fine, first) if (f := _failure_of_pod(p))]
    assert min(failures)[1] == "Pod p-0 terminated: OOMKilled (exit code 137)"
    assert _failure_of_pod(fine) is None


def test_pod_level_failures_and_messages():
    evicted = pod("p-3", None, reason="Evicted", message="The node was low on resource: memory.")
    assert _failure_of_pod(evicted)[1] == "Pod p-3 failed: Evicted: The node was low on resource: memory."
    with_message = pod("p-4", {"exitCode": 2, "reason": "Error", "message": "bad flag\n"})
    assert _failure_of_pod(with_message)[1] == "Pod p-4 terminated: Error (exit code 2): bad flag"


def test_pod_info_reports_waiting_reasons():
    waiting = {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n-1"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "task", "state": {"waiting": {"reason": "ErrImagePull", "message": "nope"}}}
            ],
        },
    }
    info = _pod_info(waiting)
    assert (info.phase, info.node_name, info.ready, info.reason, info.message) == (
        "Pending",
        "n-1",
        False,
        "ErrImagePull",
        "nope",
    )
