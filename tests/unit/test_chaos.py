"""The soak's judgement (``falcon_ray.devtools.chaos.check``) and plan, without Ray or a fleet."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from falcon_ray.devtools import chaos
from falcon_ray.devtools.chaos import Limits, Observed, check, make_plan
from falcon_ray.model import Disruption, Task, TaskEvent

T0 = dt.datetime(2026, 1, 1)
LIMITS = Limits(node_pool_timeout=20, margin=10, waiting=100)


def task(tid: int, status: str, reason: str = "", message: str = "", timeout: int = 60) -> Task:
    return Task(
        id=tid, name=f"t{tid}", actor="a", spec=json.dumps({"timeout_seconds": timeout}), status=status, reason=reason,
        message=message, cluster_id=None, node_pool_name=None, job_uid=None, timeout_seconds=timeout,
        created_at=T0, updated_at=T0, dispatched_at=None, finished_at=None, aborting_at=None, aborted_at=None,
    )


def evs(tid: int, *steps: str) -> list[TaskEvent]:
    out = []
    for i, s in enumerate(steps):
        status, _, reason = s.partition("/")
        out.append(TaskEvent(task_id=tid, at=T0 + dt.timedelta(seconds=i), status=status, reason=reason, message=""))
    return out


def obs(*changes) -> Observed:
    o = Observed()
    for at, status, reason, message in changes:
        o.see(at, status, reason, message)
    return o


HAPPY = ("Pending", "Pending/Waiting", "Pending/Provisioning", "Pending/Dispatching", "Running", "Succeeded")
FLEET_CLEAN = {"clusters": {"edge-a": {"jobs": [{"name": "falcon-task-1", "creates": 1}], "node_pools": [{"name": "falcon-x", "deleted_at": 5.0}]}}}


def test_a_clean_run_is_ok():
    r = check([task(1, "Succeeded")], {1: evs(1, *HAPPY)}, {1: obs((0, "Pending", "", ""), (3, "Succeeded", "", ""))}, 50, FLEET_CLEAN, LIMITS)
    assert r["ok"] and not any(r["invariants"].values()) and r["details"] == {}


def test_lost_task_pool_alive_and_second_job_create():
    fleet = {
        "clusters": {
            "edge-a": {
                "jobs": [{"name": "falcon-task-1", "creates": 2}],
                "node_pools": [
                    {"name": "falcon-x", "deleted_at": None, "status": "RUNNING", "supply": "flex-start", "hosts": 4, "nodes": []},
                    {"name": "default-pool", "deleted_at": None},
                ],
            }
        }
    }
    r = check([task(1, "Pending", "Waiting", "Queue position #1")], {1: evs(1, "Pending", "Pending/Waiting")}, {}, 50, fleet, LIMITS)
    assert not r["ok"]
    assert r["invariants"]["lost"] == 1 and r["invariants"]["pools_alive"] == 1 and r["invariants"]["second_job_creates"] == 1
    # what the pool holds comes along: hosts held and nodes registered tell a capacity wait from a leak
    want = {"cluster": "edge-a", "pool": "falcon-x", "status": "RUNNING", "supply": "flex-start", "hosts": 4, "nodes": 0}
    assert r["details"]["pools_alive"] == [want]
    # a second create comes with its timeline: the task's events (Unix seconds, as the fleet's)
    second = r["details"]["second_job_creates"][0]
    assert (second["cluster"], second["job"], second["creates"]) == ("edge-a", "falcon-task-1", 2)
    assert [p for _, p, _ in second["events"]] == ["Pending", "Pending/Waiting"]
    assert second["events"][0][0] == T0.replace(tzinfo=dt.UTC).timestamp()


def test_a_second_create_shows_when_the_fleet_created_and_deleted_the_job():
    fleet = {"clusters": {"edge-b": {"jobs": [{"name": "falcon-task-7", "creates": 2, "created_at": [10.0, 12.5], "deleted_at": [11.25]}], "node_pools": []}}}
    r = check([task(7, "Succeeded")], {7: evs(7, *HAPPY)}, {}, 50, fleet, LIMITS)
    second = r["details"]["second_job_creates"][0]
    assert second["created_at"] == [10.0, 12.5] and second["deleted_at"] == [11.25]
    assert len(second["events"]) == len(HAPPY)


def test_stuck_is_a_quiet_stretch_longer_than_the_phase_limit():
    # Dispatching may stay quiet 20 + 10 s: 31 s is stuck, even though the task finished later
    stuck = obs((0, "Pending", "Dispatching", "Job submitted"), (31, "Running", "", ""), (32, "Succeeded", "", ""))
    fine = obs((0, "Pending", "Dispatching", "Job submitted"), (29, "Running", "", ""), (32, "Succeeded", "", ""))
    tasks = [task(1, "Succeeded"), task(2, "Succeeded")]
    r = check(tasks, {1: evs(1, *HAPPY), 2: evs(2, *HAPPY)}, {1: stuck, 2: fine}, 100, FLEET_CLEAN, LIMITS)
    assert r["invariants"]["stuck"] == 1
    assert r["details"]["stuck"][0]["id"] == 1 and r["details"]["stuck"][0]["phase"] == "Pending/Dispatching"


def test_a_job_made_again_counts_only_when_an_earlier_create_ran_a_pod():
    """Nodes that never came: the Job (no pod ever ran) is deleted with its pool and made
    again on the next pool, which is no second run. A Job made again after a create that
    ran a pod is (its work may run twice); a fleet that does not record runs counts all."""

    def fleet(**job) -> dict:
        return {"clusters": {"edge-a": {"jobs": [{"name": "falcon-task-1", **job}], "node_pools": []}}}

    def count(f: dict) -> int:
        return check([task(1, "Succeeded")], {}, {}, 10, f, LIMITS)["invariants"]["second_job_creates"]

    assert count(fleet(creates=2, ran=[2])) == 0  # only the last create ran
    assert count(fleet(creates=2, ran=[])) == 0
    assert count(fleet(creates=2, ran=[1, 2])) == 1
    assert count(fleet(creates=2, ran=[1])) == 1
    assert count(fleet(creates=2)) == 1


def test_a_capacity_wait_that_lasted_the_whole_budget_is_not_a_failure_for_capacity():
    """The operator's capacity_budget_s ends a wait the fleet never answered: NodePoolFailed
    after the whole budget (by the event log) is the limit working, before it a failure."""
    msg = "Node pool creation failed: GKE did not deliver the nodes of node pool falcon-t1-8x8 (0/16 registered, supply: flex-start) within capacity_budget_s=6h00m"

    def log(wait_s: float) -> list[TaskEvent]:
        steps = [(0, "Pending", "Waiting"), (10, "Pending", "Provisioning"), (500, "Pending", "WaitingForNode"),
                 (500 + wait_s, "Failed", "NodePoolFailed")]  # fmt: skip
        return [TaskEvent(task_id=1, at=T0 + dt.timedelta(seconds=at), status=st, reason=r, message="") for at, st, r in steps]

    tasks = [task(1, "Failed", "NodePoolFailed", msg)]
    budget = dataclasses.replace(LIMITS, capacity_budget=21600)
    assert check(tasks, {1: log(21600)}, {}, 30000, FLEET_CLEAN, budget)["invariants"]["failed_for_capacity"] == 0
    assert check(tasks, {1: log(3600)}, {}, 30000, FLEET_CLEAN, budget)["invariants"]["failed_for_capacity"] == 1
    assert check(tasks, {1: log(21600)}, {}, 30000, FLEET_CLEAN, LIMITS)["invariants"]["failed_for_capacity"] == 1  # the soak: none


def test_a_create_waiting_its_turn_is_stuck_only_past_the_create_queue_limit():
    """A Provisioning task whose create waits behind the cluster's other node-pool operations
    says so once, since when; its limit is create_queue_limit_s, not the create's timeout."""
    queued = "Waiting to send the create of node pool falcon-t1-2x2: cluster edge-a runs as many node-pool operations at a time as it takes and others go first; queued since 13:18:59 UTC"
    o = obs((0, "Pending", "Provisioning", queued), (150, "Pending", "Provisioning", "Creating node pool falcon-t1-2x2 (supply: flex-start)..."))
    tasks = [task(1, "Pending", "Provisioning")]
    with_limit = dataclasses.replace(LIMITS, create_queue=200)
    assert check(tasks, {}, {1: o}, 160, FLEET_CLEAN, with_limit)["invariants"]["stuck"] == 0
    assert check(tasks, {}, {1: o}, 160, FLEET_CLEAN, LIMITS)["invariants"]["stuck"] == 1  # 150 s quiet > 20 + 10
    plain = obs((0, "Pending", "Provisioning", "Creating node pool falcon-t1-2x2 (supply: flex-start)..."))
    assert check(tasks, {}, {1: plain}, 150, FLEET_CLEAN, with_limit)["invariants"]["stuck"] == 1  # a create: its own timeout


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_create_asked_again_after_refusals_and_waiting_its_turn_has_the_create_queue_limit(lang):
    """A create asked again after capacity refusals says so first ("capacity_retrying"), then
    that it waits its turn among the cluster's operations (or was refused because one runs):
    the create queue's limit holds for it too, found anywhere in the Message."""
    from falcon_ray import messages

    retry = messages.text("capacity_retrying", lang, pool="falcon-t1-2x2-r1", supply="flex-start", refusals=1, detail="GKE did not deliver the nodes")
    queued = messages.text("create_queued", lang, pool="falcon-t1-2x2-r1", cluster="edge-a", ahead="", since="13:18:59")
    busy = messages.text("create_refused_busy", lang, pool="falcon-t1-2x2-r1", cluster="edge-a", detail="upgrade", since="13:18:59")
    with_limit = dataclasses.replace(LIMITS, create_queue=200)
    for text in (f"{retry}; {queued}", f"{retry}; {busy}", busy):
        o = obs((0, "Pending", "Provisioning", text))
        tasks = [task(1, "Pending", "Provisioning")]
        assert check(tasks, {}, {1: o}, 160, FLEET_CLEAN, with_limit)["invariants"]["stuck"] == 0, text
        assert check(tasks, {}, {1: o}, 250, FLEET_CLEAN, with_limit)["invariants"]["stuck"] == 1, text
    plain = obs((0, "Pending", "Provisioning", retry))  # a create asked again, sent: its own timeout
    assert check([task(1, "Pending", "Provisioning")], {}, {1: plain}, 160, FLEET_CLEAN, with_limit)["invariants"]["stuck"] == 1


def test_a_reservation_wait_is_stuck_only_past_the_instant_its_message_promised():
    """A slice held for behind runs of two days waits longer than ``waiting`` and says by
    when its hosts free up (the reservation hold): stuck only once that instant has passed
    by the margin (the judge knows the run's calendar), in either language; a wait that
    promises nothing keeps the waiting limit, and so does a judge without the calendar."""
    from falcon_ray import messages

    busy = "reservation_remaining_slices=0 reservation_needed_slices=1, waiting for reservation res-a capacity to free up..."

    def holding(by: dt.datetime, lang: str = "en") -> str:
        return busy + messages.text("reservation_holding", lang, hosts=16, by=by.strftime("%Y-%m-%d %H:%M"))

    since = 1000.0
    by = T0 + dt.timedelta(seconds=since + 5000)  # promised free 5,000 s into the wait, at the minute
    calendar = dataclasses.replace(LIMITS, origin=T0)
    tasks = [task(1, "Running")]

    def stuck(message: str, started_after_s: float, limits: Limits = calendar) -> int:
        o = obs((since, "Pending", "ClusterBusy", message), (since + started_after_s, "Running", "", ""))
        return check(tasks, {}, {1: o}, since + started_after_s + 1, FLEET_CLEAN, limits)["invariants"]["stuck"]

    for lang in ("en", "zh"):
        assert stuck(holding(by, lang), 5000 + 60 + 10) == 0, "started within the promised minute and the margin"
        assert stuck(holding(by, lang), 5000 + 60 + 11) == 1, "past the promise and the margin"
    assert stuck(holding(by), 101) == 0 and stuck(busy, 111) == 1, "no promise: the waiting limit (100 + 10 of Running's margin)"
    assert stuck(holding(by), 5000, LIMITS) == 1, "no calendar: the waiting limit"
    early = T0 + dt.timedelta(seconds=since + 30)  # a promise sooner than the waiting limit does not shorten it
    assert stuck(holding(early), 99) == 0


def test_waiting_for_nodes_is_stuck_only_past_the_capacity_budget():
    """Nodes that do not come are a capacity wait the queue ends at capacity_budget_s: a
    WaitingForNode whose Message only counts the minutes is stuck past that, not before."""
    waits = obs((0, "Pending", "WaitingForNode", "0/16 nodes (waiting 1m)"), (95, "Pending", "WaitingForNode", "0/16 nodes (waiting 95m)"),
                (100, "Failed", "NodePoolFailed", "GKE did not deliver the nodes"))  # fmt: skip
    tasks = [task(1, "Failed", "NodePoolFailed")]
    budget = Limits(node_pool_timeout=20, margin=10, waiting=100, capacity_budget=95)
    assert check(tasks, {}, {1: waits}, 200, FLEET_CLEAN, budget)["invariants"]["stuck"] == 0
    assert check(tasks, {}, {1: waits}, 200, FLEET_CLEAN, LIMITS)["invariants"]["stuck"] == 1  # no budget: node_pool_timeout


def test_a_message_change_resets_the_quiet_clock_and_running_uses_the_task_timeout():
    # Provisioning 50 s, but its Message changed every 15 s: not stuck
    chatty = obs(*[(i * 15, "Pending", "Provisioning", f"m{i}") for i in range(4)], (50, "Failed", "NodePoolTimeout", "x"))
    # Running 100 s with a 60 s timeout (+10 margin): stuck; the same with a 120 s timeout: fine
    long_run = obs((0, "Running", "", "running 1/1"), (100, "Succeeded", "", ""))
    long_ok = obs((0, "Running", "", "running 1/1"), (100, "Succeeded", "", ""))
    tasks = [task(1, "Failed", "NodePoolTimeout"), task(2, "Succeeded", timeout=60), task(3, "Succeeded", timeout=120)]
    r = check(tasks, {}, {1: chatty, 2: long_run, 3: long_ok}, 200, FLEET_CLEAN, LIMITS)
    assert [d["id"] for d in r["details"]["stuck"]] == [2]


def test_a_live_task_is_stuck_until_the_end_of_the_run():
    r = check([task(1, "Aborting")], {1: evs(1, "Pending", "Aborting")}, {1: obs((0, "Aborting", "", ""))}, 11, FLEET_CLEAN, LIMITS)
    assert r["invariants"]["stuck"] == 1 and r["invariants"]["lost"] == 1


def test_abort_overwritten_reads_the_event_log_order():
    tasks = [task(1, "Succeeded"), task(2, "Succeeded"), task(3, "Aborted"), task(4, "Aborted")]
    events = {
        1: evs(1, "Pending", "Pending/Waiting", "Aborting", "Running", "Succeeded"),  # abort overwritten
        2: evs(2, *HAPPY),  # finished before the abort landed: the upper layer's CAS lost, fine
        3: evs(3, "Pending", "Pending/Waiting", "Aborting", "Aborted"),
        4: evs(4, "Pending", "Pending/Waiting", "Aborting", "Pending/Dispatching", "Aborting", "Aborted"),  # overwritten, then Aborted
    }
    tasks.append(task(5, "Aborting"))
    events[5] = evs(5, "Pending", "Pending/Waiting", "Aborting")  # never finished: lost, not overwritten
    r = check(tasks, events, {}, 10, FLEET_CLEAN, LIMITS)
    assert sorted(d["id"] for d in r["details"]["aborts_overwritten"]) == [1, 4]
    assert r["invariants"]["lost"] == 1


def test_failed_for_capacity_is_a_capacity_refusal_not_any_node_pool_failure_nor_the_injected_ones():
    tasks = [
        task(1, "Failed", "NodePoolFailed", "Node pool creation failed: Reservation res-a does not have enough resources: 4 VM(s) requested, 0 of 6 available."),
        task(2, "Failed", "NodePoolFailed", "Node pool creation failed: ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'us-east5-b' does not have enough resources"),
        task(3, "Failed", "NodePoolFailed", "Node pool creation failed: " + chaos.CREATE_ERROR),
        task(4, "Failed", "JobFailed", "does not have enough resources"),
        task(5, "Failed", "NodePoolFailed", "Node pool creation failed: no capacity within capacity_budget_s=6m00s: waited 6m over 5 refusal(s); last answer from GKE: GCE_STOCKOUT"),
        task(6, "Failed", "NodePoolFailed", "Node pool creation failed: no free slice in the reservation for 1h (reservation_wait_limit_s); reservation_remaining_slices=0 ..."),
        task(7, "Failed", "NodePoolFailed", "Node pool creation failed: Quota 'TPUS_PER_PROJECT' exceeded. Limit: 0.0 in region us-east5."),
    ]
    r = check(tasks, {}, {}, 10, FLEET_CLEAN, LIMITS)
    assert sorted(d["id"] for d in r["details"]["failed_for_capacity"]) == [1, 2, 5, 6]
    assert not r["ok"] and r["invariants"]["failed_for_capacity"] == 4


def test_the_soak_fleet_is_a_reservation_of_6_hosts_and_a_flex_start_cluster_of_32_chips():
    fleet = chaos.chaos_fleet(1)
    a, b = fleet.cluster("edge-a"), fleet.cluster("edge-b")
    assert a.reservation is not None and a.reservation.count == 6
    assert b.reservation is None and b.chips == 32  # no reservation: flex-start by default
    assert chaos.CREATE_ERROR_CODE == 13  # INTERNAL: the injected failures are not capacity


def test_illegal_transitions_are_counted():
    r = check([task(1, "Succeeded")], {1: evs(1, "Pending", "Running", "Succeeded")}, {}, 10, FLEET_CLEAN, LIMITS)
    assert r["invariants"]["illegal_transitions"] == 1


def test_the_plan_is_seeded_and_mixed():
    a, b = make_plan(300, 7, 60), make_plan(300, 7, 60)
    assert a == b and make_plan(300, 8, 60) != a
    assert {i["spec"]["topology"] for i in a} == set(chaos.TOPOLOGIES)
    kinds = {i["kind"].split("+")[0] for i in a}
    assert kinds == {"ok", "oom", "exit1", "timeout"}
    aborted = [i for i in a if i["abort_at"] is not None]
    assert 0.08 * 300 < len(aborted) < 0.25 * 300 and all(i["abort_at"] >= i["submit_at"] for i in aborted)
    assert {i["spec"].get("supply_mode") for i in a} == {None, "flex-start", "on-demand"}
    assert all(0 <= i["submit_at"] <= 60 for i in a)


def test_a_wait_counter_in_the_message_is_not_progress():
    base = "node pool falcon-t1-4x4 control-plane RUNNING but 0/4 expected node(s) registered (Ready=0); Job falcon-task-1 submitted, its pods are pending until the nodes come ({})..."
    o = obs(*[(i * 60, "Pending", "WaitingForNode", base.format(w)) for i, w in enumerate(("waiting <1m", "waiting 1m", "waiting 2m"))])
    assert len(o.changes) == 1
    r = check([task(1, "Pending", "WaitingForNode")], {}, {1: o}, 200, FLEET_CLEAN, LIMITS)
    assert r["invariants"]["stuck"] == 1
    assert len(obs((0, "Pending", "Waiting", "Queue position #2"), (1, "Pending", "Waiting", "Queue position #1")).changes) == 2


def test_a_database_outage_does_not_count_against_a_quiet_phase():
    from falcon_ray.devtools.chaos import Limits, Observed, _longest_quiet

    obs = Observed()
    obs.see(100.0, "Aborting", "", "")
    obs.see(150.0, "Aborted", "", "")
    limits = Limits(node_pool_timeout=20)  # Aborting: 30 s
    assert _longest_quiet(obs, 200.0, limits, None)["quiet_s"] == 50.0
    assert _longest_quiet(obs, 200.0, limits, None, pauses=((110.0, 140.0),)) is None  # 20 s outside the outage
    assert _longest_quiet(obs, 200.0, limits, None, pauses=((140.0, 145.0),))["quiet_s"] == 45.0


# ---- disruptions: a recovery must be of a run the fleet disrupted -----------------------------------

RECOVERED = ("Pending", "Pending/Waiting", "Pending/Provisioning", "Pending/Dispatching", "Running", "Pending/Recovering", "Running", "Succeeded")


def row(attempt: int, job: str, kind: str = "maintenance", at_s: float = 10.0) -> Disruption:
    return Disruption(attempt=attempt, kind=kind, node="gke-n-1", job=job, detail="pod ...: DisruptionTarget", at=T0 + dt.timedelta(seconds=at_s))


def fleet_with(*records: dict, jobs: tuple[str, ...] = ("falcon-task-1", "falcon-task-1-a1")) -> dict:
    return {"clusters": {"edge-a": {"jobs": [{"name": j, "creates": 1} for j in jobs], "node_pools": [], "disruptions": list(records)}}}


def record(kind: str = "maintenance", jobs: tuple[str, ...] = ("falcon-jobs/falcon-task-1",), pods: tuple[str, ...] = (), at_s: float = 9.0) -> dict:
    return {"kind": kind, "pool": "falcon-1", "nodes": ["gke-n-1"], "pods": list(pods), "jobs": list(jobs), "at": T0.replace(tzinfo=dt.UTC).timestamp() + at_s}


def judge(rows: dict, fleet: dict, tasks=None, events=None):
    tasks = tasks or [task(1, "Succeeded")]
    return check(tasks, events or {1: evs(1, *RECOVERED)}, {}, 50, fleet, LIMITS, disruptions=rows)


def test_a_recovery_of_a_run_the_fleet_disrupted_passes():
    r = judge({1: (row(0, "falcon-task-1"),)}, fleet_with(record()))
    assert r["ok"] and r["invariants"]["recovered_own_failure"] == 0
    assert r["figures"]["recoveries"] == 1 and r["figures"]["recovered_tasks"] == 1 and r["figures"]["recoveries_by_kind"] == {"maintenance": 1}


def test_a_recovery_without_a_disruption_record_of_its_job_is_the_tasks_own_failure_recovered():
    # the fleet disrupted attempt 0, but the controller also recovered attempt 1 (say, its exit code)
    rows = {1: (row(0, "falcon-task-1"), row(1, "falcon-task-1-a1", kind="pool-lost", at_s=20))}
    r = judge(rows, fleet_with(record()))
    assert not r["ok"] and r["invariants"]["recovered_own_failure"] == 1
    d = r["details"]["recovered_own_failure"][0]
    assert (d["id"], d["attempt"], d["job"], d["kind"]) == (1, 1, "falcon-task-1-a1", "pool-lost")
    assert "no disruption record" in d["why"]
    # what lines it up: the fleet's records of the task's Jobs and the task's event log
    assert {j.get("name") for j in d["fleet_jobs"] if "name" in j} == {"falcon-task-1", "falcon-task-1-a1"}
    assert len(d["events"]) == len(RECOVERED)


def test_no_disruption_at_all_and_a_recovery_row_fails():
    r = judge({1: (row(0, "falcon-task-1"),)}, fleet_with())
    assert r["invariants"]["recovered_own_failure"] == 1


def test_a_record_of_another_tasks_job_does_not_cover_a_recovery():
    # falcon-task-10 and falcon-task-1-a1 were disrupted; falcon-task-1 was not
    fleet = fleet_with(record(jobs=("falcon-jobs/falcon-task-10", "falcon-jobs/falcon-task-1-a1")))
    r = judge({1: (row(0, "falcon-task-1"),)}, fleet)
    assert r["invariants"]["recovered_own_failure"] == 1


def test_a_row_naming_a_job_that_is_not_the_tasks_attempt_fails_even_if_the_fleet_disrupted_it():
    fleet = fleet_with(record(jobs=("falcon-jobs/falcon-task-1-a1",)))
    r = judge({1: (row(0, "falcon-task-1-a1"),)}, fleet)  # attempt 0's Job is falcon-task-1
    assert r["invariants"]["recovered_own_failure"] == 1 and "not the task's Job of attempt 0" in r["details"]["recovered_own_failure"][0]["why"]


def test_a_disruption_recorded_after_the_recovery_did_not_cause_it():
    late = record(at_s=10.0 + chaos.DISRUPTION_CLOCK_SLACK_S + 5)
    assert judge({1: (row(0, "falcon-task-1", at_s=10.0),)}, fleet_with(late))["invariants"]["recovered_own_failure"] == 1
    close = record(at_s=10.0 + chaos.DISRUPTION_CLOCK_SLACK_S - 1)  # two clocks, a little apart
    assert judge({1: (row(0, "falcon-task-1", at_s=10.0),)}, fleet_with(close))["invariants"]["recovered_own_failure"] == 0


def test_a_job_drained_with_a_maintenance_it_came_after_is_covered_by_the_records_pods():
    # the record's jobs were taken at the notice; the Job's pods came onto the node before the drain
    pods = ("falcon-jobs/falcon-task-1-a1-0-bc2d4", "falcon-jobs/falcon-task-7-x4z9q")
    fleet = fleet_with(record(jobs=("falcon-jobs/falcon-task-7",), pods=pods))
    r = judge({1: (row(0, "falcon-task-1"), row(1, "falcon-task-1-a1", at_s=20))}, fleet)
    assert [d["attempt"] for d in r["details"]["recovered_own_failure"]] == [0]  # a1's pod is in pods; task-1's is not


def test_pod_names_map_to_their_jobs_without_confusing_attempts_and_indexes():
    fleet = fleet_with(record(jobs=(), pods=("ns/falcon-task-5-a1-bcdfg", "ns/falcon-task-6-0-bcdfg", "ns/falcon-task-50-a2345", "ns/other-x-bcdfg")))
    assert set(chaos.disrupted_jobs(fleet)) == {"falcon-task-5-a1", "falcon-task-6", "falcon-task-50"}
    assert chaos.task_of_job("falcon-task-5-a1") == 5 and chaos.task_of_job("falcon-task-5") == 5
    assert chaos.task_of_job("falcon-task-5-x") is None and chaos.task_of_job("falcon-task-") is None


def test_a_task_ended_disrupted_is_no_capacity_failure_and_is_counted():
    msg = "The fleet disrupted this task's runs 4 time(s), more than its max_recoveries (3) allows: ... GCE_STOCKOUT ... does not have enough resources"
    rows = {1: tuple(row(a, chaos.job_name(1, a), kind="reclaim", at_s=10 + a) for a in range(4))}
    fleet = fleet_with(record(kind="reclaim", jobs=tuple(f"ns/{chaos.job_name(1, a)}" for a in range(4))))
    r = judge(rows, fleet, tasks=[task(1, "Failed", "Disrupted", msg)], events={1: evs(1, "Pending", "Pending/Waiting")})
    assert r["invariants"]["failed_for_capacity"] == 0 and r["invariants"]["recovered_own_failure"] == 0
    assert r["figures"]["disrupted"] == 1 and r["figures"]["recoveries"] == 4
    # the same message on NodePoolFailed is a capacity failure: the check can tell them apart
    assert check([task(1, "Failed", "NodePoolFailed", msg)], {}, {}, 10, FLEET_CLEAN, LIMITS)["invariants"]["failed_for_capacity"] == 1


def test_a_second_create_of_an_attempts_job_finds_its_task():
    fleet = {"clusters": {"edge-a": {"jobs": [{"name": "falcon-task-3", "creates": 1}, {"name": "falcon-task-3-a1", "creates": 2}], "node_pools": []}}}
    r = check([task(3, "Succeeded")], {3: evs(3, *RECOVERED)}, {}, 50, fleet, LIMITS)
    # two attempts of one task are two Jobs; the attempt created twice is the bug
    assert r["invariants"]["second_job_creates"] == 1
    second = r["details"]["second_job_creates"][0]
    assert second["job"] == "falcon-task-3-a1" and len(second["events"]) == len(RECOVERED)


def test_a_task_whose_every_run_fails_must_not_succeed():
    def spec_task(tid, status, env):
        t = task(tid, status)
        return dataclasses.replace(t, spec=json.dumps({"timeout_seconds": 60, "env": env}))

    tasks = [
        spec_task(1, "Succeeded", {"FALCON_SIM_EXIT_CODE": "1"}),
        spec_task(2, "Succeeded", {"FALCON_SIM_OOM": "1"}),
        spec_task(3, "Succeeded", {"FALCON_SIM_EXIT_CODE": "0"}),
        spec_task(4, "Failed", {"FALCON_SIM_EXIT_CODE": "1"}),
        spec_task(5, "Succeeded", {"FALCON_SIM_RUN_SECONDS": "1"}),
    ]
    tasks[3] = dataclasses.replace(tasks[3], reason="JobFailed")
    r = check(tasks, {}, {}, 10, FLEET_CLEAN, LIMITS)
    assert sorted(d["id"] for d in r["details"]["failing_task_succeeded"]) == [1, 2]


def test_recovering_may_stay_quiet_as_long_as_the_recovery_wait():
    quiet = obs((0, "Pending", "Recovering", "attempt 2/4: Job falcon-task-1-a1 submitted"), (45, "Running", "", ""), (46, "Succeeded", "", ""))
    base = check([task(1, "Succeeded")], {}, {1: quiet}, 50, FLEET_CLEAN, LIMITS)  # 20 + 10 s
    assert base["invariants"]["stuck"] == 1 and base["details"]["stuck"][0]["phase"] == "Pending/Recovering"
    longer = Limits(node_pool_timeout=20, margin=10, waiting=100, recovery_wait=40)  # 40 + 10 s
    assert check([task(1, "Succeeded")], {}, {1: quiet}, 50, FLEET_CLEAN, longer)["invariants"]["stuck"] == 0


def test_an_abandoned_attempt_after_a_disruption_is_no_recovery_of_its_own():
    from falcon_ray.devtools import chaos
    from falcon_ray.model import Disruption

    at = dt.datetime(2026, 12, 1, 12, 0, 0)
    first = Disruption(0, "reclaim", "", "falcon-task-7", "reclaimed", at)
    left = Disruption(1, "abandoned", "", "falcon-task-7-a1", "the nodes did not come back", at)
    fleet_jobs = {"falcon-task-7": at.replace(tzinfo=dt.UTC).timestamp()}
    assert chaos._own_failure_recovered(7, left, fleet_jobs, (first, left)) is None
    alone = Disruption(0, "abandoned", "", "falcon-task-7", "x", at)
    assert chaos._own_failure_recovered(7, alone, fleet_jobs, (alone,)) == "an abandoned attempt that follows no disruption"


def test_a_task_without_a_timeout_runs_under_the_products_default_not_the_soaks():
    """A spec that sets no timeout_seconds runs for up to spec.DEFAULT_TIMEOUT_SECONDS (3600 s):
    the judge reads the same default (the soak's own tasks set theirs: 120 s, or 2-3 s)."""
    from falcon_ray.spec import DEFAULT_TIMEOUT_SECONDS

    def untimed(tid: int) -> Task:
        return dataclasses.replace(task(tid, "Succeeded"), spec=json.dumps({"tpu_type": "v6e"}), timeout_seconds=None)

    within = obs((0, "Running", "", "running 1/1"), (DEFAULT_TIMEOUT_SECONDS, "Succeeded", "", ""))
    past = obs((0, "Running", "", "running 1/1"), (DEFAULT_TIMEOUT_SECONDS + 11, "Succeeded", "", ""))
    r = check([untimed(1), untimed(2)], {}, {1: within, 2: past}, 2 * DEFAULT_TIMEOUT_SECONDS, FLEET_CLEAN, LIMITS)
    assert [d["id"] for d in r["details"]["stuck"]] == [2]
    assert r["details"]["stuck"][0]["limit_s"] == DEFAULT_TIMEOUT_SECONDS + 10
    assert all(item["spec"]["timeout_seconds"] in (chaos.DEFAULT_TASK_TIMEOUT, 2, 3) for item in make_plan(60, 1, 10))
