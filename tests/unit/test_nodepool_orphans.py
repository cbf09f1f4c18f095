"""Orphan pools, table-driven: the listed pools, leases, held pools and deletes in flight
in, the pools to delete out."""

from __future__ import annotations

import datetime as dt

import pytest

from falcon_ray.lifecycle import LeaseState as L
from falcon_ray.model import Lease
from falcon_ray.nodepools.orphans import ListedPool, orphan_pools
from falcon_ray.spec import SupplyMode

NOW = dt.datetime(2026, 1, 1, 12, 0, 0)
MONO = 5000.0
GRACE = 60.0
OURS = {"managed-by": "falcon", "falcon-installation": "prod"}


def pool(name="falcon-t1-2x4", labels=OURS, listed_s_ago=600.0) -> ListedPool:
    return ListedPool(name, labels, MONO - listed_s_ago)


def lease(state: L, created_s_ago: float = 600.0, name="falcon-t1-2x4") -> Lease:
    created = NOW - dt.timedelta(seconds=created_s_ago)
    return Lease(1, "c-1", "2x4", name, SupplyMode.RESERVATION, state, None, None, 0, "", created, created, None, None, None)


CASES = [
    # (situation, listed pool, its live lease, held by a live task, delete in flight, orphan)
    ("ours, no lease, no task, old", pool(), None, False, False, True),
    ("ours, a live lease manages it", pool(), lease(L.IN_USE), False, False, False),
    ("ours, an idle lease keeps it", pool(), lease(L.IDLE), False, False, False),
    ("ours, its lease is deleting (the delete may be lost)", pool(), lease(L.DELETING), False, False, True),
    ("ours, deleting lease created a moment ago", pool(), lease(L.DELETING, created_s_ago=5), False, False, False),
    ("ours, no lease but a live task names it", pool(), None, True, False, False),
    ("ours, listed a moment ago (its row may not be visible yet)", pool(listed_s_ago=5), None, False, False, False),
    ("ours, listed exactly the grace ago", pool(listed_s_ago=GRACE), None, False, False, True),
    ("ours, a delete already queued or running", pool(), None, False, True, False),
    ("another installation's pool", pool(labels={**OURS, "falcon-installation": "staging"}), None, False, False, False),
    ("not managed by Falcon", pool(labels={"falcon-installation": "prod"}), None, False, False, False),
    ("Falcon's labels but not Falcon's name", pool(name="default-pool"), None, False, False, False),
]


@pytest.mark.parametrize(("situation", "listed", "live_lease", "held", "deleting", "orphan"), CASES, ids=[c[0] for c in CASES])
def test_orphan_pools(situation, listed, live_lease, held, deleting, orphan):
    leases = {listed.name: live_lease} if live_lease else {}
    found = orphan_pools(
        [listed], "prod", leases, {listed.name} if held else set(), {listed.name} if deleting else set(), GRACE, NOW, MONO
    )
    assert found == ([listed.name] if orphan else [])


def test_orphans_come_back_in_listing_order():
    pools = [pool("falcon-b"), pool("falcon-a", listed_s_ago=1), pool("falcon-c")]
    assert orphan_pools(pools, "prod", {}, set(), set(), GRACE, NOW, MONO) == ["falcon-b", "falcon-c"]
