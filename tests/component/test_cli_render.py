"""falcon-ray render (the operator's dry run) and clusters add's reservation forms."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from falcon_ray import cli

SPEC = {"tpu_type": "v6e", "topology": "2x4", "image": "busybox", "command": ["python", "train.py"]}
BASE = ["render", "--project", "proj-a", "--location", "us-east5-b", "--tpu-type", "v6e"]


def run(*args: str):
    return CliRunner().invoke(cli.main, list(args), catch_exceptions=False)


def rendered(*args: str, spec: dict | None = None) -> dict:
    result = run(*BASE, *args, "--spec", json.dumps(spec or SPEC), "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_render_shows_scopes_the_job_and_the_service():
    out = rendered("--reservation", "res-a", "--task-id", "42")
    pool = out["node_pool"]
    assert pool["name"] == "falcon-t42-2x4"
    assert pool["config"]["oauthScopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert pool["config"]["reservationAffinity"]["values"] == ["res-a"]
    assert pool["locations"] == ["us-east5-b"]
    assert out["job"]["kind"] == "Job" and out["job"]["metadata"]["name"] == "falcon-task-42"
    assert out["service"]["kind"] == "Service"  # 2x4 is two hosts
    rules = out["job"]["spec"]["podFailurePolicy"]["rules"]  # the fleet's failures told from the task's
    assert [r["action"] for r in rules] == ["FailJob", "FailJob"]
    assert rules[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]


def test_render_of_a_shared_reservation_names_its_full_path_and_no_bogus_zone():
    pool = rendered("--reservation", "projects/owner-proj/reservations/res-x")["node_pool"]
    assert pool["config"]["reservationAffinity"]["values"] == ["projects/owner-proj/reservations/res-x"]
    assert pool["locations"] == ["us-east5-b"]


def test_render_chooses_the_supply_mode_as_the_controller_does_and_reads_settings(tmp_path):
    config = tmp_path / "settings.yaml"
    config.write_text("node_service_account: nodes@proj-a.iam.gserviceaccount.com\n")
    out = rendered("--config", str(config), spec={**SPEC, "topology": "1x1"})
    pool = out["node_pool"]
    assert pool["config"]["flexStart"] is True  # no reservation: flex-start
    assert pool["config"]["serviceAccount"] == "nodes@proj-a.iam.gserviceaccount.com"
    assert out["service"] is None


def test_render_without_json_has_headings():
    result = run(*BASE, "--spec", json.dumps(SPEC))
    assert result.exit_code == 0, result.stderr
    for heading in ("# supply mode: flex-start", "# node pool: POST", "# job: POST", "# service: POST"):
        assert heading in result.stdout
    assert "oauthScopes:" in result.stdout


def test_render_reads_the_spec_from_a_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC))
    result = run(*BASE, "--spec", f"@{path}", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["job"]["kind"] == "Job"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--spec", "{not json"], "invalid task spec"),
        (["--spec", json.dumps({**SPEC, "topology": "3x3"})], "unknown topology"),
        (["--spec", json.dumps({**SPEC, "tpu_type": "v7x", "topology": "2x2x2"})], "the cluster offers v6e"),
        (["--reservation", "projects/p/res", "--spec", json.dumps(SPEC)], "projects/PROJECT/reservations/NAME"),
        (["--spec", json.dumps({**SPEC, "supply_mode": "reservation"})], "no --reservation"),
        (["--spec", "@/no/such/file.json"], "cannot read spec file"),
    ],
)
def test_render_bad_input_is_one_line_and_exit_2(args, words):
    result = run(*BASE, *args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_render_unknown_tpu_type_and_a_regional_cluster_without_a_zone_exit_2():
    result = run("render", "--project", "p-a", "--location", "us-east5", "--tpu-type", "v9", "--spec", json.dumps(SPEC))
    assert result.exit_code == 2 and "unknown TPU type" in result.stderr
    result = run("render", "--project", "proj-a", "--location", "us-east5", "--tpu-type", "v6e", "--spec", json.dumps(SPEC))
    assert result.exit_code == 2 and "no zone is known" in result.stderr
    out = run(
        "render", "--project", "proj-a", "--location", "us-east5", "--tpu-type", "v6e", "--zone", "us-east5-c",
        "--spec", json.dumps(SPEC), "--json",
    )
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["node_pool"]["locations"] == ["us-east5-c"]


@pytest.mark.parametrize(
    ("reservation", "ok"),
    [
        ("res-a", True),
        ("us-east5-b/res-a", True),
        ("projects/owner-proj/reservations/res-a", True),
        ("projects/owner-proj/zones/us-east5-b/reservations/res-a", True),
        ("projects/owner-proj/res-a", False),
        ("owner-proj/reservations/res-a", False),
        ("Res_A", False),
    ],
)
def test_clusters_add_accepts_the_reservation_forms_and_refuses_others(store, reservation, ok):
    result = run(
        "clusters", "add", "--db", store.url, "edge-x", "--project", "proj-a", "--location", "us-east5-b",
        "--tpu-type", "v6e", "--reservation", reservation,
    )
    if ok:
        assert result.exit_code == 0, result.stderr
    else:
        assert result.exit_code == 2 and "projects/PROJECT/reservations/NAME" in result.stderr, result.output
