"""The fleet's per-answer caches answer what working the answer out again would: the clusters of a
project and location, an operation's ``OperationInfo`` and a quantity's canonical text."""

from __future__ import annotations

import pytest

from falcon_ray.devtools.simulate.fleet import SimGke, VirtualFleet
from falcon_ray.devtools.simulate.schedule import Scheduler
from falcon_ray.gcp import OperationInfo
from falcon_ray.sim import kube_admission
from falcon_ray.sim.kube_store import RESOURCES
from falcon_ray.sim.quantities import canonical
from tests.harness.simulate import POOL_2X2, run_for, virtual_fleet

LOC = "us-east5-b"
FLEET = {
    "clusters": [
        {"name": "c1", "project": "p-a", "location": LOC, "tpu_type": "v6e", "chips": 64},
        {"name": "c2", "project": "p-b", "location": LOC, "tpu_type": "v6e", "chips": 64},
        {"name": "c3", "project": "p-a", "location": LOC, "tpu_type": "v6e", "chips": 64},
    ]
}
POOL = POOL_2X2


def _fleet() -> tuple[VirtualFleet, Scheduler]:
    return virtual_fleet(FLEET)


_run = run_for


def _scan_owner(fleet: VirtualFleet, project: str, location: str, name: str):
    """get_operation's owner as a scan of every cluster finds it."""
    return next(
        (
            c
            for c in fleet.clusters.values()
            if c.config.project == project and c.config.location == location and name in c.pools.operations
        ),
        None,
    )


def _fresh(op) -> OperationInfo:
    body = op.to_json(False)
    return OperationInfo(
        name=body["name"],
        status=body["status"],
        done=body["status"] == "DONE",
        error=None,
        target=body["targetLink"],
        operation_type=body["operationType"],
        detail="",
    )


def test_the_clusters_of_a_project_and_location_are_those_a_scan_finds_in_order():
    fleet, _ = _fleet()
    for project in ("p-a", "p-b", "p-c"):
        for location in (LOC, "us-central1"):
            scan = [
                c
                for c in fleet.clusters.values()
                if c.config.project == project and c.config.location == location
            ]
            assert fleet.clusters_at(project, location) == scan
            assert fleet.clusters_at(project, location) == scan  # asked again: the same answer
    assert [c.config.name for c in fleet.clusters_at("p-a", LOC)] == ["c1", "c3"]


def test_an_operation_in_two_clusters_is_the_first_ones_as_the_scan_says():
    fleet, scheduler = _fleet()
    gke = SimGke(fleet)
    name = gke.create_node_pool("p-a", LOC, "c3", POOL)
    assert gke.get_operation("p-a", LOC, name).target.endswith("/clusters/c3/nodePools/pool-a")
    # the same operation name, later, in an earlier cluster of the same project and location
    c1 = fleet.clusters["c1"]
    c1.pools.operations[name] = (
        fleet.clusters["c3"]
        .pools.operations[name]
        .__class__(name, "DELETE_NODE_POOL", "pool-b", c1, started_at=c1.wall())
    )
    assert _scan_owner(fleet, "p-a", LOC, name) is c1
    info = gke.get_operation("p-a", LOC, name)
    assert info == _fresh(c1.pools.operations[name])
    assert info.target.endswith("/clusters/c1/nodePools/pool-b")


def test_an_operations_info_is_made_again_when_its_status_changes():
    fleet, scheduler = _fleet()
    gke = SimGke(fleet)
    name = gke.create_node_pool("p-a", LOC, "c1", POOL)
    op = fleet.clusters["c1"].pools.operations[name]
    seen = []
    for when in (0, 1, 3600, 60):
        _run(scheduler, when)
        info = gke.get_operation("p-a", LOC, name)
        assert info == _fresh(op)
        seen.append(info.status)
    assert seen[0] == "RUNNING" and seen[-1] == "DONE"
    # an operation ended with an error: its error is classified at every call, never cached
    op.error = {"code": 8, "message": "out of resources"}
    first = gke.get_operation("p-a", LOC, name)
    second = gke.get_operation("p-a", LOC, name)
    assert first.done and first.error is not None and second.error is not None
    assert first.error is not second.error and str(first.error) == str(second.error)
    op.error = None
    assert gke.get_operation("p-a", LOC, name) == _fresh(op)


@pytest.mark.parametrize(
    "text", ["4", "1Gi", "1024Mi", "0.5", "500m", "2e3", "1.5k", "+7", "0", "3Ki", "1e-3"]
)
def test_a_quantitys_canonical_text_is_canonicals(text):
    resources = {"google.com/tpu": text}
    kube_admission.normalize_quantities(RESOURCES["pods"], resources, "where")
    assert resources == {"google.com/tpu": canonical(text)}
    again = {"google.com/tpu": text}
    kube_admission.normalize_quantities(RESOURCES["pods"], again, "where")
    assert again == resources


def test_a_bad_quantity_text_is_refused_every_time_and_numbers_are_still_canonical():
    for _ in range(2):
        with pytest.raises(Exception) as raised:
            kube_admission.normalize_quantities(RESOURCES["pods"], {"cpu": "lots"}, "where")
        assert getattr(raised.value, "code", None) == 400
    numbers = {"a": 4, "b": 0.5, "c": "4"}
    kube_admission.normalize_quantities(RESOURCES["pods"], numbers, "where")
    assert numbers == {"a": canonical(4), "b": canonical(0.5), "c": canonical("4")}
