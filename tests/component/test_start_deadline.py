"""A spec's ``start_deadline_s`` in virtual time: the product's poller, queues and cluster
gateways against the simulated fleet (``devtools.simulate``), at production settings.

From every phase a task waits in for its first start (not placed yet, Waiting, Provisioning,
ClusterBusy, WaitingForNode, Dispatching) it ends Failed/StartDeadlineExceeded at its
deadline (not before, within a tick after), its Job and pool are deleted from the fleet,
its lease ends Deleted, and the queue's slot goes to the next task at once. A task that
started before its deadline runs to its end."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from falcon_ray.config import Settings
from falcon_ray.devtools.simulate.driver import Simulation
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import TaskEvent
from falcon_ray.reconcile.context import stamp
from falcon_ray.sim.fleet import parse_fleet
from tests.harness.simulate import sim_task
from tests.harness.virtual import TIMINGS  # GKE's orders of magnitude, as the other virtual-time tests

DEADLINE_S = 1800.0
S = Settings()
LATE_S = S.queue_tick_s + S.poll_interval_s  # how long after the deadline the end may come


def cluster(name: str = "c", status: str = "active", reservation: int | None = None, chips: int = 64, **timings) -> dict:
    c = {"name": name, "project": f"p-{name}", "location": "us-east5-b", "tpu_type": "v6e", "chips": chips,
         "status": status, "timings": {**TIMINGS, **timings}}  # fmt: skip
    if reservation is not None:
        c["reservation"] = {"name": f"res-{name}", "count": reservation}
    return {"clusters": [c]}


@dataclass
class Played:
    outcomes: dict[int, str]
    events: dict[int, list[TaskEvent]]
    created: dict[int, dt.datetime]
    leases: list
    jobs_alive: list[str]
    job_deletes: dict[str, list[float]]
    pools_alive: int
    pools_deleted: dict[str, float | None]
    t0_wall: float
    start: dt.datetime

    def failed_at(self, tid: int) -> tuple[float, str, TaskEvent]:
        """Seconds after its submission at which ``tid`` ended, the phase it ended from, and the event."""
        evs = self.events[tid]
        (i,) = [i for i, e in enumerate(evs) if e.status == "Failed"]
        before = evs[i - 1]
        phase = f"{before.status}/{before.reason}" if before.reason else before.status
        return (evs[i].at - self.created[tid]).total_seconds(), phase, evs[i]

    def entered(self, tid: int, status: str, reason: str = "") -> float | None:
        """Seconds after the start of the run at which ``tid`` first entered the phase."""
        at = next((e.at for e in self.events[tid] if (e.status, e.reason) == (status, reason)), None)
        return None if at is None else (at - self.start).total_seconds()


def play(fleet: dict, tasks: list[dict], until_s: float = 6 * 3600.0) -> Played:
    sim = Simulation(parse_fleet(fleet), tasks, S, 1, until_s=until_s)
    try:
        start = sim.clock.now()
        sim.run()
        rows = {i: sim.store.get_task(i) for i in sim.ids}
        (c,) = sim.fleet.clusters.values()
        return Played(
            outcomes={i: f"{t.status}/{t.reason}" if t.reason else str(t.status) for i, t in rows.items()},
            events={i: sim.store.events(i) for i in sim.ids},
            created={i: t.created_at for i, t in rows.items()},
            leases=sim.store.leases(),
            jobs_alive=[j["metadata"]["name"] for j in c.store.list("jobs")],
            job_deletes={r["name"]: r.get("deleted_at", []) for r in c.job_records.values()},
            pools_alive=sim.falcon_pools_alive(),
            pools_deleted={p.name: p.deleted_at for p in c.pools.history},
            t0_wall=sim.clock.time() - sim.simulated_s,
            start=start,
        )
    finally:
        sim.dispose()


def deadline_task(i: int, submit_at: float = 0.0, run_s: float = 600.0, deadline_s: float = DEADLINE_S, **spec) -> dict:
    return sim_task(i, submit_at, run_s, start_deadline_s=deadline_s, **spec)


def assert_ended_clean(p: Played, tid: int, phase: str, deadline_s: float = DEADLINE_S) -> str:
    """``tid`` ended StartDeadlineExceeded from ``phase`` at its deadline, and nothing of it is
    left in the fleet or held in the database. Returns its Message."""
    assert p.outcomes[tid] == "Failed/StartDeadlineExceeded", (p.outcomes, p.events[tid][-2:])
    after, was, ev = p.failed_at(tid)
    assert was == phase, (was, [(e.status, e.reason) for e in p.events[tid]])
    assert deadline_s <= after <= deadline_s + LATE_S, after
    assert p.pools_alive == 0 and not p.jobs_alive, (p.pools_alive, p.jobs_alive)
    # released: no lease is bound to a task or kept (the run ends once GKE has the pools gone,
    # possibly before the queue's next look moves a lease from Deleting to Deleted)
    assert all(x.state in (LeaseState.DELETING, LeaseState.DELETED) for x in p.leases), [(x.name, x.state) for x in p.leases]
    created = p.created[tid]
    named = f"start deadline {stamp(created + dt.timedelta(seconds=deadline_s))} UTC"
    assert named in ev.message and f"submission at {stamp(created)} UTC" in ev.message and " since " in ev.message, ev.message
    return ev.message


def test_a_task_no_cluster_takes_ends_at_its_deadline_by_the_poller():
    """The only cluster of its TPU type is in maintenance: the poller holds the task (Pending,
    no Reason) and ends it at its deadline."""
    p = play(cluster(status="maintenance"), [deadline_task(0, deadline_s=600.0)])
    text = assert_ended_clean(p, p_id(p), "Pending", 600.0)
    assert "it was Pending, waiting to be placed on a cluster" in text, text
    assert "No active cluster offers TPU type v6e" in text, text  # its last Message: what it waited for
    assert not p.pools_deleted and not p.job_deletes  # nothing was ever made for it


def p_id(p: Played) -> int:
    (tid,) = p.outcomes
    return tid


def test_a_waiting_task_ends_at_its_deadline_and_the_slot_holder_goes_on():
    """A's create takes 50 minutes; B waits behind it with a 10-minute deadline and ends then,
    from Waiting, without touching A, which runs to its end."""
    tasks = [sim_task(0, 0.0, 600.0), deadline_task(1, 10.0, deadline_s=600.0)]
    p = play(cluster(reservation=4, node_pool_create=3000.0), tasks)
    a, b = sorted(p.outcomes)
    text = assert_ended_clean(p, b, "Pending/Waiting", 600.0)
    assert "waiting in queue c/2x2 for its turn to acquire resources" in text, text
    assert p.outcomes[a] == "Succeeded", p.outcomes


def test_a_task_whose_create_is_slow_ends_at_its_deadline_its_pool_deleted_and_the_next_task_takes_the_slot():
    """A holds the slot while GKE creates its pool (50 minutes); at A's deadline it ends from
    Provisioning, its pool (still being created, wanted by B) is kept for B as an abort's
    would be, and B, waiting behind it, leaves Waiting in the same step."""
    tasks = [deadline_task(0, deadline_s=1200.0), sim_task(1, 10.0, 600.0)]
    p = play(cluster(reservation=4, node_pool_create=3000.0), tasks)
    a, b = sorted(p.outcomes)
    assert p.outcomes == {a: "Failed/StartDeadlineExceeded", b: "Succeeded"}, p.outcomes
    after, was, ev = p.failed_at(a)
    assert was == "Pending/Provisioning" and 1200.0 <= after <= 1200.0 + LATE_S, (was, after)
    assert "waiting for node pool falcon-" in ev.message and "(supply: reservation)" in ev.message, ev.message
    ended = (ev.at - p.start).total_seconds()
    picked = p.entered(b, "Pending", "Provisioning")
    assert picked is not None and ended <= picked <= ended + S.queue_tick_s, (ended, picked)
    assert p.pools_alive == 0 and not p.jobs_alive



def test_a_task_alone_whose_create_is_slow_ends_at_its_deadline_and_its_pool_is_deleted():
    p = play(cluster(reservation=4, node_pool_create=3000.0), [deadline_task(0, deadline_s=1200.0)])
    tid = p_id(p)
    assert_ended_clean(p, tid, "Pending/Provisioning", 1200.0)
    ((name, deleted),) = p.pools_deleted.items()
    # GKE runs one operation on a pool at a time: the delete asked at the deadline runs once the create ends
    assert deleted is not None and deleted - p.t0_wall <= 3000.0 + TIMINGS["node_pool_delete"] + 2 * S.operation_poll_s, (name, deleted - p.t0_wall)


def test_a_task_in_cluster_busy_for_reservation_room_ends_at_its_deadline():
    """A runs two hours on the reservation's one host; B, picked once A runs, waits in
    ClusterBusy for the room and ends at its deadline."""
    tasks = [sim_task(0, 0.0, 7200.0), deadline_task(1, 10.0)]
    p = play(cluster(reservation=1), tasks)
    a, b = sorted(p.outcomes)
    text = assert_ended_clean(p, b, "Pending/ClusterBusy")
    assert "waiting for reservation capacity on cluster c" in text and "reservation_remaining_slices=0" in text, text
    assert p.outcomes[a] == "Succeeded"


def test_a_flex_start_task_waiting_for_its_nodes_ends_at_its_deadline_its_job_and_pool_deleted():
    """Flex-start capacity comes after three hours: the pool is up and the Job submitted, the
    pods wait for the nodes (WaitingForNode) when the deadline ends the task."""
    p = play(cluster(flex_capacity_wait=3 * 3600.0), [deadline_task(0, supply_mode="flex-start")])
    tid = p_id(p)
    text = assert_ended_clean(p, tid, "Pending/WaitingForNode")
    assert "waiting for flex-start capacity: the nodes of node pool falcon-" in text, text
    ((job, deletes),) = p.job_deletes.items()
    assert deletes and deletes[0] - p.t0_wall <= DEADLINE_S + LATE_S + 1.0, (job, deletes)


def test_a_task_whose_pods_do_not_start_ends_at_its_deadline_its_job_and_pool_deleted():
    """Its pool is ready and its Job accepted, but its pods take an hour to start: it ends
    from Dispatching at its deadline (before its own timeout), the Job deleted first."""
    p = play(cluster(reservation=4, pod_start=3600.0), [deadline_task(0)])
    tid = p_id(p)
    text = assert_ended_clean(p, tid, "Pending/Dispatching")
    assert "waiting for the pods of its Job on node pool falcon-" in text, text
    assert [d for ds in p.job_deletes.values() for d in ds], p.job_deletes


def test_a_task_that_started_before_its_deadline_runs_past_it_to_its_end():
    p = play(cluster(reservation=4), [deadline_task(0, run_s=2 * DEADLINE_S)])
    tid = p_id(p)
    assert p.outcomes[tid] == "Succeeded", (p.outcomes, p.events[tid][-2:])
    running = p.entered(tid, "Running")
    assert running is not None and running < DEADLINE_S


def test_a_deadline_after_a_slow_start_changes_nothing():
    p = play(cluster(reservation=4, node_pool_create=3000.0), [deadline_task(0, deadline_s=3600.0)])
    assert p.outcomes == {p_id(p): "Succeeded"}, p.events
