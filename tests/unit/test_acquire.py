"""Rule 4, table by table: what the slot holder does for each lease state, pool and
operation view, and time since the create (a fake clock: ``created_s`` seconds ago)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState, Phase, Reason
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
)
from falcon_ray.reconcile import (
    DeleteJob,
    DeletePool,
    EnsurePool,
    MoveLease,
    RecordDisruption,
    RecordOperation,
    SubmitJob,
    Transition,
    UpdateTask,
    decide,
)
from falcon_ray.reconcile.context import stamp
from falcon_ray.spec import parse_spec
from tests.harness.fakes import FakeClock

S = Settings(node_pool_timeout_s=600, create_visibility_grace_s=120)
POOL = "falcon-t1-2x2"
CLOCK = FakeClock()


@dataclass(frozen=True)
class Row:
    name: str
    phase: Phase
    lease: LeaseState | None
    pool: tuple | None = None  # (status, registered, ready)
    op: OpView | None = None
    created_s: float = 30.0
    other_waiting: bool = False
    mode: str = "reservation"
    expect_to: Phase | None = None  # the task's transition, if any
    expect_lease: LeaseState | None = None  # the lease's move, if any
    expect: tuple[type, ...] = ()  # other effects that must be there
    message: str = ""  # in the task's new Message
    absent: tuple[type, ...] = field(default=())
    recorded: str | None = "op-1"  # the operation name already on the lease
    job: tuple | None = None  # (phase, ready pods) of the task's Job
    in_phase_s: float = 0.0
    accepted_s: float | None = None  # GKE accepted the create this long ago (the lease's accepted_at)
    alternatives: bool = False  # another active cluster of the TPU type exists
    topology: str = "2x2"  # 4x4: a slice of 4 hosts
    nodes_s: float | None = None  # the pool's first node came this long ago (PoolView.nodes_since)
    releases: int = 0  # pools the task gave back before (``released`` rows)


RUNNING_OK = OpView("create", "done", operation="op-1")
ROWS = [
    Row("create accepted: Requested -> Creating, operation recorded with the move", lc.PROVISIONING, LeaseState.REQUESTED,
        pool=("PROVISIONING", 0, 0), op=OpView("create", "running", operation="op-1"),
        expect_lease=LeaseState.CREATING, absent=(RecordOperation,), recorded=None),
    Row("create started, GKE has not answered: still Requested (the call may yet be refused)", lc.PROVISIONING,
        LeaseState.REQUESTED, op=OpView("create", "running"), recorded=None, absent=(MoveLease, RecordOperation)),
    Row("all nodes Ready: Dispatching, its Job submitted in the same group (Creating -> InUse)", lc.PROVISIONING,
        LeaseState.CREATING, pool=("RUNNING", 1, 1), op=RUNNING_OK, expect_to=lc.DISPATCHING, expect_lease=LeaseState.IN_USE,
        expect=(SubmitJob,), message="submitted, waiting for pods"),  # the move says what the group leaves
    Row("all nodes Ready and its Job already there: Dispatching on a Ready pool, no second submit", lc.PROVISIONING,
        LeaseState.CREATING, pool=("RUNNING", 1, 1), op=RUNNING_OK, job=("Pending", 0), expect_to=lc.DISPATCHING,
        expect_lease=LeaseState.READY, absent=(SubmitJob,), message=f"Node pool {POOL} ready"),
    Row("control plane RUNNING, nodes registering: WaitingForNode", lc.PROVISIONING, LeaseState.CREATING,
        pool=("RUNNING", 0, 0), op=RUNNING_OK, expect_to=lc.WAITING_FOR_NODE, message="0/1 expected node(s) registered"),
    Row("nodes late, nobody else waits: keep waiting past the timeout", lc.WAITING_FOR_NODE, LeaseState.CREATING,
        pool=("RUNNING", 0, 0), op=RUNNING_OK, created_s=3600, absent=(Transition, DeletePool)),
    # the contested wait (issue 37): counted from the pool's first node, never on a pool whose
    # nodes are all registered, and a release back to the head of the queue, not a failure
    Row("nodes late, another topology waits, no node yet: the pool holds nothing, it keeps waiting",
        lc.WAITING_FOR_NODE, LeaseState.CREATING, pool=("RUNNING", 0, 0), op=RUNNING_OK, created_s=700, in_phase_s=601,
        other_waiting=True, absent=(Transition, DeletePool)),
    Row("2/4 nodes held for over the timeout since the first came, another topology waits: pool given back, head of the queue",
        lc.WAITING_FOR_NODE, LeaseState.CREATING, topology="4x4", pool=("RUNNING", 2, 2, "", None), nodes_s=601,
        op=RUNNING_OK, created_s=1400, in_phase_s=1300, other_waiting=True, expect_to=lc.WAITING,
        expect_lease=LeaseState.DELETING, expect=(DeletePool, RecordDisruption), message="release 1 of at most 3"),
    Row("2/4 nodes, waiting for an hour but the first node came 5 minutes ago: the nodes get their time",
        lc.WAITING_FOR_NODE, LeaseState.CREATING, topology="4x4", pool=("RUNNING", 2, 2, "", None), nodes_s=300,
        op=RUNNING_OK, created_s=3700, in_phase_s=3600, other_waiting=True, absent=(Transition, DeletePool)),
    Row("every node registered, not all Ready, an hour after the first, another topology waits: never given back",
        lc.WAITING_FOR_NODE, LeaseState.CREATING, topology="4x4", pool=("RUNNING", 4, 2, "", None), nodes_s=3600,
        op=RUNNING_OK, created_s=3700, in_phase_s=3600, other_waiting=True, absent=(Transition, DeletePool)),
    Row("2/4 nodes held too long after 3 releases: Failed/NodePoolFailed, the capacity not delivered in time",
        lc.WAITING_FOR_NODE, LeaseState.CREATING, topology="4x4", pool=("RUNNING", 2, 2, "", None), nodes_s=601,
        op=RUNNING_OK, created_s=1400, in_phase_s=1300, other_waiting=True, releases=3,
        expect_to=lc.failed(Reason.NODE_POOL_FAILED), expect_lease=LeaseState.DELETING, expect=(DeletePool,),
        absent=(RecordDisruption,), message="Capacity not delivered in time"),
    Row("a create that queued long, nodes just due, another topology waits: the nodes get their time",
        lc.WAITING_FOR_NODE, LeaseState.CREATING, pool=("RUNNING", 0, 0), op=RUNNING_OK, created_s=700, in_phase_s=30,
        other_waiting=True, absent=(Transition, DeletePool)),
    Row("control plane not RUNNING in time: the pool given back, head of the queue", lc.PROVISIONING, LeaseState.CREATING,
        pool=("PROVISIONING", 0, 0), op=OpView("create", "running"), created_s=601, in_phase_s=700,
        expect_to=lc.WAITING, expect_lease=LeaseState.DELETING, expect=(DeletePool, RecordDisruption),
        message="control plane PROVISIONING 601s after GKE accepted the create"),
    Row("control plane not RUNNING in time after 3 releases: NodePoolTimeout", lc.PROVISIONING, LeaseState.CREATING,
        pool=("PROVISIONING", 0, 0), op=OpView("create", "running"), created_s=601, in_phase_s=700, releases=3,
        expect_to=lc.failed(Reason.NODE_POOL_TIMEOUT), expect_lease=LeaseState.DELETING, expect=(DeletePool,),
        absent=(RecordDisruption,), message="control plane PROVISIONING 601s after GKE accepted the create"),
    Row("control plane not RUNNING yet: wait", lc.PROVISIONING, LeaseState.CREATING,
        pool=("PROVISIONING", 0, 0), op=OpView("create", "running"), created_s=599, absent=(Transition, DeletePool)),
    Row("create refused: NodePoolFailed with GKE's words", lc.PROVISIONING, LeaseState.REQUESTED,
        op=OpView("create", "failed", 1, "quota_exceeded", "Quota 'TPUS_PER_PROJECT' exceeded"),
        expect_to=lc.failed(Reason.NODE_POOL_FAILED), expect_lease=LeaseState.DELETING, message="TPUS_PER_PROJECT"),
    Row("pool in ERROR after its create: NodePoolFailed", lc.PROVISIONING, LeaseState.CREATING,
        pool=("ERROR", 0, 0), op=RUNNING_OK, expect_to=lc.failed(Reason.NODE_POOL_FAILED), message="is in ERROR"),
    Row("pool in ERROR, its create had a retried 503: NodePoolFailed says GKE's reason, not the 503", lc.PROVISIONING,
        LeaseState.CREATING, pool=("ERROR", 0, 0, "Internal error while creating node pool."),
        op=OpView("create", "done", 1, None, "503 Service Unavailable", operation="op-1"),
        expect_to=lc.failed(Reason.NODE_POOL_FAILED), message="Internal error while creating node pool."),
    Row("the ClusterActor forgot the create: ask again, following the recorded operation", lc.PROVISIONING,
        LeaseState.CREATING, expect=(EnsurePool,), absent=(Transition,)),
    Row("flex-start pool not visible yet after its create: say so, no orphan delete", lc.PROVISIONING,
        LeaseState.CREATING, op=OpView("create", "done"), mode="flex-start", absent=(DeletePool,),
        expect=(UpdateTask,), message="not yet visible"),
    Row("busy cluster: the create waits its turn and says why", lc.PROVISIONING, LeaseState.REQUESTED,
        op=OpView("create", "queued", 2, "incompatible_operation", "Cluster is running incompatible operation"),
        expect=(UpdateTask,), message="incompatible operation"),
    Row("pool Ready (kept for it): Dispatching", lc.PROVISIONING, LeaseState.READY, pool=("RUNNING", 1, 1),
        expect_to=lc.DISPATCHING),
    # flex-start pools scale from zero: the Job first, the nodes follow for its pending pods
    Row("flex-start control plane RUNNING with no node: submit the Job, WaitingForNode", lc.PROVISIONING,
        LeaseState.CREATING, pool=("RUNNING", 0, 0), op=RUNNING_OK, mode="flex-start",
        expect_to=lc.WAITING_FOR_NODE, expect_lease=LeaseState.IN_USE, expect=(SubmitJob,),
        message="0/1 expected node(s) registered"),
    Row("flex-start Job pending for an hour, nobody else waits: keep waiting, say since when", lc.WAITING_FOR_NODE,
        LeaseState.IN_USE, pool=("RUNNING", 0, 0), mode="flex-start", job=("Pending", 0), in_phase_s=3700,
        created_s=3800, absent=(Transition, DeletePool, DeleteJob),
        message=f"(waiting since {stamp(CLOCK() - dt.timedelta(seconds=3700))} UTC)"),
    Row("flex-start nodes came and pods ready: Running, the timeout clock starts", lc.WAITING_FOR_NODE,
        LeaseState.IN_USE, pool=("RUNNING", 1, 1), mode="flex-start", job=("Running", 1), expect_to=lc.RUNNING),
    Row("flex-start nodes partly there, held past the timeout, another topology waits: given back, Job and pool deleted",
        lc.WAITING_FOR_NODE, LeaseState.IN_USE, topology="4x4", pool=("RUNNING", 1, 0, "", None), nodes_s=601,
        mode="flex-start", job=("Pending", 0), in_phase_s=3000, other_waiting=True, expect_to=lc.WAITING,
        expect_lease=LeaseState.DELETING, expect=(DeleteJob, DeletePool, RecordDisruption)),
    Row("flex-start capacity delivered after 50 minutes (every node registered), another topology waits: kept (issue 37)",
        lc.WAITING_FOR_NODE, LeaseState.IN_USE, pool=("RUNNING", 1, 0, "", None), nodes_s=20, mode="flex-start",
        job=("Pending", 0), in_phase_s=3000, other_waiting=True, absent=(Transition, DeletePool, DeleteJob)),
    Row("flex-start with no node yet holds nothing: another topology waiting does not end the capacity wait",
        lc.WAITING_FOR_NODE, LeaseState.IN_USE, pool=("RUNNING", 0, 0), mode="flex-start", job=("Pending", 0),
        in_phase_s=3700, other_waiting=True, absent=(Transition, DeletePool, DeleteJob)),
    # the create's timeout counts from GKE's acceptance, not from the lease row (issue 24)
    Row("create queued behind the cluster's other operations for an hour: not failed, says what it waits for and since when",
        lc.PROVISIONING, LeaseState.REQUESTED, op=OpView("create", "queued"), created_s=3600, recorded=None,
        absent=(Transition, DeletePool, MoveLease), message="Waiting to send the create of node pool falcon-t1-2x2"),
    Row("create refused for an hour because another operation runs: not failed, says so and since when",
        lc.PROVISIONING, LeaseState.REQUESTED, recorded=None, created_s=3600,
        op=OpView("create", "queued", 9, "incompatible_operation", "Cluster is running incompatible operation"),
        absent=(Transition, DeletePool), message="while cluster edge-a runs another operation"),
    Row("create still queued past create_queue_limit_s: NodePoolFailed, the Message puts it on the cluster's load",
        lc.PROVISIONING, LeaseState.REQUESTED, op=OpView("create", "queued"), created_s=10801, recorded=None,
        expect_to=lc.failed(Reason.NODE_POOL_FAILED), expect_lease=LeaseState.DELETING, expect=(DeletePool,),
        message="the task itself did nothing wrong"),
    Row("create accepted after an hour in the queue: Creating, its timeout starts now", lc.PROVISIONING,
        LeaseState.REQUESTED, op=OpView("create", "running", operation="op-1"), created_s=3600, recorded=None,
        expect_lease=LeaseState.CREATING, absent=(Transition, DeletePool)),
    Row("accepted 599s ago, row written an hour ago: the control plane still has time", lc.PROVISIONING,
        LeaseState.CREATING, pool=("PROVISIONING", 0, 0), op=OpView("create", "running", operation="op-1"),
        created_s=3600, accepted_s=599, absent=(Transition, DeletePool)),
    Row("accepted 601s ago, control plane not RUNNING: given back", lc.PROVISIONING, LeaseState.CREATING,
        pool=("PROVISIONING", 0, 0), op=OpView("create", "running", operation="op-1"), created_s=3600, accepted_s=601,
        in_phase_s=3600, expect_to=lc.WAITING, expect=(DeletePool,), message="601s after GKE accepted"),
    # nodes that never come are a capacity wait under capacity_budget_s (issue 24)
    Row("flex-start nodes not delivered within capacity_budget_s, no other cluster: NodePoolFailed, Job and pool deleted",
        lc.WAITING_FOR_NODE, LeaseState.IN_USE, pool=("RUNNING", 0, 0), mode="flex-start", job=("Pending", 0),
        in_phase_s=21601, created_s=22000, expect_to=lc.failed(Reason.NODE_POOL_FAILED), expect_lease=LeaseState.DELETING,
        expect=(DeleteJob, DeletePool), message="not a fault of the task"),
    Row("flex-start nodes not delivered within capacity_budget_s, another cluster exists: ClusterBusy to move or ask again",
        lc.WAITING_FOR_NODE, LeaseState.IN_USE, pool=("RUNNING", 0, 0), mode="flex-start", job=("Pending", 0),
        in_phase_s=21601, created_s=22000, alternatives=True, expect_to=lc.CLUSTER_BUSY, expect_lease=LeaseState.DELETING,
        expect=(DeleteJob, DeletePool), message="moving it to another cluster that can start it now"),
    Row("flex-start nodes 5h59m late: still within the budget", lc.WAITING_FOR_NODE, LeaseState.IN_USE,
        pool=("RUNNING", 0, 0), mode="flex-start", job=("Pending", 0), in_phase_s=21540, created_s=22000,
        absent=(Transition, DeletePool, DeleteJob)),
    Row("nodes of a reservation pool not registered within capacity_budget_s: NodePoolFailed", lc.WAITING_FOR_NODE,
        LeaseState.CREATING, pool=("RUNNING", 0, 0), op=RUNNING_OK, in_phase_s=21601, created_s=22000,
        expect_to=lc.failed(Reason.NODE_POOL_FAILED), expect_lease=LeaseState.DELETING, expect=(DeletePool,),
        message="GKE did not deliver the nodes"),
    Row("flex-start Job lost while waiting: submit again (409 adopts)", lc.WAITING_FOR_NODE, LeaseState.IN_USE,
        pool=("RUNNING", 0, 0), mode="flex-start", expect=(SubmitJob,), absent=(Transition,)),
]


def situation(row: Row) -> tuple[QueueState, ClusterView]:
    now = CLOCK()
    cluster = Cluster("c1", "edge-a", "proj", "us-east5-b", "v6e", "logs", "res-a", "active", "falcon-jobs", "falcon-job", now, now)
    spec = parse_spec({"tpu_type": "v6e", "topology": row.topology, "image": "img:1", "command": ["run"], "supply_mode": row.mode})
    since = now - dt.timedelta(seconds=row.in_phase_s)
    day_ago = now - dt.timedelta(days=1)
    released = tuple(Disruption(i, "released", "", f"falcon-task-1-{i}", "held 2/4", day_ago) for i in range(row.releases))
    t = QueueTask(1, "t1", "alice", row.phase, now, None, spec, POOL, None, "", phase_since=since, disruptions=released)
    leases = ()
    if row.lease is not None:
        created = now - dt.timedelta(seconds=row.created_s)
        accepted = None if row.accepted_s is None else now - dt.timedelta(seconds=row.accepted_s)
        leases = (Lease(1, "c1", "2x2", POOL, row.mode, row.lease, 1, row.recorded, 0, "", created, created, None, None, None,
                        accepted_at=accepted),)
    others = row.other_waiting
    nodes_since = None if row.nodes_s is None else now - dt.timedelta(seconds=row.nodes_s)
    pools = {POOL: PoolView(POOL, *row.pool, nodes_since=nodes_since) if len(row.pool) > 3 else PoolView(POOL, *row.pool)} if row.pool else {}
    jobs = {1: JobView(1, "falcon-task-1", "falcon-jobs", "u1", row.job[0], row.job[1], row.job[1], 1)} if row.job else {}
    view = ClusterView(pools=pools, ops={POOL: row.op} if row.op else {}, jobs=jobs, synced=True)
    state = QueueState(cluster, "2x2", (t,), leases, "", other_topology_waiting=others, alternatives_exist=row.alternatives)
    return state, view


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_acquisition_rule(row: Row):
    state, view = situation(row)
    out = [e for g in decide(state, view, CLOCK(), S) for e in g.effects]
    moves = [e for e in out if isinstance(e, Transition) and e.task_id == 1]
    if row.expect_to is None:
        assert not moves, moves
    else:
        assert [m.to for m in moves] == [row.expect_to]
    lease_moves = [e.to for e in out if isinstance(e, MoveLease) and e.to != LeaseState.DELETED]
    if row.expect_lease is not None:
        assert row.expect_lease in lease_moves, lease_moves
    for kind in row.expect:
        assert any(isinstance(e, kind) for e in out), (kind.__name__, out)
    if row.expect_lease == LeaseState.CREATING and row.op is not None and row.op.operation:
        move = next(e for e in out if isinstance(e, MoveLease) and e.to == LeaseState.CREATING)
        assert move.fields.get("operation") == row.op.operation, move
        assert move.fields.get("accepted_at") == CLOCK(), "GKE's acceptance is written with the move"
    for kind in row.absent:
        assert not any(isinstance(e, kind) for e in out), (kind.__name__, out)
    if row.message:
        texts = [e.message for e in out if isinstance(e, (Transition, UpdateTask)) and e.message]
        assert any(row.message in m for m in texts), texts
    for sub in (e for e in out if isinstance(e, SubmitJob)):
        if row.expect_to == lc.DISPATCHING:  # every node there: the timeout clock starts with the Job
            assert sub.phase == lc.DISPATCHING and sub.first
        else:
            assert sub.phase == lc.WAITING_FOR_NODE and not sub.first, "the timeout clock starts when the nodes came"
    if row.expect_to == lc.RUNNING:
        assert "dispatched_at" in moves[0].fields
    for g in decide(state, view, CLOCK(), S):  # a live task never loses its Job before its terminal write
        kinds = [type(e) for e in g.effects]
        ends = [i for i, e in enumerate(g.effects) if isinstance(e, Transition) and e.to.status in lc.TERMINAL]
        if DeleteJob in kinds and ends:
            assert ends[0] < kinds.index(DeleteJob), (g.what, kinds)
    ensure = [e for e in out if isinstance(e, EnsurePool)]
    if ensure and row.lease is not None:
        assert ensure[0].operation == "op-1"  # the recorded operation is followed, not asked again
