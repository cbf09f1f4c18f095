"""parse_spec: every bad spec is refused with a message naming the field; nothing else escapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falcon_ray import spec as sp
from falcon_ray.spec import SpecError, TaskSpec, parse_spec

BASE = {"tpu_type": "v6e", "topology": "2x4", "image": "python:3.12", "command": ["python", "-c", "print(1)"]}


def with_(**changes):
    d = dict(BASE)
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DROP = object()

# (case id, raw spec, words the message must contain)
BAD = [
    ("unknown-tpu-type", with_(tpu_type="v9z"), ["tpu_type", "v9z", "v5e", "v5p", "v6e", "v7x"]),
    ("tpu-type-not-string", with_(tpu_type=6), ["tpu_type"]),
    ("unknown-topology", with_(topology="3x3"), ["topology", "3x3", "1x1", "2x4", "16x16"]),
    ("v7x-needs-3d-topology", with_(tpu_type="v7x", topology="2x4"), ["topology", "2x2x2"]),
    ("image-uppercase", with_(image="Python:3.12"), ["image"]),
    ("image-space", with_(image="python 3.12"), ["image"]),
    ("image-empty", with_(image=""), ["image"]),
    ("image-tag-only", with_(image=":latest"), ["image"]),
    ("image-bad-digest", with_(image="python@sha256:xyz"), ["image"]),
    ("image-too-long", with_(image="a" * 600), ["image"]),
    ("image-missing", with_(image=_DROP), ["image", "missing"]),
    ("env-name-digit-first", with_(env={"1ABC": "x"}), ["env", "1ABC"]),
    ("env-name-space", with_(env={"A B": "x"}), ["env", "A B"]),
    ("env-name-equals", with_(env={"A=B": "x"}), ["env"]),
    ("env-name-empty", with_(env={"": "x"}), ["env"]),
    ("env-value-not-string", with_(env={"A": 1}), ["env"]),
    ("env-not-object", with_(env=["A=1"]), ["env"]),
    ("env-reserved-task-id", with_(env={"FALCON_TASK_ID": "1"}), ["env", "FALCON_TASK_ID"]),
    ("env-reserved-worker-id", with_(env={"TPU_WORKER_ID": "0"}), ["env", "TPU_WORKER_ID"]),
    ("env-too-many", with_(env={f"V{i}": "x" for i in range(sp.MAX_ENV_ITEMS + 1)}), ["env"]),
    ("env-too-big", with_(env={"BIG": "x" * (sp.MAX_ENV_BYTES + 1)}), ["env", "bytes"]),
    ("env-nul", with_(env={"A": "x\x00y"}), ["env", "NUL"]),
    ("command-too-big", with_(command=["x" * (sp.MAX_ARGV_BYTES + 1)]), ["command", "bytes"]),
    ("command-too-many", with_(command=["x"] * (sp.MAX_ARGV_ITEMS + 1)), ["command"]),
    ("command-nul", with_(command=["a\x00b"]), ["command", "NUL"]),
    ("command-is-string", with_(command="python train.py"), ["command"]),
    ("command-items-not-strings", with_(command=["python", 3]), ["command"]),
    ("args-too-big", with_(args=["y" * (sp.MAX_ARGV_BYTES + 1)]), ["args"]),
    ("no-command-no-args", with_(command=[]), ["command"]),
    ("timeout-negative", with_(timeout_seconds=-5), ["timeout_seconds"]),
    ("timeout-zero", with_(timeout_seconds=0), ["timeout_seconds"]),
    ("timeout-absurd", with_(timeout_seconds=10**12), ["timeout_seconds", str(sp.MAX_TIMEOUT_SECONDS)]),
    ("timeout-bool", with_(timeout_seconds=True), ["timeout_seconds"]),
    ("timeout-float", with_(timeout_seconds=60.5), ["timeout_seconds"]),
    ("timeout-string", with_(timeout_seconds="60"), ["timeout_seconds"]),
    ("timeout-null", with_(timeout_seconds=None), ["timeout_seconds"]),
    ("supply-mode-unknown", with_(supply_mode="spot"), ["supply_mode", "flex-start", "reservation"]),
    ("supply-mode-list", with_(supply_mode=["spot"]), ["supply_mode"]),
    ("supply-mode-object", with_(supply_mode={"a": 1}), ["supply_mode"]),
    ("cpu-not-quantity", with_(cpu="lots"), ["cpu"]),
    ("cpu-number", with_(cpu=4), ["cpu"]),
    ("memory-bad-unit", with_(memory="16GB"), ["memory"]),
    ("working-dir-relative", with_(working_dir="src"), ["working_dir"]),
    ("field-privileged", with_(privileged=True), ["privileged", "unknown field"]),
    ("field-hostPath", with_(hostPath="/"), ["hostPath", "unknown field"]),
    ("field-hostNetwork", with_(hostNetwork=True), ["hostNetwork", "unknown field"]),
    ("field-namespace", with_(namespace="kube-system"), ["namespace", "unknown field"]),
    ("field-serviceAccountName", with_(serviceAccountName="admin"), ["serviceAccountName", "unknown field"]),
    ("field-volumes", with_(volumes=[{"hostPath": {"path": "/"}}]), ["volumes", "unknown field"]),
    ("field-nodeSelector", with_(nodeSelector={"a": "b"}), ["nodeSelector", "unknown field"]),
    ("field-securityContext", with_(securityContext={"privileged": True}), ["securityContext", "unknown field"]),
    ("json-array", "[1, 2]", ["spec", "object", "list"]),
    ("json-number", "3", ["spec", "object", "int"]),
    ("json-string", '"v6e"', ["spec", "object", "str"]),
    ("json-null", "null", ["spec", "object", "NoneType"]),
    ("json-true", "true", ["spec", "object", "bool"]),
    ("python-list", [BASE], ["spec", "object"]),
    ("invalid-json-truncated", json.dumps(BASE)[:-1], ["spec", "JSON"]),
    ("invalid-json-empty", "", ["spec", "JSON"]),
    ("invalid-json-bytes", b"\xff\xfe{", ["spec", "JSON"]),
    ("invalid-json-deep", "[" * 100_000 + "]" * 100_000, ["spec"]),
]


@pytest.mark.parametrize("raw,words", [pytest.param(raw, words, id=case) for case, raw, words in BAD])
def test_bad_spec_names_the_field(raw, words):
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    message = str(err.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    assert len(message) < 2000


def test_several_problems_are_all_reported():
    with pytest.raises(SpecError) as err:
        parse_spec(with_(image="BAD", env={"1X": "y"}, privileged=True))
    assert all(w in str(err.value) for w in ("image", "env", "privileged"))


@pytest.mark.parametrize(
    "raw",
    [
        BASE,
        json.dumps(BASE),
        json.dumps(BASE).encode(),
        with_(command=[], args=["--steps", "10"]),
        with_(supply_mode=""),
        with_(supply_mode=None),
        with_(image="us-docker.pkg.dev/my-proj/repo/trainer:v1.2-rc3"),
        with_(image="localhost:5000/a/b@sha256:" + "a" * 64),
        with_(tpu_type="v7x", topology="2x2x2", supply_mode="flex-start", timeout_seconds=sp.MAX_TIMEOUT_SECONDS),
        with_(env={"XLA_FLAGS": "--xla_dump_to=/tmp", "my.var-1": ""}, cpu="500m", memory="16Gi", working_dir="/app"),
    ],
    ids=lambda r: str(r)[:40],
)
def test_good_specs_parse(raw):
    spec = parse_spec(raw)
    assert isinstance(spec, TaskSpec)
    assert spec.shape.topology == spec.topology


def test_defaults_and_frozen():
    spec = parse_spec(BASE)
    assert spec.timeout_seconds == sp.DEFAULT_TIMEOUT_SECONDS
    assert spec.supply_mode is None and spec.env == {} and spec.args == []
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type is an implementation detail
        spec.image = "other"  # type: ignore[misc]
    assert parse_spec(with_(supply_mode="on-demand")).supply_mode == sp.SupplyMode.ON_DEMAND


# --- property: whatever comes in, only a TaskSpec or a SpecError comes out ---------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=25,
)
FIELDS = list(TaskSpec.model_fields) + ["privileged", "hostPath", "namespace", "volumes"]
plausible = {
    "tpu_type": st.sampled_from(["v5e", "v5p", "v6e", "v7x", "", "V6E"]) | json_values,
    "topology": st.sampled_from(["1x1", "2x4", "2x2x2", "4x4x4", "2x2x1"]) | json_values,
    "image": st.sampled_from(["python:3.12", "gcr.io/p/i:t", "x@sha256:" + "0" * 64]) | json_values,
    "command": st.lists(st.text(max_size=20), max_size=4) | json_values,
    "timeout_seconds": st.integers(-10, 10**7) | json_values,
    "supply_mode": st.sampled_from(["", "reservation", "on-demand", "flex-start"]) | json_values,
    "env": st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4) | json_values,
}
field_dicts = st.fixed_dictionaries(
    {},
    optional={name: plausible.get(name, json_values) for name in FIELDS},
)


def _only_taskspec_or_specerror(raw) -> None:
    try:
        out = parse_spec(raw)
    except SpecError as e:
        assert str(e)
        return
    assert isinstance(out, TaskSpec)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_random_json_values(value):
    _only_taskspec_or_specerror(value)
    _only_taskspec_or_specerror(json.dumps(value))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field_dicts)
def test_random_values_under_real_field_names(value):
    _only_taskspec_or_specerror(value)
    _only_taskspec_or_specerror(json.dumps(value))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60) | st.binary(max_size=60))
def test_random_text_and_bytes(raw):
    _only_taskspec_or_specerror(raw)


@pytest.mark.parametrize(
    "raw,prefix",
    [(with_(topology="3x3"), "topology: "), (with_(command=[]), "command: "), (with_(image="B A D"), "image: ")],
)
def test_message_leads_with_the_field(raw, prefix):
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert str(err.value).startswith(prefix), str(err.value)
