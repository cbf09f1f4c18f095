"""Orphan pools: node pools of this installation that nothing manages any more.

Contract
--------
A pool is an orphan when all of these hold:

1. this installation created it (``render.owned_pool``: the ``falcon-`` name, the
   ``managed-by=falcon`` label and the installation's label); another installation's pool,
   or one Falcon did not create, is never an orphan;
2. no live lease manages it (a lease in Deleting counts as not managing: its delete may have
   been lost) and no non-terminal task names it as its pool;
3. it is at least ``grace_s`` old: a pool created a moment ago may not have its lease row
   visible yet. The age is the lease row's when there is one, else the time since the
   gateway first listed the pool;
4. no delete of it is already queued or running.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from falcon_ray import render
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import Lease


@dataclass(frozen=True)
class ListedPool:
    """A node pool as the gateway listed it."""

    name: str
    resource_labels: Mapping[str, str]
    first_seen: float  # monotonic seconds when the gateway first listed it


def pool_age_s(pool: ListedPool, lease: Lease | None, now: dt.datetime, monotonic: float) -> float:
    """How long the pool has been known: from its lease row's creation, else from its first listing."""
    if lease is not None:
        return (now - lease.created_at).total_seconds()
    return monotonic - pool.first_seen


def orphan_pools(
    pools: Collection[ListedPool],
    installation: str,
    live_leases: Mapping[str, Lease],
    held: Collection[str],
    deleting: Collection[str],
    grace_s: float,
    now: dt.datetime,
    monotonic: float,
) -> list[str]:
    """The names of the orphans among ``pools``, in their order. ``live_leases``: the
    cluster's live lease rows by pool name; ``held``: the pools non-terminal tasks name;
    ``deleting``: the pools with a delete queued or running; ``now`` and ``monotonic``: the
    wall and monotonic times of the scan."""
    found = []
    for pool in pools:
        if not render.owned_pool(pool.name, pool.resource_labels, installation):
            continue
        lease = live_leases.get(pool.name)
        if (lease is not None and lease.state != LeaseState.DELETING) or pool.name in held:
            continue
        if pool.name in deleting or pool_age_s(pool, lease, now, monotonic) < grace_s:
            continue
        found.append(pool.name)
    return found
