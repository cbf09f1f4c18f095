"""Scenarios in virtual time: the tests whose claim is an order or a timing, played by
``falcon-ray simulate``'s driver (``falcon_ray.devtools.simulate.driver.Simulation``: the
product's poller, queues and cluster gateways on one virtual clock against the fleet model).

``scenario(fleet, tasks, seed=..., settings=..., actions=...)`` (the fixture) builds a run,
plays it to its end and returns a ``Played`` to assert on; the run is disposed of after the
test. ``fleet`` is a fleet file's dict (``cluster`` builds an entry at production timings),
``tasks`` the demo's task lines (``task`` builds one), ``actions`` a list of
``(seconds, fn)``: ``fn(played)`` runs at that virtual second, as an operator or a test
would act on a live controller (a cluster's status, the fleet's faults, a look at a row),
and every queue and the poller then step at their next tick, as production's timed loops
would see the change. ``when(pred, fn)`` is an action that looks every few virtual seconds
and acts at the first look at which ``pred`` holds (a task in the phase a step is about);
``exact=True`` steps every loop at every tick, as production's Tickers do, for a claim about
what a step writes while nothing else changes (the driver otherwise leaves such steps out).

Replay: the run is the same at every run of the test (one thread, the seed). The fixture
prints, before the run, the pytest node id that replays it and, for a run without
``actions``, the ``falcon-ray simulate`` command over the fleet, tasks and settings files it
writes to the test's ``tmp_path``; pytest shows that output when the test fails.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.devtools.simulate.driver import START, Simulation
from falcon_ray.devtools.simulate.report import build_report
from falcon_ray.render import job_name
from falcon_ray.sim.fleet import parse_fleet

# GKE's own orders of magnitude (docs/sim.md), in virtual seconds
TIMINGS = {
    "node_pool_create": 420.0,
    "node_register": 90.0,
    "pod_start": 20.0,
    "node_pool_delete": 180.0,
    "flex_visibility_lag": 60.0,
    "autoscaler_scale_up": 30.0,
    "flex_capacity_wait": 120.0,
    "autoscaler_scale_down": 600.0,
    "pod_termination": 30.0,
}


def cluster(name: str = "edge-a", **kw: Any) -> dict:
    """A v6e cluster entry at production timings; ``timings`` merges into ``TIMINGS``."""
    timings = {**TIMINGS, **kw.pop("timings", {})}
    return {"name": name, "project": f"proj-{name}", "location": "us-east5-b", "tpu_type": "v6e", "gcs_bucket": f"logs-{name}", "timings": timings, **kw}


def spec(topology: str = "2x2", run_s: float = 600, **kw: Any) -> dict:
    """A valid v6e task spec whose pods run ``run_s`` virtual seconds; ``env`` merges."""
    env = {"FALCON_SIM_RUN_SECONDS": str(run_s), **kw.pop("env", {})}
    return {"tpu_type": "v6e", "topology": topology, "image": "us-docker.pkg.dev/p/r/img:1", "command": ["python", "run.py"], "env": env, **kw}


def task(name: str, actor: str, at: float, task_spec: dict | str, abort_at: float | None = None) -> dict:
    return {"name": name, "actor": actor, "submit_at": at, "abort_at": abort_at, "spec": task_spec}


def seconds(at) -> float:
    """A database timestamp of the run as virtual seconds from its start."""
    return (at - START).total_seconds()


class Played:
    """A run, played to its end (or during it, from an action)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.store = sim.store
        self.seen: dict[str, Any] = {}  # what the actions looked at, by their own keys

    @property
    def now_s(self) -> float:
        return self.sim.simulated_s

    def id(self, name: str) -> int:
        """The id of the task submitted under ``name``."""
        (tid,) = [t.id for t in self.tasks() if t.name == name]
        return tid

    def task(self, name: str):
        return self.store.get_task(self.id(name))

    def tasks(self) -> list:
        return [self.store.get_task(i) for i in self.sim.ids]

    def phases(self, name: str) -> list[str]:
        return [str(lc.phase_of(e.status, e.reason)) for e in self.store.events(self.id(name))]

    def entered(self, name: str, phase: str) -> float | None:
        """Virtual seconds at which the task first entered ``phase`` ("Pending/ClusterBusy")."""
        return next((seconds(e.at) for e in self.store.events(self.id(name)) if str(lc.phase_of(e.status, e.reason)) == phase), None)

    def history(self, *names: str) -> str:
        """Each task's event log (phase@seconds), for an assertion's message."""
        names = names or tuple(t.name for t in self.tasks())
        return "\n".join(
            f"{n}: " + ", ".join(f"{lc.phase_of(e.status, e.reason)}@{seconds(e.at):g}" for e in self.store.events(self.id(n)))
            for n in names
        )

    def later(self, delay: float, fn: Callable[[Played], None]) -> None:
        """Run ``fn(self)`` ``delay`` virtual seconds from now (an action: see ``when``)."""
        self.sim.scheduler.at(self.sim.clock.monotonic() + delay, fn, self)

    def falcon_pools(self) -> list[str]:
        """The Falcon pools alive in the fleet, by name."""
        return sorted(n for c in self.sim.fleet.clusters.values() for n, p in c.pools.pools.items() if p.deleted_at is None and n.startswith("falcon-"))

    def cluster(self, name: str):
        return self.sim.fleet.clusters[name]

    def stats(self, name: str) -> dict:
        """The fleet model's figures of one cluster (``falcon_ray.sim``'s stats, as ``/stats`` serves them)."""
        return self.sim.fleet.clusters[name].stats()

    def pool(self, cluster: str, name: str) -> dict:
        (p,) = [p for p in self.stats(cluster)["node_pools"] if p["name"] == name]
        return p

    def job(self, cluster: str, tid: int) -> dict:
        (j,) = [j for j in self.stats(cluster)["jobs"] if j["name"] == job_name(tid)]
        return j

    def create_pool(self, cluster: str, name: str, labels: dict | None = None, topology: str = "2x2") -> None:
        """Create a node pool in the fleet as someone other than this controller would (another
        team, a leak), through the fleet's GKE API."""
        from falcon_ray.devtools.simulate.fleet import SimGke

        c = self.sim.fleet.clusters[cluster].config
        body = {
            "name": name,
            "initialNodeCount": 1,
            "config": {"machineType": "ct6e-standard-4t", "resourceLabels": labels or {}},
            "placementPolicy": {"tpuTopology": topology},
        }
        SimGke(self.sim.fleet).create_node_pool(c.project, c.location, c.name, body)

    def report(self) -> dict:
        return build_report(self.sim, 0.0)

    def assert_clean(self) -> dict:
        """What every end-to-end scenario ended with, and the simulate report's invariants:
        every task over, no Falcon pool left, at most pool_ops_at_once node-pool operations at a time per cluster and none refused,
        each dispatched task's Job created once, every event log along the lifecycle table."""
        report = self.report()
        assert report["invariants"] == dict.fromkeys(report["invariants"], 0), (report["invariants"], report.get("broken"))
        assert not self.store.live_tasks() and self.sim.falcon_pools_alive() == 0
        stats = {name: c.stats() for name, c in self.sim.fleet.clusters.items()}
        at_once = self.sim.settings.pool_ops_at_once
        assert all(c["max_concurrent_pool_ops"] <= at_once and c["rejected_pool_ops"] == 0 for c in stats.values()), {
            n: (c["max_concurrent_pool_ops"], c["rejected_pool_ops"]) for n, c in stats.items()
        }
        creates = {j["name"]: j["creates"] for c in stats.values() for j in c["jobs"]}
        for t in self.tasks():
            if t.dispatched_at is not None:
                assert creates.get(job_name(t.id)) == 1, (t.id, creates)
            phases = [lc.phase_of(e.status, e.reason) for e in self.store.events(t.id)]
            assert phases[0] == lc.NEW
            for a, b in zip(phases, phases[1:], strict=False):
                assert a == b or lc.allowed(a, b), f"task {t.id}: {a} -> {b} is not in the lifecycle table"
        return stats


Action = tuple[float, Callable[[Played], None]]


def when(pred: Callable[[Played], bool], fn: Callable[[Played], None], every: float = 5.0) -> Callable[[Played], None]:
    """An action that looks every ``every`` virtual seconds and runs ``fn`` at the first look at
    which ``pred`` holds (what a test of a live controller would wait for, at a virtual second
    the run fixes). Only that look counts as a change (``_changed``): the looks before it
    leave the schedule as it was."""

    def look(run: Played) -> None:
        if pred(run):
            fn(run)
            _changed(run.sim)
        else:
            run.later(every, look)

    look.quiet = True  # type: ignore[attr-defined]
    return look


def _changed(sim: Simulation) -> None:
    """Something outside the controller changed: every queue and the poller step at their
    next tick (production's timed loops would), the end check and the Message look run again."""
    sim._written = True
    sim._changed_since_check = True
    sim._poke_poller()
    for _q, loop in sim.queues.values():
        loop.wake_on_tick()


def replay_lines(nodeid: str, where: Path | None, fleet: dict, tasks: list[dict], settings: Settings, seed: int, until_s: float | None = None, exact: bool = False) -> list[str]:
    """The commands that replay a run: the pytest node id, and (``where`` given: a run
    without actions) ``falcon-ray simulate`` over the fleet, tasks and settings written there."""
    # the hash seed the command pins (the product iterates a few sets of strings)
    lines = [f"replay: PYTHONHASHSEED=0 pytest -p no:xdist -p no:randomly {shlex.quote(nodeid)}  (seed {seed})"]
    if where is None:
        return lines  # the command has no way to say the actions
    (where / "fleet.json").write_text(json.dumps(fleet))
    (where / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (where / "settings.yaml").write_text(yaml.safe_dump(settings.model_dump(mode="json", exclude_defaults=True)))
    cmd = ["falcon-ray", "simulate", "--fleet", str(where / "fleet.json"), "--tasks", str(where / "tasks.jsonl"),
           "--config", str(where / "settings.yaml"), "--seed", str(seed)]  # fmt: skip
    if until_s is not None:
        cmd += ["--until-s", f"{until_s:g}"]
    if exact:
        cmd.append("--exact")
    lines.append("replay: " + shlex.join(cmd))
    return lines


def play(fleet: dict, tasks: list[dict], seed: int, settings: Settings, actions: list[Action] = (), until_s: float | None = None, exact: bool = False) -> Played:
    """Build the run, schedule the actions, play it to its end (the caller disposes of
    ``played.sim``). ``exact``: every loop at every tick, as production's Tickers (the
    driver's ``exact``), for a claim about what a step writes while nothing changes."""
    sim = Simulation(parse_fleet(fleet), tasks, settings, seed, until_s=until_s, exact=exact)
    played = Played(sim)

    def act(fn: Callable[[Played], None]) -> None:
        fn(played)
        if not getattr(fn, "quiet", False):
            _changed(sim)

    for at, fn in sorted(actions, key=lambda a: a[0]):
        sim.scheduler.at(sim.t0 + at, act, fn)
    try:
        sim.run()
    except BaseException:
        sim.dispose()
        raise
    return played


@pytest.fixture
def scenario(request):
    runs: list[Simulation] = []

    def run(fleet: dict, tasks: list[dict], seed: int, settings: Settings | None = None, actions: list[Action] = (), until_s: float | None = None, exact: bool = False) -> Played:
        settings = settings or Settings()
        where = None if actions else request.getfixturevalue("tmp_path")
        for line in replay_lines(request.node.nodeid, where, fleet, tasks, settings, seed, until_s, exact):
            print(line)
        played = play(fleet, tasks, seed, settings, actions, until_s, exact)
        runs.append(played.sim)
        return played

    yield run
    for sim in runs:
        sim.dispose()
