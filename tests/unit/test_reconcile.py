"""The QueueActor's decisions, table by table, without Ray or HTTP (a fixed clock)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState, Reason
from falcon_ray.model import (
    Cluster,
    ClusterView,
    Disruption,
    JobView,
    Lease,
    OpView,
    PoolView,
    QueueState,
    QueueTask,
    ReservationError,
    ReservationView,
    SubmitError,
)
from falcon_ray.reconcile import (
    CreateLease,
    DeleteJob,
    DeletePool,
    EnsurePool,
    MarkReady,
    MoveLease,
    RecordOperation,
    RefreshMessages,
    SubmitJob,
    Transition,
    Unassign,
    UpdateTask,
    decide,
)
from falcon_ray.spec import parse_spec

NOW = dt.datetime(2026, 11, 30, 12, 0, 0)
S = Settings(node_pool_timeout_s=600, create_visibility_grace_s=120)


def cluster(reservation: str = "res-a", status: str = "active") -> Cluster:
    return Cluster("c1", "edge-a", "proj", "us-east5-b", "v6e", "logs", reservation, status, "falcon-jobs", "falcon-job", NOW, NOW)


def spec(topology: str = "2x2", **kw) -> object:
    return parse_spec({"tpu_type": "v6e", "topology": topology, "image": "img:1", "command": ["run"], **kw})


def task(
    id: int, actor: str = "alice", phase=lc.WAITING, age_s: float = 100, pool=None, dispatched_s=None, message="", in_phase_s=None, **spec_kw
):
    return QueueTask(
        id=id,
        name=f"t{id}",
        actor=actor,
        phase=phase,
        created_at=NOW - dt.timedelta(seconds=age_s),
        dispatched_at=NOW - dt.timedelta(seconds=dispatched_s) if dispatched_s is not None else None,
        spec=spec(**spec_kw),
        node_pool_name=pool,
        job_uid=None,
        message=message,
        phase_since=NOW - dt.timedelta(seconds=in_phase_s) if in_phase_s is not None else None,
    )


def lease(id: int, name: str, state: LeaseState, task_id=None, age_s: float = 50, mode="reservation", attempts=0):
    t = NOW - dt.timedelta(seconds=age_s)
    ready = t if state in (LeaseState.READY, LeaseState.IN_USE, LeaseState.IDLE) else None  # it was Ready once
    return Lease(id, "c1", "2x2", name, mode, state.value, task_id, None, attempts, "", t, t, ready, None, None)


def state(tasks=(), leases=(), last="", c=None, **kw) -> QueueState:
    return QueueState(cluster=c or cluster(), topology="2x2", tasks=tuple(tasks), leases=tuple(leases), last_granted=last, **kw)


def effects(groups, kind=None):
    out = [e for g in groups for e in g.effects]
    return [e for e in out if kind is None or isinstance(e, kind)]


def transitions(groups):
    return {(e.task_id, e.to) for e in effects(groups, Transition)}


def test_pick_gives_slot_to_oldest_task_of_an_actor_not_granted_last():
    ts = [task(1, "alice", age_s=300), task(2, "alice", age_s=200), task(3, "bob", age_s=100)]
    g = decide(state(ts, last="alice"), ClusterView(), NOW, S)
    assert (3, lc.PROVISIONING) in transitions(g)
    g = decide(state(ts, last="bob"), ClusterView(), NOW, S)
    assert (1, lc.PROVISIONING) in transitions(g)


def test_only_one_task_of_a_queue_acquires_at_a_time():
    ts = [task(1, phase=lc.PROVISIONING, pool="falcon-t1-2x2"), task(2, "bob"), task(3, "carol")]
    g = decide(state(ts, [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1)]), ClusterView(synced=True), NOW, S)
    assert not any(e.to == lc.PROVISIONING and e.task_id in (2, 3) for e in effects(g, Transition))


def test_reservation_short_waits_in_cluster_busy_and_never_falls_back():
    t = task(1, phase=lc.PROVISIONING, supply_mode="reservation")
    g = decide(state([t]), ClusterView(reservation=ReservationView(count=4, in_use=4)), NOW, S)
    assert transitions(g) == {(1, lc.CLUSTER_BUSY)}
    assert not effects(g, CreateLease) and not effects(g, EnsurePool)
    msg = effects(g, Transition)[0].message
    assert "reservation_remaining_slices=0" in msg and "reservation_needed_slices=1" in msg


def test_reservation_headroom_back_creates_pool_with_reservation_affinity():
    t = task(1, phase=lc.CLUSTER_BUSY)
    g = decide(state([t]), ClusterView(reservation=ReservationView(count=4, in_use=3)), NOW, S)
    assert (1, lc.PROVISIONING) in transitions(g)
    (create,) = effects(g, CreateLease)
    (ensure,) = effects(g, EnsurePool)
    assert create.supply_mode == "reservation" and ensure.name == create.name
    assert ensure.request["config"]["reservationAffinity"]["values"] == ["res-a"]


def test_no_reservation_on_cluster_defaults_to_flex_start():
    t = task(1, phase=lc.PROVISIONING)
    g = decide(state([t], c=cluster(reservation="")), ClusterView(), NOW, S)
    (create,) = effects(g, CreateLease)
    assert create.supply_mode == "flex-start"


def test_pick_hands_an_idle_pool_straight_to_the_next_task():
    """The hand-over and the Job's submit are one group: Idle -> InUse, Dispatching, SubmitJob."""
    ts = [task(2, "bob")]
    g = decide(state(ts, [lease(7, "falcon-t1-2x2", LeaseState.IDLE)]), ClusterView(), NOW, S)
    assert (2, lc.DISPATCHING) in transitions(g)
    (mv,) = effects(g, MoveLease)
    assert (mv.expect, mv.to, mv.fields["task_id"]) == ((LeaseState.IDLE,), LeaseState.IN_USE, 2)
    (sub,) = effects(g, SubmitJob)
    assert sub.task_id == 2 and sub.first and sub.phase == lc.DISPATCHING
    (group,) = [x for x in g if any(isinstance(e, SubmitJob) for e in x.effects)]
    assert [type(e) for e in group.effects][-3:] == [MoveLease, Transition, SubmitJob]  # the pick is won before the submit
    assert not effects(g, CreateLease)


def test_a_hand_over_to_a_task_with_a_refused_submit_leaves_the_submit_to_the_next_round():
    ts = [task(2, "bob")]
    refused = {2: SubmitError("transient", "apiserver busy")}
    g = decide(state(ts, [lease(7, "falcon-t1-2x2", LeaseState.IDLE)], submit_errors=refused), ClusterView(), NOW, S)
    (mv,) = effects(g, MoveLease)
    assert mv.to == LeaseState.READY and not effects(g, SubmitJob)


def test_finished_job_keeps_pool_when_same_topology_task_waits():
    running = task(1, phase=lc.RUNNING, pool="falcon-t1-2x2", dispatched_s=10)
    view = ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Succeeded", 0, 0, 1)})
    g = decide(state([running, task(2, "bob")], [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1)]), view, NOW, S)
    kinds = [type(e) for e in g[0].effects]
    assert kinds == [Transition, MoveLease, DeleteJob]  # a succeeded Job holds no TPU: the pool kept Idle moves with the terminal write
    assert g[0].effects[1].to == LeaseState.IDLE
    assert (1, lc.SUCCEEDED) in transitions(g)


def test_finished_job_deletes_pool_when_nobody_waits():
    running = task(1, phase=lc.RUNNING, pool="falcon-t1-2x2", dispatched_s=10)
    view = ClusterView(
        jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Failed", 0, 0, 1, "Pod terminated: OOMKilled (exit code 137)")},
        pools={"falcon-t1-2x2": PoolView("falcon-t1-2x2", "RUNNING", 1, 1)},
    )
    g = decide(state([running], [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1)]), view, NOW, S)
    assert effects(g, DeletePool) == [DeletePool("falcon-t1-2x2")]
    (tr,) = effects(g, Transition)
    assert tr.to == lc.failed(Reason.JOB_FAILED) and "OOMKilled (exit code 137)" in tr.message


def test_abort_while_provisioning_keeps_pool_for_next_task():
    ts = [task(1, phase=lc.ABORTING, pool="falcon-t1-2x2"), task(2, "bob")]
    g = decide(state(ts, [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1)]), ClusterView(), NOW, S)
    abort = next(gr for gr in g if gr.what.endswith(": abort"))
    assert [type(e) for e in abort.effects] == [MoveLease, Transition]
    assert abort.effects[0].to == LeaseState.IDLE and abort.effects[1].to == lc.ABORTED


def test_abort_while_running_deletes_job_then_pool_then_aborts():
    t = task(1, phase=lc.ABORTING, pool="falcon-t1-2x2")
    view = ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Running", 1, 1, 1)})
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1)]), view, NOW, S)
    assert "waiting for the Kubernetes Job to be deleted" in g[0].effects[0].message
    assert [type(e) for e in g[1].effects] == [DeleteJob, MoveLease, DeletePool, Transition]


def test_abort_while_waiting_only_writes_aborted():
    text = "Aborting, waiting for the Kubernetes Job to be deleted and the node pool cleaned up..."
    g = decide(state([task(1, phase=lc.ABORTING, message=text)]), ClusterView(), NOW, S)
    assert [type(e) for e in g[0].effects] == [Transition]


def test_control_plane_not_running_in_time_gives_the_pool_back_then_fails_node_pool_timeout():
    view = ClusterView(pools={"falcon-t1-2x2": PoolView("falcon-t1-2x2", "PROVISIONING", 0, 0)}, ops={"falcon-t1-2x2": OpView("create", "running")})
    t = task(1, phase=lc.PROVISIONING, pool="falcon-t1-2x2", in_phase_s=700)
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1, age_s=601)]), view, NOW, S)
    assert transitions(g) == {(1, lc.WAITING)}, "GKE is slow, not the task: back at the head of the queue"
    assert effects(g, DeletePool)
    move = effects(g, Transition)[0]
    assert "within 10m of accepting its create" in move.message and "release 1 of at most 3" in move.message, move.message
    # past pool_release_limit the next slow create ends it NodePoolTimeout, saying so
    released = tuple(Disruption(i, "released", "", f"falcon-task-1-a{i}", "slow", NOW - dt.timedelta(days=1)) for i in range(3))
    t = dataclasses.replace(t, disruptions=released)
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1, age_s=601)]), view, NOW, S)
    assert transitions(g) == {(1, lc.failed(Reason.NODE_POOL_TIMEOUT))}
    assert effects(g, DeletePool)
    assert "(10m)" in effects(g, Transition)[0].message and "gave 3 earlier node pool(s) back" in effects(g, Transition)[0].message


def test_waiting_for_node_is_kept_past_the_timeout_when_no_other_topology_waits():
    t = task(1, phase=lc.WAITING_FOR_NODE, pool="falcon-t1-2x2", in_phase_s=4000)
    view = ClusterView(pools={"falcon-t1-2x2": PoolView("falcon-t1-2x2", "RUNNING", 0, 0)}, ops={"falcon-t1-2x2": OpView("create", "done")})
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1, age_s=5000)]), view, NOW, S)
    assert not transitions(g)
    # another topology waiting changes nothing for a pool with no node: it holds no capacity (issue 37)
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1, age_s=5000)], other_topology_waiting=True), view, NOW, S)
    assert not transitions(g)


def test_pool_running_with_nodes_registering_is_waiting_for_node_then_dispatching():
    t = task(1, phase=lc.PROVISIONING, pool="falcon-t1-2x2")
    ls = [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1)]
    view = ClusterView(pools={"falcon-t1-2x2": PoolView("falcon-t1-2x2", "RUNNING", 0, 0)})
    g = decide(state([t], ls), view, NOW, S)
    (tr,) = effects(g, Transition)
    assert tr.to == lc.WAITING_FOR_NODE and "0/1 expected node(s) registered (Ready=0)" in tr.message
    view = ClusterView(pools={"falcon-t1-2x2": PoolView("falcon-t1-2x2", "RUNNING", 1, 1)})
    g = decide(state([t], ls), view, NOW, S)
    assert (1, lc.DISPATCHING) in transitions(g)


def test_quota_error_fails_node_pool_failed_with_the_api_message():
    t = task(1, phase=lc.PROVISIONING, pool="falcon-t1-2x2")
    view = ClusterView(ops={"falcon-t1-2x2": OpView("create", "failed", 1, "quota_exceeded", "Quota 'TPUS_PER_PROJECT' exceeded")})
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.REQUESTED, 1)]), view, NOW, S)
    (tr,) = effects(g, Transition)
    assert tr.to == lc.failed(Reason.NODE_POOL_FAILED) and "TPUS_PER_PROJECT" in tr.message


def test_flex_pool_not_yet_visible_is_kept_within_the_grace():
    t = task(1, phase=lc.PROVISIONING, pool="falcon-t1-2x2")
    view = ClusterView(ops={"falcon-t1-2x2": OpView("create", "done")})
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1, mode="flex-start", age_s=5)], c=cluster("")), view, NOW, S)
    assert not effects(g, DeletePool) and not transitions(g)
    assert "not yet visible" in effects(g, UpdateTask)[0].message


def test_deleting_flex_lease_is_not_marked_deleted_before_the_grace():
    ls = [lease(1, "falcon-t1-2x2", LeaseState.DELETING, None, mode="flex-start", age_s=5)]
    g = decide(state([], ls), ClusterView(ops={"falcon-t1-2x2": OpView("delete", "done")}), NOW, S)
    assert not any(e.to == LeaseState.DELETED for e in effects(g, MoveLease))
    ls = [lease(1, "falcon-t1-2x2", LeaseState.DELETING, None, mode="flex-start", age_s=500)]
    g = decide(state([], ls), ClusterView(ops={"falcon-t1-2x2": OpView("delete", "done")}), NOW, S)
    assert any(e.to == LeaseState.DELETED for e in effects(g, MoveLease))


def test_timeout_counts_from_dispatched_at():
    t = task(1, phase=lc.RUNNING, pool="p", dispatched_s=3601, timeout_seconds=3600)
    view = ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Running", 1, 1, 1)})
    g = decide(state([t]), view, NOW, S)
    assert transitions(g) == {(1, lc.failed(Reason.TIMEOUT))}
    assert effects(g, DeleteJob)
    t = task(1, phase=lc.RUNNING, pool="p", dispatched_s=3599, timeout_seconds=3600, message="Pod running (1/1 active)")
    assert not transitions(decide(state([t]), view, NOW, S))


def test_dispatching_submits_the_job_once_and_running_when_every_pod_is_ready():
    t = task(1, phase=lc.DISPATCHING, pool="falcon-t1-2x4", topology="2x4")
    ls = [lease(1, "falcon-t1-2x4", LeaseState.READY, 1)]
    g = decide(state([t], ls), ClusterView(), NOW, S)
    (sub,) = effects(g, SubmitJob)
    assert sub.first and sub.service is not None  # 2x4 is two hosts: Indexed Job + headless Service
    view = ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Running", 2, 1, 2)})
    assert not transitions(decide(state([t], ls), view, NOW, S))
    view = ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Running", 2, 2, 2)})
    assert (1, lc.RUNNING) in transitions(decide(state([t], ls), view, NOW, S))


def test_refused_job_fails_job_submit_failed():
    t = task(1, phase=lc.DISPATCHING, pool="falcon-t1-2x2")
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.READY, 1)], submit_errors={1: SubmitError("permanent", "admission webhook denied")}), ClusterView(), NOW, S)
    (tr,) = effects(g, Transition)
    assert tr.to == lc.failed(Reason.JOB_SUBMIT_FAILED) and "admission webhook denied" in tr.message


def test_waiting_messages_show_position_and_tasks_ahead_and_are_written_only_when_changed():
    holder = task(1, "alice", phase=lc.PROVISIONING, pool="falcon-t1-2x2")
    w = [task(2, "bob", age_s=50), task(3, "carol", age_s=40)]
    ls = [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1)]
    g = decide(state([holder, *w], ls, last="alice"), ClusterView(ops={"falcon-t1-2x2": OpView("create", "running")}), NOW, S)
    (refresh,) = effects(g, RefreshMessages)
    msgs = {tid: m for tid, _, m in refresh.updates}
    assert msgs[3] == "Queue position #3, 2 task(s) ahead (alice: t1, bob: t2)"
    w2 = [task(2, "bob", age_s=50, message=msgs[2]), task(3, "carol", age_s=40, message=msgs[3])]
    g = decide(state([holder, *w2], ls, last="alice"), ClusterView(ops={"falcon-t1-2x2": OpView("create", "running")}), NOW, S)
    assert not effects(g, RefreshMessages)


def test_maintenance_cluster_rehomes_waiting_tasks_and_deletes_idle_pools():
    c = cluster(status="maintenance")
    g = decide(state([task(2)], [lease(1, "falcon-t1-2x2", LeaseState.IDLE)], c=c, alternatives_exist=True), ClusterView(), NOW, S)
    assert effects(g, Unassign) and effects(g, DeletePool)
    assert not effects(g, Transition)  # nobody is picked: no Provisioning or Dispatching move grants the slot


def test_job_of_a_task_that_is_no_longer_live_is_deleted():
    view = ClusterView(jobs={9: JobView(9, "falcon-task-9", "ns", "u", "Succeeded", 0, 0, 1)})
    g = decide(state([]), view, NOW, S)
    assert effects(g, DeleteJob) == [DeleteJob(9, "ns", "falcon-task-9")]


def test_acquiring_task_switches_to_a_pool_that_became_idle():
    t = task(2, "bob", phase=lc.PROVISIONING, pool="falcon-t2-2x2")
    ls = [lease(1, "falcon-t2-2x2", LeaseState.CREATING, 2), lease(2, "falcon-t1-2x2", LeaseState.IDLE)]
    g = decide(state([t], ls), ClusterView(ops={"falcon-t2-2x2": OpView("create", "running")}), NOW, S)
    assert (2, lc.DISPATCHING) in transitions(g)
    assert DeletePool("falcon-t2-2x2") in effects(g)  # nobody else waits: its own create is abandoned


@pytest.mark.parametrize("src", lc.LIVE_PHASES)
def test_every_decided_transition_is_in_the_lifecycle_table(src):
    """Whatever decide() emits must be an allowed edge (the store would refuse it)."""
    t = task(1, phase=src, pool="falcon-t1-2x2", dispatched_s=10)
    views = [
        ClusterView(),
        ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Succeeded", 0, 0, 1)}),
        ClusterView(pools={"falcon-t1-2x2": PoolView("falcon-t1-2x2", "RUNNING", 1, 1)}, reservation=ReservationView(4, 0)),
    ]
    for v in views:
        for g in decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1)]), v, NOW, S):
            for e in g.effects:
                if isinstance(e, Transition):
                    assert all(lc.allowed(s, e.to) for s in e.expect), e


def test_finished_pool_is_kept_for_an_acquiring_task_whose_own_pool_is_not_ready():
    running = task(1, phase=lc.RUNNING, pool="falcon-t1-2x2", dispatched_s=10)
    acquiring = task(2, "bob", phase=lc.WAITING_FOR_NODE, pool="falcon-t2-2x2")
    ls = [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1), lease(2, "falcon-t2-2x2", LeaseState.CREATING, 2)]
    view = ClusterView(
        jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Succeeded", 0, 0, 1)},
        pools={"falcon-t2-2x2": PoolView("falcon-t2-2x2", "RUNNING", 0, 0)},
    )
    g = decide(state([running, acquiring], ls), view, NOW, S)
    moves = {(e.name, e.to) for e in effects(g, MoveLease)}
    assert ("falcon-t1-2x2", LeaseState.IDLE) in moves
    assert not effects(g, DeletePool)


def test_unreadable_reservation_fails_when_permanent_and_says_why_when_transient():
    t = task(1, phase=lc.PROVISIONING)
    g = decide(state([t]), ClusterView(reservation_error=ReservationError("not_found", "reservation res-a not found")), NOW, S)
    (tr,) = effects(g, Transition)
    assert tr.to == lc.failed(Reason.NODE_POOL_FAILED) and "res-a not found" in tr.message
    g = decide(state([t]), ClusterView(reservation_error=ReservationError("transient", "503 backend error")), NOW, S)
    assert not transitions(g)
    assert "503 backend error" in effects(g, UpdateTask)[0].message


def test_pools_and_jobs_carry_the_installation_mark():
    t = task(1, phase=lc.PROVISIONING)
    g = decide(state([t]), ClusterView(reservation=ReservationView(4, 0)), NOW, S.model_copy(update={"installation": "prod"}))
    (ensure,) = effects(g, EnsurePool)
    assert ensure.request["config"]["resourceLabels"]["falcon-installation"] == "prod"
    t = task(1, phase=lc.DISPATCHING, pool="falcon-t1-2x2")
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.READY, 1)]), ClusterView(), NOW, S)
    (sub,) = effects(g, SubmitJob)
    assert sub.manifest["metadata"]["labels"]["falcon.dev/installation"] == "default"


def test_pool_in_error_waits_for_the_operation_to_report_the_apis_own_message():
    t = task(1, phase=lc.PROVISIONING, pool="falcon-t1-2x2")
    ls = [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1)]
    pools = {"falcon-t1-2x2": PoolView("falcon-t1-2x2", "ERROR", 0, 0, "")}
    g = decide(state([t], ls), ClusterView(pools=pools, ops={"falcon-t1-2x2": OpView("create", "running")}), NOW, S)
    assert not transitions(g)
    failed_op = OpView("create", "failed", 1, "quota_exceeded", "Quota 'TPUS_PER_PROJECT' exceeded")
    g = decide(state([t], ls), ClusterView(pools=pools, ops={"falcon-t1-2x2": failed_op}), NOW, S)
    assert "TPUS_PER_PROJECT" in effects(g, Transition)[0].message


def test_unreachable_cluster_says_so_then_times_out_like_a_create_that_never_came_back():
    view = ClusterView(error="RefreshError: metadata server unreachable", synced=False)
    g = decide(state([task(1, phase=lc.PROVISIONING, in_phase_s=30)]), view, NOW, S)
    assert not transitions(g)
    assert "Cannot reach cluster edge-a yet (RefreshError" in effects(g, UpdateTask)[0].message
    g = decide(state([task(1, phase=lc.PROVISIONING, in_phase_s=601)]), view, NOW, S)
    (tr,) = effects(g, Transition)
    assert tr.to == lc.failed(Reason.NODE_POOL_TIMEOUT) and "unreachable for 601s" in tr.message


def test_a_cluster_actor_still_connecting_never_fails_a_task():
    """The ClusterActor building its clients (a restart, a loaded head) is the controller's
    own time: a Provisioning task waits, its create queued, and is told why; past the create's
    limit it is not failed (the soak's kills made 30 such NodePoolTimeouts otherwise)."""
    view = ClusterView(error="cluster edge-a not connected yet: not started since 12:00:00 UTC", synced=False, connecting=True)
    g = decide(state([task(1, phase=lc.PROVISIONING, in_phase_s=5000)]), view, NOW, S)
    assert not transitions(g)
    assert "not connected yet" in effects(g, UpdateTask)[0].message
    t = task(1, phase=lc.PROVISIONING, pool="falcon-t1-2x2", in_phase_s=5000)
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.REQUESTED, 1, age_s=5000)]), view, NOW, S)
    assert not transitions(g) and not effects(g, DeletePool)
    # the same wait with a failed connect attempt is GKE's (or IAM's) answer: it times out
    failed = ClusterView(error="cannot connect to cluster edge-a (attempt 3): 403", synced=False)
    g = decide(state([t], [lease(1, "falcon-t1-2x2", LeaseState.REQUESTED, 1, age_s=5000)]), failed, NOW, S)
    assert transitions(g) == {(1, lc.failed(Reason.NODE_POOL_TIMEOUT))}


def test_an_idle_pool_whose_create_never_finished_is_not_handed_over():
    """A task aborted mid-create left its pool Idle: nobody gets it until the create finished."""
    t = NOW - dt.timedelta(seconds=30)
    unfinished = Lease(7, "c1", "2x2", "falcon-t1-2x2", "reservation", "Idle", None, None, 0, "", t, t, None, t, None)
    g = decide(state([task(2, "bob")], [unfinished]), ClusterView(pools={"falcon-t1-2x2": PoolView("falcon-t1-2x2", "PROVISIONING", 0, 0)}), NOW, S)
    assert (2, lc.DISPATCHING) not in transitions(g)
    # its create then fails: the pool is deleted, never handed over
    failed = OpView("create", "failed", 1, "quota_exceeded", "Quota exceeded")
    g = decide(state([task(2, "bob", phase=lc.PROVISIONING)], [unfinished]), ClusterView(ops={"falcon-t1-2x2": failed}), NOW, S)
    assert (2, lc.DISPATCHING) not in transitions(g)
    assert any(isinstance(e, DeletePool) and e.name == "falcon-t1-2x2" for e in effects(g))
    # or it finishes: it is marked ready, and handed over on the next decision
    up = ClusterView(pools={"falcon-t1-2x2": PoolView("falcon-t1-2x2", "RUNNING", 1, 1)})
    g = decide(state([task(2, "bob")], [unfinished]), up, NOW, S)
    assert any(isinstance(e, MarkReady) for e in effects(g))


def test_an_idle_pool_still_held_by_an_earlier_job_is_not_handed_over():
    held = JobView(1, "falcon-task-1", "ns", "u", "Running", 1, 1, 1, node_pool="falcon-t1-2x2")
    g = decide(state([task(2, "bob")], [lease(7, "falcon-t1-2x2", LeaseState.IDLE)]), ClusterView(jobs={1: held}), NOW, S)
    assert (2, lc.DISPATCHING) not in transitions(g)
    gone = JobView(1, "falcon-task-1", "ns", "u", "Deleted", 0, 0, 1, node_pool="falcon-t1-2x2")
    g = decide(state([task(2, "bob")], [lease(7, "falcon-t1-2x2", LeaseState.IDLE)]), ClusterView(jobs={1: gone}), NOW, S)
    assert (2, lc.DISPATCHING) in transitions(g)


def test_a_refused_job_deletes_its_pool_even_when_tasks_wait():
    t = task(1, phase=lc.DISPATCHING, pool="falcon-t1-2x2")
    ls = [lease(1, "falcon-t1-2x2", LeaseState.READY, 1)]
    g = decide(state([t, task(2, "bob")], ls, submit_errors={1: SubmitError("permanent", "denied")}), ClusterView(), NOW, S)
    assert (1, lc.failed(Reason.JOB_SUBMIT_FAILED)) in transitions(g)
    assert any(isinstance(e, DeletePool) for e in effects(g))
    assert not any(isinstance(e, MoveLease) and e.to == LeaseState.IDLE for e in effects(g))


def test_a_timed_out_job_is_deleted_after_the_terminal_write_and_before_its_pool_is_kept():
    t = task(1, phase=lc.RUNNING, pool="falcon-t1-2x2", dispatched_s=7300)
    view = ClusterView(jobs={1: JobView(1, "falcon-task-1", "ns", "u", "Running", 1, 1, 1)})
    g = decide(state([t, task(2, "bob")], [lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1)]), view, NOW, S)
    (grp,) = [g_ for g_ in g if "finish" in g_.what]
    kinds = [type(e).__name__ for e in grp.effects]
    # terminal first: a group stopped after the delete must not leave a live task with no Job
    assert kinds.index("Transition") < kinds.index("DeleteJob") < kinds.index("MoveLease"), kinds


def test_higher_priority_is_picked_first_then_fifo_and_round_robin_within_it():
    ts = [
        task(1, "alice", age_s=300),
        task(2, "bob", age_s=200, priority=10),
        task(3, "carol", age_s=100, priority=10),
        task(4, "bob", age_s=50, priority=10),
    ]
    g = decide(state(ts, last="bob"), ClusterView(), NOW, S)
    assert (3, lc.PROVISIONING) in transitions(g)  # top priority; bob was granted last
    (refresh,) = effects(g, RefreshMessages)
    order = [tid for tid, _, _ in refresh.updates]
    assert order == [2, 4, 1]  # positions follow the same order: priority, then the pick rule


def test_priority_never_preempts_the_slot_holder():
    holder = task(1, "alice", phase=lc.PROVISIONING, pool="falcon-t1-2x2")
    urgent = task(2, "bob", priority=100)
    g = decide(state([holder, urgent], [lease(1, "falcon-t1-2x2", LeaseState.CREATING, 1)]), ClusterView(), NOW, S)
    assert (2, lc.PROVISIONING) not in transitions(g)
    assert not any(e.task_id == 1 and e.to == lc.ABORTED for e in effects(g, Transition))


@pytest.mark.parametrize("bad", [101, -101, "5", True, 1.5])
def test_priority_is_an_integer_from_minus_100_to_100(bad):
    from falcon_ray.spec import SpecError

    with pytest.raises(SpecError, match="priority"):
        spec(priority=bad)


def test_the_idle_pool_with_ready_nodes_is_handed_over_before_an_emptied_one():
    """Two idle flex-start pools of the topology: the autoscaler emptied the first. The next
    task must get the one with nodes, not wait on the empty one for capacity the other holds."""
    empty, full = "falcon-t1-2x2", "falcon-t3-2x2"
    idle = [lease(7, empty, LeaseState.IDLE, mode="flex-start"), lease(8, full, LeaseState.IDLE, mode="flex-start")]
    view = ClusterView(pools={empty: PoolView(empty, "RUNNING", 0, 0), full: PoolView(full, "RUNNING", 1, 1)})
    g = decide(state([task(2, "bob")], idle), view, NOW, S)
    (taken,) = [e for e in effects(g, MoveLease) if e.to == LeaseState.IN_USE]
    assert taken.name == full and taken.fields["task_id"] == 2


DAY = 86400.0


@pytest.mark.parametrize(
    "nodes_age_s, timeout_s, handed",
    [
        (None, 6 * DAY, True),  # no node now: the task gets fresh VMs, a full seven days
        (3600, 6 * DAY, True),  # an hour-old node outlives a six-day run
        (6 * DAY, 12 * 3600, True),  # a day left, a 12-hour run (and its start) fits
        (6 * DAY, DAY, False),  # a day left, a one-day run does not: GKE would delete the VMs mid-run
        (7 * DAY - 300, 60, False),  # five minutes left: not even a minute's run plus its start
    ],
)
def test_a_flex_start_pool_is_handed_only_to_a_task_its_nodes_outlive(nodes_age_s, timeout_s, handed):
    """GKE deletes a flex-start pool's VMs maxRunDuration (seven days) after they came: a task
    handed the pool runs on those nodes, so it gets the pool only when its whole run fits in
    what is left of the oldest one; otherwise it creates its own pool."""
    name = "falcon-t1-2x2"
    since = None if nodes_age_s is None else NOW - dt.timedelta(seconds=nodes_age_s)
    view = ClusterView(pools={name: PoolView(name, "RUNNING", 1, 1, nodes_since=since)})
    ts = [task(2, "bob", supply_mode="flex-start", timeout_seconds=int(timeout_s))]
    g = decide(state(ts, [lease(7, name, LeaseState.IDLE, mode="flex-start")]), view, NOW, S)
    taken = [e for e in effects(g, MoveLease) if e.to == LeaseState.IN_USE and e.name == name]
    assert bool(taken) == handed, g
    if not handed:
        assert effects(g, CreateLease) and (2, lc.PROVISIONING) in transitions(g)


# ---- an idle pool whose create its task abandoned: its timeout counts from GKE's acceptance ----


def abandoned(age_s: float, accepted_s: float | None = None, operation: str | None = None) -> Lease:
    t = NOW - dt.timedelta(seconds=age_s)
    accepted = None if accepted_s is None else NOW - dt.timedelta(seconds=accepted_s)
    return Lease(1, "c1", "2x2", "falcon-t1-2x2", "reservation", LeaseState.IDLE.value, None, operation, 0, "", t, t, None, t,
                 None, accepted_at=accepted)


@pytest.mark.parametrize(
    "name, pool, op, deleted, recorded",
    [
        ("still queued behind the cluster's operations an hour after its row: kept", abandoned(3600),
         OpView("create", "queued"), False, False),
        ("queued past create_queue_limit_s: deleted (cancels the queued create)", abandoned(S.create_queue_limit_s + 1),
         OpView("create", "queued"), True, False),
        ("accepted after it went idle: the acceptance is recorded, not late", abandoned(3600),
         OpView("create", "running", operation="op-7"), False, True),
        ("accepted 599s ago, row an hour old: kept", abandoned(3600, accepted_s=599),
         OpView("create", "running", operation="op-7"), False, False),
        ("accepted 601s ago, control plane not up: deleted", abandoned(3600, accepted_s=601),
         OpView("create", "running", operation="op-7"), True, False),
    ],
)
def test_abandoned_create_is_late_from_gke_acceptance(name, pool, op, deleted, recorded):
    g = decide(state([task(2)], [pool]), ClusterView(ops={"falcon-t1-2x2": op}), NOW, S)  # task 2 waits for it
    assert any("did not finish in time" in x.what for x in g) == deleted, name
    assert bool(effects(g, DeletePool)) == deleted, name
    assert bool(effects(g, RecordOperation)) == recorded, name


# ---- issue 37: the slot serializes acquiring new capacity, not reuse ------------------------------


def _flex_holder(pool_ready: int = 0, in_phase_s: float = 200):
    """Task 1 holds the slot in WaitingForNode on its new flex-start pool (Job submitted, 0
    nodes, for less than ``capacity_wait_park_s`` by default); an idle pool of the topology
    has its node Ready (``pool_ready`` on the holder's)."""
    holder = task(1, phase=lc.WAITING_FOR_NODE, pool="falcon-t1-2x2", in_phase_s=in_phase_s, supply_mode="flex-start")
    own = lease(1, "falcon-t1-2x2", LeaseState.IN_USE, 1, age_s=1900, mode="flex-start")
    idle = lease(2, "falcon-t9-2x2", LeaseState.IDLE, None, age_s=4000, mode="on-demand")
    pools = {
        "falcon-t1-2x2": PoolView("falcon-t1-2x2", "RUNNING", pool_ready, pool_ready),
        "falcon-t9-2x2": PoolView("falcon-t9-2x2", "RUNNING", 1, 1, nodes_since=NOW - dt.timedelta(seconds=3000)),
    }
    jobs = {1: JobView(1, "falcon-task-1", "falcon-jobs", "u1", "Pending", 0, 0, 1, node_pool="falcon-t1-2x2")}
    return holder, own, idle, ClusterView(pools=pools, jobs=jobs, synced=True)


def test_a_waiting_task_takes_a_ready_idle_pool_while_the_slot_holder_waits_for_flex_capacity():
    holder, own, idle, view = _flex_holder()
    waiting = task(2, actor="bob", age_s=50)
    second = lease(3, "falcon-t8-2x2", LeaseState.IDLE, None, age_s=4000, mode="on-demand")
    pools = {**view.pools, "falcon-t8-2x2": PoolView("falcon-t8-2x2", "RUNNING", 1, 1, nodes_since=NOW)}
    view = ClusterView(pools=pools, jobs=view.jobs, synced=True)
    g = decide(state([holder, waiting], [own, idle, second]), view, NOW, S)
    moves = transitions(g)
    assert moves == {(1, lc.DISPATCHING), (2, lc.DISPATCHING)}, "the holder takes one, the waiting task the other"
    claims = {e.lease_id: e.fields["task_id"] for e in effects(g, MoveLease) if e.lease_id in (2, 3)}
    assert sorted(claims.values()) == [1, 2], claims
    # the original's strict rule: the waiting task stays behind the slot holder until it runs
    strict = Settings(node_pool_timeout_s=600, create_visibility_grace_s=120, strict_slot=True)
    g = decide(state([holder, waiting], [own, idle, second]), view, NOW, strict)
    assert transitions(g) == {(1, lc.DISPATCHING)}
    # and a Dispatching hand-over holds the slot under the strict rule only
    dispatching = task(1, phase=lc.DISPATCHING, pool="falcon-t9-2x2", in_phase_s=5)
    in_use = lease(2, "falcon-t9-2x2", LeaseState.READY, 1, age_s=4000, mode="on-demand")
    for settings, picked in ((S, True), (strict, False)):
        g = decide(state([dispatching, waiting], [in_use, second]), view, NOW, settings)
        assert ((2, lc.DISPATCHING) in transitions(g)) is picked


def test_a_hand_over_past_the_slot_needs_every_node_ready():
    holder, own, idle, view = _flex_holder()
    waiting = task(2, actor="bob", age_s=50, supply_mode="flex-start")  # the holder's supply: its slot
    emptied = dict(view.pools)
    emptied["falcon-t9-2x2"] = PoolView("falcon-t9-2x2", "RUNNING", 0, 0)  # the autoscaler took its node
    g = decide(state([holder, waiting], [own, idle]), ClusterView(pools=emptied, jobs=view.jobs, synced=True), NOW, S)
    assert (2, lc.DISPATCHING) not in transitions(g), "a pool with no node would acquire capacity: that waits for the slot"
    assert not [e for e in effects(g, MoveLease) if e.lease_id == 2 and e.to != LeaseState.DELETING], "nor does the holder switch to it"


def test_a_task_waiting_for_flex_nodes_switches_to_a_ready_idle_pool_and_its_new_pool_goes():
    holder, own, idle, view = _flex_holder()
    g = decide(state([holder], [own, idle]), view, NOW, S)
    assert transitions(g) == {(1, lc.DISPATCHING)}
    recorded = [e for g_ in g for e in g_.effects if type(e).__name__ == "RecordDisruption"]
    assert recorded and recorded[0].kind == "switched" and recorded[0].job == "falcon-task-1", recorded
    assert {e.name for e in effects(g, DeletePool)} == {"falcon-t1-2x2"}
    assert effects(g, DeleteJob), "the Job on the empty pool goes"
    assert not effects(g, SubmitJob), "the next attempt's Job waits for the old one to be gone"
    move = next(e for e in effects(g, Transition) if e.task_id == 1)
    assert move.fields["node_pool_name"] == "falcon-t9-2x2" and "falcon-t9-2x2" in move.message
    assert "dispatched_at" in move.fields and move.fields["dispatched_at"] is None, "the next Job's timeout clock starts afresh"


def test_a_task_whose_flex_nodes_came_does_not_switch():
    holder, own, idle, view = _flex_holder(pool_ready=1)
    jobs = {1: JobView(1, "falcon-task-1", "falcon-jobs", "u1", "Pending", 0, 0, 1, node_pool="falcon-t1-2x2")}
    g = decide(state([holder], [own, idle]), ClusterView(pools=view.pools, jobs=jobs, synced=True), NOW, S)
    assert "falcon-t1-2x2" not in {e.name for e in effects(g, DeletePool)} and (1, lc.DISPATCHING) not in transitions(g)


def test_each_supply_mode_has_its_own_slot():
    """A task waiting for one supply's capacity does not hold back a task of the queue that
    would take another supply: a reservation task is picked (and creates on the reservation)
    while a flex-start holder waits for GKE's capacity, and a flex-start task while a
    reservation task waits for room (ClusterBusy). Not with ``slot_per_supply: false`` nor
    the strict slot; a task of the holder's own supply still waits."""
    per = S.model_copy(update={"slot_per_supply": True})
    holder, own, _idle, view = _flex_holder()
    res_task = task(2, actor="bob", age_s=50)  # the cluster's default: reservation
    flex_task = task(3, actor="carol", age_s=40, supply_mode="flex-start")
    room = ClusterView(pools=view.pools, jobs=view.jobs, synced=True, reservation=ReservationView(count=4, in_use=0, machine_type="ct6e-standard-4t"))

    def moved(tasks, leases, v, settings=per):
        return {e.task_id: e.to for e in effects(decide(state(tasks, leases), v, NOW, settings), Transition) if e.to != lc.WAITING}

    got = moved([holder, res_task, flex_task], [own], room)
    assert got.get(2) == lc.PROVISIONING and 3 not in got, got
    assert 2 not in moved([holder, res_task], [own], room, S), "the default: one slot for the queue"
    assert 2 not in moved([holder, res_task], [own], room, per.model_copy(update={"strict_slot": True}))

    busy = task(4, phase=lc.CLUSTER_BUSY, age_s=600, in_phase_s=500)  # a reservation task waiting for room
    full = ClusterView(pools={}, jobs={}, synced=True, reservation=ReservationView(count=4, in_use=4, machine_type="ct6e-standard-4t"))
    got = moved([busy, task(5, actor="bob", age_s=50), flex_task], [], full)
    assert got.get(3) == lc.PROVISIONING and 5 not in got, got


def test_a_task_on_its_own_supply_slot_takes_another_supply_s_idle_pool_only_with_every_node_ready():
    per = S.model_copy(update={"slot_per_supply": True})
    holder, own, idle, view = _flex_holder()  # the idle pool is on-demand
    res_task = task(2, actor="bob", age_s=50)
    emptied = {**view.pools, "falcon-t9-2x2": PoolView("falcon-t9-2x2", "RUNNING", 0, 0)}
    g = decide(state([holder, res_task], [own, idle]), ClusterView(pools=emptied, jobs=view.jobs, synced=True), NOW, per)
    assert (2, lc.PROVISIONING) in transitions(g), "it creates on the reservation"
    assert (2, lc.DISPATCHING) not in transitions(g), "the empty on-demand pool would wait for on-demand capacity"
    second = lease(3, "falcon-t8-2x2", LeaseState.IDLE, None, age_s=4000, mode="on-demand")
    ready = {**view.pools, "falcon-t8-2x2": PoolView("falcon-t8-2x2", "RUNNING", 1, 1, nodes_since=NOW)}
    g = decide(state([holder, res_task], [own, idle, second]), ClusterView(pools=ready, jobs=view.jobs, synced=True), NOW, per)
    assert {(1, lc.DISPATCHING), (2, lc.DISPATCHING)} <= transitions(g), "every node Ready: a hand-over acquires nothing"


def test_a_parked_capacity_wait_frees_the_slot_for_the_next_create():
    """A flex-start holder whose created pool has had no node for ``capacity_wait_park_s``
    waits for GKE's capacity, not for Falcon: the next task is picked and creates its own
    pool, up to ``capacity_waits_per_queue`` such waits; never under the strict slot, never
    before the park time, never once a node has come."""
    waiting = task(2, actor="bob", age_s=50, supply_mode="flex-start")  # the holder's supply: its slot
    parks = S.model_copy(update={"capacity_waits_per_queue": 3})
    park = S.capacity_wait_park_s
    assert S.capacity_waits_per_queue == 1, "the default holds the slot until Running"

    def picked(settings=parks, in_phase_s=park, registered=0, others=()):
        holder, own, _idle, view = _flex_holder(in_phase_s=in_phase_s)
        pools = dict(view.pools)
        pools["falcon-t1-2x2"] = PoolView("falcon-t1-2x2", "RUNNING", registered, 0)
        g = decide(state([holder, *others, waiting], [own]), ClusterView(pools=pools, jobs=view.jobs, synced=True), NOW, settings)
        return any(e.task_id == 2 and e.to != lc.WAITING for e in effects(g, Transition))

    assert picked(), "parked at the park time: the slot is free"
    assert not picked(in_phase_s=park - 1), "before the park time the holder keeps the slot"
    assert not picked(registered=1), "a node came: its capacity is on the way, the holder keeps the slot"
    assert not picked(parks.model_copy(update={"strict_slot": True})), "the original's rule"
    assert not picked(S), "one capacity wait at a time (the default)"
    other = task(3, actor="carol", phase=lc.PROVISIONING, pool="falcon-t3-2x2", in_phase_s=30, supply_mode="flex-start")
    assert not picked(others=[other]), "a task that is creating holds the slot whoever else is parked"


def test_parked_capacity_waits_are_bounded_per_queue():
    parks = S.model_copy(update={"capacity_waits_per_queue": 3})
    limit = parks.capacity_waits_per_queue
    holders, leases, pools, jobs = [], [], {}, {}
    for i in range(1, limit + 1):
        name = f"falcon-t{i}-2x2"
        holders.append(task(i, phase=lc.WAITING_FOR_NODE, pool=name, in_phase_s=3600, supply_mode="flex-start"))
        leases.append(lease(i, name, LeaseState.IN_USE, i, age_s=3700, mode="flex-start"))
        pools[name] = PoolView(name, "RUNNING", 0, 0)
        jobs[i] = JobView(i, f"falcon-task-{i}", "falcon-jobs", f"u{i}", "Pending", 0, 0, 1, node_pool=name)
    waiting = task(limit + 1, actor="bob", age_s=50, supply_mode="flex-start")
    view = ClusterView(pools=pools, jobs=jobs, synced=True)
    g = decide(state([*holders, waiting], leases), view, NOW, parks)
    assert (limit + 1) not in {e.task_id for e in effects(g, Transition)}, "the queue's parked waits are at their limit"
    g = decide(state([*holders[1:], waiting], leases[1:]), view, NOW, parks)
    assert any(e.task_id == limit + 1 and e.to != lc.WAITING for e in effects(g, Transition)), "one fewer: the next task is picked"


def test_a_release_whose_move_back_was_not_made_is_finished_without_a_second_row():
    """A crash between the ``released`` row and the task's move back to Waiting: the next
    round deletes the pool and makes the move, and writes no second row (it would burn
    another Job name and count a second release)."""
    holder, own, _idle, view = _flex_holder()
    row = Disruption(0, "released", "", "falcon-task-1", "node pool held 2/4", NOW - dt.timedelta(seconds=5))
    crashed = dataclasses.replace(holder, disruptions=(row,))  # in WaitingForNode since before the row
    g = decide(state([crashed], [own]), ClusterView(pools=view.pools, jobs=view.jobs, synced=True), NOW, S)
    assert transitions(g) == {(1, lc.WAITING)}
    assert not [e for g_ in g for e in g_.effects if type(e).__name__ == "RecordDisruption"]
    assert {e.name for e in effects(g, DeletePool)} == {"falcon-t1-2x2"} and effects(g, DeleteJob)
    # picked again since the row: a new wait, nothing to finish
    again = dataclasses.replace(crashed, phase_since=NOW - dt.timedelta(seconds=1))
    g = decide(state([again], [own]), ClusterView(pools=view.pools, jobs=view.jobs, synced=True), NOW, S)
    assert (1, lc.WAITING) not in transitions(g)


def test_a_second_supply_picked_in_the_same_call_takes_no_empty_pool_of_another_supply():
    """Two picks in one call, one a supply: the first (reservation, the older) takes an idle
    on-demand pool as the queue's one acquisition would; the second (flex-start) takes its
    own supply's slot while the first acquires, so it creates rather than take the other
    empty on-demand pool."""
    per = S.model_copy(update={"slot_per_supply": True})
    res_task, flex_task = task(1, age_s=100), task(2, actor="bob", age_s=50, supply_mode="flex-start")
    idle = [lease(i, f"falcon-t{i}-2x2", LeaseState.IDLE, None, age_s=4000, mode="on-demand") for i in (8, 9)]
    pools = {l.name: PoolView(l.name, "RUNNING", 0, 0) for l in idle}
    room = ReservationView(count=4, in_use=0, machine_type="ct6e-standard-4t")
    g = decide(state([res_task, flex_task], idle), ClusterView(pools=pools, synced=True, reservation=room), NOW, per)
    assert (1, lc.DISPATCHING) in transitions(g) and (2, lc.PROVISIONING) in transitions(g), transitions(g)


def test_a_reservation_task_with_room_creates_rather_than_wait_on_another_supplys_empty_pool():
    """With ``reservation_room_first``: an idle flex-start pool without nodes would make a
    reservation task wait for flex-start capacity, so while its reservation has room for it,
    it creates its own pool; with the reservation full it takes the pool (its nodes may come
    first); a pool of its own supply, or one whose every node is Ready, it takes either way.
    Without the setting (the default) it takes the pool."""
    empty = "falcon-t1-2x2"
    waiting = task(2, "bob", supply_mode="reservation")
    first = S.model_copy(update={"reservation_room_first": True})

    def moves(mode: str, in_use: int, ready: int = 0, settings=first):
        view = ClusterView(pools={empty: PoolView(empty, "RUNNING", ready, ready)}, reservation=ReservationView(count=4, in_use=in_use), synced=True)
        return transitions(decide(state([waiting], [lease(7, empty, LeaseState.IDLE, mode=mode)]), view, NOW, settings))

    assert moves("flex-start", in_use=0, settings=S) == {(2, lc.DISPATCHING)}, "the default: the hand-over"

    assert moves("flex-start", in_use=0) == {(2, lc.PROVISIONING)}, "room of its own: a create"
    assert moves("flex-start", in_use=4) == {(2, lc.DISPATCHING)}, "no room: the flex-start pool may deliver first"
    assert moves("reservation", in_use=0) == {(2, lc.DISPATCHING)}, "its own supply's pool"
    assert moves("flex-start", in_use=0, ready=1) == {(2, lc.DISPATCHING)}, "every node Ready: nothing to wait for"
