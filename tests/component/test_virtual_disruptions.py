"""Disruptions in virtual time: the scenario of ``falcon_ray/devtools/demo/scenarios/disruptions``
(its fleet, settings and tasks, as ``falcon-ray demo`` plays them) played by ``falcon-ray
simulate``'s driver: the product's poller, queues and cluster gateways against the fleet
model disrupting runs as GKE does.

Single-host and multi-host tasks are each disrupted by each kind (maintenance, repair,
reclaim) and succeed on a later attempt; a task with ``max_recoveries: 0`` and one
disrupted more often than its budget end Failed/Disrupted; a task exiting with code 3 ends
Failed/JobFailed after one run. No Falcon pool is left, and no two Jobs of one task were
ever alive at once.

Moved from the Ray end-to-end tests (tests/e2e/test_disruptions.py), where whether the
controller read a failed run's nodes inside the maintenance window depended on the
machine's speed. Every test prints the commands that replay the run; the run is played
once per seed of ``SEEDS`` and shared by the tests.
"""

from __future__ import annotations

from collections import defaultdict
from importlib import resources

import pytest
import yaml

from falcon_ray import faults, render
from falcon_ray import lifecycle as lc
from falcon_ray.config import load_settings
from falcon_ray.devtools.demo import load_tasks
from tests.harness.virtual import play, replay_lines

SCENARIO = resources.files("falcon_ray.devtools.demo").joinpath("scenarios", "disruptions")
SEEDS = (11, 12)
EXPECTED = {
    "single-maintenance": ("Succeeded", 1),
    "single-repair": ("Succeeded", 1),
    "single-reclaim": ("Succeeded", 1),
    "multi-maintenance": ("Succeeded", 1),
    "multi-repair": ("Succeeded", 1),
    "multi-reclaim": ("Succeeded", 1),
    "three-kinds-within-budget": ("Succeeded", 3),
    "no-recovery-allowed": ("Failed/Disrupted", 1),
    "over-budget": ("Failed/Disrupted", 2),
    "own-failure": ("Failed/JobFailed", 0),
}


@pytest.fixture(scope="module", params=SEEDS, ids=lambda s: f"seed{s}")
def played(request, tmp_path_factory):
    seed = request.param
    fleet = yaml.safe_load((SCENARIO / "fleet.yaml").read_text())
    settings = load_settings(str(SCENARIO / "settings.yaml"))
    tasks = load_tasks(str(SCENARIO / "tasks.jsonl"))
    replay = replay_lines(f"{request.node.nodeid}[seed{seed}]", tmp_path_factory.mktemp(f"disruptions-{seed}"), fleet, tasks, settings, seed)
    run = play(fleet, tasks, seed, settings)
    try:
        stats = run.assert_clean()
        by_name = {t.name: t for t in run.tasks()}
        yield run, by_name, stats, replay
    finally:
        run.sim.dispose()


def _disrupted(run, t) -> list:
    """The task's disruption rows that record the fleet's disruptions (not the controller's
    own moves, ``faults.counted``)."""
    return [d for d in run.store.disruptions([t.id]).get(t.id, ()) if faults.counted(d.kind)]


def test_every_task_ends_as_its_disruptions_and_budget_say(played):
    run, by_name, _, replay = played
    print(*replay, sep="\n")
    assert set(by_name) == set(EXPECTED)
    got = {name: (str(t.phase), len(_disrupted(run, t))) for name, t in by_name.items()}
    assert got == EXPECTED, {n: (by_name[n].message) for n in got if got[n] != EXPECTED[n]}


def test_the_disruption_kinds_recorded_are_the_ones_the_fleet_injected(played):
    run, by_name, stats, replay = played
    print(*replay, sep="\n")
    injected: dict[str, list[str]] = defaultdict(list)  # Job name -> kinds the sim applied to its pods
    for c in stats.values():
        for rec in c["disruptions"]:
            for job in rec["jobs"]:
                injected[job.split("/", 1)[1]].append(rec["kind"])
    for name in ("single-maintenance", "multi-maintenance", "single-repair", "multi-repair", "single-reclaim", "multi-reclaim"):
        t = by_name[name]
        (d,) = _disrupted(run, t)
        assert injected[d.job] == [name.split("-")[1]], (name, d, injected[d.job])
        assert d.kind == name.split("-")[1], (name, d)
    # every recovery answers a disruption the fleet made: none is the task's own failure
    for t in by_name.values():
        for d in _disrupted(run, t):
            assert injected.get(d.job), (t.name, d)


def test_a_recovered_task_went_through_recovering_and_says_which_attempt(played):
    run, by_name, _, replay = played
    print(*replay, sep="\n")
    for name in ("single-maintenance", "multi-repair", "single-reclaim", "three-kinds-within-budget"):
        seen = run.phases(name)
        assert seen.count("Running") == EXPECTED[name][1] + 1, (name, seen)
        assert seen.count("Pending/Recovering") == EXPECTED[name][1], (name, seen)
        running = [e.message for e in run.store.events(by_name[name].id) if e.status == "Running"]
        assert "Attempt 2 of 4 after" in running[1], running
    over = by_name["over-budget"]
    assert "2 time(s), more than its max_recoveries (1)" in over.message
    assert "#1 maintenance on node" in over.message and "#2 repair on node" in over.message, over.message
    assert run.phases("no-recovery-allowed")[-1] == "Failed/Disrupted"
    own = by_name["own-failure"]
    assert run.phases("own-failure").count("Running") <= 1 and "exit code 3" in own.message, own.message


def test_each_attempt_had_its_own_job_and_never_two_at_once(played):
    run, by_name, stats, replay = played
    print(*replay, sep="\n")
    jobs = {j["name"]: j for c in stats.values() for j in c["jobs"]}
    for name in EXPECTED:
        t = by_name[name]
        # each row, a disruption or a move of the controller's (a switch to a ready pool),
        # moves the task to its next attempt; a task that ended Disrupted has no attempt after
        rows = run.store.disruptions([t.id]).get(t.id, ())
        finished = name not in ("no-recovery-allowed", "over-budget")
        runs = len(rows) + (1 if finished else 0)
        names = [d.job for d in rows if faults.counted(d.kind)] + ([render.job_name(t.id, len(rows))] if finished else [])
        assert all(n in jobs for n in names), (name, names, [n for n in jobs if n.startswith(f"falcon-task-{t.id}")])
        assert not any(n.startswith(f"falcon-task-{t.id}-a{runs}") for n in jobs), (name, "one attempt too many")
        spans = sorted((j["created_at"][0], j["deleted_at"][-1]) for n, j in jobs.items() if render.service_of_job(n) == f"falcon-task-{t.id}")
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start, (name, spans)
    for t in by_name.values():
        assert lc.phase_of(t.status, t.reason).status in lc.TERMINAL
