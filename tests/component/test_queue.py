"""The QueueActor's logic without Ray or HTTP: a QueueReconciler on SQLite, a fake port
and a fake clock. Each test reads as rows and a cluster view in, rows and port calls out."""

from __future__ import annotations

import datetime as dt
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import (
    ClusterView,
    JobView,
    NodeState,
    OpView,
    PodEnd,
    PoolView,
    ReservationView,
    RunEvidence,
)
from falcon_ray.reconcile.context import stamp
from falcon_ray.store.migrate import upgrade
from tests.harness.fakes import QueueBench

RES = ReservationView(count=4, in_use=0)


def pool(tid: int, status: str = "RUNNING", nodes: int = 1) -> dict[str, PoolView]:
    name = f"falcon-t{tid}-2x2"
    return {name: PoolView(name, status, nodes, nodes)}


def pool_named(name: str, status: str = "RUNNING", nodes: int = 1) -> dict[str, PoolView]:
    return {name: PoolView(name, status, nodes, nodes)}


def job(tid: int, phase: str, ready: int = 1) -> dict[int, JobView]:
    return {tid: JobView(tid, f"falcon-task-{tid}", "falcon-jobs", f"uid-{tid}", phase, ready, ready, 1)}


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    """One migrated SQLite file per module; each test starts from a copy (no Alembic per test)."""
    path = tmp_path_factory.mktemp("template") / "q.db"
    upgrade(f"sqlite:///{path}", with_jobs_table=True)
    return path


@pytest.fixture
def bench(tmp_path, migrated) -> QueueBench:
    shutil.copy(migrated, tmp_path / "q.db")
    return QueueBench(f"sqlite:///{tmp_path / 'q.db'}", migrate=False, node_pool_timeout_s=600, create_visibility_grace_s=120)


def run_to_running(b: QueueBench, tid: int, check_waiting: int | None = None, then: ReservationView = RES) -> None:
    """Drive one task from Waiting to Running: pool created, nodes Ready, Job submitted, pods ready."""
    b.step(ClusterView(reservation=RES))
    assert b.phase(tid) == "Pending/Provisioning"
    if check_waiting is not None:
        text = b.task(check_waiting).message
        assert "Queue position #2, 1 task(s) ahead (alice: alice-2x2)" in text
        assert text.endswith("(waiting since 2026-12-01 12:00 UTC)"), text  # since when, from the event log
    assert b.port.took("ensure_pool") == [("ensure_pool", f"falcon-t{tid}-2x2", None)]
    b.step(ClusterView(pools=pool(tid), reservation=then))
    assert b.port.took("submit_job") == [("submit_job", f"falcon-task-{tid}")]
    b.step(ClusterView(pools=pool(tid), jobs=job(tid, "Running"), reservation=then))
    assert b.phase(tid) == "Running"


def test_abort_while_provisioning_deletes_the_pool_and_ends_aborted(bench):
    tid = bench.submit()
    bench.step(ClusterView(reservation=RES))
    assert bench.phase(tid) == "Pending/Provisioning"
    assert bench.store.request_abort(tid)
    bench.poller.poll_once()
    assert ("hint", "edge-a", "2x2") in bench.port.calls
    bench.port.calls.clear()
    bench.step(ClusterView(pools=pool(tid, "PROVISIONING", 0), ops={f"falcon-t{tid}-2x2": OpView("create", "running")}))
    assert bench.phase(tid) == "Aborted"
    assert bench.port.took("delete_pool") == [("delete_pool", f"falcon-t{tid}-2x2")]
    (lease,) = bench.store.leases()
    assert lease.state == LeaseState.DELETING


def test_abort_while_running_deletes_the_job_first(bench):
    tid = bench.submit()
    run_to_running(bench, tid)
    bench.store.request_abort(tid)
    bench.step(ClusterView(pools=pool(tid), jobs=job(tid, "Running")))
    assert bench.phase(tid) == "Aborted"
    calls = [c[0] for c in bench.port.calls]
    assert calls.index("delete_job") < calls.index("delete_pool")


def test_hand_over_keeps_the_pool_for_the_next_task_of_the_topology(bench):
    first, second = bench.submit("alice"), bench.submit("bob")
    full = ReservationView(count=1, in_use=1)  # the first task's pool holds the whole reservation
    run_to_running(bench, first, check_waiting=second, then=full)
    assert bench.phase(second) == "Pending/ClusterBusy"
    bench.port.calls.clear()
    bench.step(ClusterView(pools=pool(first), jobs=job(first, "Succeeded"), reservation=full))
    assert bench.phase(first) == "Succeeded"
    assert bench.phase(second) in ("Pending/Dispatching", "Running")
    calls = bench.port.took("ensure_pool")
    assert calls == [], "the second task must reuse the first one's pool, not create one"
    (lease,) = bench.store.leases()
    assert lease.task_id == second and lease.state == LeaseState.IN_USE
    assert bench.task(second).node_pool_name == f"falcon-t{first}-2x2"


def test_timeout_fails_the_task_and_deletes_its_job(bench):
    tid = bench.submit(timeout_seconds=60)
    run_to_running(bench, tid)
    bench.step(ClusterView(pools=pool(tid), jobs=job(tid, "Running")), advance=59)
    assert bench.phase(tid) == "Running"
    bench.step(ClusterView(pools=pool(tid), jobs=job(tid, "Running")), advance=2)
    assert bench.phase(tid) == "Failed/Timeout"
    assert ("delete_job", f"falcon-task-{tid}") in bench.port.calls


class _DiesAfterDelete:
    """A ClusterActor that deletes the Job, then dies before it answers (the group stops)."""

    def __init__(self, port) -> None:
        self.port = port

    def __enter__(self):
        self.real = self.port.delete_job

        def delete_then_die(*args):
            self.real(*args)
            raise RuntimeError("the ClusterActor died after the delete")

        self.port.delete_job = delete_then_die

    def __exit__(self, *exc) -> None:
        self.port.delete_job = self.real


def test_a_job_that_failed_gets_no_second_job_when_the_controller_dies_after_deleting_it(bench):
    # found by the chaos soak: the delete came before the terminal write, so a group that
    # stopped in between left a Dispatching task with no Job, and it was given a new one
    tid = bench.submit()
    bench.step(ClusterView(reservation=RES))
    bench.step(ClusterView(pools=pool(tid), reservation=RES))
    assert bench.port.took("submit_job") == [("submit_job", f"falcon-task-{tid}")]
    assert bench.phase(tid) == "Pending/Dispatching"
    with _DiesAfterDelete(bench.port):
        bench.step(ClusterView(pools=pool(tid), jobs=job(tid, "Failed", ready=0), reservation=RES))
    bench.restart()
    bench.step(ClusterView(pools=pool(tid), reservation=RES))  # the Job is gone
    assert bench.port.took("submit_job") == []
    assert bench.phase(tid) == "Failed/JobFailed"
    (lease,) = bench.store.leases()
    assert lease.task_id is None or lease.state in (LeaseState.IDLE, LeaseState.DELETING)


def test_a_failed_create_whose_lease_write_landed_but_whose_answer_was_lost_does_not_stall(bench):
    # seen in the database-outage soak: "acquisition failed" stopped at a database error after
    # the lease's move to Deleting had been committed; the task stayed Provisioning and its
    # next create adopted the Deleting row of the same name
    tid = bench.submit()
    bench.step(ClusterView(reservation=RES))
    name = f"falcon-t{tid}-2x2"
    assert bench.port.took("ensure_pool") == [("ensure_pool", name, None)]
    (lease,) = bench.store.leases()
    assert bench.store.move_lease(lease.id, (LeaseState.REQUESTED,), LeaseState.DELETING, task_id=tid)
    bench.restart()
    failed = {name: PoolView(name, "ERROR", 0, 0, status_message="Internal error")}
    bench.step(ClusterView(pools=failed, reservation=RES), advance=1)
    # a create under a name no lease row holds; the old pool is deleted, never created again
    again = f"{name}-r1"
    assert bench.port.took("ensure_pool") == [("ensure_pool", again, None)]
    assert bench.task(tid).node_pool_name == again and again in bench.task(tid).message
    bench.step(ClusterView(pools={**failed, **pool_named(again)}, reservation=RES), advance=1)
    calls = bench.port.calls
    assert ("ensure_pool", name, None) not in calls and ("delete_pool", name) in calls
    bench.step(ClusterView(pools=pool_named(again), jobs=job(tid, "Running"), reservation=RES))
    assert bench.phase(tid) == "Running"
    bench.step(ClusterView(pools=pool_named(again), jobs=job(tid, "Succeeded"), reservation=RES))
    assert bench.phase(tid) == "Succeeded"


def test_cluster_busy_waits_for_reservation_headroom_then_creates(bench):
    tid = bench.submit()
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=4)))
    t = bench.task(tid)
    assert str(t.phase) == "Pending/ClusterBusy"
    assert "reservation_remaining_slices=0 reservation_needed_slices=1" in t.message
    assert t.message.endswith(f"(waiting since {stamp(bench.clock.now())} UTC)"), t.message
    assert bench.port.took("ensure_pool") == []
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=4)), advance=3600)
    assert bench.phase(tid) == "Pending/ClusterBusy", "no timer ends a wait for reservation headroom"
    assert bench.task(tid).message == t.message, "an hour more of the same wait rewrites nothing"
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=3)))
    assert bench.phase(tid) == "Pending/Provisioning"
    assert bench.port.took("ensure_pool") == [("ensure_pool", f"falcon-t{tid}-2x2", None)]


def test_a_delete_that_keeps_failing_is_counted_and_reported_then_finished(bench):
    tid = bench.submit()
    run_to_running(bench, tid)
    name = f"falcon-t{tid}-2x2"
    bench.step(ClusterView(pools=pool(tid), jobs=job(tid, "Succeeded")))
    assert bench.phase(tid) == "Succeeded"
    for attempts in (1, 2, 3):
        failing = OpView("delete", "queued", attempts=attempts, error_kind="transient", error="503 backend unavailable")
        bench.step(ClusterView(pools=pool(tid), ops={name: failing}))
        if attempts < 3:
            assert "not yet deleted" not in bench.task(tid).message
    (lease,) = bench.store.leases()
    assert lease.state == LeaseState.DELETING and lease.delete_attempts == 3
    assert "503 backend unavailable" in lease.last_error
    assert "not yet deleted" in bench.task(tid).message and "503" in bench.task(tid).message
    bench.step(ClusterView(ops={name: OpView("delete", "done", attempts=3)}))
    assert bench.store.leases() == []
    assert [l.state for l in bench.store.leases(live_only=False)] == [LeaseState.DELETED]


def test_the_unreachable_cluster_timer_survives_a_restart(bench):
    """The time a task has spent in its phase comes from the event log, not actor memory."""
    tid = bench.submit()
    bench.step(ClusterView(reservation=RES, error="RefreshError: metadata unreachable", synced=False))
    bench.queue.reconcile_once()
    bench.step(ClusterView(error="RefreshError: metadata unreachable", synced=False))
    # picked at once; nothing can be created while GKE is unreachable
    assert bench.phase(tid) == "Pending/Provisioning"
    assert "Cannot reach cluster edge-a" in bench.task(tid).message
    bench.clock.advance(400)
    bench.restart()
    bench.step(ClusterView(error="RefreshError: metadata unreachable", synced=False))
    assert bench.phase(tid) == "Pending/Provisioning"
    bench.clock.advance(201)
    bench.restart()
    bench.step(ClusterView(error="RefreshError: metadata unreachable", synced=False))
    t = bench.task(tid)
    assert str(t.phase) == "Failed/NodePoolTimeout" and "unreachable for 601s" in t.message


def test_the_lease_records_the_operation_and_a_restarted_cluster_actor_follows_it(bench):
    tid = bench.submit()
    bench.step(ClusterView(reservation=RES))
    name = f"falcon-t{tid}-2x2"
    bench.port.took("ensure_pool")
    accepted = OpView("create", "running", operation="operation-123")
    bench.step(ClusterView(pools=pool(tid, "PROVISIONING", 0), ops={name: accepted}))
    (lease,) = bench.store.leases()
    assert lease.operation == "operation-123" and lease.state == LeaseState.CREATING
    # the ClusterActor restarted: it knows neither the pool nor the operation yet
    bench.restart(cluster_actor_too=True)
    bench.step(ClusterView(synced=True))
    assert bench.port.took("ensure_pool") == [("ensure_pool", name, "operation-123")]


def test_a_create_queued_behind_other_operations_keeps_its_timeout_across_a_restart(bench):
    """An hour in the ClusterActor's FIFO is not the task's time: the create's timeout counts
    from GKE's acceptance, which the lease row keeps (``accepted_at``) for a restarted queue."""
    tid = bench.submit()
    bench.step(ClusterView(reservation=RES))
    name = f"falcon-t{tid}-2x2"
    queued = OpView("create", "queued")
    for _ in range(6):  # an hour of ten-minute rounds behind the cluster's other operations
        bench.step(ClusterView(ops={name: queued}, reservation=RES), advance=600)
        assert bench.phase(tid) == "Pending/Provisioning"
    assert "Waiting to send the create of node pool" in bench.task(tid).message
    assert "queued since 12:00:00 UTC" in bench.task(tid).message
    accepted = OpView("create", "running", operation="operation-9")
    bench.step(ClusterView(pools=pool(tid, "PROVISIONING", 0), ops={name: accepted}, reservation=RES), advance=1)
    (lease,) = bench.store.leases()
    assert lease.state == LeaseState.CREATING and lease.accepted_at == bench.clock.now()
    bench.clock.advance(599)
    bench.restart()
    bench.step(ClusterView(pools=pool(tid, "PROVISIONING", 0), ops={name: accepted}, reservation=RES))
    assert bench.phase(tid) == "Pending/Provisioning"  # 599 s since GKE accepted it
    bench.step(ClusterView(pools=pool(tid, "PROVISIONING", 0), ops={name: accepted}, reservation=RES), advance=2)
    t = bench.task(tid)
    # GKE is slow, not the task (issue 37): the pool is given back and the task, at the
    # head of the queue, asks again under a new name
    back = [e for e in bench.store.events(tid) if e.reason == "Waiting"][-1]
    assert "601s after GKE accepted the create" in back.message, back.message
    assert [x.kind for x in bench.store.disruptions([tid])[tid]] == ["released"]
    assert str(t.phase) == "Pending/Provisioning" and t.node_pool_name == f"{name}-r1", (t.phase, t.node_pool_name)


def test_a_refused_job_fails_the_task_and_deletes_its_pool_through_keep_or_delete(bench):
    tid = bench.submit()
    bench.port.submit_result = {"error_kind": "permanent", "error": "admission webhook denied the request"}
    bench.step(ClusterView(reservation=RES))
    bench.step(ClusterView(pools=pool(tid), reservation=RES))
    t = bench.task(tid)
    assert str(t.phase) == "Failed/JobSubmitFailed" and "admission webhook denied" in t.message


def test_a_refused_reservation_claim_creates_nothing_and_waits_in_cluster_busy(bench):
    tid = bench.submit()
    bench.port.claims_granted = False  # another queue took the last slice first
    bench.step(ClusterView(reservation=RES))
    assert bench.phase(tid) == "Pending/Provisioning"
    assert bench.port.took("ensure_pool") == [] and bench.store.leases() == []
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=0, claimed=4)))
    t = bench.task(tid)
    assert str(t.phase) == "Pending/ClusterBusy" and "reservation_remaining_slices=0" in t.message
    bench.port.claims_granted = True
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=0, claimed=3)))
    assert bench.phase(tid) == "Pending/Provisioning"
    assert [c[0] for c in bench.port.calls][:2] == ["claim_reservation", "ensure_pool"]


def test_abort_while_creating_keeps_the_pool_and_hands_it_over_once_its_create_finished(bench):
    first, second = bench.submit("alice"), bench.submit("bob")
    name = f"falcon-t{first}-2x2"
    bench.step(ClusterView(reservation=RES))
    creating = ClusterView(pools=pool(first, "PROVISIONING", 0), ops={name: OpView("create", "running")}, reservation=RES)
    bench.step(creating)
    assert bench.store.leases()[0].state == LeaseState.CREATING
    bench.store.request_abort(first)
    bench.port.calls.clear()
    bench.step(creating)
    assert bench.phase(first) == "Aborted"
    (lease,) = bench.store.leases()
    assert lease.state == LeaseState.IDLE and lease.ready_at is None  # kept for bob, not handed over yet
    assert bench.phase(second) == "Pending/Provisioning"
    assert "Waiting for node pool" in bench.task(second).message
    assert bench.port.took("ensure_pool") == [], "no second pool while the abandoned one is being created"
    bench.step(ClusterView(pools=pool(first), ops={name: OpView("create", "done")}, reservation=RES))
    assert bench.phase(second) in ("Pending/Dispatching", "Running")
    assert bench.task(second).node_pool_name == name


def test_a_failed_create_of_an_abandoned_pool_is_deleted_and_the_next_task_makes_its_own(bench):
    first, second = bench.submit("alice"), bench.submit("bob")
    name = f"falcon-t{first}-2x2"
    bench.step(ClusterView(reservation=RES))
    creating = ClusterView(pools=pool(first, "PROVISIONING", 0), ops={name: OpView("create", "running")}, reservation=RES)
    bench.step(creating)
    bench.store.request_abort(first)
    bench.step(creating)
    bench.port.calls.clear()
    bench.step(ClusterView(pools=pool(first, "ERROR", 0), ops={name: OpView("create", "done")}, reservation=RES))
    assert ("delete_pool", name) in bench.port.calls
    assert ("ensure_pool", f"falcon-t{second}-2x2", None) in bench.port.calls
    assert bench.task(second).node_pool_name == f"falcon-t{second}-2x2"


def test_pick_order_is_fifo_per_actor_and_round_robin_between_actors(bench):
    ids = {label: bench.submit(label[:-1]) for label in ("alice1", "alice2", "alice3", "bob1", "bob2", "carol1")}
    order = []
    for _ in ids:
        bench.step(ClusterView(reservation=RES))
        (holder,) = [k for k, tid in ids.items() if bench.phase(tid) == "Pending/Provisioning"]
        order.append(holder)
        bench.store.request_abort(ids[holder])  # free the slot for the next pick
        bench.step(ClusterView(reservation=RES))
    assert order == ["alice1", "bob1", "alice2", "bob2", "alice3", "carol1"], order
    assert bench.store.last_granted(bench.cluster.id, "2x2") == "carol"


def test_a_reservation_task_with_no_cluster_that_has_a_reservation_fails_at_intake(bench):
    bench.store.add_cluster("edge-b", "proj-b", "us-central1-b", "v6e", "logs-b", "")
    bench.store.set_cluster_status("edge-a", "offline")
    tid = bench.submit(supply_mode="reservation")
    t = bench.task(tid)
    assert (t.status, t.reason) == ("Failed", "NoCandidateCluster") and "reservation" in t.message


def test_a_job_submission_refused_for_now_is_retried_then_fails_after_its_budget(bench):
    tid = bench.submit()
    bench.port.submit_result = {"error_kind": "transient", "error": "503 the apiserver is overloaded"}
    bench.step(ClusterView(reservation=RES))
    bench.step(ClusterView(pools=pool(tid), reservation=RES))
    t = bench.task(tid)
    assert str(t.phase) == "Pending/Dispatching" and "retrying (waiting since " in t.message and "503" in t.message
    assert t.dispatched_at is None  # the Dispatching move started the timeout clock; the refusal stopped it
    bench.step(ClusterView(pools=pool(tid)), advance=bench.settings.submit_budget_s - 10)
    assert bench.phase(tid) == "Pending/Dispatching"
    bench.port.calls.clear()
    bench.step(ClusterView(pools=pool(tid)), advance=20)
    t = bench.task(tid)
    assert str(t.phase) == "Failed/JobSubmitFailed" and "no Job accepted within 10m" in t.message
    assert ("delete_pool", f"falcon-t{tid}-2x2") in bench.port.calls  # the original's failure table


def test_a_job_accepted_in_the_dispatching_group_costs_no_write_after_the_submit(bench):
    """The Dispatching move writes the accepted Job's Message and starts the timeout clock;
    the accepted submit writes nothing more; the Job's uid goes with the Running move."""
    tid = bench.submit()
    bench.step(ClusterView(reservation=RES))
    before = dict(bench.store.breakdown)
    bench.step(ClusterView(pools=pool(tid), reservation=RES))
    sent = {k: n - before.get(k, 0) for k, n in bench.store.breakdown.items() if n != before.get(k, 0)}
    t = bench.task(tid)
    assert str(t.phase) == "Pending/Dispatching" and "submitted, waiting for pods" in t.message, t.message
    assert t.dispatched_at is not None and t.job_uid is None
    assert "update_task UPDATE" not in sent, sent
    bench.step(ClusterView(pools=pool(tid), jobs=job(tid, "Running"), reservation=RES))
    assert bench.phase(tid) == "Running" and bench.task(tid).job_uid


STOCKOUT = (
    "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'projects/proj-a/zones/us-east5-b' does not have enough resources "
    "available to fulfill the request (ct6e-standard-4t x 1). Try a different zone, or try again later."
)


def refuse(b: QueueBench, name: str, advance: float = 0.0) -> None:
    """GKE ends the create of ``name`` as a stockout: the operation failed, the pool in ERROR."""
    view = ClusterView(
        pools={name: PoolView(name, "ERROR", 0, 0, STOCKOUT, "stockout")},
        ops={name: OpView("create", "failed", 1, "stockout", STOCKOUT)},
    )
    b.step(view, advance=advance)


def test_stockout_waits_with_backoff_across_restarts_then_runs(bench):
    tid = bench.submit(supply_mode="on-demand")
    bench.step(ClusterView())
    first = f"falcon-t{tid}-2x2"
    assert bench.port.took("ensure_pool") == [("ensure_pool", first, None)]
    refuse(bench, first, advance=5)
    t = bench.task(tid)
    assert str(t.phase) == "Pending/ClusterBusy" and "ZONE_RESOURCE_POOL_EXHAUSTED" in t.message
    refused_at = bench.clock.now()
    retry_at = stamp(refused_at + dt.timedelta(seconds=60))
    assert f"refusal 1), asking GKE again at {retry_at} UTC: ZONE_" in t.message, t.message
    assert t.message.endswith(f"(waiting since {stamp(refused_at)} UTC)")
    assert bench.port.took("delete_pool") == [("delete_pool", first)]  # a pool in ERROR is deleted
    (lease,) = bench.store.leases()
    assert lease.state == LeaseState.DELETING and lease.refused_at == bench.clock.now() and lease.task_id == tid
    bench.step(ClusterView(), advance=59)  # the pool is gone; the first retry is due 60 s after the refusal
    assert bench.phase(tid) == "Pending/ClusterBusy" and bench.port.took("ensure_pool") == []
    assert bench.store.leases(live_only=False)[0].state == LeaseState.DELETED
    bench.restart(cluster_actor_too=True)  # a new QueueActor continues the same backoff
    bench.step(ClusterView(), advance=1)
    second = f"{first}-r1"
    assert bench.port.took("ensure_pool") == [("ensure_pool", second, None)]
    assert bench.phase(tid) == "Pending/Provisioning" and "after 1 capacity refusal(s)" in bench.task(tid).message
    refuse(bench, second, advance=10)
    bench.restart(cluster_actor_too=True)
    bench.step(ClusterView(), advance=119)
    assert bench.phase(tid) == "Pending/ClusterBusy" and bench.port.took("ensure_pool") == [], "the second wait is 120 s"
    assert bench.task(tid).message.endswith(f"(waiting since {stamp(refused_at)} UTC)")  # the first refusal
    bench.step(ClusterView(), advance=1)
    third = f"{first}-r2"
    assert bench.port.took("ensure_pool") == [("ensure_pool", third, None)]
    bench.step(ClusterView(pools={third: PoolView(third, "RUNNING", 1, 1)}))
    assert bench.port.took("submit_job") == [("submit_job", f"falcon-task-{tid}")]
    bench.step(ClusterView(pools={third: PoolView(third, "RUNNING", 1, 1)}, jobs=job(tid, "Running")))
    assert bench.phase(tid) == "Running" and bench.task(tid).node_pool_name == third
    names = [(l.name, l.state, l.refused_at is not None) for l in bench.store.leases(live_only=False)]
    assert names == [(first, "Deleted", True), (second, "Deleted", True), (third, "InUse", False)]


def test_stockout_past_the_capacity_budget_ends_node_pool_failed(tmp_path, migrated):
    shutil.copy(migrated, tmp_path / "q.db")
    b = QueueBench(f"sqlite:///{tmp_path / 'q.db'}", migrate=False, capacity_budget_s=300, capacity_retry_first_s=200)
    tid = b.submit(supply_mode="flex-start")
    b.step(ClusterView())
    first = f"falcon-t{tid}-2x2"
    refuse(b, first)
    assert b.phase(tid) == "Pending/ClusterBusy"
    b.step(ClusterView(), advance=200)
    refuse(b, f"{first}-r1", advance=10)  # refused again 210 s after the first; next wait 400 s
    assert b.phase(tid) == "Pending/ClusterBusy"
    b.restart()
    b.step(ClusterView(), advance=89)
    assert b.phase(tid) == "Pending/ClusterBusy"
    b.step(ClusterView(), advance=1)  # 300 s since the first refusal
    t = b.task(tid)
    assert str(t.phase) == "Failed/NodePoolFailed"
    assert "waited 5m over 2 refusal(s)" in t.message and "ZONE_RESOURCE_POOL_EXHAUSTED" in t.message
    assert all(l.state in ("Deleting", "Deleted") for l in b.store.leases(live_only=False))


def test_quota_exceeded_ends_node_pool_failed_at_once(bench):
    tid = bench.submit(supply_mode="on-demand")
    bench.step(ClusterView())
    name = f"falcon-t{tid}-2x2"
    quota = "Quota 'TPUS_PER_PROJECT' exceeded. Limit: 8.0 in region us-east5."
    bench.step(ClusterView(ops={name: OpView("create", "failed", 1, "quota_exceeded", quota)}))
    t = bench.task(tid)
    assert str(t.phase) == "Failed/NodePoolFailed" and "TPUS_PER_PROJECT" in t.message
    assert bench.port.took("delete_pool") == [("delete_pool", name)]
    assert bench.store.leases()[0].refused_at is None


# ---- disruptions: the fleet, not the task, ended a run ----------------------------------------

DISRUPTED = RunEvidence(
    pods=(PodEnd("falcon-task-1-0-abc", "gke-node-0", "Failed", "TerminationByKubelet: host maintenance", 143, "Error"),),
    nodes=(NodeState("gke-node-0", False, maintenance=True, unschedulable=True),),
    condition="PodFailurePolicy: Pod falcon-jobs/falcon-task-1-0-abc has condition DisruptionTarget matching FailJob rule at index 0",
)


def failed_job(tid: int, attempt: int = 0, evidence: RunEvidence | None = DISRUPTED) -> dict[int, JobView]:
    name = f"falcon-task-{tid}" + (f"-a{attempt}" if attempt else "")
    return {tid: JobView(tid, name, "falcon-jobs", f"uid-{tid}-{attempt}", "Failed", 0, 0, 1, "", f"falcon-t{tid}-2x2", attempt, evidence)}


def attempt_job(tid: int, attempt: int, phase: str, ready: int) -> dict[int, JobView]:
    return {tid: JobView(tid, f"falcon-task-{tid}-a{attempt}", "falcon-jobs", f"uid-{tid}-{attempt}", phase, ready, ready, 1, "", f"falcon-t{tid}-2x2", attempt)}


def test_a_disrupted_run_is_recovered_on_the_same_pool_as_a_new_attempt(bench):
    tid = bench.submit(timeout_seconds=600)
    run_to_running(bench, tid)
    bench.port.calls.clear()
    bench.step(ClusterView(pools=pool(tid, nodes=0), jobs=failed_job(tid)), advance=300)
    assert bench.phase(tid) == "Pending/Recovering"
    assert "Attempt 2 of 4 after maintenance" in bench.task(tid).message
    assert bench.task(tid).dispatched_at is None  # the next attempt's timeout clock starts afresh
    assert set(bench.port.took("delete_job")) == {("delete_job", f"falcon-task-{tid}")}  # again each round until it is gone
    assert bench.port.took("submit_job") == [], "no new attempt while the old Job is there"
    bench.port.calls.clear()
    deleting = {tid: replace(failed_job(tid)[tid], deleting=True)}
    bench.step(ClusterView(pools=pool(tid, nodes=0), jobs=deleting))
    assert bench.port.took("delete_job") == [] and bench.port.took("submit_job") == [], "a delete under way is not asked again"
    assert "waiting for Job falcon-task-1 of the disrupted run to be deleted" in bench.task(tid).message
    (d,) = bench.store.disruptions([tid])[tid]
    assert (d.attempt, d.kind, d.node) == (0, "maintenance", "gke-node-0")
    # the old Job is gone: attempt 1 goes onto the same pool, whose nodes are still away
    bench.step(ClusterView(pools=pool(tid, nodes=0)))
    assert bench.port.took("submit_job") == [("submit_job", f"falcon-task-{tid}-a1")]
    bench.step(ClusterView(pools=pool(tid, nodes=0), jobs=attempt_job(tid, 1, "Pending", 0)), advance=120)
    assert bench.phase(tid) == "Pending/Recovering" and "waiting for its nodes to come back" in bench.task(tid).message
    bench.step(ClusterView(pools=pool(tid), jobs=attempt_job(tid, 1, "Running", 1)))
    assert bench.phase(tid) == "Running" and "Attempt 2 of 4" in bench.task(tid).message
    # the second attempt gets its whole timeout: 590 s after it started it still runs
    bench.step(ClusterView(pools=pool(tid), jobs=attempt_job(tid, 1, "Running", 1)), advance=590)
    assert bench.phase(tid) == "Running"
    bench.step(ClusterView(pools=pool(tid), jobs=attempt_job(tid, 1, "Succeeded", 0)))
    assert bench.phase(tid) == "Succeeded"
    assert bench.port.took("ensure_pool") == [], "the same pool served the recovery"


def test_the_tasks_own_failure_is_not_recovered(bench):
    tid = bench.submit()
    run_to_running(bench, tid)
    own = RunEvidence(pods=(PodEnd("falcon-task-1-0-abc", "gke-node-0", "Failed", "", 3, "Error"),), nodes=(NodeState("gke-node-0", True),))
    bench.step(ClusterView(pools=pool(tid), jobs=failed_job(tid, evidence=own)))
    assert bench.phase(tid) == "Failed/JobFailed"
    assert bench.store.disruptions([tid]) == {}


def test_past_max_recoveries_the_task_ends_disrupted_naming_each_disruption(bench):
    tid = bench.submit(max_recoveries=1)
    run_to_running(bench, tid)
    bench.step(ClusterView(pools=pool(tid, nodes=0), jobs=failed_job(tid)))
    assert bench.phase(tid) == "Pending/Recovering"
    bench.step(ClusterView(pools=pool(tid, nodes=0)))
    bench.step(ClusterView(pools=pool(tid, nodes=0), jobs=failed_job(tid, attempt=1)))
    assert bench.phase(tid) == "Failed/Disrupted"
    text = bench.task(tid).message
    assert "2 time(s), more than its max_recoveries (1)" in text and text.count("maintenance on node gke-node-0") == 2
    assert [d.attempt for d in bench.store.disruptions([tid])[tid]] == [0, 1]
    assert ("delete_pool", f"falcon-t{tid}-2x2") in bench.port.calls


def test_a_recovery_whose_pool_is_gone_acquires_a_new_pool_ahead_of_the_queue_under_a_new_job_name(bench):
    tid = bench.submit("alice")
    run_to_running(bench, tid)
    later = [bench.submit("bob") for _ in range(2)]
    bench.step(ClusterView(pools=pool(tid), jobs=job(tid, "Running"), reservation=RES))
    bench.step(ClusterView(pools={}, jobs=failed_job(tid, evidence=None), reservation=RES))
    assert bench.phase(tid) == "Pending/Recovering"
    bench.port.calls.clear()
    bench.step(ClusterView(pools={}, reservation=RES))  # the old Job is gone, so is the pool
    # back to Waiting with its pool's lease deleted, ahead of every task still waiting: only
    # the slot holder (the first of the later tasks, picked while it ran) is ahead of it
    holder, behind = later
    assert bench.phase(tid) == "Pending/Waiting" and bench.phase(holder) == "Pending/Provisioning"
    assert "after pool-lost" in bench.task(tid).message and "Queue position #2, 1 task(s) ahead" in bench.task(tid).message
    assert "Queue position #3" in bench.task(behind).message
    assert ("delete_pool", f"falcon-t{tid}-2x2") in bench.port.calls
    # the attempt it left keeps its Job name: the new pool's run is attempt 2, and the
    # abandoned pool did not use up a recovery
    kinds = [(d.attempt, d.kind) for d in bench.store.disruptions([tid])[tid]]
    assert kinds == [(0, "pool-lost"), (1, "abandoned")]
    assert "Attempt 2 of 4 after pool-lost" in bench.task(tid).message


def test_an_abandonment_whose_move_back_to_waiting_was_lost_is_finished_not_recorded_again(bench):
    # a step recorded the abandoned attempt and died before the task's move to Waiting (a
    # queue killed between the two): the next step makes the move and writes no second row,
    # which would burn a Job name and read as an abandonment that follows no disruption
    tid = bench.submit("alice")
    run_to_running(bench, tid)
    bench.step(ClusterView(pools=pool(tid), jobs=job(tid, "Running"), reservation=RES))
    bench.step(ClusterView(pools={}, jobs=failed_job(tid, evidence=None), reservation=RES))
    assert bench.phase(tid) == "Pending/Recovering"
    assert bench.store.record_disruption(tid, 1, "abandoned", "", f"falcon-task-{tid}-a1", "node pool gone")
    bench.restart()  # the queue that died; its successor reads every row
    bench.step(ClusterView(pools={}, reservation=RES))
    # back to Waiting, and picked at once: nothing else waits
    assert bench.phase(tid) == "Pending/Provisioning"
    kinds = [(d.attempt, d.kind) for d in bench.store.disruptions([tid])[tid]]
    assert kinds == [(0, "pool-lost"), (1, "abandoned")]


# ---- issue 37: a hand-over passes a slot holder that waits for flex capacity ----------------------


@pytest.mark.parametrize("strict", [False, True])
def test_a_hand_over_passes_the_slot_holder_waiting_for_flex_capacity(tmp_path, migrated, strict):
    """Xavier's flex-start pool ran him for 6 days 20 hours: its VMs have 4 hours left of
    flex-start's 7. Alice holds the slot waiting for the nodes of her new flex-start pool;
    her run (a day) would not fit on Xavier's pool, Bob's (an hour) does. When Xavier ends,
    Bob takes the pool at once while Alice keeps waiting for GKE; under the original's rule
    (``strict_slot``) Bob waits behind Alice."""
    shutil.copy(migrated, tmp_path / "q.db")
    b = QueueBench(f"sqlite:///{tmp_path / 'q.db'}", migrate=False, node_pool_timeout_s=600, strict_slot=strict)
    x = b.submit("xavier", supply_mode="flex-start", timeout_seconds=6 * 86400 + 79200)
    px, pa = f"falcon-t{x}-2x2", ""
    b.step(ClusterView())
    assert b.phase(x) == "Pending/Provisioning"
    b.step(ClusterView(pools=pool_named(px, nodes=0)))
    assert b.phase(x) == "Pending/WaitingForNode"
    came = b.clock.now()
    xpool = {px: PoolView(px, "RUNNING", 1, 1, nodes_since=came)}
    b.step(ClusterView(pools=xpool, jobs=job(x, "Running")))
    assert b.phase(x) == "Running"

    b.clock.advance(6 * 86400 + 72000)  # 6 days 20 hours of Xavier's run
    a = b.submit("alice", supply_mode="flex-start", timeout_seconds=86400)
    pa = f"falcon-t{a}-2x2"
    b.step(ClusterView(pools=xpool, jobs=job(x, "Running")))
    assert b.phase(a) == "Pending/Provisioning"
    pools = {**xpool, **pool_named(pa, nodes=0)}
    jobs = {**job(x, "Running"), a: JobView(a, f"falcon-task-{a}", "falcon-jobs", "ua", "Pending", 0, 0, 1, node_pool=pa)}
    b.step(ClusterView(pools=pools, jobs=jobs))
    assert b.phase(a) == "Pending/WaitingForNode", "Alice holds the slot, waiting for flex capacity"
    bob = b.submit("bob", supply_mode="flex-start", timeout_seconds=3600)  # Alice's supply: behind her in its slot
    b.step(ClusterView(pools=pools, jobs=jobs), advance=60)
    assert b.phase(bob) == "Pending/Waiting"

    jobs[x] = job(x, "Succeeded")[x]  # Xavier ends: his pool, with its Ready node, is kept for a waiting task
    b.step(ClusterView(pools=pools, jobs=jobs), advance=60)
    assert b.phase(x) == "Succeeded"
    b.port.calls.clear()
    b.step(ClusterView(pools=pools, jobs={a: jobs[a]}), advance=5)
    assert b.phase(a) == "Pending/WaitingForNode", "Alice's day would outlive the pool's VMs: she waits for her own"
    if strict:
        assert b.phase(bob) == "Pending/Waiting", "the original's rule: one task between pick and Running"
        return
    assert b.phase(bob) == "Pending/Dispatching", "Bob takes the Ready pool past the slot holder"
    assert b.task(bob).node_pool_name == px
    assert b.port.took("submit_job") == [("submit_job", f"falcon-task-{bob}")]


@pytest.mark.parametrize("per_supply", [False, True])
def test_a_reservation_wait_holds_back_a_flex_start_task_only_with_one_slot_for_the_queue(tmp_path, migrated, per_supply):
    """Alice's reservation task waits for room (ClusterBusy); Bob's flex-start task of the
    same queue takes other capacity. With one slot (the default) he waits behind her; with
    ``slot_per_supply`` he creates his flex-start pool at once, and she still creates first
    on the reservation when its room comes back."""
    shutil.copy(migrated, tmp_path / "q.db")
    b = QueueBench(f"sqlite:///{tmp_path / 'q.db'}", migrate=False, node_pool_timeout_s=600, slot_per_supply=per_supply)
    full = ReservationView(count=4, in_use=4)
    alice = b.submit("alice")
    b.step(ClusterView(reservation=full))
    assert b.phase(alice) == "Pending/ClusterBusy"
    bob = b.submit("bob", supply_mode="flex-start")
    b.step(ClusterView(reservation=full), advance=60)
    b.step(ClusterView(reservation=full), advance=5)
    if not per_supply:
        assert b.phase(bob) == "Pending/Waiting" and not b.port.took("ensure_pool")
        return
    assert b.phase(bob) in ("Pending/Provisioning", "Pending/WaitingForNode")
    assert set(b.port.took("ensure_pool")) == {("ensure_pool", f"falcon-t{bob}-2x2", None)}, "his pool, not hers"
    assert b.phase(alice) == "Pending/ClusterBusy"
    b.step(ClusterView(reservation=ReservationView(count=4, in_use=3)), advance=5)
    assert b.phase(alice) == "Pending/Provisioning"
