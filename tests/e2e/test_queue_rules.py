"""The queue's rules end to end (issue 10): priority order and queue positions, a pool whose
task was aborted mid-create, and a Job submission refused for now until ``submit_budget_s``.

Real Ray actors, the simulated fleet through the real clients, SQLite. Each test is one
DemoRun (its start is most of the cost) that plays several steps which do not interfere;
every timing is in seconds. The component tests (tests/component/test_queue.py) hold the
same rules without Ray; here they must survive the real ClusterActor, GKE's operations and
the Kubernetes API.
"""

from __future__ import annotations

import re
import time

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.devtools.demo import DemoRun
from falcon_ray.render import job_name
from tests.harness.e2e import assert_clean, make_fleet, phase_is, spec, wait_for

pytestmark = pytest.mark.timeout(180)

ACQUIRING = {lc.PROVISIONING, lc.CLUSTER_BUSY, lc.WAITING_FOR_NODE, lc.DISPATCHING}
POSITION = re.compile(r"Queue position #(\d+)")


def phases(run: DemoRun, tid: int) -> list[str]:
    return [str(lc.phase_of(e.status, e.reason)) for e in run.store.events(tid)]


def slot_taken_at(run: DemoRun, tid: int):
    """When the task first held its queue's acquisition slot (event log)."""
    return next(e.at for e in run.store.events(tid) if lc.phase_of(e.status, e.reason) in ACQUIRING)


def history(run: DemoRun, ids: dict[str, int]) -> str:
    """Each task's event log (phase and time), for an assertion's message."""
    return "\n".join(
        f"{name}: " + ", ".join(f"{lc.phase_of(e.status, e.reason)}@{e.at:%H:%M:%S.%f}" for e in run.store.events(tid))
        for name, tid in ids.items()
    )


def position(message: str) -> int | None:
    m = POSITION.search(message or "")
    return int(m.group(1)) if m else None


def pools_of(run: DemoRun, cluster: str = "edge-a") -> dict[str, dict]:
    return {p["name"]: p for p in run.sim.stats()["clusters"][cluster]["node_pools"]}


def job_record(run: DemoRun, tid: int, cluster: str = "edge-a") -> dict:
    (j,) = [j for j in run.sim.stats()["clusters"][cluster]["jobs"] if j["name"] == job_name(tid)]
    return j


def pool_of_job(job: dict) -> str:
    return job["manifest"]["spec"]["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"]


def wait_creating(run: DemoRun, tid: int) -> str:
    """The task's pool once GKE accepted its create (lease Creating): an abort from then on
    keeps the pool for the next task (before, a Requested pool is simply deleted)."""
    name = wait_for(run, tid, lambda t: t.node_pool_name is not None and t.phase == lc.PROVISIONING).node_pool_name

    def creating() -> bool:
        return any(l.name == name and l.state == "Creating" for l in run.store.leases(live_only=False))

    assert run.wait(creating, 20), [(l.name, l.state) for l in run.store.leases(live_only=False)]
    return name


def test_priority_order_and_positions_round_robin_within_a_priority(controller):
    """A one-slice reservation runs one task at a time. While the first holds the slot, seven
    tasks of three priorities and four actors wait: their positions, and then the order in
    which they take the slot, are the highest priority first, round robin between actors
    (the actor granted last goes behind the others) and FIFO per actor within one priority."""
    # the holder's create (8 s) outlasts the ranking's wait on a loaded machine
    fleet = make_fleet(a={"reservation": {"name": "res-a", "count": 1}, "timings": {"node_pool_create": 8.0}}, with_b=False)
    run = controller(fleet)
    holder = run.submit("alice", spec("2x2", 0.5), "holder")
    wait_for(run, holder, phase_is(lc.PROVISIONING), timeout=30)
    plan = [("a1", "alice", 0), ("a2", "alice", 0), ("b1", "bob", 0), ("c1", "carol", 5), ("b2", "bob", -10), ("d1", "dan", 5), ("a3", "alice", 5)]
    ids = {name: run.submit(actor, spec("2x2", 0.5, priority=prio), name) for name, actor, prio in plan}
    expected = ["c1", "d1", "a3", "b1", "a1", "a2", "b2"]

    def shown() -> dict[str, int | None]:
        return {name: position(run.store.get_task(tid).message) for name, tid in ids.items()}

    def settled(p: dict[str, int | None]) -> bool:  # one step that saw all seven wrote them all
        got = sorted(v for v in p.values() if v is not None)
        return len(got) == len(expected) and got == list(range(got[0], got[0] + len(expected)))

    # a position is written as soon as a task is seen, so the first ones are from before the
    # later tasks arrived: wait for the step that ranks all seven. The seven rows are read one
    # at a time, so one look can mix a step's new Messages with rows it has not rewritten
    # yet: a ranking counts once it has stayed the same for a second.
    last: dict = {"pos": None, "since": 0.0}

    def ranked() -> bool:
        now = shown()
        if now != last["pos"]:
            last.update(pos=now, since=time.monotonic())
        return settled(now) and time.monotonic() - last["since"] >= 1.0

    assert run.wait(ranked, 30), shown()
    assert run.store.get_task(holder).phase in ACQUIRING, "the holder must still hold the slot for this check"
    pos = last["pos"]
    assert sorted(pos, key=lambda n: pos[n]) == expected, pos
    assert [pos[n] for n in expected] == list(range(pos["c1"], pos["c1"] + len(expected))), pos
    # the tasks ahead are named in the same order
    ahead_of_a1 = run.store.get_task(ids["a1"]).message
    assert "carol: c1, dan: d1, alice: a3, bob: b1" in ahead_of_a1, ahead_of_a1
    assert_clean(run, timeout=120)
    assert all(t.status == "Succeeded" for t in run.tasks()), [(t.name, t.status, t.message) for t in run.tasks()]
    started = sorted(ids, key=lambda n: slot_taken_at(run, ids[n]))
    assert started == expected, (started, history(run, {"holder": holder, **ids}))
    assert slot_taken_at(run, holder) < slot_taken_at(run, ids["c1"])  # no preemption of the holder


def test_abandoned_create_is_never_handed_over_unready_and_a_refused_submit_ends_at_its_budget(controller):
    """Three steps on one cluster, one after the other:

    1. a task aborted while its pool is created: the next task waits for that create and is
       handed the pool only once it is Ready (its Job comes after the pool's nodes);
    2. the same with a create that then fails (INTERNAL): the next task makes its own pool;
    3. the Kubernetes API refuses Jobs for now (the policy webhook is unreachable): the task
       retries, says so, ends JobSubmitFailed after ``submit_budget_s`` and its pool is
       deleted, never kept for the task behind it."""
    run = controller(make_fleet(with_b=False), submit_budget_s=2, api_retry_timeout_s=0.5)
    run.sim.set_timings("edge-a", node_pool_create=2.5)

    # 1. aborted mid-create, the create succeeds: handed over once Ready
    aborted = run.submit("alice", spec("2x2", 0.5), "aborted-mid-create")
    nxt = run.submit("bob", spec("2x2", 0.5), "next")
    pool = wait_creating(run, aborted)
    assert run.abort(aborted)
    seen = set()
    done = wait_for(run, nxt, lambda t: seen.add(t.message) or t.terminal, timeout=40)
    assert done.status == "Succeeded" and done.node_pool_name == pool, (done.status, done.node_pool_name, pool)
    assert any(f"Waiting for node pool {pool}, whose create an aborted task started" in m for m in seen), seen
    assert "Pending/Provisioning" in phases(run, nxt) and run.store.get_task(aborted).status == "Aborted"
    p, job = pools_of(run)[pool], job_record(run, nxt)
    assert p["ready_at"] is not None and job["first_created_at"] >= p["ready_at"], (p, job["first_created_at"])
    assert p["first_node_at"] is not None and job["first_created_at"] >= p["first_node_at"]
    creates = [o for o in run.sim.stats()["clusters"]["edge-a"]["pool_ops"] if o["type"] == "CREATE_NODE_POOL"]
    assert len(creates) == 1, creates  # no second pool was made for it
    assert run.wait(lambda: not run.falcon_pools_alive(), 20), run.falcon_pools_alive()

    # 2. aborted mid-create, the create then fails: the next task makes its own pool
    run.sim.set_faults("edge-a", create_error="Internal error while creating node pool.", create_error_code=13)
    aborted2 = run.submit("carol", spec("2x2", 0.5), "aborted-failing-create")
    nxt2 = run.submit("dan", spec("2x2", 0.5), "next-own-pool")
    failing = wait_creating(run, aborted2)
    run.sim.set_faults("edge-a", create_error=None)
    assert run.abort(aborted2)
    done2 = wait_for(run, nxt2, lambda t: t.terminal, timeout=40)
    assert done2.status == "Succeeded" and done2.node_pool_name not in (None, failing), (done2.status, done2.node_pool_name)
    assert pool_of_job(job_record(run, nxt2)) == done2.node_pool_name
    assert pools_of(run)[failing]["error"]["code"] == 13 and pools_of(run)[failing]["deleted_at"] is not None
    assert run.wait(lambda: not run.falcon_pools_alive(), 20), run.falcon_pools_alive()

    # 3. Jobs refused for now: JobSubmitFailed after submit_budget_s, its pool deleted
    run.sim.set_timings("edge-a", node_pool_create=0.6)
    run.sim.set_faults("edge-a", webhook_unavailable=True)
    refused = run.submit("erin", spec("2x2", 0.5), "submit-refused")
    behind = run.submit("frank", spec("2x2", 0.5), "behind-it")
    messages: list[str] = []
    t = wait_for(run, refused, lambda t: messages.append(t.message) or t.terminal, timeout=40)
    run.sim.set_faults("edge-a", webhook_unavailable=False)
    assert (t.status, t.reason) == ("Failed", "JobSubmitFailed"), (t.status, t.reason, t.message)
    assert "no Job accepted within 2s" in t.message and 'failed calling webhook "policy.example.com"' in t.message, t.message
    assert any(m.startswith("Kubernetes Job submission refused for now, retrying") for m in messages), messages
    assert phases(run, refused)[-2:] == ["Pending/Dispatching", "Failed/JobSubmitFailed"], phases(run, refused)
    assert not [j for j in run.sim.stats()["clusters"]["edge-a"]["jobs"] if j["name"] == job_name(refused)]
    dead = t.node_pool_name
    done3 = wait_for(run, behind, lambda t: t.terminal, timeout=40)
    assert done3.status == "Succeeded" and done3.node_pool_name != dead, (done3.status, done3.node_pool_name, dead)
    assert pools_of(run)[dead]["deleted_at"] is not None
    stats = assert_clean(run, timeout=60)
    assert stats["clusters"]["edge-a"]["fault_counts"]["webhook_unavailable"] >= 2
    lease = next(l for l in run.store.leases(live_only=False) if l.name == dead)
    assert lease.state == "Deleted" and lease.task_id in (refused, None)
