"""The TPU catalogue: arithmetic, the verified shapes, placement and errors."""

from __future__ import annotations

import math

import pytest

from falcon_ray import tpu
from falcon_ray.tpu import Placement, UnknownShape

ALL = sorted(tpu.CATALOGUE)


@pytest.mark.parametrize("tpu_type,topology", ALL, ids=lambda x: str(x))
def test_chip_and_host_arithmetic(tpu_type, topology):
    shape = tpu.lookup(tpu_type, topology)
    dims = [int(d) for d in topology.split("x")]
    assert shape.chips == math.prod(dims)
    assert shape.hosts * shape.chips_per_host == shape.chips
    assert shape.hosts >= 1 and shape.chips_per_host in (1, 4, 8)
    assert (shape.tpu_type, shape.topology) == (tpu_type, topology)
    assert shape.multi_host == (shape.hosts > 1)
    if shape.hosts == 1:
        assert shape.placement is Placement.NONE
    else:
        assert shape.placement is not Placement.NONE
    assert shape.node_selector == {tpu.ACCELERATOR_LABEL: shape.accelerator, tpu.TOPOLOGY_LABEL: topology}
    assert len(dims) == (3 if tpu_type in ("v5p", "v7x") else 2)


def test_v6e_2x4_is_two_hosts_of_ct6e_standard_4t():
    s = tpu.lookup("v6e", "2x4")
    assert (s.machine_type, s.hosts, s.chips_per_host, s.chips) == ("ct6e-standard-4t", 2, 4, 8)
    assert s.accelerator == "tpu-v6e-slice"
    assert s.placement is Placement.COMPACT


def test_v7x_2x2x2_is_two_hosts_of_tpu7x_standard_4t():
    s = tpu.lookup("v7x", "2x2x2")
    assert (s.machine_type, s.hosts, s.chips_per_host, s.chips) == ("tpu7x-standard-4t", 2, 4, 8)
    assert s.accelerator == "tpu7x"
    assert s.placement is Placement.WORKLOAD_POLICY


@pytest.mark.parametrize(
    "tpu_type,topology,machine",
    [("v6e", "1x1", "ct6e-standard-1t"), ("v6e", "2x2", "ct6e-standard-4t"), ("v7x", "2x2x1", "tpu7x-standard-4t")],
)
def test_single_host_shapes(tpu_type, topology, machine):
    s = tpu.lookup(tpu_type, topology)
    assert s.hosts == 1 and s.machine_type == machine and s.placement is Placement.NONE


def test_unknown_type_lists_allowed_types():
    with pytest.raises(UnknownShape) as err:
        tpu.lookup("v4", "2x2")
    assert "'v4'" in str(err.value)
    for name in tpu.tpu_types():
        assert name in str(err.value)


def test_unknown_topology_lists_allowed_topologies():
    with pytest.raises(UnknownShape) as err:
        tpu.lookup("v6e", "2x2x2")
    assert "'2x2x2'" in str(err.value)
    for topo in tpu.topologies("v6e"):
        assert topo in str(err.value)


def test_listing_helpers():
    assert set(tpu.tpu_types()) == {t for t, _ in tpu.CATALOGUE}
    assert tpu.topologies("nope") == []
    assert tpu.is_verified("v6e") and tpu.is_verified("v7x")
    assert not tpu.is_verified("v5e")
    assert issubclass(UnknownShape, ValueError)
