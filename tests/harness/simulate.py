"""For ``falcon-ray simulate``'s tests: tasks in the demo's format (``devtools.simulate.driver``),
and a fleet model on a virtual clock to drive by hand (``devtools.simulate.fleet``)."""

from __future__ import annotations

import datetime as dt

from falcon_ray.devtools.simulate.fleet import VirtualFleet
from falcon_ray.devtools.simulate.schedule import Scheduler, VirtualClock
from falcon_ray.sim.fleet import parse_fleet

START = dt.datetime(2026, 1, 5)
POOL_2X2 = {  # a node pool request of one v6e 2x2 host, as GKE takes it
    "name": "pool-a",
    "initialNodeCount": 1,
    "config": {"machineType": "ct6e-standard-4t"},
    "placementPolicy": {"tpuTopology": "2x2"},
}


def virtual_fleet(fleet: dict) -> tuple[VirtualFleet, Scheduler]:
    """The fleet model of ``fleet`` (the sim's format) and its schedule, at ``START``."""
    scheduler = Scheduler(VirtualClock(START))
    return VirtualFleet(parse_fleet(fleet), scheduler), scheduler


def run_for(scheduler: Scheduler, seconds: float) -> None:
    """Run what the schedule holds for the next ``seconds`` virtual seconds."""
    end = scheduler.clock.monotonic() + seconds
    while scheduler.next_at() is not None and scheduler.next_at() <= end:
        scheduler.run_next()


def sim_task(i: int, submit_at: float, run_s: float, topology: str = "2x2", abort_at: float | None = None, **spec) -> dict:
    """Task ``i``: a v6e ``topology`` slice submitted at ``submit_at`` (aborted at
    ``abort_at``), whose run lasts ``run_s`` on the simulated fleet; ``spec`` adds or
    replaces spec fields."""
    return {
        "name": f"t{i}",
        "actor": ("alice", "bob", "carol")[i % 3],
        "submit_at": submit_at,
        "abort_at": abort_at,
        "spec": {
            "tpu_type": "v6e",
            "topology": topology,
            "image": "us-docker.pkg.dev/p/r/train:1",
            "command": ["python", "train.py"],
            "env": {"FALCON_SIM_RUN_SECONDS": str(int(run_s))},
            "timeout_seconds": int(run_s) + 3600,
            **spec,
        },
    }
