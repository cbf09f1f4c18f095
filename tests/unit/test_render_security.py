"""No task spec, however hostile, can change what only the registry and Falcon decide."""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from falcon_ray import render, tpu
from falcon_ray.model import Cluster
from falcon_ray.spec import RESERVED_ENV, SpecError, TaskSpec, parse_spec

HOSTILE = [
    "--privileged",
    "hostPath",
    "; rm -rf /",
    "$(id)",
    "`id`",
    "' ; echo pwned '",
    '"}, "hostNetwork": true, {"',
    "\n/bin/sh -c 'curl evil'",
    "kube-system",
    "default",
    "$(FALCON_POD_NAME)",
]
text = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40),
)
env_names = st.one_of(
    st.sampled_from(["FALCON_POD_NAME", "POD_NAME", "PATH", "TPU_NAME"]),
    st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_.-]{0,15}\Z"),
).filter(lambda n: n not in RESERVED_ENV)


def cluster(bucket: str) -> Cluster:
    now = dt.datetime(2026, 1, 1)
    return Cluster(
        id="c",
        name="edge",
        project="p",
        location="us-east5-b",
        tpu_type="v6e",
        gcs_bucket=bucket,
        default_reservation="r",
        status="active",
        namespace="falcon-jobs",
        service_account="falcon-runner",
        created_at=now,
        updated_at=now,
    )


@st.composite
def specs(draw) -> TaskSpec:
    shape = draw(st.sampled_from(sorted(tpu.CATALOGUE.values(), key=lambda s: (s.tpu_type, s.topology))))
    raw: dict[str, Any] = {
        "tpu_type": shape.tpu_type,
        "topology": shape.topology,
        "image": draw(
            st.sampled_from(["busybox", "gcr.io/p/img:1", "us-docker.pkg.dev/p/r/i@sha256:" + "a" * 64])
        ),
        "command": draw(st.lists(text, max_size=4)),
        "args": draw(st.lists(text, max_size=4)),
        "env": draw(st.dictionaries(env_names, text, max_size=4)),
        "working_dir": draw(st.one_of(st.none(), text.map(lambda t: "/" + t))),
        "cpu": draw(st.sampled_from([None, "4", "500m"])),
        "memory": draw(st.sampled_from([None, "16Gi"])),
    }
    if not raw["command"] and not raw["args"]:
        raw["args"] = ["--x"]
    try:
        return parse_spec(raw)
    except SpecError:  # the validator refuses it, so it is never rendered
        assume(False)


def walk(obj: Any, path: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{path}.{k}", k, v
            yield from walk(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from walk(v, f"{path}[{i}]")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), bucket=st.sampled_from(["", "logs-bucket"]), task_id=st.integers(0, 10**12))
def test_spec_cannot_escalate_or_escape(spec, bucket, task_id):
    c = cluster(bucket)
    objects = [render.job_manifest(task_id, spec, c, "falcon-pool", "edge.2x2")]
    objects.append(render.headless_service(task_id, spec, c))
    for obj in objects:
        for path, key, value in walk(obj):
            assert key not in {"hostPath", "hostPort", "capabilities", "procMount"}, path
            if key in {"privileged", "allowPrivilegeEscalation", "hostNetwork", "hostPID", "hostIPC"}:
                assert value is False, path
            if key == "namespace":
                assert value == "falcon-jobs", path
            if key in {"serviceAccountName", "serviceAccount"}:
                assert value == "falcon-runner", path
        assert obj["metadata"]["namespace"] == "falcon-jobs"

    job = objects[0]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["serviceAccountName"] == "falcon-runner"
    assert pod["automountServiceAccountToken"] is False
    assert set(pod) <= {
        "restartPolicy",
        "serviceAccountName",
        "automountServiceAccountToken",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "nodeSelector",
        "tolerations",
        "containers",
        "volumes",
        "subdomain",
    }
    for volume in pod.get("volumes", []):
        assert set(volume) == {"name", "csi"} and volume["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
    assert pod["nodeSelector"]["cloud.google.com/gke-nodepool"] == "falcon-pool"

    # Spec text never becomes part of a shell script: with the wrapper, the script is the
    # fixed constant and the user's argv follows it as separate positional parameters.
    command = container.get("command", [])
    if render.logs_captured(spec, c):
        assert command == ["/bin/sh", "-c", render.LOG_WRAPPER_SCRIPT, render.WRAPPER_ARGV0]
        assert container["args"] == [*spec.command, *spec.args]
    else:
        assert command == list(spec.command)
        assert container.get("args", []) == list(spec.args)

    # Spec env never overrides the variables Falcon sets.
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names))
    falcon_env = {
        e["name"]: e for e in container["env"] if "valueFrom" in e or e["name"].startswith("FALCON_")
    }
    assert falcon_env["FALCON_TASK_ID"]["value"] == str(task_id)
    assert falcon_env["FALCON_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
