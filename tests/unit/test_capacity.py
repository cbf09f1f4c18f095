"""Capacity waits, table by table (a fake clock): a create that GKE refuses for capacity
keeps the task ClusterBusy and is asked again with backoff until ``capacity_budget_s``;
a quota or an error that will not heal fails at once. The wait is read only from the
refused lease rows (``QueueState.refused``), so a restarted queue decides the same."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.lifecycle import LeaseState, Phase, Reason
from falcon_ray.model import (
    Cluster,
    ClusterView,
    Destination,
    JobView,
    Lease,
    OpView,
    PoolView,
    QueueState,
    QueueTask,
    ReservationView,
)
from falcon_ray.reconcile import (
    ClaimReservation,
    CreateLease,
    DeleteJob,
    DeletePool,
    EnsurePool,
    MoveLease,
    MoveTask,
    Transition,
    UpdateTask,
    decide,
)
from falcon_ray.reconcile.context import stamp
from falcon_ray.spec import SupplyMode, parse_spec
from tests.harness.fakes import FakeClock

S = Settings()  # production defaults: 60 s first retry, x2, 1800 s cap, 6 h budget
CLOCK = FakeClock()
NOW = CLOCK()
POOL = "falcon-t1-2x2"
STOCKOUT = (
    "ZONE_RESOURCE_POOL_EXHAUSTED: The zone 'projects/proj/zones/us-east5-b' does not have enough resources "
    "available to fulfill the request (ct6e-standard-4t x 1). Try a different zone, or try again later."
)
QUOTA = "Quota 'TPUS_PER_PROJECT' exceeded. Limit: 8.0 in region us-east5."


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def cluster(reservation: str = "") -> Cluster:
    return Cluster("c1", "edge-a", "proj", "us-east5-b", "v6e", "logs", reservation, "active", "falcon-jobs", "falcon-job", NOW, NOW)


def task(phase: Phase, mode: str = "on-demand", pool: str | None = POOL, message: str = "") -> QueueTask:
    spec = parse_spec({"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["run"], "supply_mode": mode})
    return QueueTask(1, "t1", "alice", phase, ago(7200), None, spec, pool, None, message, phase_since=ago(10))


def lease(name: str, state: LeaseState, mode: str = "on-demand", refused_s: float | None = None, lid: int = 1) -> Lease:
    refused_at = ago(refused_s) if refused_s is not None else None
    created = ago((refused_s or 0) + 30)
    refusal = STOCKOUT if refused_at else ""
    return Lease(lid, "c1", "2x2", name, mode, state, 1, "op-1", 0, "", created, created, None, None, None, refused_at, refusal)


def refused_rows(*seconds_ago: float) -> tuple[Lease, ...]:
    """Refused pools of task 1, oldest first: attempt i refused ``seconds_ago[i]`` ago (Deleted)."""
    names = [POOL] + [f"{POOL}-r{i}" for i in range(1, len(seconds_ago))]
    return tuple(lease(n, LeaseState.DELETED, refused_s=s, lid=10 + i) for i, (n, s) in enumerate(zip(names, seconds_ago, strict=True)))


def run(t: QueueTask, leases=(), refused=(), view: ClusterView | None = None, reservation: str = "", s: Settings = S):
    state = QueueState(cluster(reservation), "2x2", (t,), tuple(leases), "", refused=tuple(refused))
    return [e for g in decide(state, view or ClusterView(synced=True), NOW, s) for e in g.effects]


def moves(out) -> list[Phase]:
    return [e.to for e in out if isinstance(e, Transition) and e.task_id == 1]


def texts(out) -> list[str]:
    return [e.message for e in out if isinstance(e, (Transition, UpdateTask)) and e.message]


# ---- the answer to a create: a wait, or a failure ----------------------------------------------


@dataclass(frozen=True)
class Answer:
    name: str
    op: OpView | None
    pool: PoolView | None
    to: Phase
    words: str


WAIT, FAILED = lc.CLUSTER_BUSY, lc.failed(Reason.NODE_POOL_FAILED)
ANSWERS = [
    Answer("stockout on the operation: ClusterBusy with GKE's words", OpView("create", "failed", 1, "stockout", STOCKOUT),
           None, WAIT, "ZONE_RESOURCE_POOL_EXHAUSTED"),
    Answer("reservation short at GKE: ClusterBusy", OpView("create", "failed", 1, "stockout",
           "Reservation res-a does not have enough resources: 1 VM(s) requested, 0 of 2 available."), None, WAIT, "res-a"),
    Answer("pool in ERROR for capacity, operation forgotten: ClusterBusy", None,
           PoolView(POOL, "ERROR", 0, 0, STOCKOUT, "stockout"), WAIT, "does not have enough resources"),
    Answer("quota exceeded: NodePoolFailed at once (the original's failure table)",
           OpView("create", "failed", 1, "quota_exceeded", QUOTA), None, FAILED, "TPUS_PER_PROJECT"),
    Answer("reservation not found: NodePoolFailed at once", OpView("create", "failed", 1, "not_found",
           "Reservation 'projects/proj/zones/us-east5-b/reservations/r' was not found."), None, FAILED, "was not found"),
    Answer("permission denied: NodePoolFailed at once", OpView("create", "failed", 1, "permanent",
           "Required 'container.nodePools.create' permission."), None, FAILED, "permission"),
    Answer("bad request: NodePoolFailed at once", OpView("create", "failed", 1, "permanent",
           "Invalid value for field 'machineType'."), None, FAILED, "machineType"),
    Answer("pool in ERROR for a quota: NodePoolFailed", None, PoolView(POOL, "ERROR", 0, 0, QUOTA, "quota_exceeded"),
           FAILED, "TPUS_PER_PROJECT"),
]


@pytest.mark.parametrize("a", ANSWERS, ids=[a.name for a in ANSWERS])
def test_create_answer(a: Answer):
    view = ClusterView(pools={POOL: a.pool} if a.pool else {}, ops={POOL: a.op} if a.op else {}, synced=True)
    out = run(task(lc.PROVISIONING), [lease(POOL, LeaseState.CREATING)], view=view)
    assert moves(out) == [a.to]
    assert any(a.words in m for m in texts(out)), texts(out)
    deleting = [e for e in out if isinstance(e, MoveLease) and e.to == LeaseState.DELETING]
    assert len(deleting) == 1 and any(isinstance(e, DeletePool) and e.name == POOL for e in out), "never leak the pool"
    if a.to == WAIT:
        assert deleting[0].fields["refused_at"] == NOW and deleting[0].fields["refusal"]  # the durable record
        assert deleting[0].fields["task_id"] == 1
        # since the first refusal (now), the first retry 60 s later: instants, not counters
        assert f"(waiting since {stamp(NOW)} UTC)" in texts(out)[0], texts(out)[0]
        assert f"asking GKE again at {stamp(NOW + dt.timedelta(seconds=60))} UTC" in texts(out)[0]
        assert not any(isinstance(e, EnsurePool) for e in out)
    else:
        assert "refused_at" not in deleting[0].fields


def test_first_refusal_of_a_flex_start_create_is_a_wait_too():
    op = OpView("create", "failed", 1, "stockout", STOCKOUT)
    out = run(task(lc.PROVISIONING, mode="flex-start"), [lease(POOL, LeaseState.REQUESTED, mode="flex-start")],
              view=ClusterView(ops={POOL: op}, synced=True))
    assert moves(out) == [WAIT] and "supply: flex-start" in texts(out)[0]


def test_flex_pool_failing_for_capacity_while_its_job_waits_for_nodes():
    pool = PoolView(POOL, "ERROR", 0, 0, STOCKOUT, "stockout")
    job = JobView(1, "falcon-task-1", "falcon-jobs", "u1", "Pending", 0, 0, 1)
    view = ClusterView(pools={POOL: pool}, jobs={1: job}, synced=True)
    out = run(task(lc.WAITING_FOR_NODE, mode="flex-start"), [lease(POOL, LeaseState.IN_USE, mode="flex-start")], view=view)
    assert moves(out) == [WAIT]
    kinds = [type(e) for e in out]
    assert kinds.index(DeleteJob) < kinds.index(Transition) and DeletePool in kinds
    assert lc.allowed(lc.WAITING_FOR_NODE, lc.CLUSTER_BUSY)


# ---- the backoff: 60, 120, 240, ... capped at 1800 s, from the last refusal ---------------------

SCHEDULE = [(1, 60), (2, 120), (3, 240), (4, 480), (5, 960), (6, 1800), (7, 1800), (9, 1800)]


@pytest.mark.parametrize(("refusals", "delay"), SCHEDULE)
def test_backoff_schedule(refusals: int, delay: float):
    assert S.capacity_retry_after_s(refusals) == delay
    # refusal i came long before, the last one ``delay`` seconds ago (budget not spent: 6 h)
    earlier = [delay + 1 + i for i in range(refusals - 1, 0, -1)]
    rows = refused_rows(*earlier, delay - 1)  # one second before the retry is due
    t = task(lc.CLUSTER_BUSY, pool=None)
    out = run(t, refused=rows)
    assert not any(isinstance(e, (EnsurePool, CreateLease)) for e in out) and not moves(out)
    assert any(f"refusal {refusals})" in m for m in texts(out)), texts(out)
    rows = refused_rows(*earlier, delay)  # due now: asked again, under the next attempt's name
    out = run(t, refused=rows)
    name = f"{POOL}-r{refusals}"
    assert [e.name for e in out if isinstance(e, CreateLease)] == [name]
    assert [e.name for e in out if isinstance(e, EnsurePool)] == [name]
    assert moves(out) == [lc.PROVISIONING]
    assert any(f"after {refusals} capacity refusal(s)" in m for m in texts(out)), texts(out)


def test_fast_settings_scale_the_schedule():
    fast = Settings(capacity_retry_first_s=0.5, capacity_retry_factor=3, capacity_retry_max_s=4)
    assert [fast.capacity_retry_after_s(n) for n in (1, 2, 3, 4)] == [0.5, 1.5, 4, 4]


# ---- the budget: from the first refusal -------------------------------------------------------


def test_budget_spent_while_backing_off_ends_node_pool_failed():
    rows = refused_rows(21700, 100)  # first refusal 6h01m ago, the last one 100 s ago (backoff 120 s)
    out = run(task(lc.CLUSTER_BUSY, pool=None), refused=rows)
    assert moves(out) == [FAILED]
    text = texts(out)[0]
    assert "capacity_budget_s=6h00m" in text and "waited 6h01m over 2 refusal(s)" in text and "ZONE_RESOURCE_POOL_EXHAUSTED" in text


def test_budget_spent_at_a_refusal_ends_node_pool_failed_and_deletes_the_pool():
    op = OpView("create", "failed", 1, "stockout", STOCKOUT)
    out = run(task(lc.PROVISIONING, pool=f"{POOL}-r1"), [lease(f"{POOL}-r1", LeaseState.CREATING)],
              refused=refused_rows(21600), view=ClusterView(ops={f"{POOL}-r1": op}, synced=True))
    assert moves(out) == [FAILED] and "over 2 refusal(s)" in texts(out)[0]
    assert any(isinstance(e, DeletePool) and e.name == f"{POOL}-r1" for e in out)


def test_budget_not_spent_keeps_waiting():
    out = run(task(lc.CLUSTER_BUSY, pool=None), refused=refused_rows(21500, 100))
    assert not moves(out) and any(f"(waiting since {stamp(ago(21500))} UTC)" in m for m in texts(out))


def test_reservation_headroom_wait_after_a_refusal_has_no_limit():
    """The backoff passed and the ledger has no headroom: ClusterBusy for headroom, whatever the budget."""
    view = ClusterView(reservation=ReservationView(count=1, in_use=1), synced=True)
    out = run(task(lc.CLUSTER_BUSY, mode="reservation", pool=None), refused=refused_rows(30000, 2000), view=view,
              reservation="res-a")
    assert not moves(out) and not any(isinstance(e, (ClaimReservation, EnsurePool)) for e in out)
    assert any("reservation_remaining_slices=0" in m for m in texts(out)), texts(out)


# ---- durable: the wait is read from the lease rows only ---------------------------------------


def test_crash_between_the_refused_lease_and_the_task_write_still_waits():
    """The refused lease moved to Deleting (with refused_at), the task is still Provisioning."""
    deleting = lease(POOL, LeaseState.DELETING, refused_s=5)
    out = run(task(lc.PROVISIONING), [deleting], refused=[deleting], view=ClusterView(ops={POOL: OpView("delete", "running")}, synced=True))
    assert moves(out) == [WAIT]
    assert not any(isinstance(e, (EnsurePool, CreateLease)) for e in out)


def test_same_rows_same_decision():
    """What a restarted queue sees is what the old one saw: the same effects."""
    rows = refused_rows(900, 300, 100)
    first = run(task(lc.CLUSTER_BUSY, pool=None), refused=rows)
    again = run(task(lc.CLUSTER_BUSY, pool=None), refused=tuple(reversed(rows)))
    assert first == again and not moves(first)


def test_an_unreachable_gke_during_the_backoff_does_not_end_the_wait():
    """A backoff needs nothing from GKE: a long capacity wait survives a connection flap."""
    t = replace(task(lc.CLUSTER_BUSY, pool=None), phase_since=ago(1200))  # past node_pool_timeout_s
    out = run(t, refused=refused_rows(1300, 1000, 100), view=ClusterView(error="connect timeout", synced=True))
    assert not moves(out) and any("asking GKE again" in m for m in texts(out))


# ---- nodes that never come: a capacity wait under the same budget (issue 24) -----------------


def flex_waiting(in_phase_s: float, refused=(), alternatives: bool = False, destinations=()):
    t = replace(task(lc.WAITING_FOR_NODE, mode="flex-start"), phase_since=ago(in_phase_s))
    held = Lease(1, "c1", "2x2", POOL, "flex-start", LeaseState.IN_USE, 1, "op-1", 0, "", ago(in_phase_s + 500),
                 ago(in_phase_s), ago(in_phase_s), None, None)
    view = ClusterView(pools={POOL: PoolView(POOL, "RUNNING", 0, 0)},
                       jobs={1: JobView(1, "falcon-task-1", "falcon-jobs", "u1", "Pending", 0, 0, 1)}, synced=True)
    state = QueueState(cluster(), "2x2", (t,), (held,), "", refused=tuple(refused), alternatives_exist=alternatives,
                       destinations=tuple(destinations))
    return [e for g in decide(state, view, NOW, S) for e in g.effects]


def test_nodes_within_the_budget_keep_waiting():
    assert not moves(flex_waiting(S.capacity_budget_s - 60))


def test_nodes_not_delivered_with_no_other_cluster_end_node_pool_failed_as_the_fleets():
    out = flex_waiting(S.capacity_budget_s + 1)
    assert moves(out) == [FAILED]
    assert "did not deliver the nodes" in texts(out)[0] and "not a fault of the task" in texts(out)[0]
    mark = next(e for e in out if isinstance(e, MoveLease))
    assert mark.to == LeaseState.DELETING and mark.fields["refused_at"] == NOW  # recorded as a refusal
    assert any(isinstance(e, DeleteJob) for e in out) and any(isinstance(e, DeletePool) for e in out)


def test_nodes_not_delivered_counts_from_an_earlier_refusal():
    """Refused at first, then created and waiting for nodes: one capacity wait, one budget."""
    out = flex_waiting(3600, refused=refused_rows(S.capacity_budget_s + 1))
    assert moves(out) == [FAILED]


def test_nodes_not_delivered_with_another_cluster_goes_cluster_busy_then_moves_or_asks_once_more():
    out = flex_waiting(S.capacity_budget_s + 1, alternatives=True)
    assert moves(out) == [WAIT]
    # the next round reads the non-delivery from the lease row as a refusal made now
    undelivered = replace(lease(POOL, LeaseState.DELETING, mode="flex-start", refused_s=1), refusal="GKE did not deliver")
    busy = replace(task(lc.CLUSTER_BUSY, mode="flex-start", pool=None), phase_since=ago(1))
    target = Destination(replace(cluster(), id="c2", name="edge-b"), idle_pools=(SupplyMode.FLEX_START,))
    state = QueueState(cluster(), "2x2", (busy,), (undelivered,), "", refused=(undelivered,), alternatives_exist=True,
                       destinations=(target,))
    moved = [e for g in decide(state, ClusterView(synced=True), NOW, S) for e in g.effects]
    assert any(isinstance(e, MoveTask) and e.to_cluster == "edge-b" for e in moved), moved
    # no cluster can start it now: it waits out the backoff, then asks this cluster once more
    alone = [e for g in decide(replace(state, destinations=()), ClusterView(synced=True), NOW, S) for e in g.effects]
    assert not moves(alone) and any("asking GKE again" in m for m in texts(alone))
    # a second non-delivery: the budget counts from the first one, so it ends NodePoolFailed
    again = flex_waiting(600, refused=(replace(undelivered, refused_at=ago(S.capacity_budget_s + 1)),), alternatives=True)
    assert moves(again) == [WAIT]
    later = replace(state, refused=(replace(undelivered, refused_at=ago(S.capacity_budget_s + 700)), undelivered),
                    destinations=())
    ended = [e for g in decide(later, ClusterView(synced=True), NOW, S) for e in g.effects]
    assert moves(ended) == [FAILED] and "capacity_budget_s" in texts(ended)[0]


# ---- the failover: a stockout is its zone's; another zone may have the capacity --------------------


def other(name: str = "edge-b", location: str = "us-central1-b", **kw) -> Destination:
    return Destination(replace(cluster(), id=f"id-{name}", name=name, location=location), **kw)


def busy_after(*seconds_ago: float, mode: str = "on-demand", destinations=()) -> QueueState:
    rows = refused_rows(*seconds_ago)
    waiting = replace(task(lc.CLUSTER_BUSY, mode=mode, pool=None), phase_since=ago(min(seconds_ago)))
    return QueueState(cluster(), "2x2", (waiting,), (), "", refused=rows, alternatives_exist=True, destinations=tuple(destinations))


def effects_of(state: QueueState) -> list:
    return [e for g in decide(state, ClusterView(synced=True), NOW, S) for e in g.effects]


@pytest.mark.parametrize("mode", ["on-demand", "flex-start"])
def test_a_refused_task_fails_over_to_an_empty_queue_in_another_zone_and_says_why(mode):
    """Refused for capacity for longer than failover_after_s (1 h): the stockout lasts."""
    assert not [e for e in effects_of(busy_after(S.failover_after_s - 1, 30, mode=mode, destinations=[other()])) if isinstance(e, MoveTask)]
    out = effects_of(busy_after(S.failover_after_s + 90, 30, mode=mode, destinations=[other()]))
    [m] = [e for e in out if isinstance(e, MoveTask)]
    assert (m.task_id, m.to_cluster, m.topology) == (1, "edge-b", "2x2")
    assert m.message == (
        f"Moved from edge-a to edge-b: GKE had no {mode} capacity for its node pool on edge-a (2 refusal(s) since "
        f"{stamp(ago(S.failover_after_s + 90))}), and its queue for the topology is empty in another zone (us-central1-b), where GKE has "
        "not refused it; next to acquire resources there"
    )
    assert not [e for e in out if isinstance(e, CreateLease)]


@pytest.mark.parametrize(
    ("destination", "why"),
    [
        (other(location="us-east5-b"), "the same zone: the stockout is there too"),
        (other(claimants=1), "its queue has a task ahead"),
        (other(refused=frozenset({1})), "it refused this task before: never back and forth"),
        (Destination(replace(cluster(), id="id-edge-b", name="edge-b", location="us-central1", zone="us-east5-b")), "a regional cluster whose pools go to the same zone"),
        (other(), "not active"),
    ],
)
def test_no_failover_where_the_capacity_would_not_be_there_or_the_task_was_before(destination, why):
    if why == "not active":
        destination = replace(destination, cluster=replace(destination.cluster, status="maintenance"))
    out = effects_of(busy_after(S.failover_after_s + 90, 30, destinations=[destination]))
    assert not [e for e in out if isinstance(e, MoveTask)], why


def test_a_reservation_task_never_fails_over_to_another_supply():
    rows = tuple(replace(r, supply_mode="reservation") for r in refused_rows(S.failover_after_s + 90))
    waiting = replace(task(lc.CLUSTER_BUSY, mode="reservation", pool=None), phase_since=ago(90))
    state = QueueState(cluster("res-a"), "2x2", (waiting,), (), "", refused=rows, alternatives_exist=True, destinations=(other(),))
    assert not [e for e in effects_of(state) if isinstance(e, MoveTask)]


def test_no_failover_when_it_is_off():
    state = busy_after(S.failover_after_s + 90, 30, destinations=[other()])
    off = Settings(failover_after_s=None)
    assert not [e for g in decide(state, ClusterView(synced=True), NOW, off) for e in g.effects if isinstance(e, MoveTask)]
    at_once = Settings(failover_after_s=0)
    assert [e for g in decide(busy_after(5, destinations=[other()]), ClusterView(synced=True), NOW, at_once) for e in g.effects if isinstance(e, MoveTask)]


def test_a_task_never_refused_does_not_fail_over():
    """ClusterBusy without a refusal (a reservation's headroom, say) moves only where it can start now."""
    waiting = replace(task(lc.CLUSTER_BUSY, pool=None), phase_since=ago(90))
    state = QueueState(cluster(), "2x2", (waiting,), (), "", alternatives_exist=True, destinations=(other(),))
    assert not [e for e in effects_of(state) if isinstance(e, MoveTask)]


def test_no_failover_once_the_budget_here_is_spent():
    """Past capacity_budget_s on its cluster the task ends NodePoolFailed where it is."""
    out = effects_of(busy_after(S.capacity_budget_s + 10, 30, destinations=[other()]))
    assert not [e for e in out if isinstance(e, MoveTask)]
    assert [e.to for e in out if isinstance(e, Transition)] == [lc.failed(Reason.NODE_POOL_FAILED)]


def test_nodes_not_delivered_fail_over_at_once_to_another_zone():
    """A whole budget without the nodes is a lasting shortage of the zone: the next round
    moves the task to an empty queue in another zone, without waiting failover_after_s."""
    undelivered = replace(lease(POOL, LeaseState.DELETING, mode="flex-start", refused_s=1),
                          refusal=_not_delivered_text())
    busy = replace(task(lc.CLUSTER_BUSY, mode="flex-start", pool=None), phase_since=ago(1))
    state = QueueState(cluster(), "2x2", (busy,), (undelivered,), "", refused=(undelivered,), alternatives_exist=True,
                       destinations=(other(),))
    [m] = [e for e in effects_of(state) if isinstance(e, MoveTask)]
    assert m.to_cluster == "edge-b" and "GKE had no flex-start capacity" in m.message
    # a create refused a second ago is no lasting shortage: it waits out its backoff here
    refused_now = replace(state, refused=(replace(undelivered, refusal=STOCKOUT),))
    assert not [e for e in effects_of(refused_now) if isinstance(e, MoveTask)]


def _not_delivered_text() -> str:
    from falcon_ray import messages

    return messages.text("nodes_not_delivered", "en", pool=POOL, registered=0, expected=1, supply="flex-start", limit="6h00m", waited="6h00m")
