"""The fleet file model, the simulator's TPU table and its selector parser (no server)."""

from __future__ import annotations

import pytest
from google.cloud import container_v1

from falcon_ray.sim.fleet import FleetConfigError, load_fleet, parse_fleet
from falcon_ray.sim.machines import FAMILIES, chips_per_host, default_topology, tpu_family
from falcon_ray.sim.node_pools import OP_STATUS, OP_TYPE, POOL_STATUS, RESERVATION_TYPE
from falcon_ray.sim.selectors import parse_field_selector, parse_label_selector

MINIMAL = {"clusters": [{"name": "c1", "project": "p", "location": "us-east5-b"}]}


def test_default_fleet_is_the_documented_three_cluster_fleet():
    fleet = load_fleet(None)
    by_name = {c.name: c for c in fleet.clusters}
    assert set(by_name) == {"edge-a", "edge-b", "edge-r"}
    a, b, r = by_name["edge-a"], by_name["edge-b"], by_name["edge-r"]
    assert (r.location, r.zones, r.reservation.name, r.reservation_zone) == (
        "us-central1",
        ["us-central1-a", "us-central1-c"],
        "res-r",
        "us-central1-c",
    )
    assert (a.tpu_type, a.status, a.chips, a.reservation.name, a.reservation.count) == (
        "v6e",
        "active",
        64,
        "res-a",
        4,
    )
    assert (b.tpu_type, b.status, b.chips, b.reservation) == ("v6e", "active", 32, None)
    for c in (a, b, r):
        assert 0 < c.timings.node_pool_create <= 2
    assert fleet.auth.required is True


def test_defaults_fill_a_minimal_fleet():
    fleet = parse_fleet(MINIMAL)
    c = fleet.clusters[0]
    assert c.faults.api_error_rate == 0 and c.faults.deny_images == [] and c.faults.create_error is None
    assert c.timings.node_pool_create > 0 and c.status == "active"


@pytest.mark.parametrize(
    "patch, where",
    [
        ({"clusters": [{**MINIMAL["clusters"][0], "chipz": 4}]}, "clusters[0].chipz"),
        ({"clusters": [{**MINIMAL["clusters"][0], "chips": -1}]}, "clusters[0].chips"),
        ({"clusters": [{**MINIMAL["clusters"][0], "name": "Bad_Name"}]}, "clusters[0].name"),
        ({"clusters": [{**MINIMAL["clusters"][0], "status": "broken"}]}, "clusters[0].status"),
        ({"clusters": [{**MINIMAL["clusters"][0], "tpu_type": "v9"}]}, "clusters[0].tpu_type"),
        (
            {"clusters": [{**MINIMAL["clusters"][0], "timings": {"node_pool_create": -2}}]},
            "timings.node_pool_create",
        ),
        (
            {"clusters": [{**MINIMAL["clusters"][0], "faults": {"api_error_rate": 1.5}}]},
            "faults.api_error_rate",
        ),
        ({"clusters": [{**MINIMAL["clusters"][0], "faults": {"typo": 1}}]}, "faults.typo"),
        ({"clusters": [MINIMAL["clusters"][0], MINIMAL["clusters"][0]]}, "repeated: c1"),
        ({"clusters": []}, "clusters"),
        ({"auth": {"required": True, "ttl": 5}, **MINIMAL}, "auth.ttl"),
        ({"clusters": [{**MINIMAL["clusters"][0], "location": "us-east5"}]}, "node_locations is required"),
        (
            {
                "clusters": [
                    {**MINIMAL["clusters"][0], "location": "us-east5", "node_locations": ["us-west1-a"]}
                ]
            },
            "'us-west1-a' is not a zone of us-east5",
        ),
        (
            {"clusters": [{**MINIMAL["clusters"][0], "node_locations": ["us-east5-a"]}]},
            "must include its zone us-east5-b",
        ),
        (
            {
                "clusters": [
                    {**MINIMAL["clusters"][0], "reservation": {"name": "r", "count": 1, "zone": "eu-x1-a"}}
                ]
            },
            "reservation.zone",
        ),
        (
            {"clusters": [{**MINIMAL["clusters"][0], "timings": {"autoscaler_scale_down": -1}}]},
            "timings.autoscaler_scale_down",
        ),
    ],
)
def test_invalid_fleets_name_the_offending_key(patch, where):
    with pytest.raises(FleetConfigError) as err:
        parse_fleet(patch, "f.yaml")
    assert where in str(err.value)
    assert str(err.value).startswith("f.yaml")


def test_zones_and_autoscaler_timings_default_sensibly():
    zonal = parse_fleet({"clusters": [{**MINIMAL["clusters"][0], "reservation": {"name": "r", "count": 1}}]})
    c = zonal.clusters[0]
    assert not c.regional and c.zones == ["us-east5-b"] and c.reservation_zone == "us-east5-b"
    t = c.timings
    assert (t.autoscaler_scale_up, t.flex_capacity_wait, t.autoscaler_scale_down) == (0.5, 0.5, 30.0)
    regional = parse_fleet(
        {
            "clusters": [
                {
                    **MINIMAL["clusters"][0],
                    "location": "us-central1",
                    "node_locations": ["us-central1-c", "us-central1-a"],
                    "reservation": {"name": "r", "count": 1},
                }
            ]
        }
    ).clusters[0]
    assert regional.regional and regional.zones == ["us-central1-c", "us-central1-a"]
    assert regional.reservation_zone == "us-central1-c"  # default: the first node location


def test_load_fleet_reports_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(FleetConfigError, match="cannot read fleet file"):
        load_fleet(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters: [\n")
    with pytest.raises(FleetConfigError, match="not valid YAML"):
        load_fleet(str(bad))
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("7\n")
    with pytest.raises(FleetConfigError, match="top level must be a mapping"):
        load_fleet(str(scalar))


def test_enum_numbers_match_the_container_v1_protos():
    for name, number in POOL_STATUS.items():
        assert container_v1.NodePool.Status[name] == number
    for name, number in OP_STATUS.items():
        assert container_v1.Operation.Status[name] == number
    for name, number in OP_TYPE.items():
        assert container_v1.Operation.Type[name] == number
    for number, name in RESERVATION_TYPE.items():
        assert container_v1.ReservationAffinity.Type[name] == number


def test_tpu_machine_table():
    assert tpu_family("ct6e-standard-4t").accelerator == "tpu-v6e-slice"
    assert tpu_family("tpu7x-standard-4t").accelerator == "tpu7x"
    assert tpu_family("n2-standard-8") is None
    assert chips_per_host("ct6e-standard-4t") == 4 and chips_per_host("ct5lp-hightpu-8t") == 8
    assert chips_per_host("e2-medium") == 0
    v6e = next(f for f in FAMILIES if f.tpu_type == "v6e")
    v7x = next(f for f in FAMILIES if f.tpu_type == "v7x")
    assert [default_topology(v6e, n) for n in (1, 4, 8, 16, 32)] == ["1x1", "2x2", "2x4", "4x4", "4x8"]
    assert [default_topology(v7x, n) for n in (4, 8, 16, 32)] == ["2x2x1", "2x2x2", "2x2x4", "2x4x4"]


@pytest.mark.parametrize(
    "selector, labels, expected",
    [
        ("app=x", {"app": "x"}, True),
        ("app==x", {"app": "y"}, False),
        ("app!=x", {}, True),
        ("app!=x", {"app": "x"}, False),
        ("app", {"app": ""}, True),
        ("!app", {"app": "x"}, False),
        ("app in (x, y),tier", {"app": "y", "tier": "1"}, True),
        ("app in (x,y)", {"app": "z"}, False),
        ("app notin (x,y)", {"app": "z"}, True),
        ("managed-by=falcon,falcon/task notin (7)", {"managed-by": "falcon", "falcon/task": "8"}, True),
        ("", {"anything": "x"}, True),
    ],
)
def test_label_selectors(selector, labels, expected):
    assert parse_label_selector(selector).matches(labels) is expected


@pytest.mark.parametrize("selector", ["app in (x", "app=(", "a b c", "app in ()", ",", "app=x=y"])
def test_bad_label_selectors_are_rejected(selector):
    with pytest.raises(ValueError, match="unable to parse requirement"):
        parse_label_selector(selector)


def test_field_selectors():
    obj = {"metadata": {"name": "a", "namespace": "ns"}, "status": {"phase": "Running"}}
    assert parse_field_selector("metadata.name=a").matches(obj)
    assert parse_field_selector("metadata.name!=a").matches(obj) is False
    assert parse_field_selector("status.phase=Running,metadata.namespace==ns").matches(obj)
    with pytest.raises(ValueError):
        parse_field_selector("nonsense")


def _docs() -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[2] / "docs" / "sim.md").read_text()


def test_the_documented_fleet_example_is_valid():
    text = _docs()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    import yaml

    fleet = parse_fleet(yaml.safe_load(block), "docs/sim.md")
    assert fleet.clusters[0].reservation.machine_type == "ct6e-standard-4t"


def test_every_fleet_key_is_documented():
    from falcon_ray.sim.fleet import (
        AuthConfig,
        ClusterConfig,
        Faults,
        FleetConfig,
        MetadataConfig,
        ReservationConfig,
        Timings,
    )

    text = _docs()
    for model in (FleetConfig, AuthConfig, MetadataConfig, ClusterConfig, ReservationConfig, Timings, Faults):
        for key in model.model_fields:
            spelled = (f"`{key}`", f"`{key}.", f"`auth.{key}`", f"`metadata.{key}`")
            assert any(s in text for s in spelled), f"{model.__name__}.{key} is not documented in docs/sim.md"
