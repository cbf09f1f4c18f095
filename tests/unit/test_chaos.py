"""The soak's judgement (``falcon_ray.chaos.check``) and plan, without Ray or a fleet."""

from __future__ import annotations

import datetime as dt
import json

from falcon_ray import chaos
from falcon_ray.chaos import Limits, Observed, check, make_plan
from falcon_ray.model import Task, TaskEvent

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
    from falcon_ray.chaos import Limits, Observed, _longest_quiet

    obs = Observed()
    obs.see(100.0, "Aborting", "", "")
    obs.see(150.0, "Aborted", "", "")
    limits = Limits(node_pool_timeout=20)  # Aborting: 30 s
    assert _longest_quiet(obs, 200.0, limits, None)["quiet_s"] == 50.0
    assert _longest_quiet(obs, 200.0, limits, None, pauses=((110.0, 140.0),)) is None  # 20 s outside the outage
    assert _longest_quiet(obs, 200.0, limits, None, pauses=((140.0, 145.0),))["quiet_s"] == 45.0
