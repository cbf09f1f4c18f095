"""TPU catalogue: (TPU type, topology) -> what GKE needs to run one slice.

Contract
--------
``lookup(tpu_type, topology)`` returns a frozen :class:`SliceShape` or raises
:class:`UnknownShape` whose message names the allowed values. Everything Falcon
renders (node-pool requests, Job manifests, reservation arithmetic) takes its
machine type, chip and host counts, node labels and placement rule from here and
from nowhere else.

Sources and confidence
----------------------
v6e and TPU7x (v7x) come from the project's API reference (GKE TPU docs, xpk's
``system_characteristics.py``, Google's sample manifests): machine types, the
``gke-tpu-accelerator`` label values, 4 chips per host and hosts = chips / 4.
v5e (``tpu-v5-lite-podslice``, ``ct5lp-hightpu-*``) and v5p (``tpu-v5p-slice``,
``ct5p-hightpu-4t``) follow the same rules as xpk applies them; they are NOT in
the verified reference and are marked UNVERIFIED below. TPU7x multi-host pools
are placed by a workload policy (``placementPolicy.policyName``) instead of
COMPACT + ``tpuTopology``; that field mapping is UNVERIFIED as well.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
TPU_RESOURCE = "google.com/tpu"


class Placement(StrEnum):
    """How a slice's hosts are kept together."""

    NONE = "none"  # single host: nothing to place
    COMPACT = "compact"  # placementPolicy{type: COMPACT, tpuTopology: T}
    WORKLOAD_POLICY = "workload-policy"  # placementPolicy{policyName: P} (TPU7x, UNVERIFIED)


class UnknownShape(ValueError):
    """The (TPU type, topology) pair is not in the catalogue."""


@dataclass(frozen=True)
class SliceShape:
    tpu_type: str
    topology: str
    machine_type: str
    accelerator: str  # value of cloud.google.com/gke-tpu-accelerator
    chips_per_host: int
    hosts: int
    placement: Placement

    @property
    def chips(self) -> int:
        return self.chips_per_host * self.hosts

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def node_selector(self) -> dict[str, str]:
        return {ACCELERATOR_LABEL: self.accelerator, TOPOLOGY_LABEL: self.topology}


@dataclass(frozen=True)
class _Family:
    accelerator: str
    machine_1chip: str | None  # machine type for the 1-chip topology, if any
    machine_4chip: str  # machine type for 4-chip hosts (the multi-host building block)
    multi_host_placement: Placement
    topologies: tuple[str, ...]
    extra: dict[str, tuple[str, int, int]]  # topology -> (machine type, chips/host, hosts) overrides
    verified: bool


_FAMILIES: dict[str, _Family] = {
    # UNVERIFIED: v5e values follow xpk's conventions; not in the verified reference.
    # 2x4 on v5e is served as one 8-chip host (ct5lp-hightpu-8t), as GKE allows.
    "v5e": _Family(
        accelerator="tpu-v5-lite-podslice",
        machine_1chip="ct5lp-hightpu-1t",
        machine_4chip="ct5lp-hightpu-4t",
        multi_host_placement=Placement.COMPACT,
        topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        extra={"2x4": ("ct5lp-hightpu-8t", 8, 1)},
        verified=False,
    ),
    # UNVERIFIED: v5p values follow xpk's conventions; not in the verified reference.
    "v5p": _Family(
        accelerator="tpu-v5p-slice",
        machine_1chip=None,
        machine_4chip="ct5p-hightpu-4t",
        multi_host_placement=Placement.COMPACT,
        topologies=("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8"),
        extra={},
        verified=False,
    ),
    # Verified in the reference: ct6e-standard-4t, 4 chips/host, 2x4 = 2 hosts x 4 chips.
    "v6e": _Family(
        accelerator="tpu-v6e-slice",
        machine_1chip="ct6e-standard-1t",
        machine_4chip="ct6e-standard-4t",
        multi_host_placement=Placement.COMPACT,
        topologies=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        extra={},
        verified=True,
    ),
    # Verified: tpu7x-standard-4t, accelerator label tpu7x, 2x2x2 = 2 hosts x 4 chips.
    # UNVERIFIED: multi-host placement through a workload policy in placementPolicy.policyName.
    "v7x": _Family(
        accelerator="tpu7x",
        machine_1chip="tpu7x-standard-1t",
        machine_4chip="tpu7x-standard-4t",
        multi_host_placement=Placement.WORKLOAD_POLICY,
        topologies=("1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8"),
        extra={},
        verified=True,
    ),
}


def _shape(tpu_type: str, topology: str, fam: _Family) -> SliceShape:
    chips = math.prod(int(d) for d in topology.split("x"))
    if topology in fam.extra:
        machine, per_host, hosts = fam.extra[topology]
    elif chips == 1:
        assert fam.machine_1chip is not None
        machine, per_host, hosts = fam.machine_1chip, 1, 1
    else:
        machine, per_host, hosts = fam.machine_4chip, 4, chips // 4
    placement = fam.multi_host_placement if hosts > 1 else Placement.NONE
    return SliceShape(tpu_type, topology, machine, fam.accelerator, per_host, hosts, placement)


CATALOGUE: dict[tuple[str, str], SliceShape] = {
    (t, topo): _shape(t, topo, fam) for t, fam in _FAMILIES.items() for topo in fam.topologies
}


def tpu_types() -> list[str]:
    return list(_FAMILIES)


def topologies(tpu_type: str) -> list[str]:
    fam = _FAMILIES.get(tpu_type)
    return list(fam.topologies) if fam else []


def is_verified(tpu_type: str) -> bool:
    return _FAMILIES[tpu_type].verified


def lookup(tpu_type: str, topology: str) -> SliceShape:
    if tpu_type not in _FAMILIES:
        raise UnknownShape(f"unknown TPU type {tpu_type!r}; allowed: {', '.join(tpu_types())}")
    shape = CATALOGUE.get((tpu_type, topology))
    if shape is None:
        raise UnknownShape(
            f"unknown topology {topology!r} for TPU type {tpu_type}; allowed: {', '.join(topologies(tpu_type))}"
        )
    return shape
