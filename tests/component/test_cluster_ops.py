"""The ClusterGateway without Ray or GKE, over a real store: its node-pool operation FIFO,
its claims on the reservation ledger, and its seams (the loops it is given run its steps;
its jitter comes from the rng it is given).

The fence read before every GKE call that changes something is a database read. When the
database does not answer, an operation stays queued (taken out of the FIFO, it would never
run while its queue sees it queued). The ledger's rule has its own table
(tests/unit/test_nodepool_ledger.py); here the gateway feeds it the lease rows it reads
and keeps the grants it makes."""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import replace

import pytest
import sqlalchemy as sa

from actors.cluster import ClusterGateway, PoolOp
from falcon_ray import render
from falcon_ray.clock import ManualClock
from falcon_ray.config import Settings
from falcon_ray.errors import CloudError, ErrorKind
from falcon_ray.kube import JobObservation
from falcon_ray.model import OpKind, OpState, PoolView, ReservationView
from falcon_ray.store import Store
from falcon_ray.store.migrate import upgrade
from tests.harness.fakes import FakePort

# Every endpoint on a closed loopback port: the watch's connect attempt, started with the
# gateway, fails at once and never reaches Google.
NOWHERE = "127.0.0.1:9"


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    monkeypatch.setenv("GCE_METADATA_HOST", NOWHERE)  # its connect sets it; restored after the test
    monkeypatch.setenv("GCE_METADATA_IP", NOWHERE)
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    upgrade(url, with_jobs_table=True)
    store = Store(url, epoch=None)
    store.add_cluster("edge-a", "proj-a", "us-east5-b", "v6e", "logs-a", "res-a")
    settings = Settings(
        gke_endpoint=f"http://{NOWHERE}", compute_endpoint=f"http://{NOWHERE}", metadata_host=NOWHERE, api_retry_timeout_s=0.5
    )
    # the test runs the steps itself: no loop runs on its own
    gw = ClusterGateway("edge-a", settings, store, FakePort(), loops=ManualLoop)
    yield gw
    gw.shutdown()
    store.dispose()


class ManualLoop:
    """A loop that never steps by itself (``actors.ticker.Loop``): the test calls ``step``."""

    def __init__(self, name, step, interval, log, start_after=0.0, halted=None, clock=None):
        self.name, self.step, self.interval, self.start_after = name, step, interval, start_after
        self.wakes = 0
        self.stopped = False

    def wake(self):
        self.wakes += 1

    def stop(self):
        self.stopped = True

    def join(self, timeout):
        return True

    def status(self):
        return {"steps": 0, "wakes": self.wakes}


def _db_down(*_a, **_k):
    raise sa.exc.OperationalError("SELECT epoch", {}, ConnectionRefusedError("database unreachable"))


@pytest.mark.parametrize("kind", [OpKind.DELETE, OpKind.CREATE])
def test_an_operation_whose_fence_read_fails_stays_queued_and_runs_next_time(gateway, monkeypatch, kind):
    ran = []
    gateway.conn.gke = object()  # connected: the step takes operations (none reaches GKE here)
    monkeypatch.setattr(gateway, "_run_op", lambda op: ran.append(op.name))
    monkeypatch.setattr(gateway, "_hint_pool_owner", lambda pool: None)
    if kind == OpKind.DELETE:
        gateway.delete_pool("falcon-t1-2x2")
    else:
        gateway.ensure_pool("falcon-t1-2x2", {"name": "falcon-t1-2x2"})
    fence = gateway.store.check_fence
    monkeypatch.setattr(gateway.store, "check_fence", _db_down)
    with pytest.raises(sa.exc.OperationalError):
        gateway._op_step()
    assert ran == []
    op = gateway.op_queue.ops["falcon-t1-2x2"]
    assert op.kind == kind and op.state == OpState.QUEUED and list(gateway.op_queue.fifo) == [op]
    # asking again while it waits queues nothing twice
    assert (gateway.delete_pool if kind == OpKind.DELETE else lambda n: gateway.ensure_pool(n, {}))("falcon-t1-2x2") == OpState.QUEUED
    assert len(gateway.op_queue.fifo) == 1
    monkeypatch.setattr(gateway.store, "check_fence", fence)  # the database is back
    gateway._op_step()
    assert ran == ["falcon-t1-2x2"] and op.state == OpState.DONE and not gateway.op_queue.fifo


def test_a_lost_wake_up_after_an_operation_does_not_stop_the_next_one(gateway, monkeypatch):
    ran = []
    gateway.conn.gke = object()
    monkeypatch.setattr(gateway, "_run_op", lambda op: ran.append(op.name))
    monkeypatch.setattr(gateway.store, "get_lease", _db_down)  # the wake-up's read fails
    gateway.delete_pool("falcon-t1-2x2")
    gateway.delete_pool("falcon-t2-2x2")
    gateway._op_step()
    assert ran == ["falcon-t1-2x2", "falcon-t2-2x2"]


def test_an_operation_that_succeeds_on_retry_keeps_no_error(gateway, monkeypatch):
    """A retried error is over once the operation is DONE: the pool's queue must not report
    GKE's old words as the pool's state."""
    gateway.conn.gke = object()
    calls = []

    def run_op(op):
        calls.append(op.name)
        if len(calls) == 1:
            raise CloudError(ErrorKind.TRANSIENT, "503 backend unavailable")

    monkeypatch.setattr(gateway, "_run_op", run_op)
    monkeypatch.setattr(gateway, "_hint_pool_owner", lambda pool: None)
    gateway.ensure_pool("falcon-t1-2x2", {"name": "falcon-t1-2x2"})
    gateway._op_step()
    op = gateway.op_queue.ops["falcon-t1-2x2"]
    assert (op.state, op.error_kind, op.attempts) == (OpState.QUEUED, ErrorKind.TRANSIENT, 1)
    assert "503" in op.error
    op.next_at = 0.0  # its backoff is over
    gateway._op_step()
    assert calls == ["falcon-t1-2x2", "falcon-t1-2x2"]
    assert (op.state, op.error_kind, op.error) == (OpState.DONE, None, "")


def test_two_claims_on_the_last_free_slice_grant_one(gateway):
    """4 hosts free, a 2-host pool being created: one more 2-host claim fits, a second does not."""
    cluster = gateway.cluster
    gateway.reservation.reading = ReservationView(count=4, in_use=0)
    gateway.store.create_lease(cluster.id, "2x4", "falcon-t1-2x4", "reservation", None)
    assert gateway.claim_reservation("falcon-t2-2x4", 2)
    assert not gateway.claim_reservation("falcon-t3-2x4", 2)
    assert gateway.claim_reservation("falcon-t2-2x4", 2)  # idempotent: its grant holds
    assert gateway.reservation_view().claimed == 4


def test_a_node_registered_after_the_reservation_was_read_still_holds_its_claim(gateway):
    """GKE's in_use was read before the 1-host pool's node registered: the pool list that
    shows the node is newer than the figure, so the ledger must not take the node as counted
    by in_use (it would grant the 2-host claim a full reservation cannot serve)."""
    cluster = gateway.cluster
    gateway.reservation.reading = ReservationView(count=2, in_use=0)  # read with no node listed
    gateway.store.create_lease(cluster.id, "2x2", "falcon-t1-2x2", "reservation", None)
    gateway.pool_cache.pools["falcon-t1-2x2"] = PoolView("falcon-t1-2x2", "RUNNING", registered=1, ready=1)
    assert not gateway.claim_reservation("falcon-t2-2x4", 2)
    assert gateway.reservation_view().claimed == 1
    # the next read counts the node in in_use and lists it beside: still one host free
    gateway.reservation.reading, gateway.reservation.registered = ReservationView(count=2, in_use=1), {"falcon-t1-2x2": 1}
    assert gateway.reservation_view().claimed == 0
    assert not gateway.claim_reservation("falcon-t2-2x4", 2)


def test_a_grant_is_dropped_once_its_lease_row_carries_it(gateway):
    cluster = gateway.cluster
    gateway.reservation.reading = ReservationView(count=4, in_use=0)
    assert gateway.claim_reservation("falcon-t1-2x4", 2)
    assert set(gateway.reservation.grants) == {"falcon-t1-2x4"}
    gateway.store.create_lease(cluster.id, "2x4", "falcon-t1-2x4", "reservation", None)
    gateway.reservation.rows = (0.0, None)  # the next view reads the rows again
    assert gateway.reservation_view().claimed == 2  # counted once, from the row
    assert gateway.reservation.grants == {}


def test_the_gateway_runs_its_loops_from_the_factory_it_is_given(gateway):
    loops = gateway.tickers
    workers = {"operations", "operations-2", "operations-3", "operations-4"}  # pool_ops_at_once
    assert set(loops) == {"watch", "orphans", "gauges", *workers}
    assert {loop.name.split(": ")[1] for loop in gateway.op_loops} == workers
    assert all(isinstance(loop, ManualLoop) for loop in loops.values())
    assert loops["orphans"].start_after == gateway.settings.orphan_scan_interval_s
    assert loops["watch"].start_after == 0.0 and loops["operations"].start_after == 0.0
    gateway.delete_pool("falcon-t1-2x2")  # a new operation wakes every operation worker
    assert all(loops[w].wakes == 1 for w in workers)
    assert gateway.snapshot()["loops"]["operations"] == {"steps": 0, "wakes": 1}
    gateway.shutdown()
    assert all(loop.stopped for loop in loops.values())


def test_operations_run_side_by_side_up_to_the_setting_and_never_two_on_one_pool(gateway, monkeypatch):
    """Each worker takes the next due operation while fewer than ``pool_ops_at_once`` run;
    a delete asked for while its pool's create runs waits for that create to end."""
    gateway.conn.gke = object()
    monkeypatch.setattr(gateway, "_hint_pool_owner", lambda pool: None)
    for n in range(6):
        gateway.ensure_pool(f"falcon-p{n}", {"name": f"falcon-p{n}"})
    taken = [gateway._next_op() for _ in range(5)]  # what five workers would take now
    assert [op.name if op else None for op in taken] == ["falcon-p0", "falcon-p1", "falcon-p2", "falcon-p3", None]
    assert gateway.next_operation_due() is None  # four run: no worker need wake before one ends
    assert gateway.snapshot()["ops_running"] == ["falcon-p0", "falcon-p1", "falcon-p2", "falcon-p3"]
    gateway.op_queue.running.pop("falcon-p3")  # a worker ended one
    gateway.delete_pool("falcon-p0")  # p0's create still runs: its delete waits for it
    op = gateway._next_op()
    assert op is not None and op.name == "falcon-p4"
    gateway.op_queue.running.pop("falcon-p1")
    assert gateway._next_op().name == "falcon-p5"
    gateway.op_queue.running.pop("falcon-p2")
    assert gateway._next_op() is None and gateway.next_operation_due() is None  # only p0's delete is left
    gateway.op_queue.running.pop("falcon-p0")  # p0's create ended
    assert gateway.next_operation_due() == 0.0
    op = gateway._next_op()
    assert (op.name, op.kind) == ("falcon-p0", OpKind.DELETE)


def test_a_refusal_as_concurrent_lowers_the_operations_run_together_until_the_probe(gateway, monkeypatch):
    """GKE that answers "incompatible operation" naming one of the two operations of ours
    that run takes two at most; after pool_ops_probe_s the setting is tried again. An
    incompatible operation that is not ours (GKE's own upgrade) teaches nothing."""
    gateway.conn.gke = object()
    monkeypatch.setattr(gateway, "_hint_pool_owner", lambda pool: None)
    for n, name in enumerate(("falcon-a", "falcon-b")):  # two of ours run
        gateway.op_queue.running[name] = PoolOp(name, OpKind.CREATE, state=OpState.RUNNING, operation=f"operation-{n}-ours")

    def refused_by(running):
        def run_op(op):
            raise CloudError(ErrorKind.INCOMPATIBLE_OPERATION, f"Cluster is running incompatible operation {running}. Please wait and try again.")
        return run_op

    monkeypatch.setattr(gateway, "_run_op", refused_by("operation-9-upgrade"))
    gateway.ensure_pool("falcon-c", {"name": "falcon-c"})
    gateway._op_step()  # GKE's own operation holds the cluster: retried, nothing learned
    op = gateway.op_queue.ops["falcon-c"]
    assert (op.state, op.error_kind, op.attempts) == (OpState.QUEUED, ErrorKind.INCOMPATIBLE_OPERATION, 1)
    assert gateway.ops_at_once() == 4
    monkeypatch.setattr(gateway, "_run_op", refused_by("operation-1-ours"))
    gateway.ensure_pool("falcon-d", {"name": "falcon-d"})  # asked for after c
    op.next_at = 0.0
    gateway._op_step()
    assert op.attempts == 2 and gateway.ops_at_once() == 2 and gateway.snapshot()["ops_at_once"] == 2
    assert op.next_at <= gateway.clock.monotonic() and gateway.op_queue.fifo[0] is op  # no backoff: first again
    assert gateway._next_op() is None  # two run: c waits for one of them to end
    gateway.op_queue.running.pop("falcon-a")
    assert gateway._next_op() is op
    gateway.op_queue.running.pop("falcon-c")
    gateway.op_queue.learned = replace(gateway.op_queue.learned, until=gateway.clock.monotonic())  # the probe is due
    assert gateway.ops_at_once() == gateway.settings.pool_ops_at_once == 4


def test_the_connect_backoff_draws_its_jitter_from_the_given_rng(tmp_path):
    url = f"sqlite:///{tmp_path / 'rng.db'}"
    upgrade(url, with_jobs_table=True)
    store = Store(url, epoch=None)
    store.add_cluster("edge-a", "proj-a", "us-east5-b", "v6e", "logs-a", "")

    def unreachable(cluster, settings, user_agent, stage):
        stage("reading the cluster from the GKE API")
        raise CloudError(ErrorKind.TRANSIENT, "connection refused")

    delays = []
    for failures in (1, 2):
        gw = ClusterGateway("edge-a", Settings(), store, FakePort(), connect=unreachable, rng=random.Random(7), loops=ManualLoop)
        for _ in range(failures):
            gw.tickers["watch"].step()
        delays.append(gw.watch_delay)
        assert gw.gke is None and "connection refused" in gw.not_connected()
    drawn = random.Random(7)
    first, second = drawn.random(), drawn.random()
    assert delays == [1.0 + first, 2.0 + second]
    store.dispose()


def test_an_outage_is_dated_from_its_first_failed_connect(tmp_path):
    """The view a queue decides on says since when GKE has been unreachable: the create's
    limit counts from then, not from the task's phase."""
    url = f"sqlite:///{tmp_path / 'since.db'}"
    upgrade(url, with_jobs_table=True)
    store = Store(url, epoch=None)
    store.add_cluster("edge-a", "proj-a", "us-east5-b", "v6e", "logs-a", "")
    clock = ManualClock(dt.datetime(2026, 1, 5, 9, 0, 0))

    def unreachable(cluster, settings, user_agent, stage):
        raise CloudError(ErrorKind.TRANSIENT, "connection refused")

    gw = ClusterGateway("edge-a", Settings(), store, FakePort(), connect=unreachable, rng=random.Random(7), loops=ManualLoop, clock=clock)
    gw.tickers["watch"].step()
    clock.advance(300)
    gw.tickers["watch"].step()
    view = gw.observe("edge-a-2x2", [], False)
    assert "connection refused" in view.error and view.error_since == dt.datetime(2026, 1, 5, 9, 0, 0)
    store.dispose()


def test_the_read_only_views_a_scheduler_reads_say_when_the_operations_can_next_run(gateway):
    """``next_operation_due``, ``op_views``, ``pool_owner`` and ``view_listed_at`` (the
    simulator's seams) read the FIFO and caches and change nothing."""
    assert gateway.next_operation_due() is None  # not connected
    gateway.conn.gke = object()
    assert gateway.next_operation_due() is None  # nothing queued
    gateway.ensure_pool("falcon-a", {"name": "falcon-a"})
    gateway.ensure_pool("falcon-b", {"name": "falcon-b"})
    gateway.op_queue.ops["falcon-a"].next_at = 50.0  # a retry later than b's
    gateway.op_queue.ops["falcon-b"].next_at = 20.0
    assert gateway.next_operation_due() == 20.0
    gateway.delete_pool("falcon-b")  # cancels b's create: its delete is the one queued
    gateway.op_queue.ops["falcon-b"].next_at = 70.0
    assert gateway.next_operation_due() == 50.0
    views = gateway.op_views()
    assert set(views) == {"falcon-a", "falcon-b"} and views["falcon-b"].kind == OpKind.DELETE
    gateway.op_queue.fifo.clear()  # taken out to run: only asked for by name
    assert gateway.op_views() == {} and gateway.op_views(["falcon-a", "falcon-x"])["falcon-a"].state == OpState.QUEUED
    assert gateway.next_operation_due() is None
    gateway.observe("edge-a.2x2", ["falcon-a"], want_reservation=False)
    assert gateway.pool_owner("falcon-a") == "2x2" and gateway.pool_owner("falcon-x") is None
    gateway.pool_cache.listed_at, gateway.reservation.read_at = 10.0, 12.0
    assert gateway.view_listed_at == 12.0


def _job(task_id: int, topology: str, phase: str = "Running", uid: str = "") -> JobObservation:
    return JobObservation(
        task_id=task_id, name=f"falcon-t{task_id}", uid=uid or f"uid-{task_id}", namespace="falcon", phase=phase,
        active=1 if phase == "Running" else 0, ready=0, succeeded=1 if phase == "Succeeded" else 0, failed=0, expected=1,
        message="", resource_version="1", labels={render.LABEL_QUEUE: render.queue_label("edge-a", topology)},
    )


def test_a_relist_wakes_only_the_queues_whose_jobs_it_finds_changed_or_gone(gateway):
    """The first list makes the Job cache synced and wakes every queue it finds a Job of; a
    re-list (after a dropped watch, or its period) that finds each Job as the events left it
    wakes nobody, one that finds a Job changed or gone wakes that Job's queue."""
    port = gateway.port
    jobs = [_job(1, "2x2"), _job(2, "4x4"), _job(3, "2x2")]
    gateway._on_resync(jobs)
    assert sorted(port.took("hint")) == [("hint", "edge-a", "2x2"), ("hint", "edge-a", "4x4")]
    gateway._on_resync(jobs)
    assert port.took("hint") == []
    gateway._on_job(_job(2, "4x4", phase="Succeeded"))  # an event between the lists: its queue is told then
    assert port.took("hint") == [("hint", "edge-a", "4x4")]
    gateway._on_resync([jobs[0], _job(2, "4x4", phase="Succeeded"), jobs[2]])
    assert port.took("hint") == []
    gateway._on_resync([jobs[0], _job(2, "4x4", phase="Succeeded")])  # task 3's Job is gone
    assert port.took("hint") == [("hint", "edge-a", "2x2")]
    gateway._on_resync([_job(1, "2x2", phase="Succeeded"), _job(2, "4x4", phase="Succeeded")])  # missed while the watch was down
    assert port.took("hint") == [("hint", "edge-a", "2x2")]
