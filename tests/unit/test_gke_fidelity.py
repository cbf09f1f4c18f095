"""What real GKE and Compute accept, in the node-pool request and at intake: shared
reservations, node OAuth scopes, one zone per TPU pool, TPU7x workload policies, and
flex-start's 7-day run limit (pure functions only)."""

from __future__ import annotations

import dataclasses

import pytest

from falcon_ray import messages, render, scheduling, tpu
from falcon_ray.config import Settings
from falcon_ray.spec import SupplyMode, parse_spec
from tests.unit.test_render import make_cluster, make_spec

V6E_2X4 = tpu.lookup("v6e", "2x4")
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [
        ("res-a", (None, None, "res-a")),
        ("us-east5-b/res-a", (None, "us-east5-b", "res-a")),
        ("projects/owner-proj/reservations/res-a", ("owner-proj", None, "res-a")),
        ("projects/owner-proj/zones/us-east5-b/reservations/res-a", ("owner-proj", "us-east5-b", "res-a")),
    ],
)
def test_every_registry_form_of_a_reservation_parses(ref, parsed):
    assert tuple(render.parse_reservation(ref)) == parsed
    assert render.reservation_parts(ref) == (parsed[1], parsed[2])


@pytest.mark.parametrize(
    "ref",
    ["", "Res-A", "res_a", "us-east5/res-a", "projects/owner-proj/res-a", "projects/P/reservations/r",
     "projects/owner-proj/regions/us-east5/reservations/r", "a/b/c", "projects//reservations/r"],
)
def test_other_reservation_forms_are_refused(ref):
    with pytest.raises(ValueError, match="projects/PROJECT/reservations/NAME"):
        render.parse_reservation(ref)


@pytest.mark.parametrize(
    ("ref", "value", "zone"),
    [
        ("res-a", "res-a", "us-east5-b"),
        ("projects/proj-a/reservations/res-a", "res-a", "us-east5-b"),  # the cluster's own project
        ("projects/owner-proj/reservations/res-a", "projects/owner-proj/reservations/res-a", "us-east5-b"),
        ("projects/owner-proj/zones/us-east5-b/reservations/res-a", "projects/owner-proj/reservations/res-a", "us-east5-b"),
    ],
)
def test_a_shared_reservation_is_named_by_its_full_path_and_never_makes_a_zone(ref, value, zone):
    pool = render.node_pool_request(
        make_spec(V6E_2X4), make_cluster(default_reservation=ref), "reservation", "falcon-t1-2x4", 1, idle_seconds=600
    )
    affinity = pool["config"]["reservationAffinity"]
    assert affinity == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": [value],
    }
    assert pool["locations"] == [zone]


def test_a_regional_cluster_takes_the_zone_a_shared_reservation_names():
    cluster = make_cluster(location="us-east5", default_reservation="projects/owner-proj/zones/us-east5-c/reservations/r")
    pool = render.node_pool_request(make_spec(V6E_2X4), cluster, "reservation", "falcon-t1-2x4", 1, idle_seconds=600)
    assert pool["locations"] == ["us-east5-c"]


@pytest.mark.parametrize("mode", list(SupplyMode))
def test_every_pool_names_its_nodes_scopes_and_service_account_when_set(mode):
    pool = render.node_pool_request(make_spec(V6E_2X4), make_cluster(), mode, "falcon-t1-2x4", 1, idle_seconds=600)
    assert pool["config"]["oauthScopes"] == [CLOUD_PLATFORM]
    assert "serviceAccount" not in pool["config"]  # the Compute Engine default
    s = Settings(node_oauth_scopes=[CLOUD_PLATFORM, "https://www.googleapis.com/auth/devstorage.read_only"],
                 node_service_account="tpu-nodes@proj-a.iam.gserviceaccount.com")
    pool = render.node_pool_request(
        make_spec(V6E_2X4), make_cluster(), mode, "falcon-t1-2x4", 1, idle_seconds=600,
        oauth_scopes=s.node_oauth_scopes, service_account=s.node_service_account,
    )
    assert pool["config"]["oauthScopes"] == s.node_oauth_scopes
    assert pool["config"]["serviceAccount"] == "tpu-nodes@proj-a.iam.gserviceaccount.com"


def test_settings_refuse_an_empty_scope_list():
    with pytest.raises(ValueError):
        Settings(node_oauth_scopes=[])


@pytest.mark.parametrize(
    ("location", "registry_zone", "given", "node_zones", "expected"),
    [
        ("us-east5-b", "", None, (), "us-east5-b"),  # zonal: its own zone
        ("us-east5", "", "us-east5-c", ("us-east5-a",), "us-east5-c"),  # the chosen zone first
        ("us-east5", "us-east5-b", None, ("us-east5-a",), "us-east5-b"),  # the registry's zone
        ("us-east5", "", None, ("us-east5-c", "us-east5-a"), "us-east5-a"),  # sorted node zones
        ("us-east5", "", None, (), None),  # nothing known: refused, never left out
    ],
)
def test_a_tpu_pool_always_has_one_zone(location, registry_zone, given, node_zones, expected):
    cluster = make_cluster(location=location, zone=registry_zone, default_reservation="")
    if expected is None:
        with pytest.raises(ValueError, match="clusters set-zone"):
            render.pool_zone(cluster, given, node_zones)
        return
    assert render.pool_zone(cluster, given, node_zones) == expected
    pool = render.node_pool_request(
        make_spec(V6E_2X4), cluster, "flex-start", "falcon-t1-2x4", 1, idle_seconds=600, zone=given, node_zones=node_zones
    )
    assert pool["locations"] == [expected]


# --- TPU7x workload policies ---------------------------------------------------------------

V7X = make_cluster(tpu_type="v7x", location="us-central1", project="proj-v7")


@pytest.mark.parametrize(
    ("found", "topology", "problem"),
    [
        (None, "2x2x2", "does not exist in project proj-v7, region us-central1"),
        ({"name": "falcon-2x2x2", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}}, "2x2x2", None),
        ({"name": "falcon-2x2x2", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x4"}}, "2x2x2", "is for accelerator topology 2x2x4, not 2x2x2"),
        ({"name": "falcon-2x2x2", "workloadPolicy": {"type": "HIGH_AVAILABILITY"}}, "2x2x2", "not a HIGH_THROUGHPUT workload policy"),
        ({"name": "falcon-2x2x2", "groupPlacementPolicy": {"collocation": "COLLOCATED"}}, "2x2x2", "not a HIGH_THROUGHPUT workload policy"),
        ({"name": "falcon-2x2x2", "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}}, "", None),
    ],
)
def test_workload_policy_problem(found, topology, problem):
    text = render.workload_policy_problem("falcon-2x2x2", topology, V7X, found)
    if problem is None:
        assert text is None
        return
    assert problem in text
    assert "gcloud compute resource-policies create workload-policy falcon-2x2x2 --type=HIGH_THROUGHPUT" in text
    assert "--project=proj-v7 --region=us-central1" in text


def test_a_pool_without_a_policy_needs_no_check_and_a_zonal_cluster_checks_in_its_region():
    assert render.workload_policy_problem("", "2x4", V7X, None) is None
    zonal = make_cluster(tpu_type="v7x", location="us-central1-c")
    assert render.cluster_region(zonal) == "us-central1"
    assert "--region=us-central1" in render.workload_policy_problem("p", "2x2x2", zonal, None)
    request = render.node_pool_request(
        make_spec(tpu.lookup("v7x", "2x2x2")), make_cluster(tpu_type="v7x", default_reservation=""), "flex-start",
        "falcon-t1-2x2x2", 1, idle_seconds=600, workload_policy="falcon-2x2x2",
    )
    assert render.pool_policy_name(request) == "falcon-2x2x2"
    assert render.pool_policy_name({"placementPolicy": {"type": "COMPACT"}}) == ""


# --- flex-start's 7-day maximum run duration ------------------------------------------------

WEEK = render.FLEX_START_MAX_RUN_SECONDS


def long_spec(timeout: int, supply_mode: str | None = None):
    """A spec with a timeout past flex-start's run limit: valid (the spec allows 30 days),
    refused only where flex-start is the supply."""
    spec = make_spec(V6E_2X4, supply_mode=supply_mode)
    return parse_spec({**spec.model_dump(exclude_none=True), "timeout_seconds": timeout})


@pytest.mark.parametrize(
    ("reservation", "supply_mode", "timeout", "serves"),
    [
        ("", None, WEEK + 1, False),  # no reservation: flex-start by default
        ("", "flex-start", WEEK + 1, False),
        ("", "flex-start", WEEK, True),  # exactly the limit fits
        ("", "on-demand", WEEK + 1, True),
        ("res-a", None, WEEK + 1, True),  # the reservation by default
        ("res-a", "flex-start", 30 * 86400, False),
        ("res-a", "reservation", 30 * 86400, True),
    ],
)
def test_flex_start_cannot_serve_a_timeout_longer_than_its_run_limit(reservation, supply_mode, timeout, serves):
    spec = long_spec(timeout, supply_mode)
    o = scheduling.offer(spec, make_cluster(default_reservation=reservation))
    assert o.serves is serves
    if not serves:
        assert o.unfit == scheduling.Unfit.FLEX_START_MAX_RUN and o.mode == SupplyMode.FLEX_START


def test_a_task_only_flex_start_could_serve_gets_no_candidate_but_another_cluster_takes_it():
    spec = long_spec(WEEK + 3600)
    flex = make_cluster(id="c-f", name="edge-flex", default_reservation="")
    placed = scheduling.place(spec, [flex], scheduling.FleetLoad())
    assert placed.verdict == "no_candidate"
    (o,) = placed.offers
    text = messages.text("offer_flex_start_max_run", "en", cluster=o.cluster, seconds=spec.timeout_seconds, limit="7 days")
    assert text == (
        "edge-flex: flex-start, whose VMs run at most 7 days (maxRunDuration), shorter than the task's "
        "timeout_seconds 608400"
    )
    reserved = dataclasses.replace(make_cluster(id="c-r", name="edge-res"), reservation_machine_type="ct6e-standard-4t")
    placed = scheduling.place(spec, [flex, reserved], scheduling.FleetLoad())
    assert placed.verdict == "ok" and [c.name for c in placed.clusters] == ["edge-res"]
