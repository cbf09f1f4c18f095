"""``falcon-ray simulate``: the product's poller, queues and cluster gateways in virtual time
against the fleet model (falcon_ray.devtools.simulate), at production settings.

Each run is seconds of wall time for hours or days of fleet time; the fleets are written
here so each test shows the timings it checks against."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from falcon_ray.config import Settings
from falcon_ray.devtools.simulate.cli import simulate
from falcon_ray.devtools.simulate.driver import START, Simulation
from falcon_ray.devtools.simulate.generate import generate_tasks
from falcon_ray.devtools.simulate.report import _eta_error, build_report, estimate_s, latest_s
from falcon_ray.sim.fleet import parse_fleet
from tests.harness.simulate import sim_task as _task

CREATE_S, REGISTER_S, POD_START_S, DELETE_S = 420.0, 90.0, 20.0, 180.0
TIMINGS = {
    "node_pool_create": CREATE_S,
    "node_register": REGISTER_S,
    "pod_start": POD_START_S,
    "node_pool_delete": DELETE_S,
    "flex_visibility_lag": 60.0,
    "autoscaler_scale_up": 30.0,
    "flex_capacity_wait": 120.0,
    "autoscaler_scale_down": 600.0,
    "maintenance_notice": 600.0,
    "maintenance_duration": 300.0,
    "repair_detect": 300.0,
    "pod_termination": 30.0,
}


def _cluster(name: str, **kw) -> dict:
    return {"name": name, "project": f"p-{name}", "location": "us-east5-b", "tpu_type": "v6e", "timings": dict(TIMINGS), **kw}


def _run(fleet: dict, tasks: list[dict], seed: int = 1, settings: Settings | None = None, look=None, **kw) -> tuple[dict, Simulation]:
    """The run's report and the simulation; ``look(sim)``, when given, reads its database
    before it is disposed of (its answer is ``sim.looked``)."""
    sim = Simulation(parse_fleet(fleet), tasks, settings or Settings(), seed, **kw)
    try:
        sim.run()
        if look is not None:
            sim.looked = look(sim)
        return build_report(sim, 0.0), sim
    finally:
        sim.dispose()


def _disruptions(sim: Simulation) -> dict[int, tuple]:
    return sim.store.disruptions(sim.ids)


MIXED = {
    "clusters": [
        _cluster("res-a", reservation={"name": "res-a", "count": 4}, chips=16,
                 faults={"api_error_rate": 0.02, "incompatible_op_rate": 0.02, "disruption_rate_per_node_hour": 0.02}),
        _cluster("flex-b", location="us-central1-b", chips=24,
                 faults={"too_many_requests_rate": 0.02, "disruption_rate_per_node_hour": 0.02}),
    ]
}


def _mixed_tasks(spread_s: float = 300.0) -> list[dict]:
    """18 tasks, ``spread_s`` apart (bursts of three), runs of 10 minutes to 1h10m."""
    shapes = ["2x2", "2x4", "2x2", "4x4", "2x2", "2x4"]
    tasks = [_task(i, spread_s * (i // 3 * 3) + 40.0 * (i % 3), 600.0 + 900.0 * (i % 5), shapes[i % len(shapes)]) for i in range(18)]
    tasks[4]["abort_at"] = tasks[4]["submit_at"] + 200.0  # aborted while its pool is created
    tasks[9]["abort_at"] = tasks[9]["submit_at"] + 1500.0  # aborted while it runs
    tasks[7]["spec"]["env"]["FALCON_SIM_EXIT_CODE"] = "1"
    tasks[11]["spec"]["supply_mode"] = "flex-start"
    return tasks


def _without_wall(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "wall_s"}


FAULTY = {  # faults at ten times MIXED's rates: most creates and deletes meet one
    "clusters": [
        _cluster("res-a", reservation={"name": "res-a", "count": 4}, chips=16,
                 faults={"api_error_rate": 0.1, "incompatible_op_rate": 0.2, "too_many_requests_rate": 0.05}),
        _cluster("flex-b", location="us-central1-b", chips=24,
                 faults={"api_error_rate": 0.1, "incompatible_op_rate": 0.2, "disruption_rate_per_node_hour": 0.5}),
    ]
}


def test_the_same_seed_gives_the_same_report_with_or_without_the_left_out_steps_and_another_seed_another_digest():
    """The driver leaves out a queue's steps that would only repeat its last decision: a run
    that steps every queue at every tick (``exact``, as the Tickers would) plays the same
    event log, to the second. (A 5 s queue tick keeps the exact run short.)"""
    tasks = _mixed_tasks(spread_s=120.0)[:4]
    for t in tasks:
        t["spec"]["env"]["FALCON_SIM_RUN_SECONDS"] = "600"
    tasks[1]["spec"]["supply_mode"] = "flex-start"
    settings = Settings(queue_tick_s=5.0)
    first, _ = _run(FAULTY, tasks, seed=3, settings=settings)
    again, _ = _run(FAULTY, tasks, seed=3, settings=settings)
    exact, _ = _run(FAULTY, tasks, seed=3, settings=settings, exact=True)
    other, _ = _run(FAULTY, tasks, seed=4, settings=settings)
    assert json.dumps(_without_wall(first), sort_keys=True) == json.dumps(_without_wall(again), sort_keys=True)
    assert exact["digest"] == first["digest"] and exact["outcomes"] == first["outcomes"]
    # what is left out are steps that carry out nothing: the same steps act in both runs
    assert exact["queue_steps"]["applied"] == first["queue_steps"]["applied"] > 0
    assert first["queue_steps"]["applied"] <= first["queue_steps"]["run"]  # a step acts at most once
    assert first["queue_steps"]["run"] < exact["queue_steps"]["run"] / 5, (first["queue_steps"], exact["queue_steps"])
    assert other["digest"] != first["digest"]
    assert first["tasks"] == 4 and sum(first["outcomes"].values()) == 4


def test_the_steps_last_decision_is_what_the_due_tick_search_would_decide_again(monkeypatch):
    """The search for a queue's next step starts from the step's last plan instead of
    deciding again at the same instant: the two must be the same groups, every time."""
    from falcon_ray import reconcile
    from falcon_ray.devtools.simulate import driver

    given, searched = [], []

    def checked(state, view, now, settings, tick, horizon, done=None, guess=None):
        if done is not None:
            assert done == reconcile.decide(state, view, now, settings)
            given.append(now)
        searched.append(guess)
        return driver_next_due(state, view, now, settings, tick, horizon, done=done, guess=guess)

    driver_next_due = driver.next_due
    monkeypatch.setattr(driver, "next_due", checked)
    report, _ = _run(MIXED, _mixed_tasks()[:9], seed=2)
    assert sum(report["outcomes"].values()) == 9
    assert len(given) > 0.9 * len(searched) > 50, (len(given), len(searched))
    assert sum(g is not None for g in searched) > 0.9 * len(searched)


def test_a_task_on_an_idle_reservation_cluster_runs_at_the_fleets_create_register_and_pod_start_times():
    fleet = {"clusters": [_cluster("res-a", reservation={"name": "res-a", "count": 4}, chips=0)]}
    report, sim = _run(fleet, [_task(0, 0.0, 60.0)])
    s = sim.settings
    fleet_s = CREATE_S + REGISTER_S + POD_START_S
    # the controller's own steps on the way: the poll that takes the task, the queue's tick,
    # the operation poll that sees the create DONE, the pool view's refresh, the queue's tick
    # that submits the Job; each is at most its period
    controller_s = s.poll_interval_s + s.queue_tick_s + s.operation_poll_s + s.pool_refresh_s + s.queue_tick_s
    ttr = report["time_to_running_s"]["all"]
    assert ttr["n"] == 1
    assert fleet_s <= ttr["p50"] <= fleet_s + controller_s, (ttr, fleet_s, controller_s)
    assert report["outcomes"] == {"Succeeded": 1}
    assert report["time_to_running_s"]["supply"] == {"reservation": {"n": 1, "p50": ttr["p50"], "p90": ttr["p90"], "p99": ttr["p99"], "mean": ttr["mean"]}}
    assert not any(report["invariants"].values())


DAY_SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def faulty_days():
    """A simulated day of the mixed fleet under faults (API 503s and 429s, incompatible
    operations, disruptions), once per seed of ``DAY_SEEDS``, shared by the tests that read it."""
    runs = {}
    for seed in DAY_SEEDS:
        report, sim = _run(MIXED, _mixed_tasks(spread_s=86400.0 / 18), seed=seed)
        runs[seed] = (report, sim.clock.driver_waits)
    return runs


def test_a_simulated_day_of_a_mixed_fleet_under_faults_keeps_every_invariant_for_several_seeds(faulty_days):
    for seed, (report, driver_waits) in faulty_days.items():
        assert report["invariants"] == dict.fromkeys(report["invariants"], 0), (seed, report.get("broken"))
        assert report["outcomes"].get("Aborted", 0) >= 1 and report["outcomes"].get("Failed/JobFailed", 0) >= 1, seed
        assert "live" not in report["outcomes"], seed
        assert driver_waits == 0  # every wait was a worker's, handed back to the schedule
        assert report["simulated_s"] >= 86400 * 15 / 18
    assert len({report["digest"] for report, _ in faulty_days.values()}) == len(DAY_SEEDS)


def test_a_pool_that_never_comes_up_is_given_back_then_fails_at_the_production_node_pool_timeout():
    """Every create takes three times ``node_pool_timeout_s``: each is given back at the
    limit and asked again at the head of the queue (``pool_release_limit`` times); the last
    ends the task NodePoolTimeout. GKE's time is counted from each acceptance, so the task
    spends at least (limit + 1) timeouts in Provisioning."""
    s = Settings()
    slow = dict(TIMINGS, node_pool_create=3 * s.node_pool_timeout_s)
    fleet = {"clusters": [_cluster("res-a", reservation={"name": "res-a", "count": 4}, chips=0, timings=slow)]}
    report, sim = _run(fleet, [_task(0, 0.0, 60.0)], look=lambda sim: sim.store.disruptions(sim.ids))
    assert report["outcomes"] == {"Failed/NodePoolTimeout": 1}
    assert report["not_delivered"] == 0  # a create that never ended is no capacity wait
    assert [d.kind for rows in sim.looked.values() for d in rows] == ["released"] * s.pool_release_limit
    provisioning = report["pending_s_by_reason"]["Provisioning"]
    assert (s.pool_release_limit + 1) * s.node_pool_timeout_s <= provisioning
    assert report["invariants"]["pools_alive"] == 0  # the timed-out pools were deleted once their creates ended


def test_a_stockout_is_waited_out_for_the_production_capacity_budget_then_fails():
    s = Settings()
    fleet = {"clusters": [_cluster("flex-b", chips=0)]}  # never a chip to give
    report, _ = _run(fleet, [_task(0, 0.0, 60.0, supply_mode="on-demand")])
    assert report["outcomes"] == {"Failed/NodePoolFailed": 1}
    assert report["not_delivered"] == 1  # the whole budget in capacity waits: GKE's, not the task's
    # each retry is a new create that GKE ends with the stockout after its create time; the
    # budget counts from the first refusal, and the last wait before it may be a whole retry
    pending = sum(report["pending_s_by_reason"].values())
    assert report["pending_s_by_reason"]["ClusterBusy"] > 0
    assert s.capacity_budget_s <= pending <= s.capacity_budget_s + s.capacity_retry_max_s + 2 * CREATE_S


DAY = 86400.0
MAX_RUN_S = 7 * DAY  # GKE: flex-start VMs exist at most maxRunDuration, seven days


def test_flex_start_nodes_go_at_the_production_run_limit_and_the_task_recovers():
    """A run longer than its nodes may live: seven days after they came GKE deletes the VMs
    (the fleet's reclaim, trigger maxRunDuration); Falcon counts it as the fleet's fault and
    starts a new attempt on new nodes, never fails the task for it."""
    fleet = {"clusters": [_cluster("flex-b", chips=8)]}
    task = _task(0, 0.0, 8 * DAY, supply_mode="flex-start", timeout_seconds=int(MAX_RUN_S))
    report, sim = _run(fleet, [task], until_s=MAX_RUN_S + 3 * 3600.0, look=_disruptions)
    records = sim.fleet.clusters["flex-b"].disruptions.records
    (limit,) = [r for r in records if r["trigger"] == "maxRunDuration"]
    pool = sim.fleet.clusters["flex-b"].pools.history[0]
    assert limit["kind"] == "reclaim" and limit["pool"] == pool.name and limit["jobs"]
    (first,) = [r for r in sim.fleet.clusters["flex-b"].job_records.values() if r["name"] == "falcon-task-1"]
    assert first["creates"] == 1 and first["ran"] == [1]  # the fleet records which creates ran a pod
    assert limit["at"] - pool.first_node_at == pytest.approx(MAX_RUN_S, abs=1.0)
    (tid,) = sim.ids
    (run,) = sim.looked[tid]
    assert run.kind == "reclaim" and run.attempt == 0
    assert report["outcomes"] == {"live": 1}, report["outcomes"]  # its second attempt runs
    assert report["invariants"]["failed_for_capacity"] == 0


def test_a_flex_start_pool_is_not_handed_to_a_task_its_nodes_would_not_outlive():
    """A runs six and a half days on its pool's node. X (a one-day run) is creating its own
    pool and B (under an hour) waits behind it when A ends: A's pool is kept for them, but
    its node has half a day left, so X keeps its own create (on A's node GKE would delete
    its VM half-way) and B, whose run fits, is handed A's pool."""
    fleet = {"clusters": [_cluster("flex-b", chips=16)]}
    a_ends = REGISTER_S + POD_START_S + 570.0 + 6.5 * DAY  # its create, the flex lag and scale-up, its run
    a = _task(0, 0.0, 6.5 * DAY, supply_mode="flex-start")
    x = _task(1, a_ends - 100.0, DAY, supply_mode="flex-start")
    b = _task(2, a_ends - 50.0, 3000.0, supply_mode="flex-start")
    report, sim = _run(fleet, [a, x, b], look=lambda sim: ([sim.store.get_task(i) for i in sim.ids], _disruptions(sim)))
    assert report["outcomes"] == {"Succeeded": 3}, report["outcomes"]
    (ta, tx, tb), disrupted = sim.looked
    assert not any(disrupted.values()), disrupted
    assert tx.node_pool_name != ta.node_pool_name, "X would lose its VM half-way on A's node"
    assert tb.node_pool_name == ta.node_pool_name, (ta.node_pool_name, tb.node_pool_name)
    assert report["invariants"] == dict.fromkeys(report["invariants"], 0), report.get("broken")


def test_a_job_made_again_after_nodes_that_never_came_is_no_second_create():
    """Flex-start nodes that never come: at capacity_budget_s the Job and pool are deleted and,
    with another cluster of the type in another zone, the task fails over there (once), where
    the nodes do not come either: it asks once more there, on a new pool with the same Job,
    then ends NodePoolFailed. No pod of any of its Jobs ever ran, so a Job made again is no
    second run."""
    fleet = {"clusters": [_cluster("flex-b", chips=0), _cluster("flex-c", location="us-central1-b", chips=0)]}
    report, sim = _run(fleet, [_task(0, 0.0, 600.0, supply_mode="flex-start")])
    jobs = {name: [(r["creates"], r["ran"]) for r in c.job_records.values()] for name, c in sim.fleet.clusters.items()}
    assert jobs == {"flex-b": [(1, [])], "flex-c": [(2, [])]}, jobs
    assert report["outcomes"] == {"Failed/NodePoolFailed": 1}
    assert report["not_delivered"] == 1
    assert report["invariants"] == dict.fromkeys(report["invariants"], 0), report.get("broken")


def test_generated_tasks_follow_the_trace_figures_and_a_seed():
    fleet = parse_fleet(MIXED)
    items = generate_tasks(fleet, 2000, 7.0, seed=5)
    assert items == generate_tasks(fleet, 2000, 7.0, seed=5)
    assert 1800 <= len(items) <= 2200
    runs = sorted(float(t["spec"]["env"]["FALCON_SIM_RUN_SECONDS"]) for t in items if "FALCON_SIM_EXIT_CODE" not in t["spec"]["env"])
    assert 120 <= runs[len(runs) // 2] <= 350  # Helios: median 206 s
    cancelled = sum(1 for t in items if t["abort_at"] is not None) / len(items)
    failed = sum(1 for t in items if "FALCON_SIM_EXIT_CODE" in t["spec"]["env"]) / len(items)
    assert 0.13 <= cancelled <= 0.23 and 0.12 <= failed <= 0.20
    weekday = sum(1 for t in items if t["submit_at"] < 5 * 86400) / 5
    weekend = sum(1 for t in items if t["submit_at"] >= 5 * 86400) / 2
    assert weekend < weekday / 1.5


def test_a_waiting_message_start_estimate_is_read_in_seconds():
    # a Message written 10 minutes into the run (2026-01-05 00:10 UTC) names a time
    assert estimate_s("Queue position #3, ..., expected to start around 2026-01-05 00:22 UTC (waiting since ...)", 600) == 720
    assert estimate_s("... expected to start around 2026-01-05 01:15 UTC", 600) == 3900
    assert estimate_s("... expected to start around 2026-01-06 00:10 UTC", 600) == 86400
    assert estimate_s("Queue position #1, next to acquire resources on c (2x2)", 600) is None
    # and its latest start: the time alone on the expected start's day, with its date on another
    assert latest_s("..., expected to start around 2026-01-05 00:22 UTC, by 00:40 UTC at the latest (waiting ...)", 600) == 1800
    assert latest_s("... expected to start around 2026-01-05 23:50 UTC, by 2026-01-06 00:30 UTC at the latest", 600) == 86400 + 1200
    assert latest_s("... expected to start around 2026-01-05 00:22 UTC", 600) is None


def test_the_estimates_error_its_coverage_and_its_lean_per_supply_mode():
    messages = [  # (at, task, Message): 1 promised 00:10-00:20 and started at 00:15; 2 00:10-00:12, at 00:30
        (0.0, 1, "expected to start around 2026-01-05 00:10 UTC, by 00:20 UTC at the latest"),
        (0.0, 2, "expected to start around 2026-01-05 00:10 UTC, by 00:12 UTC at the latest"),
        (60.0, 2, "expected to start around 2026-01-05 00:20 UTC, by 00:40 UTC at the latest"),  # a later promise
        (0.0, 3, "Queue position #1, next to acquire resources on c (2x2)"),
    ]
    got = _eta_error(messages, {1: 900.0, 2: 1800.0, 3: 60.0}, {1: "flex-start", 2: "reservation", 3: "flex-start"}, {1: "a/flex-start", 2: "a/reservation"})
    assert got["tasks"] == 2 and got["coverage"] == 0.5 and got["signed_p50"] == 300.0
    assert got["per_supply"] == {"flex-start": {"first_p50": 300.0, "coverage": 1.0}, "reservation": {"first_p50": 1200.0, "coverage": 0.0}}
    assert got["per_cell"]["a/reservation"] == {"tasks": 1, "first_p50": 1200.0, "coverage": 0.0}
    # the ratio: the first estimate's median error over the median wait of the same tasks
    # (task 3 gave no estimate: its wait is not counted)
    got = _eta_error(messages, {1: 900.0, 2: 1800.0, 3: 60.0}, {}, None, {1: 1000.0, 2: 2000.0, 3: 10.0})
    assert got["wait_p50"] == 1000.0 and got["first_over_wait"] == 0.3


IN_PROCESS = {"FALCON_SIMULATE_IN_PROCESS": "1"}  # CliRunner: no re-exec to pin the hash seed


def test_the_command_writes_the_report_and_replays_a_failure(tmp_path):
    fleet_file = tmp_path / "fleet.json"  # YAML is a superset of JSON
    fleet_file.write_text(json.dumps({"clusters": [_cluster("res-a", reservation={"name": "res-a", "count": 4}, chips=0)]}))
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(json.dumps(_task(0, 0.0, 60.0)) + "\n")
    out = tmp_path / "report.json"
    res = CliRunner(env=IN_PROCESS).invoke(simulate, ["--fleet", str(fleet_file), "--tasks", str(tasks_file), "--json", "--out", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["outcomes"] == {"Succeeded": 1} and report["seed"] == 1
    # cut short: the task is still live, an invariant breaks, the replay command is printed
    res = CliRunner(env=IN_PROCESS).invoke(simulate, ["--fleet", str(fleet_file), "--tasks", str(tasks_file), "--until-s", "100", "--quiet"])
    assert res.exit_code == 1
    assert f"falcon-ray simulate --fleet {fleet_file} --tasks {tasks_file} --seed 1 --until-s 100" in res.output
    # several seeds: a line each, the replay command of each seed that broke an invariant
    res = CliRunner(env=IN_PROCESS).invoke(simulate, ["--fleet", str(fleet_file), "--tasks", str(tasks_file), "--seeds", "1-2", "--until-s", "100"])
    assert res.exit_code == 1
    assert res.output.count("invariants lost=1") == 2, res.output
    assert f"--tasks {tasks_file} --seed 2 --until-s 100" in res.output
    res = CliRunner(env=IN_PROCESS).invoke(simulate, ["--fleet", str(fleet_file), "--tasks", str(tasks_file), "--seeds", "2,1", "--quiet"])
    assert res.exit_code == 0 and [line.split(":")[0] for line in res.output.splitlines()] == ["seed 2", "seed 1"], res.output
    assert CliRunner(env=IN_PROCESS).invoke(simulate, ["--tasks", str(tasks_file), "--seeds", "3-1"]).exit_code == 2
    gen = tmp_path / "gen.jsonl"
    res = CliRunner(env=IN_PROCESS).invoke(simulate, ["--fleet", str(fleet_file), "--tasks", str(gen), "--generate", "--count", "50", "--days", "1"])
    assert res.exit_code == 0 and len(gen.read_text().splitlines()) > 30


def test_the_run_starts_on_a_monday():
    assert START.weekday() == 0 and START.hour == 0


def test_two_processes_with_different_hash_seeds_give_the_same_report(tmp_path):
    """The command pins PYTHONHASHSEED (the product iterates sets of strings), so the
    report is the same from one invocation to the next, not only within one process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    fleet_file, tasks_file = tmp_path / "fleet.json", tmp_path / "tasks.jsonl"
    fleet_file.write_text(json.dumps(MIXED))
    tasks_file.write_text("".join(json.dumps(t) + "\n" for t in _mixed_tasks()[:2]))
    reports = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"r{hash_seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        env.pop("FALCON_SIMULATE_IN_PROCESS", None)
        cmd = [str(Path(sys.executable).parent / "falcon-ray"), "simulate", "--fleet", str(fleet_file), "--tasks", str(tasks_file), "--out", str(out), "--quiet"]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        reports.append(_without_wall(json.loads(out.read_text())))
    assert reports[0] == reports[1]


def test_a_slice_as_large_as_the_reservation_is_not_starved_by_a_stream_of_smaller_ones():
    """A 16-host reservation, a 2x2 / 2x4 / 4x4 task every 5 minutes for 6 hours (more than
    it holds, so some always wait), and one 8x8, which needs all 16 hosts free at once. Each
    queue hands its pools to its own next task, so hosts never all come free while the
    stream lasts: without the reservation hold the 8x8 waits for the stream's end. With it
    (``reservation_hold_after_s``, 30 minutes), once it has waited that long newer tasks of
    the other topologies claim nothing and keep no pool for hand-over, the hosts come free
    as their runs (40 minutes) end, and it starts."""
    fleet = {"clusters": [_cluster("res-a", reservation={"name": "res-a", "count": 16}, chips=0)]}
    shapes = ["2x2", "2x4", "4x4"]
    tasks = [_task(i, 300.0 * i, 2400.0, shapes[i % 3]) for i in range(72)]
    tasks.append(_task(99, 3600.0, 1800.0, "8x8"))

    def big_start(settings: Settings) -> tuple[float, dict]:
        report, _ = _run(fleet, tasks, settings=settings)
        assert report["outcomes"] == {"Succeeded": 73} and not any(report["invariants"].values())
        return report["time_to_running_s"]["topology"]["v6e/8x8"]["p50"], report

    held, report = big_start(Settings())
    starved, _ = big_start(Settings(reservation_hold_after_s=None))
    run_s, create_s = 2400.0, CREATE_S + REGISTER_S + POD_START_S
    assert held <= 1800.0 + run_s + DELETE_S + create_s + 600.0, held  # hold, the drain, its create; 10 min of steps
    assert starved >= 5 * 3600.0 - 3600.0, starved  # until the stream's last runs ended
    assert report["time_to_running_s"]["topology"]["v6e/2x2"]["n"] == 24


def test_a_queue_reads_its_clusters_busy_tasks_again_only_once_a_hold_could_have_begun():
    """A reservation cluster with no long wait: each step of its busy queue would read the
    cluster's ClusterBusy tasks (114 reads over these 2.4 hours); a read that found no
    waiter old enough answers until one could be (``reservation_hold_after_s``)."""
    fleet = {"clusters": [_cluster("res-a", reservation={"name": "res-a", "count": 4}, chips=0)]}
    tasks = [_task(i, 600.0 * i, 1200.0, "2x2") for i in range(12)]

    def reads(sim) -> int:
        return sum(n for s in sim.controller_stores for k, n in s.breakdown.items() if "reservation_waiters" in k)

    report, sim = _run(fleet, tasks, look=reads)
    assert report["outcomes"] == {"Succeeded": 12}
    assert 1 <= sim.looked <= 2 * report["simulated_s"] / Settings().reservation_hold_after_s + 2, sim.looked


def test_on_a_contended_reservation_with_a_hold_the_left_out_steps_keep_what_production_would_decide():
    """The reservation hold's stream (above) with a 5 s queue tick, once with the driver's
    left-out steps and once stepping every queue at every tick (``exact``, as production's
    Tickers do). The two do not play the same log to the second (a view refreshed a tick
    apart reorders two claims), but what users feel must agree: the 8x8's start, and each
    topology's mean wait within 10%. Waking a queue on another's step only for a change its
    decisions read, and stepping it when its kept ClusterBusy tasks come due for a re-read,
    is what keeps them together: before (010ca36) the 2x2 tasks' mean wait was 7,225 s
    against exact's 3,127 s."""
    fleet = {"clusters": [_cluster("res-a", reservation={"name": "res-a", "count": 16}, chips=0)]}
    shapes = ["2x2", "2x4", "4x4"]
    tasks = [_task(i, 300.0 * i, 2400.0, shapes[i % 3]) for i in range(72)]
    tasks.append(_task(99, 3600.0, 1800.0, "8x8"))
    settings = Settings(queue_tick_s=5.0)
    left_out, _ = _run(fleet, tasks, settings=settings)
    exact, _ = _run(fleet, tasks, settings=settings, exact=True)
    assert left_out["outcomes"] == exact["outcomes"] == {"Succeeded": 73}
    a, b = left_out["time_to_running_s"]["topology"], exact["time_to_running_s"]["topology"]
    assert abs(a["v6e/8x8"]["p50"] - b["v6e/8x8"]["p50"]) <= settings.queue_tick_s, (a["v6e/8x8"], b["v6e/8x8"])
    for topology in ("v6e/2x2", "v6e/2x4", "v6e/4x4"):
        assert abs(a[topology]["mean"] - b[topology]["mean"]) <= 0.1 * b[topology]["mean"], (topology, a[topology], b[topology])
    waiting = left_out["pending_s_by_reason"]["Waiting"], exact["pending_s_by_reason"]["Waiting"]
    assert abs(waiting[0] - waiting[1]) <= 0.05 * waiting[1], waiting
