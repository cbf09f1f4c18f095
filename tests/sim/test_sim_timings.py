"""Timings that vary, stockouts and consolidationDelay, on the fleet model in virtual time.

The fleet model (``falcon_ray.sim``) runs on the simulate driver's scheduler and virtual
clock (``VirtualFleet``), so hours of fleet time pass in milliseconds and nothing sleeps:
``_run_until`` plays the model's timers up to an instant and moves the clock there.
"""

from __future__ import annotations

import datetime as dt
import random
import statistics

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from falcon_ray.devtools.simulate.cli import _replay_command, parse_timing, simulate
from falcon_ray.devtools.simulate.fleet import VirtualFleet
from falcon_ray.devtools.simulate.schedule import Scheduler, VirtualClock
from falcon_ray.sim.cluster import SimCluster
from falcon_ray.sim.fleet import (
    FleetConfigError,
    LogNormal,
    Timings,
    load_fleet,
    parse_fleet,
    with_timings,
)
from falcon_ray.sim.node_pools import NODEPOOL_LABEL

START = dt.datetime(2026, 1, 5)
ZONE = "us-east5-b"
SLOW_FLEX = "falcon_ray/devtools/simulate/fleets/five_clusters_slow_flex.yaml"
CONSTANT = {
    "node_pool_create": 420,
    "node_register": 90,
    "flex_visibility_lag": 60,
    "node_pool_delete": 180,
    "pod_start": 20,
    "autoscaler_scale_up": 30,
    "flex_capacity_wait": 300,
    "autoscaler_scale_down": 600,
}


def _cluster(**kw) -> dict:
    return {"name": "c1", "project": "p-c1", "location": ZONE, "tpu_type": "v6e", "chips": 64, **kw}


def _fleet(fleet: dict) -> tuple[SimCluster, Scheduler]:
    scheduler = Scheduler(VirtualClock(START))
    virtual = VirtualFleet(parse_fleet(fleet), scheduler)
    return virtual.clusters["c1"], scheduler


def _run_until(scheduler: Scheduler, c: SimCluster, at_s: float) -> None:
    """Play the model's timers up to ``at_s`` seconds after the cluster started, then move the clock there."""
    end = c.started_at + at_s
    while scheduler.next_at() is not None and scheduler.next_at() <= end:
        scheduler.run_next()
    scheduler.clock.advance_to(end)


def _pool(
    name: str, *, supply: str = "on-demand", initial: int = 1, consolidation: str | None = None
) -> dict:
    config: dict = {"machineType": "ct6e-standard-4t"}
    if supply == "flex-start":
        config["flexStart"] = True
        initial = 0
    if supply == "reservation":
        config["reservationAffinity"] = {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": ["res-1"],
        }
    if consolidation is not None:
        config["consolidationDelay"] = consolidation
    return {
        "nodePool": {
            "name": name,
            "initialNodeCount": initial,
            "config": config,
            "autoscaling": {"enabled": True, "totalMinNodeCount": 0, "totalMaxNodeCount": 1},
        }
    }


def _pod(name: str, pool: str, run_s: int = 600) -> dict:
    return {
        "metadata": {"name": name, "namespace": "t"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {NODEPOOL_LABEL: pool},
            "containers": [
                {
                    "name": "main",
                    "image": "img",
                    "env": [{"name": "FALCON_SIM_RUN_SECONDS", "value": str(run_s)}],
                    "resources": {"limits": {"google.com/tpu": "4"}},
                }
            ],
        },
    }


# ---- distributions ----------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    return sorted(values)[int(q * len(values))]


@pytest.mark.parametrize("median, p90", [(3600.0, 7200.0), (420.0, 900.0), (120.0, 121.0)])
def test_a_distribution_draws_the_median_and_p90_it_was_given(median, p90):
    dist = LogNormal(median=median, p90=p90)
    rng = random.Random(11)
    draws = [dist.draw(rng) for _ in range(4000)]
    assert _quantile(draws, 0.5) == pytest.approx(median, rel=0.03)
    assert _quantile(draws, 0.9) == pytest.approx(p90, rel=0.04)
    assert min(draws) > 0
    # the tail is long: some draws far past the p90 (none when p90 hugs the median)
    if p90 >= 2 * median:
        assert max(draws) > 3 * median


def test_a_cluster_draws_each_event_from_its_own_timing_generator():
    c, _ = _fleet(
        {"seed": 4, "clusters": [_cluster(timings={"node_pool_create": {"median": 420, "p90": 900}})]}
    )
    draws = [c.draw("node_pool_create") for _ in range(4000)]
    assert statistics.median(draws) == pytest.approx(420, rel=0.03)
    assert _quantile(draws, 0.9) == pytest.approx(900, rel=0.04)
    again = random.Random("4:c1:timings")
    dist = LogNormal(median=420, p90=900)
    assert draws[:5] == [dist.draw(again) for _ in range(5)]


def test_creates_take_a_drawn_time_each():
    c, scheduler = _fleet(
        {"clusters": [_cluster(timings={**CONSTANT, "node_pool_create": {"median": 420, "p90": 900}})]}
    )
    took = []
    for i in range(4):
        op = c.pools.create(_pool(f"pool-{i}"))
        began = c.mono()
        while op.status != "DONE":
            scheduler.run_next()
        took.append(c.mono() - began)
        _run_until(scheduler, c, c.mono() - c.started_at + 1)
    assert len(set(took)) == 4  # each create drew its own duration
    expected = random.Random("0:c1:timings")
    dist = LogNormal(median=420, p90=900)
    # each create's draw, then its registration's (a number: no draw), in the order they happened
    assert took == pytest.approx([dist.draw(expected) for _ in range(4)])


def _scenario(timings: dict) -> tuple[SimCluster, list[str]]:
    """Two on-demand pools, a flex-start pool scaled up for a pod, a pool deleted; the node names."""
    c, scheduler = _fleet({"seed": 9, "clusters": [_cluster(timings=timings)]})
    nodes: list[str] = []
    c.store.add_listener(
        lambda ev: (
            nodes.append(ev.obj["metadata"]["name"]) if ev.plural == "nodes" and ev.type == "ADDED" else None
        )
    )
    for name in ("pool-a", "pool-b"):
        c.pools.create(_pool(name))
        _run_until(scheduler, c, c.mono() - c.started_at + 2000)
    c.pools.create(_pool("flex-c", supply="flex-start"))
    _run_until(scheduler, c, c.mono() - c.started_at + 2000)
    c.store.create("pods", _pod("p1", "flex-c", run_s=60))
    _run_until(scheduler, c, c.mono() - c.started_at + 40000)
    c.pools.delete("pool-a")
    _run_until(scheduler, c, c.mono() - c.started_at + 2000)
    return c, nodes


def test_constant_timings_draw_nothing_and_distributions_shift_no_other_draw():
    constant, names = _scenario(CONSTANT)
    untouched = random.Random("9:c1:timings")
    assert constant.timing_rng.getstate() == untouched.getstate()  # numbers never draw
    varying, varied_names = _scenario(
        {
            **CONSTANT,
            "node_pool_create": {"median": 420, "p90": 900},
            "node_register": {"median": 120, "p90": 240},
            "flex_capacity_wait": {"median": 3600, "p90": 7200},
        }
    )
    assert varying.timing_rng.getstate() != untouched.getstate()
    # the names (operations, nodes) and the fault draws come from generators of their own
    assert varied_names == names and len(names) == 3
    assert varying.rng.getstate() == constant.rng.getstate()
    assert varying.fault_rng.getstate() == constant.fault_rng.getstate()


def test_the_slow_flex_fleet_is_the_five_clusters_with_three_timings_drawn():
    slow, plain = load_fleet(SLOW_FLEX), load_fleet("falcon_ray/devtools/simulate/fleets/five_clusters.yaml")
    assert [c.name for c in slow.clusters] == [c.name for c in plain.clusters]
    drawn = {"flex_capacity_wait": (3600, 7200), "node_pool_create": (420, 900), "node_register": (120, 240)}
    for s, p in zip(slow.clusters, plain.clusters, strict=True):
        assert s.model_dump(exclude={"timings"}) == p.model_dump(exclude={"timings"})
        for name in Timings.model_fields:
            value = getattr(s.timings, name)
            if name in drawn:
                assert (value.median, value.p90) == drawn[name]
            else:
                assert value == getattr(p.timings, name)


@pytest.mark.parametrize(
    "timing, where",
    [
        ({"median": 3600, "p90": 1800}, "p90 (1800) must be at least the median (3600)"),
        ({"median": 3600}, "timings.flex_capacity_wait.p90: Field required"),
        ({"median": 3600, "p90": 7200, "p99": 9000}, "timings.flex_capacity_wait.p99: Extra inputs"),
        ({"median": 0, "p90": 10}, "timings.flex_capacity_wait.median: Input should be greater than 0"),
        ("an hour", "a number of seconds or a distribution {median: M, p90: P}"),
        (-1, "timings.flex_capacity_wait: Input should be greater than or equal to 0"),
    ],
)
def test_bad_distributions_are_refused_with_where_and_why(timing, where):
    with pytest.raises(FleetConfigError) as err:
        parse_fleet({"clusters": [_cluster(timings={"flex_capacity_wait": timing})]}, "f.yaml")
    assert where in str(err.value)
    assert ".seconds" not in str(err.value) and ".distribution" not in str(err.value)


def test_runtime_control_takes_the_same_shapes():
    c, _ = _fleet({"clusters": [_cluster()]})
    c.set_timings(node_register={"median": 120, "p90": 240})
    assert c.timings.node_register == LogNormal(median=120, p90=240)
    assert c.timings.model_dump()["node_register"] == {"median": 120.0, "p90": 240.0}
    c.set_timings(node_pool_create=5)  # another timing: the distribution stays
    assert c.timings.node_register.median == 120 and c.timings.draw("node_pool_create", c.timing_rng) == 5
    with pytest.raises(ValidationError, match="p90"):
        c.set_timings(node_register={"median": 120})
    c.reset_faults()
    assert c.timings.node_register == 1.0


# ---- the simulate command's --timing ----------------------------------------------------------


def test_timing_options_apply_to_every_cluster_and_go_into_the_replay_command():
    fleet = load_fleet("falcon_ray/devtools/simulate/fleets/five_clusters.yaml")
    changes = dict(
        parse_timing(t) for t in ("flex_capacity_wait=median:1800,p90:3600", "node_pool_create=600")
    )
    swept = with_timings(fleet, changes)
    for c in swept.clusters:
        assert c.timings.flex_capacity_wait == LogNormal(median=1800, p90=3600)
        assert c.timings.node_pool_create == 600 and c.timings.node_register == 90
    assert fleet.clusters[0].timings.node_pool_create == 420  # the loaded fleet is unchanged
    replay = _replay_command("f.yaml", "t.jsonl", None, 3, None, None, False, ("node_pool_create=600",))
    assert "--timing node_pool_create=600" in replay


@pytest.mark.parametrize(
    "option, says",
    [
        ("flex_capacity_wait=median:1800,p90:900", "p90 (900) must be at least the median (1800)"),
        ("flex_capacity_wait=median:1800", "flex_capacity_wait.p90: Field required"),
        ("node_pool_create=soon", "'soon' is not a number of seconds"),
        ("node_pool_create", "is not NAME=SECONDS or NAME=median:M,p90:P"),
        ("no_such_timing=5", "no_such_timing: Extra inputs are not permitted"),
    ],
)
def test_a_bad_timing_option_exits_2_with_one_line(tmp_path, option, says):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("")
    result = CliRunner().invoke(simulate, ["--tasks", str(tasks), "--timing", option, "--quiet"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.output


# ---- stockouts --------------------------------------------------------------------------------


def test_a_stockout_refuses_creates_of_its_supply_in_its_window_only():
    c, scheduler = _fleet(
        {
            "clusters": [
                _cluster(
                    timings=CONSTANT,
                    reservation={"name": "res-1", "count": 4},
                    stockouts=[{"start_s": 1000, "duration_s": 2000, "supply": ["on-demand"]}],
                )
            ]
        }
    )

    def create_at(at_s: float, name: str, supply: str = "on-demand"):
        _run_until(scheduler, c, at_s)
        op = c.pools.create(_pool(name, supply=supply))
        _run_until(scheduler, c, at_s + 500)
        return op

    before = create_at(0, "before")
    assert before.error is None and c.pools.pools["before"].status == "RUNNING"
    inside = create_at(1000, "inside")  # the window's first second
    assert inside.error["code"] == 8
    assert inside.error["message"].startswith(
        "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'projects/p-c1/zones/us-east5-b'"
    )
    assert c.pools.pools["inside"].status == "ERROR" and c.pools.pools["inside"].hosts == 1
    assert c.fault_counts["stockout"] == 1
    held = create_at(2000, "reserved", supply="reservation")  # not the stockout's supply
    assert held.error is None
    after = create_at(3000, "after")  # the window is [1000, 3000)
    assert after.error is None and c.pools.pools["after"].status == "RUNNING"
    assert c.fault_counts["stockout"] == 1


def test_a_flex_start_pool_gets_no_capacity_during_a_stockout_and_its_nodes_after_it():
    c, scheduler = _fleet(
        {"clusters": [_cluster(timings=CONSTANT, stockouts=[{"start_s": 0, "duration_s": 5000}])]}
    )
    op = c.pools.create(_pool("flex", supply="flex-start"))  # created empty: it asks for no host yet
    _run_until(scheduler, c, 600)
    assert op.error is None and c.pools.pools["flex"].status == "RUNNING"
    c.store.create("pods", _pod("p1", "flex"))
    # attempts 30 + 300 s after the pod came (930 s), then every flex_capacity_wait (300 s):
    # the fourteen up to 4830 s are turned away, the one at 5130 s gets a node 90 s later
    _run_until(scheduler, c, 5130 + 90 - 1)
    pool = c.pools.pools["flex"]
    assert pool.hosts == 1 and pool.node_names == []  # held since 5130 s, not registered yet
    assert c.fault_counts["stockout"] == 14
    _run_until(scheduler, c, 5130 + 90 + 1)
    assert len(pool.node_names) == 1


def test_a_flex_start_scale_up_waits_a_drawn_time_for_its_capacity():
    waits = []
    for seed in range(3):
        c, scheduler = _fleet(
            {
                "seed": seed,
                "clusters": [
                    _cluster(timings={**CONSTANT, "flex_capacity_wait": {"median": 3600, "p90": 7200}})
                ],
            }
        )
        c.pools.create(_pool("flex", supply="flex-start"))
        _run_until(scheduler, c, 600)
        c.store.create("pods", _pod("p1", "flex"))
        pool = c.pools.pools["flex"]
        while not pool.node_names:
            scheduler.run_next()
        waits.append(c.mono() - c.started_at - 600)
        wait = LogNormal(median=3600, p90=7200).draw(random.Random(f"{seed}:c1:timings"))
        assert waits[-1] == pytest.approx(30 + wait + 90)  # scale-up, the capacity's wait, registration
    assert len(set(waits)) == 3


def test_stockouts_are_validated():
    for bad, says in (
        ({"start_s": -1, "duration_s": 10}, "stockouts[0].start_s"),
        ({"start_s": 0, "duration_s": 0}, "stockouts[0].duration_s"),
        ({"start_s": 0, "duration_s": 10, "supply": ["reservation"]}, "stockouts[0].supply[0]"),
        ({"start_s": 0, "duration_s": 10, "zone": "x"}, "stockouts[0].zone"),
    ):
        with pytest.raises(FleetConfigError) as err:
            parse_fleet({"clusters": [_cluster(stockouts=[bad])]})
        assert f"clusters[0].{says}" in str(err.value)


# ---- consolidationDelay -----------------------------------------------------------------------


def _idle_pool(honour: bool | None, consolidation: str | None) -> tuple[SimCluster, Scheduler, float]:
    """An on-demand pool of one node that no pod uses, and when that node registered."""
    fleet: dict = {"clusters": [_cluster(timings=CONSTANT)]}
    if honour is not None:
        fleet["honour_consolidation_delay"] = honour
    c, scheduler = _fleet(fleet)
    c.pools.create(_pool("idle", consolidation=consolidation))
    _run_until(scheduler, c, 420 + 90)  # created, then its node registered
    assert len(c.pools.pools["idle"].node_names) == 1
    return c, scheduler, 420 + 90


def test_the_autoscaler_keeps_an_empty_node_for_its_pools_consolidation_delay():
    c, scheduler, registered = _idle_pool(None, "3600s")  # the fleet's default: honoured
    pool = c.pools.pools["idle"]
    _run_until(scheduler, c, registered + 600 + 5)  # past autoscaler_scale_down
    assert len(pool.node_names) == 1
    _run_until(scheduler, c, registered + 3600 - 5)
    assert len(pool.node_names) == 1
    _run_until(scheduler, c, registered + 3600 + 5)
    assert pool.node_names == [] and pool.hosts == 0


def test_without_honouring_it_or_without_one_the_node_goes_at_autoscaler_scale_down():
    for honour, consolidation in ((False, "3600s"), (True, None)):
        c, scheduler, registered = _idle_pool(honour, consolidation)
        pool = c.pools.pools["idle"]
        _run_until(scheduler, c, registered + 600 - 5)
        assert len(pool.node_names) == 1
        _run_until(scheduler, c, registered + 600 + 5)
        assert pool.node_names == [], (honour, consolidation)


def test_a_cluster_may_say_otherwise_than_its_fleet_and_a_bad_delay_is_refused():
    fleet = parse_fleet(
        {
            "honour_consolidation_delay": False,
            "clusters": [_cluster(), _cluster(name="c2", honour_consolidation_delay=True)],
        }
    )
    assert [c.honours_consolidation_delay for c in fleet.clusters] == [False, True]
    assert parse_fleet({"clusters": [_cluster()]}).clusters[0].honours_consolidation_delay
    c, _ = _fleet({"clusters": [_cluster()]})
    with pytest.raises(Exception, match="consolidation_delay"):
        c.pools.create(_pool("bad", consolidation="10 minutes"))
