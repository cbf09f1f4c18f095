"""The reservation ledger, table-driven: lease rows, registered nodes and grants in, the
hosts Falcon holds and the claim decision out. v6e shapes: 2x4 is 2 hosts, 4x4 is 4."""

from __future__ import annotations

import datetime as dt

import pytest

from falcon_ray.lifecycle import LeaseState as L
from falcon_ray.model import Lease
from falcon_ray.nodepools.ledger import (
    GRANT_TTL_S,
    ClaimOutcome,
    Grant,
    claimed_hosts,
    decide_claim,
    outstanding_grants,
    search_zones,
)
from falcon_ray.spec import SupplyMode

T0 = dt.datetime(2026, 1, 1)
RES, FLEX, OD = SupplyMode.RESERVATION, SupplyMode.FLEX_START, SupplyMode.ON_DEMAND


def lease(name: str, state: L, topology: str = "2x4", mode: SupplyMode = RES) -> Lease:
    return Lease(1, "c-1", topology, name, mode, state, None, None, 0, "", T0, T0, None, None, None)


CLAIMED = [
    # (situation, leases, registered nodes per pool, grants, exclude, hosts claimed)
    ("nothing", [], {}, {}, "", 0),
    ("a pool asked for: all its hosts", [lease("p1", L.REQUESTED)], {}, {}, "", 2),
    ("a pool being created, one node registered", [lease("p1", L.CREATING)], {"p1": 1}, {}, "", 1),
    ("a ready pool: GKE counts every node", [lease("p1", L.READY)], {"p1": 2}, {}, "", 0),
    ("an idle pool the autoscaler emptied", [lease("p1", L.IDLE, "4x4")], {"p1": 0}, {}, "", 4),
    ("an in-use pool with a node lost", [lease("p1", L.IN_USE, "4x4")], {"p1": 3}, {}, "", 1),
    ("more nodes than the shape: never negative", [lease("p1", L.READY)], {"p1": 5}, {}, "", 0),
    ("a deleting pool gives its hosts back", [lease("p1", L.DELETING)], {}, {}, "", 0),
    ("a flex-start pool is not the reservation's", [lease("p1", L.CREATING, mode=FLEX)], {}, {}, "", 0),
    ("an on-demand pool is not the reservation's", [lease("p1", L.CREATING, mode=OD)], {}, {}, "", 0),
    ("a shape the catalogue does not know counts nothing", [lease("p1", L.CREATING, "3x3")], {}, {}, "", 0),
    ("a grant whose lease row is not written yet", [], {}, {"p1": Grant(2, 0.0)}, "", 2),
    ("a grant its lease row carries counts once", [lease("p1", L.REQUESTED)], {}, {"p1": Grant(2, 0.0)}, "", 2),
    ("the pool weighed is left out (lease)", [lease("p1", L.CREATING), lease("p2", L.CREATING)], {}, {}, "p1", 2),
    ("the pool weighed is left out (grant)", [], {}, {"p1": Grant(2, 0.0), "p2": Grant(4, 0.0)}, "p1", 4),
    ("leases and grants add up", [lease("p1", L.CREATING), lease("p2", L.IDLE, "4x4")], {"p2": 1}, {"p3": Grant(2, 0.0)}, "", 7),
]


@pytest.mark.parametrize(("situation", "leases", "registered", "grants", "exclude", "hosts"), CLAIMED, ids=[c[0] for c in CLAIMED])
def test_claimed_hosts(situation, leases, registered, grants, exclude, hosts):
    assert claimed_hosts("v6e", leases, registered, grants, exclude) == hosts


OUTSTANDING = [
    # (situation, leases, grant's age in seconds, still counted)
    ("a fresh grant, no lease row yet", [], 1.0, True),
    ("its lease row holds the reservation now", [lease("p1", L.REQUESTED)], 1.0, False),
    ("its lease row is deleting: the grant still counts", [lease("p1", L.DELETING)], 1.0, True),
    ("at the time limit", [], GRANT_TTL_S, True),
    ("past the time limit: the row was never written", [], GRANT_TTL_S + 0.1, False),
]


@pytest.mark.parametrize(("situation", "leases", "age", "kept"), OUTSTANDING, ids=[c[0] for c in OUTSTANDING])
def test_outstanding_grants(situation, leases, age, kept):
    now = 1000.0
    assert ("p1" in outstanding_grants({"p1": Grant(2, now - age)}, leases, now)) is kept


CLAIMS = [
    # (situation, GKE's free hosts, leases, registered, grants, hosts asked for by p1, outcome, free seen)
    ("no reservation read", None, [], {}, {}, 2, ClaimOutcome.NO_RESERVATION, 0),
    ("enough free", 4, [], {}, {}, 2, ClaimOutcome.GRANTED, 4),
    ("exactly enough", 2, [], {}, {}, 2, ClaimOutcome.GRANTED, 2),
    ("one short", 1, [], {}, {}, 2, ClaimOutcome.REFUSED, 1),
    ("the last slice was claimed by another pool's lease", 2, [lease("p2", L.CREATING)], {}, {}, 2, ClaimOutcome.REFUSED, 0),
    ("the last slice was granted to another queue", 2, [], {}, {"p2": Grant(2, 0.0)}, 2, ClaimOutcome.REFUSED, 0),
    ("another pool's nodes registered: GKE counts them", 2, [lease("p2", L.READY)], {"p2": 2}, {}, 2, ClaimOutcome.GRANTED, 2),
    ("granted before: granted again", 0, [], {}, {"p1": Grant(2, 0.0)}, 2, ClaimOutcome.HELD, 0),
    ("its lease row exists: granted again", 0, [lease("p1", L.CREATING)], {}, {}, 2, ClaimOutcome.HELD, 0),
    ("even with no free host, a held claim is held", -3, [lease("p1", L.IN_USE)], {"p1": 2}, {}, 2, ClaimOutcome.HELD, 0),
]


@pytest.mark.parametrize(
    ("situation", "free", "leases", "registered", "grants", "hosts", "outcome", "free_seen"), CLAIMS, ids=[c[0] for c in CLAIMS]
)
def test_decide_claim(situation, free, leases, registered, grants, hosts, outcome, free_seen):
    decision = decide_claim("p1", hosts, free, "v6e", leases, registered, grants)
    assert decision.outcome == outcome
    assert decision.free == free_seen
    assert decision.granted is (outcome in (ClaimOutcome.GRANTED, ClaimOutcome.HELD))


ZONES = [
    # (situation, zone the reference names, the cluster's node zones, zone last found in, zones read in order)
    ("the reference names its zone", "us-east5-a", ["us-east5-b", "us-east5-c"], "us-east5-b", ["us-east5-a"]),
    ("no zone named: the cluster's zones", "", ["us-east5-b", "us-east5-c"], "", ["us-east5-b", "us-east5-c"]),
    ("where it was last found first", "", ["us-east5-b", "us-east5-c"], "us-east5-c", ["us-east5-c", "us-east5-b"]),
    ("last found in a zone the cluster left", "", ["us-east5-b"], "us-east5-a", ["us-east5-b"]),
    ("no zone known", "", [], "", []),
]


@pytest.mark.parametrize(("situation", "named", "zones", "last", "order"), ZONES, ids=[z[0] for z in ZONES])
def test_where_the_reservation_is_read(situation, named, zones, last, order):
    assert search_zones(named, zones, last) == order


def test_foreign_hosts_are_in_use_beyond_the_whole_shape_of_falcons_reservation_pools():
    from falcon_ray.nodepools.ledger import foreign_hosts

    rows = [lease("a", L.CREATING, "4x4"), lease("b", L.DELETING, "2x2"), lease("c", L.DELETED, "2x4"), lease("d", L.IN_USE, "4x8", FLEX)]
    assert foreign_hosts(5, "v6e", rows) == 0  # a 4x4 being created (4 VMs, no node yet) and a deleting 2x2
    assert foreign_hosts(7, "v6e", rows) == 2  # two VMs of nobody Falcon knows
    assert foreign_hosts(0, "v6e", rows) == 0
