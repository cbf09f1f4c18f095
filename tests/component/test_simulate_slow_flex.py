"""A slow-flex day in virtual time (issue 37): GKE's timings drawn from distributions
(flex-start capacity after an hour at the median, two at p90; creates of 7 minutes and 15;
nodes registering in 2 and 4), a generated half day of tasks on two v6e clusters, played
with the production settings and with the original's strict slot.

What it holds: GKE's slowness is never the task's failure (no NodePoolTimeout, no
NodePoolFailed while GKE delivers within ``capacity_budget_s``), no pool with Ready nodes
sits idle while a task of its queue waits (``ready_pool_idle_s`` 0), every invariant 0,
and the default rule starts the queue's tasks no later than the strict one at the p90.
A failure prints the seed; ``falcon-ray simulate`` replays a fleet and tasks file byte for
byte (docs/testing.md)."""

from __future__ import annotations

import pytest

from falcon_ray.config import Settings
from falcon_ray.devtools.simulate.driver import Simulation
from falcon_ray.devtools.simulate.generate import generate_tasks
from falcon_ray.devtools.simulate.report import build_report
from falcon_ray.sim.fleet import parse_fleet

SLOW = {
    "node_pool_create": {"median": 420, "p90": 900},
    "node_register": {"median": 120, "p90": 240},
    "flex_capacity_wait": {"median": 3600, "p90": 7200},
    "pod_start": 20,
    "node_pool_delete": 180,
    "flex_visibility_lag": 60,
    "autoscaler_scale_up": 30,
    "autoscaler_scale_down": 600,
    "pod_termination": 30,
}
FLEET = {
    "clusters": [
        {"name": "res-a", "project": "p-a", "location": "us-east5-b", "tpu_type": "v6e", "chips": 64,
         "reservation": {"name": "res-a", "count": 8}, "timings": SLOW},
        {"name": "flex-b", "project": "p-b", "location": "us-central1-b", "tpu_type": "v6e", "chips": 128, "timings": SLOW},
    ]
}  # fmt: skip
SEED = 3


def _play(settings: Settings) -> dict:
    fleet = parse_fleet(FLEET)
    tasks = generate_tasks(fleet, tasks=160, days=0.5, seed=SEED)
    sim = Simulation(fleet, tasks, settings, SEED)
    try:
        sim.run()
        return build_report(sim, 0.0)
    finally:
        sim.dispose()


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    return {"default": _play(Settings()), "strict": _play(Settings(strict_slot=True))}


def test_a_slow_gke_is_never_the_tasks_failure(reports):
    r = reports["default"]
    failed = {k: n for k, n in r["outcomes"].items() if k in ("Failed/NodePoolTimeout", "Failed/NodePoolFailed")}
    assert not failed, f"seed {SEED}: {failed} of {r['tasks']}; outcomes {r['outcomes']}"
    assert not any(r["invariants"].values()), (SEED, r["invariants"])
    assert r["outcomes"].get("Succeeded", 0) > r["tasks"] // 2, r["outcomes"]


def test_no_ready_pool_idles_while_a_task_of_its_queue_waits(reports):
    assert reports["default"]["ready_pool_idle_s"] == 0, (SEED, reports["default"]["ready_pool_idle_s"])


def test_the_strict_slot_keeps_its_invariants_and_starts_no_earlier(reports):
    strict, default = reports["strict"], reports["default"]
    assert not any(strict["invariants"].values()), (SEED, strict["invariants"])
    p90 = {name: r["time_to_running_s"]["all"]["p90"] for name, r in reports.items()}
    assert default["time_to_running_s"]["all"]["n"] >= strict["time_to_running_s"]["all"]["n"]
    assert p90["default"] <= p90["strict"], p90
