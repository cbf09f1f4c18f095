"""What the end-to-end tests share: a small fleet, task specs, waiting on a task.

The ``controller`` fixture starts one (SQLite, or MariaDB with ``db="mysql"``) with
settings overrides and stops it after the test; ``assert_clean`` is the check every
scenario ends with. Every end-to-end test runs a ``DemoRun`` (the same machinery as ``falcon-ray demo``)
on the session's Ray, with a fleet built by ``make_fleet``: ``edge-a`` (v6e, reservation
``res-a``) and optionally ``edge-b`` (v6e, flex-start by default), fast timings.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.devtools.demo import DemoRun, demo_settings
from falcon_ray.render import job_name
from falcon_ray.sim.fleet import FAST_TIMINGS, FleetConfig
from tests.harness.db import fresh_mysql_database

FAST = FAST_TIMINGS


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
    deadline = time.monotonic() + timeout  # wall-clock: e2e only: the controller runs as Ray actors
    while time.monotonic() < deadline:  # wall-clock: a bound on Ray actors' progress, not a timing claim
        t = run.store.get_task(task_id)
        if pred(t):
            return t
        time.sleep(0.1)  # wall-clock: polls the database the Ray actors write
    t = run.store.get_task(task_id)
    raise AssertionError(f"task {task_id} stuck at {t.status}/{t.reason}: {t.message}")


@pytest.fixture
def controller(ray_session, tmp_path):
    started: list[tuple[DemoRun, contextlib.ExitStack]] = []

    def start(fleet: FleetConfig | None = None, db: str = "sqlite", **overrides) -> DemoRun:
        stack = contextlib.ExitStack()
        if db == "mysql":
            url = stack.enter_context(fresh_mysql_database())
        else:
            url = f"sqlite:///{tmp_path / f'falcon-{len(started)}.db'}"
        run = DemoRun(fleet or make_fleet(), demo_settings(**overrides), url)
        started.append((run, stack))
        return run.start()

    yield start
    for run, stack in started:
        run.stop()
        stack.close()


def phase_is(*phases):
    return lambda t: t.phase in phases


def reasons(run: DemoRun, task_id: int) -> list[str]:
    """The task's phases in its event log, oldest first ("Pending/Provisioning", ...)."""
    return [str(lc.phase_of(e.status, e.reason)) for e in run.store.events(task_id)]


def assert_clean(run: DemoRun, timeout: float = 60.0, serial_pool_ops: bool = True) -> dict:
    assert run.wait_done(timeout), (
        f"not done: {[(t.id, t.status, t.reason, t.message) for t in run.tasks() if not t.terminal]}; "
        f"pools alive: {run.falcon_pools_alive()}"
    )
    stats = run.sim.stats()
    creates = {j["name"]: j["creates"] for c in stats["clusters"].values() for j in c["jobs"]}
    if serial_pool_ops:  # a ClusterActor keeps within pool_ops_at_once per cluster and never runs two on one pool
        at_once = run.settings.pool_ops_at_once
        assert all(c["max_concurrent_pool_ops"] <= at_once and c["rejected_pool_ops"] == 0 for c in stats["clusters"].values()), stats["clusters"]
    assert all(n == 1 for n in creates.values()), creates
    for t in run.tasks():
        if t.dispatched_at is not None:
            assert creates.get(job_name(t.id)) == 1, (t.id, creates)
        phases = [lc.phase_of(e.status, e.reason) for e in run.store.events(t.id)]
        assert phases[0] == lc.NEW
        for a, b in zip(phases, phases[1:], strict=False):
            assert a == b or lc.allowed(a, b), f"task {t.id}: {a} -> {b} is not in the lifecycle table"
    return stats


def run_command_setup(fleet: FleetConfig, tmp_path, namespace: str, **settings) -> tuple:
    """What a test of ``falcon-ray run`` starts from: the fleet served on loopback, a migrated
    SQLite database with the fleet's first cluster registered (reservation ``res-a``), and the
    demo's settings pointed at both (plus ``settings``) in ``tmp_path/config.yaml``. Returns
    (sim, store, db_url, the argv of ``falcon-ray run`` on the current Ray); the caller stops
    the sim."""
    import sys
    from pathlib import Path

    import ray
    import yaml

    from falcon_ray.sim.server import SimFleet
    from falcon_ray.store import Store
    from falcon_ray.store.migrate import upgrade

    root = Path(__file__).resolve().parents[2]
    sim = SimFleet(fleet)
    ep = sim.start()
    db_url = f"sqlite:///{tmp_path / 'falcon.db'}"
    upgrade(db_url, with_jobs_table=True)
    store = Store(db_url)
    c = fleet.clusters[0]
    store.add_cluster(c.name, c.project, c.location, c.tpu_type, gcs_bucket=c.gcs_bucket, default_reservation="res-a")
    config = yaml.safe_load((root / "falcon_ray" / "devtools" / "demo" / "settings.yaml").read_text())
    config.update(namespace=namespace, gke_endpoint=ep["gke"], compute_endpoint=ep["compute"],
                  metadata_host=ep["metadata"], kubernetes_scheme="http", **settings)  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [
        sys.executable, "-c", "from falcon_ray.cli import main; main()", "run",
        "--ray-address", ray.get_runtime_context().gcs_address, "--db", db_url, "--config", str(path),
    ]  # fmt: skip
    return sim, store, db_url, cmd
