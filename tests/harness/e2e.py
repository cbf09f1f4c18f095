"""What the end-to-end tests share: a small fleet, task specs, waiting on a task.

Every end-to-end test runs a ``DemoRun`` (the same machinery as ``falcon-ray demo``)
on the session's Ray, with a fleet built by ``make_fleet``: ``edge-a`` (v6e, reservation
``res-a``) and optionally ``edge-b`` (v6e, flex-start by default), fast timings.
"""

from __future__ import annotations

import time

from falcon_ray.demo import DemoRun
from falcon_ray.sim.fleet import FleetConfig

FAST = {"node_pool_create": 0.6, "node_register": 0.3, "flex_visibility_lag": 0.5, "node_pool_delete": 0.3, "pod_start": 0.1}


def make_fleet(a: dict | None = None, b: dict | None = None, with_b: bool = True, seed: int = 3) -> FleetConfig:
    """``a`` / ``b`` override edge-a's / edge-b's keys (dicts are merged one level deep)."""
    edge_a = {
        "name": "edge-a",
        "project": "proj-a",
        "location": "us-east5-b",
        "tpu_type": "v6e",
        "gcs_bucket": "logs-a",
        "reservation": {"name": "res-a", "count": 4},
        "chips": 64,
        "timings": dict(FAST),
    }
    edge_b = {
        "name": "edge-b",
        "project": "proj-b",
        "location": "us-central1-b",
        "tpu_type": "v6e",
        "gcs_bucket": "logs-b",
        "chips": 32,
        "timings": dict(FAST),
    }
    for base, extra in ((edge_a, a), (edge_b, b)):
        for k, v in (extra or {}).items():
            if isinstance(v, dict) and isinstance(base.get(k), dict):
                base[k] = {**base[k], **v}
            else:
                base[k] = v
    return FleetConfig(seed=seed, clusters=[edge_a, edge_b] if with_b else [edge_a])


def spec(topology: str = "2x2", run_s: float = 1, **kw) -> dict:
    """A valid v6e task spec whose pods run ``run_s`` seconds on the sim; ``env`` merges."""
    env = {"FALCON_SIM_RUN_SECONDS": str(run_s), **kw.pop("env", {})}
    return {
        "tpu_type": "v6e",
        "topology": topology,
        "image": "us-docker.pkg.dev/p/r/img:1",
        "command": ["python", "run.py"],
        "env": env,
        **kw,
    }


def wait_for(run: DemoRun, task_id: int, pred, timeout: float = 30.0):
    """Poll the task's row until ``pred(row)``; fail with where it got stuck."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t = run.store.get_task(task_id)
        if pred(t):
            return t
        time.sleep(0.1)
    t = run.store.get_task(task_id)
    raise AssertionError(f"task {task_id} stuck at {t.status}/{t.reason}: {t.message}")
