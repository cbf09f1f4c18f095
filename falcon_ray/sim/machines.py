"""What the simulated GKE knows about TPU machine types, independently of Falcon's own catalogue.

Contract
--------
* ``tpu_family(machine_type)`` -> the :class:`TpuFamily` of a TPU machine type
  (by prefix: ``ct5lp-``, ``ct5p-``, ``ct6e-``, ``tpu7x-``) or ``None`` for a
  machine without TPUs.
* ``chips_per_host(machine_type)`` reads the ``-<N>t`` suffix (``ct6e-standard-4t``
  -> 4); 0 for non-TPU machines.
* ``default_topology(family, chips)`` picks the topology GKE would label a node
  with when the request names none: the most square 2-D (or 3-D for 3-D
  families) power-of-two shape of that many chips, e.g. 8 -> ``2x4``/``2x2x2``.

This table is deliberately separate from ``falcon_ray.tpu``: the simulator is
the other side of the wire and must not inherit the controller's mistakes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TpuFamily:
    tpu_type: str
    prefix: str
    accelerator: str  # value of the cloud.google.com/gke-tpu-accelerator node label
    dims: int  # 2 for 2-D tori (v5e, v6e), 3 for 3-D (v5p, TPU7x)
    host_machine: str  # the 4-chip host machine type


FAMILIES = (
    TpuFamily("v5e", "ct5lp-", "tpu-v5-lite-podslice", 2, "ct5lp-hightpu-4t"),
    TpuFamily("v5p", "ct5p-", "tpu-v5p-slice", 3, "ct5p-hightpu-4t"),
    TpuFamily("v6e", "ct6e-", "tpu-v6e-slice", 2, "ct6e-standard-4t"),
    TpuFamily("v7x", "tpu7x-", "tpu7x", 3, "tpu7x-standard-4t"),
)

_CHIPS_SUFFIX = re.compile(r"-(\d+)t$")


def tpu_family(machine_type: str | None) -> TpuFamily | None:
    if not machine_type:
        return None
    for fam in FAMILIES:
        if machine_type.startswith(fam.prefix):
            return fam
    return None


def family_for_type(tpu_type: str) -> TpuFamily:
    for fam in FAMILIES:
        if fam.tpu_type == tpu_type:
            return fam
    raise KeyError(tpu_type)


def chips_per_host(machine_type: str | None) -> int:
    if tpu_family(machine_type) is None:
        return 0
    m = _CHIPS_SUFFIX.search(machine_type or "")
    return int(m.group(1)) if m else 0


def default_topology(family: TpuFamily, chips: int) -> str:
    """The most balanced power-of-two shape with ``chips`` chips (non-powers fall back to 1xN)."""
    if chips <= 0:
        return "x".join(["0"] * family.dims)
    if chips & (chips - 1):
        return "x".join(["1"] * (family.dims - 1) + [str(chips)])
    exponent = chips.bit_length() - 1
    sides = [0] * family.dims
    for i in range(exponent):
        sides[family.dims - 1 - (i % family.dims)] += 1
    if family.dims == 3:
        ordered = sorted(sides, key=lambda s: (s == 0, s))  # GKE writes 3-D slices as 2x2x1, 2x2x2, 2x2x4
    else:
        ordered = sorted(sides)
    return "x".join(str(2**s) for s in ordered)
