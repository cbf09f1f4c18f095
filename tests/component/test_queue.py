"""The QueueActor's logic without Ray or HTTP: a QueueReconciler on SQLite, a fake port
and a fake clock. Each test reads as rows and a cluster view in, rows and port calls out."""

from __future__ import annotations

import pytest

from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import ClusterView, JobView, OpView, PoolView, ReservationView
from tests.harness.fakes import QueueBench

RES = ReservationView(count=4, in_use=0)


def pool(tid: int, status: str = "RUNNING", nodes: int = 1) -> dict[str, PoolView]:
    name = f"falcon-t{tid}-2x2"
    return {name: PoolView(name, status, nodes, nodes)}


def job(tid: int, phase: str, ready: int = 1) -> dict[int, JobView]:
    return {tid: JobView(tid, f"falcon-task-{tid}", "falcon-jobs", f"uid-{tid}", phase, ready, ready, 1)}


@pytest.fixture
def bench(tmp_path) -> QueueBench:
    return QueueBench(f"sqlite:///{tmp_path / 'q.db'}", node_pool_timeout_s=600, create_visibility_grace_s=120)


def run_to_running(b: QueueBench, tid: int, check_waiting: int | None = None, then: ReservationView = RES) -> None:
    """Drive one task from Waiting to Running: pool created, nodes Ready, Job submitted, pods ready."""
    b.step(ClusterView(reservation=RES))
    assert b.phase(tid) == "Pending/Provisioning"
    if check_waiting is not None:
        assert "Queue position #2, 1 task(s) ahead (alice: alice-2x2)" in b.task(check_waiting).message
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


def test_cluster_busy_waits_for_reservation_headroom_then_creates(bench):
    tid = bench.submit()
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=4)))
    t = bench.task(tid)
    assert str(t.phase) == "Pending/ClusterBusy"
    assert "reservation_remaining_slices=0 reservation_needed_slices=1" in t.message
    assert bench.port.took("ensure_pool") == []
    bench.step(ClusterView(reservation=ReservationView(count=4, in_use=4)), advance=3600)
    assert bench.phase(tid) == "Pending/ClusterBusy", "no timer ends a wait for reservation headroom"
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


def test_a_refused_job_fails_the_task_and_deletes_its_pool_through_keep_or_delete(bench):
    tid = bench.submit()
    bench.port.submit_result = {"error_kind": "permanent", "error": "admission webhook denied the request"}
    bench.step(ClusterView(reservation=RES))
    bench.step(ClusterView(pools=pool(tid), reservation=RES))
    t = bench.task(tid)
    assert str(t.phase) == "Failed/JobSubmitFailed" and "admission webhook denied" in t.message


def test_an_idle_pool_whose_create_has_not_finished_is_not_handed_over(bench):
    """Found by the chaos soak (seed 2): a task aborted while its pool was being created left
    the pool Idle for the next task; that create then failed (pool in ERROR, 0 nodes) and
    the next task, handed the pool, waited for pods forever. Only a pool whose create
    finished is handed over; an idle pool whose create failed is deleted."""
    first, second = bench.submit("alice"), bench.submit("bob")
    name = f"falcon-t{first}-2x2"
    creating = ClusterView(pools=pool(first, "PROVISIONING", 0), ops={name: OpView("create", "running")}, reservation=RES)
    bench.step(ClusterView(reservation=RES))
    bench.step(creating)
    assert [l.state for l in bench.store.leases()] == [LeaseState.CREATING]
    bench.store.request_abort(first)
    bench.port.calls.clear()
    bench.step(creating)
    assert bench.phase(first) == "Aborted"
    leases = {l.name: l for l in bench.store.leases()}
    assert leases[name].state == LeaseState.IDLE, "kept for the waiting task while its create runs"
    assert bench.phase(second) == "Pending/Provisioning", "not handed a pool whose create has not finished"
    assert bench.task(second).node_pool_name == f"falcon-t{second}-2x2"
    assert bench.port.took("submit_job") == []
    # the kept pool's create fails: it is deleted, never handed over
    bench.port.calls.clear()
    failed = {name: PoolView(name, "ERROR", 0, 0, "Internal error")}
    bench.step(ClusterView(pools=failed, ops={name: OpView("create", "done")}, reservation=RES))
    assert ("delete_pool", name) in bench.port.took("delete_pool")
    assert {l.name: l.state for l in bench.store.leases()}[name] == LeaseState.DELETING
    assert bench.task(second).node_pool_name == f"falcon-t{second}-2x2"
    assert bench.port.took("submit_job") == []


def test_an_idle_pool_kept_while_creating_is_handed_over_once_its_create_finished(bench):
    first, second = bench.submit("alice"), bench.submit("bob")
    name = f"falcon-t{first}-2x2"
    creating = ClusterView(pools=pool(first, "PROVISIONING", 0), ops={name: OpView("create", "running")}, reservation=RES)
    bench.step(ClusterView(reservation=RES))
    bench.step(creating)
    bench.store.request_abort(first)
    bench.step(creating)
    assert bench.phase(second) == "Pending/Provisioning"
    # the kept pool comes up (RUNNING, its node Ready): the waiting holder switches to it
    up = ClusterView(pools=pool(first), ops={name: OpView("create", "done")}, reservation=RES)
    bench.step(up)
    assert bench.phase(second) == "Pending/Dispatching"
    assert bench.task(second).node_pool_name == name
