"""Realistic task files for a simulated fleet, drawn from published ML-cluster trace figures.

Contract
--------
``generate_tasks(fleet, tasks=N, days=D, seed=S)`` returns N task lines in the demo's
format (``name``, ``actor``, ``submit_at``, ``abort_at``, ``spec``), the same for the same
arguments, sorted by ``submit_at``:

- arrivals: a Poisson process over D days whose rate follows the working day (a peak
  in the afternoon UTC, a trough at night, weekends at ``WEEKEND_FACTOR``), scaled so
  that N tasks arrive on average; the run starts on a Monday at 00:00 UTC;
- run times: log-normal with the median and mean of Helios's GPU jobs (206 s and
  6,652 s: Hu et al., SC'21), cut at ``MAX_RUN_S``; the task's timeout is twice its run
  time plus an hour, at most ``MAX_TIMEOUT_S`` (under flex-start's seven days);
- outcomes: ``CANCELLED`` of the tasks are aborted by their user (Helios 22.1%, Philly
  13.5% killed: Jeon et al., ATC'19), after a log-normal delay (median 10 minutes);
  ``FAILED`` end with a non-zero exit code (Helios 15.5%, Philly 17.2% unsuccessful),
  after a uniform fraction of their run time;
- users: ``USERS`` actors with Zipf-like weights (a few users submit most tasks);
- shapes: the TPU types of the fleet's clusters, small slices far more often than large
  ones (``TOPOLOGY_MIX``, the many-small-few-large shape of GPU counts in the same
  traces: median 1 GPU, mean 3.7); ``FLEX_SHARE`` of the tasks ask for flex-start, the
  others take their cluster's default supply.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from falcon_ray import tpu
from falcon_ray.sim.fleet import FleetConfig

HELIOS_MEDIAN_RUN_S = 206.0
HELIOS_MEAN_RUN_S = 6652.0
MAX_RUN_S = 2 * 86400.0
MAX_TIMEOUT_S = 6 * 86400
CANCELLED = 0.18  # between Philly's 13.5% and Helios's 22.1%
FAILED = 0.16  # between Helios's 15.5% and Philly's 17.2%
CANCEL_MEDIAN_S = 600.0
FLEX_SHARE = 0.15
WEEKEND_FACTOR = 0.4
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy")
# (topology, weight) per TPU type: many single-host slices, few large ones
TOPOLOGY_MIX: dict[str, tuple[tuple[str, float], ...]] = {
    "v6e": (("2x2", 0.45), ("2x4", 0.3), ("4x4", 0.15), ("4x8", 0.07), ("8x8", 0.03)),
    "v5e": (("2x2", 0.45), ("2x4", 0.3), ("4x4", 0.15), ("4x8", 0.07), ("8x8", 0.03)),
    "v5p": (("2x2x1", 0.5), ("2x2x2", 0.3), ("2x2x4", 0.15), ("2x4x4", 0.05)),
    "v7x": (("2x2x1", 0.5), ("2x2x2", 0.3), ("2x2x4", 0.15), ("2x4x4", 0.05)),
}
IMAGE = "us-docker.pkg.dev/falcon-sim/tpu/train:1"


def _sigma() -> float:
    """Log-normal shape from a median and a mean: mean = median * exp(sigma^2 / 2)."""
    return math.sqrt(2.0 * math.log(HELIOS_MEAN_RUN_S / HELIOS_MEDIAN_RUN_S))


def daily_rate(t: float) -> float:
    """Relative arrival rate at ``t`` seconds after Monday 00:00 UTC (peak 1.0 at 15:00)."""
    day, hour = divmod(t / 3600.0, 24.0)
    shape = 0.55 + 0.45 * math.cos(2 * math.pi * (hour - 15.0) / 24.0)
    return shape * (WEEKEND_FACTOR if int(day) % 7 >= 5 else 1.0)


def _arrivals(rng: random.Random, n: int, horizon: float) -> list[float]:
    """A thinned Poisson process with ``daily_rate``'s shape, ``n`` arrivals on average."""
    steps = 2000
    mean_rate = sum(daily_rate(horizon * (i + 0.5) / steps) for i in range(steps)) / steps
    peak = n / horizon / mean_rate  # arrivals per second at rate 1.0
    out, t = [], 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= horizon:
            return out
        if rng.random() < daily_rate(t):
            out.append(t)


def _pick(rng: random.Random, choices: tuple[tuple[str, float], ...]) -> str:
    return rng.choices([c for c, _ in choices], weights=[w for _, w in choices])[0]


def generate_tasks(fleet: FleetConfig, tasks: int, days: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(f"falcon-simulate-tasks:{seed}")
    types = sorted({c.tpu_type for c in fleet.clusters if c.status == "active"})
    if not types:
        raise ValueError("the fleet has no active cluster to generate tasks for")
    user_weights = [1.0 / (i + 1) for i in range(len(USERS))]
    sigma, mu = _sigma(), math.log(HELIOS_MEDIAN_RUN_S)
    out: list[dict[str, Any]] = []
    for i, at in enumerate(_arrivals(rng, tasks, days * 86400.0)):
        tpu_type = rng.choice(types)
        mix = tuple((t, w) for t, w in TOPOLOGY_MIX.get(tpu_type, (("2x2", 1.0),)) if (tpu_type, t) in tpu.CATALOGUE)
        topology = _pick(rng, mix)
        run = min(MAX_RUN_S, max(1.0, rng.lognormvariate(mu, sigma)))
        fate = rng.random()
        env = {"FALCON_SIM_RUN_SECONDS": f"{run:.0f}"}
        if CANCELLED <= fate < CANCELLED + FAILED:
            env["FALCON_SIM_RUN_SECONDS"] = f"{max(1.0, run * rng.random()):.0f}"
            env["FALCON_SIM_EXIT_CODE"] = "1"
        spec: dict[str, Any] = {
            "tpu_type": tpu_type,
            "topology": topology,
            "image": IMAGE,
            "command": ["python", "train.py"],
            "env": env,
            "timeout_seconds": int(min(MAX_TIMEOUT_S, 2 * run + 3600)),
        }
        if rng.random() < FLEX_SHARE:
            spec["supply_mode"] = "flex-start"
        abort_at = at + rng.lognormvariate(math.log(CANCEL_MEDIAN_S), 1.5) if fate < CANCELLED else None
        out.append(
            {
                "name": f"{topology}-{i}",
                "actor": rng.choices(USERS, weights=user_weights)[0],
                "submit_at": round(at, 1),
                "abort_at": None if abort_at is None else round(abort_at, 1),
                "spec": spec,
            }
        )
    return out


def write_tasks(items: list[dict[str, Any]], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, sort_keys=True) + "\n")
