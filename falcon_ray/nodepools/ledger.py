"""The reservation ledger: how many hosts of an edge cluster's reservation Falcon's pools
hold, and whether a new claim on it is granted.

Contract
--------
GKE's reservation counts ``count`` hosts, ``in_use`` of them by nodes that exist. Falcon's
pools also hold hosts GKE does not count yet: a pool being created, or an idle pool whose
nodes are not all registered. The ledger counts, for every reservation pool whose lease
state holds the reservation (``lifecycle.LEASE_HOLDS_RESERVATION``), the hosts its shape
needs less the nodes it has registered; plus every grant whose lease row is not written
yet. A claim is granted when the hosts left free after all of that cover it.
``foreign_hosts``: the hosts in use by nodes outside Falcon's pools, which only their
owner frees (the reservation hold reads them: ``reconcile.hold``).

The registered nodes must be the ones listed no later than the reservation was read:
``in_use`` counts at least those, while a node listed after the read may not be in it yet
(subtracting it would grant hosts GKE still has to give that node).

The inputs are the cluster's live lease rows, the registered nodes per pool, and the
grants made so far (pool -> hosts and the monotonic time it was granted). A grant whose
lease row now carries it, or that is older than ``GRANT_TTL_S`` (its lease row was never
written), is no longer counted: ``outstanding_grants`` drops both.

Where the reservation is read (``search_zones``): reservations are zonal. A reference that
names its zone is read there only; otherwise in each of the cluster's node zones, the zone
it was last found in first.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from falcon_ray import tpu
from falcon_ray.lifecycle import LEASE_HOLDS_RESERVATION, LeaseState
from falcon_ray.model import Lease
from falcon_ray.spec import SupplyMode

GRANT_TTL_S = 120.0  # a grant whose lease row never appeared stops counting after this


@dataclass(frozen=True)
class Grant:
    """A claim granted to a pool whose lease row may not be written yet."""

    hosts: int
    granted_at: float  # monotonic seconds


class ClaimOutcome(enum.Enum):
    GRANTED = "granted"  # a new grant: record it
    HELD = "held"  # the pool already holds its claim (a grant or its lease row): granted again
    REFUSED = "refused"  # fewer hosts free than asked for
    NO_RESERVATION = "no reservation"  # the reservation has not been read (or could not be)


@dataclass(frozen=True)
class ClaimDecision:
    outcome: ClaimOutcome
    free: int = 0  # hosts free for this claim when it was weighed

    @property
    def granted(self) -> bool:
        return self.outcome in (ClaimOutcome.GRANTED, ClaimOutcome.HELD)


def search_zones(named_zone: str, cluster_zones: Sequence[str], last_found: str) -> list[str]:
    """The zones to read the reservation in, in order (the module's contract)."""
    if named_zone:
        return [named_zone]
    zones = list(cluster_zones)
    if last_found in zones:
        zones.remove(last_found)
        zones.insert(0, last_found)
    return zones


def holds_reservation(lease: Lease) -> bool:
    """A lease whose pool holds (or is about to hold) hosts of the reservation."""
    return lease.supply_mode == SupplyMode.RESERVATION and lease.state in LEASE_HOLDS_RESERVATION


def pool_hosts(tpu_type: str, topology: str) -> int | None:
    """The hosts a pool of this shape needs; None for a shape the catalogue does not know."""
    try:
        return tpu.lookup(tpu_type, topology).hosts
    except tpu.UnknownShape:
        return None


def outstanding_grants(grants: Mapping[str, Grant], leases: Iterable[Lease], now: float) -> dict[str, Grant]:
    """The grants still counted at ``now``: not yet carried by a lease row that holds the
    reservation, and not older than ``GRANT_TTL_S``."""
    carried = {lease.name for lease in leases if holds_reservation(lease)}
    return {
        name: g for name, g in grants.items() if name not in carried and now - g.granted_at <= GRANT_TTL_S
    }


def claimed_hosts(
    tpu_type: str,
    leases: Iterable[Lease],
    registered: Mapping[str, int],
    grants: Mapping[str, Grant],
    exclude: str = "",
) -> int:
    """Hosts of the reservation that Falcon's pools hold and GKE does not count yet, leaving
    out pool ``exclude`` (the one whose claim is being weighed)."""
    carried: set[str] = set()
    total = 0
    for lease in leases:
        if not holds_reservation(lease) or lease.name == exclude:
            continue
        carried.add(lease.name)
        hosts = pool_hosts(tpu_type, lease.topology)
        if hosts is not None:
            total += max(0, hosts - registered.get(lease.name, 0))
    return total + sum(g.hosts for name, g in grants.items() if name not in carried and name != exclude)


def foreign_hosts(in_use: int, tpu_type: str, leases: Iterable[Lease]) -> int:
    """Hosts of the reservation in use by nodes outside Falcon's reservation pools (another
    node pool, or another user of a shared reservation): ``in_use`` less the whole shape of
    every Falcon reservation pool that holds hosts or is being deleted. A pool's VMs count
    in ``in_use`` before its nodes register, so counting its registered nodes instead
    would take a pool being created for someone else's."""
    own = sum(
        pool_hosts(tpu_type, lease.topology) or 0
        for lease in leases
        if lease.supply_mode == SupplyMode.RESERVATION and (lease.state in LEASE_HOLDS_RESERVATION or lease.state == LeaseState.DELETING)
    )
    return max(0, in_use - own)


def decide_claim(
    pool: str,
    hosts: int,
    reservation_free: int | None,
    tpu_type: str,
    leases: Iterable[Lease],
    registered: Mapping[str, int],
    grants: Mapping[str, Grant],
) -> ClaimDecision:
    """Whether ``pool`` may take ``hosts`` of the reservation. ``reservation_free`` is GKE's
    ``count - inUseCount`` (None: no reservation read); ``grants`` the outstanding ones.
    Idempotent: a pool that already holds a claim (a grant, or any lease row of its name)
    is granted again without a new grant."""
    if reservation_free is None:
        return ClaimDecision(ClaimOutcome.NO_RESERVATION)
    leases = list(leases)
    if pool in grants or any(lease.name == pool for lease in leases):
        return ClaimDecision(ClaimOutcome.HELD)
    free = reservation_free - claimed_hosts(tpu_type, leases, registered, grants, exclude=pool)
    return ClaimDecision(ClaimOutcome.GRANTED if free >= hosts else ClaimOutcome.REFUSED, free)
