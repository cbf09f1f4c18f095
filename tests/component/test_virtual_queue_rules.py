"""The queue's rules in virtual time (issue 10): priority order and queue positions, a pool
whose task was aborted mid-create, and a Job submission refused for now until
``submit_budget_s``.

Moved from the Ray end-to-end tests (tests/e2e/test_queue_rules.py): the product's poller,
queues and cluster gateways in ``falcon-ray simulate``'s driver against the fleet model
(``tests/harness/virtual.py``), at production settings and GKE's timings. What a test looks
at mid-run it looks at at a virtual second the scenario fixes (an action), so the holder
still holds the slot, the create is still running, when it looks. A failure prints the
command that replays it.
"""

from __future__ import annotations

import re

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from tests.harness.virtual import cluster, seconds, spec, task

ACQUIRING = {lc.PROVISIONING, lc.CLUSTER_BUSY, lc.WAITING_FOR_NODE, lc.DISPATCHING}
POSITION = re.compile(r"Queue position #(\d+)")
CREATE_S = 420.0


def position(message: str) -> int | None:
    m = POSITION.search(message or "")
    return int(m.group(1)) if m else None


def slot_taken_at(run, name: str) -> float:
    """When the task first held its queue's acquisition slot (event log, virtual seconds)."""
    return next(seconds(e.at) for e in run.store.events(run.id(name)) if lc.phase_of(e.status, e.reason) in ACQUIRING)


def one_cluster(**kw) -> dict:
    return {"clusters": [cluster("edge-a", reservation={"name": "res-a", "count": kw.pop("count", 4)}, chips=64, **kw)]}


def lease_state(run, pool: str) -> str | None:
    return next((x.state for x in run.store.leases(live_only=False) if x.name == pool), None)


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_priority_order_and_positions_round_robin_within_a_priority(scenario, seed):
    """A one-slice reservation runs one task at a time. While the first holds the slot (its
    create takes 420 s), seven tasks of three priorities and four actors come at 10 s: at
    200 s their positions, and then the order in which they take the slot, are the highest
    priority first, round robin between actors (the actor granted last goes behind the
    others) and FIFO per actor within one priority."""
    plan = [("a1", "alice", 0), ("a2", "alice", 0), ("b1", "bob", 0), ("c1", "carol", 5), ("b2", "bob", -10), ("d1", "dan", 5), ("a3", "alice", 5)]
    tasks = [task("holder", "alice", 0, spec("2x2", 600))]
    tasks += [task(name, actor, 10 + i, spec("2x2", 600, priority=prio)) for i, (name, actor, prio) in enumerate(plan)]
    expected = ["c1", "d1", "a3", "b1", "a1", "a2", "b2"]

    def look(run):
        run.seen["holder"] = run.task("holder").phase
        run.seen["pos"] = {name: position(run.task(name).message) for name, _, _ in plan}
        run.seen["a1"] = run.task("a1").message

    run = scenario(one_cluster(count=1), tasks, seed, actions=[(200, look)])
    assert run.seen["holder"] in ACQUIRING, run.history()  # the holder holds the slot when the ranking is read
    pos = run.seen["pos"]
    assert [pos[n] for n in expected] == list(range(pos["c1"], pos["c1"] + len(expected))), pos
    # the tasks ahead are named in the same order
    assert "carol: c1, dan: d1, alice: a3, bob: b1" in run.seen["a1"], run.seen["a1"]
    run.assert_clean()
    assert all(t.status == "Succeeded" for t in run.tasks()), [(t.name, t.status, t.message) for t in run.tasks()]
    started = sorted(expected, key=lambda n: slot_taken_at(run, n))
    assert started == expected, (started, run.history())
    assert slot_taken_at(run, "holder") < slot_taken_at(run, "c1")  # no preemption of the holder
    # one at a time: each takes the slot only once the one before it has run
    for before, after in zip(["holder", *expected], expected, strict=False):
        assert run.entered(after, "Running") > run.entered(before, "Succeeded"), run.history(before, after)


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_pool_whose_task_was_aborted_mid_create_is_handed_over_only_once_ready(scenario, seed):
    """A task aborted while GKE creates its pool (accepted at once, 420 s): the next task
    waits for that create and is handed the pool only once it is Ready (its Job comes after
    the pool's nodes); no second pool is made for it."""

    def at_abort(run):
        t = run.task("aborted-mid-create")
        run.seen["pool"] = t.node_pool_name
        run.seen["state"] = (t.phase, lease_state(run, t.node_pool_name))

    def waiting(run):
        run.seen["message"] = run.task("next").message

    tasks = [task("aborted-mid-create", "alice", 0, spec("2x2", 600), abort_at=200), task("next", "bob", 0, spec("2x2", 600))]
    run = scenario(one_cluster(), tasks, seed, actions=[(199, at_abort), (300, waiting)])
    pool = run.seen["pool"]
    assert run.seen["state"] == (lc.PROVISIONING, "Creating"), run.seen["state"]
    done = run.task("next")
    assert done.status == "Succeeded" and done.node_pool_name == pool, (done.status, done.node_pool_name, pool)
    assert f"Waiting for node pool {pool}, whose create an aborted task started" in run.seen["message"], run.seen["message"]
    assert "Pending/Provisioning" in run.phases("next") and run.task("aborted-mid-create").status == "Aborted"
    p, job = run.pool("edge-a", pool), run.job("edge-a", done.id)
    assert p["ready_at"] is not None and job["first_created_at"] >= p["ready_at"], (p, job["first_created_at"])
    assert p["first_node_at"] is not None and job["first_created_at"] >= p["first_node_at"]
    creates = [o for o in run.stats("edge-a")["pool_ops"] if o["type"] == "CREATE_NODE_POOL"]
    assert len(creates) == 1, creates  # no second pool was made for it
    run.assert_clean()


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_pool_whose_task_was_aborted_mid_create_and_whose_create_fails_is_not_handed_over(scenario, seed):
    """The same with a create that GKE accepted and then fails (INTERNAL): the next task
    makes its own pool."""

    def at_abort(run):
        t = run.task("aborted-failing-create")
        run.seen["pool"] = t.node_pool_name
        run.seen["state"] = (t.phase, lease_state(run, t.node_pool_name))

    fleet = one_cluster(faults={"create_error": "Internal error while creating node pool.", "create_error_code": 13})
    actions = [(100, lambda run: run.cluster("edge-a").set_faults(create_error=None)), (199, at_abort)]
    tasks = [task("aborted-failing-create", "carol", 0, spec("2x2", 600), abort_at=200), task("next-own-pool", "dan", 0, spec("2x2", 600))]
    run = scenario(fleet, tasks, seed, actions=actions)
    failing = run.seen["pool"]
    assert run.seen["state"] == (lc.PROVISIONING, "Creating"), run.seen["state"]
    done = run.task("next-own-pool")
    assert done.status == "Succeeded" and done.node_pool_name not in (None, failing), (done.status, done.node_pool_name)
    job = run.job("edge-a", done.id)
    assert job["manifest"]["spec"]["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-nodepool"] == done.node_pool_name
    failed = run.pool("edge-a", failing)
    assert failed["error"]["code"] == 13 and failed["deleted_at"] is not None
    assert job["first_created_at"] >= failed["created_at"] + CREATE_S  # it waited for the create's end
    run.assert_clean()


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_a_job_submission_refused_for_now_ends_at_its_budget_and_its_pool_is_deleted(scenario, seed):
    """The Kubernetes API refuses Jobs for now (the policy webhook is unreachable): the task
    retries and says so, ends JobSubmitFailed at the production ``submit_budget_s`` and its
    pool is deleted, never kept for the task behind it (which makes its own once the webhook
    is back)."""
    s = Settings()
    assert s.submit_budget_s == 600  # "10m" in the Message

    def retrying(run):
        run.seen["retrying"] = run.task("submit-refused").message

    def back(run):
        run.seen["at_back"] = (run.task("submit-refused").status, run.task("behind-it").dispatched_at)
        run.cluster("edge-a").set_faults(webhook_unavailable=False)

    tasks = [task("submit-refused", "erin", 0, spec("2x2", 600)), task("behind-it", "frank", 0, spec("2x2", 600))]
    actions = [(CREATE_S + 300, retrying), (CREATE_S + s.submit_budget_s + 300, back)]
    run = scenario(one_cluster(faults={"webhook_unavailable": True}), tasks, seed, s, actions=actions)
    assert run.seen["at_back"] == ("Failed", None), run.history()  # it failed while the webhook was down; the next had no Job yet
    t = run.task("submit-refused")
    assert (t.status, t.reason) == ("Failed", "JobSubmitFailed"), (t.status, t.reason, t.message)
    assert "no Job accepted within 10m" in t.message and 'failed calling webhook "policy.example.com"' in t.message, t.message
    assert run.seen["retrying"].startswith("Kubernetes Job submission refused for now, retrying"), run.seen["retrying"]
    assert run.phases("submit-refused")[-2:] == ["Pending/Dispatching", "Failed/JobSubmitFailed"], run.history()
    dispatching = run.entered("submit-refused", "Pending/Dispatching")
    failed_at = run.entered("submit-refused", "Failed/JobSubmitFailed")
    assert s.submit_budget_s <= failed_at - dispatching <= s.submit_budget_s + 2 * s.queue_tick_s + s.api_retry_timeout_s, run.history()
    assert not [j for j in run.stats("edge-a")["jobs"] if j["name"] == f"falcon-task-{t.id}"]
    dead = t.node_pool_name
    done = run.task("behind-it")
    assert done.status == "Succeeded" and done.node_pool_name != dead, (done.status, done.node_pool_name, dead)
    assert run.pool("edge-a", dead)["deleted_at"] is not None
    stats = run.assert_clean()
    assert stats["edge-a"]["fault_counts"]["webhook_unavailable"] >= 2
    lease = next(x for x in run.store.leases(live_only=False) if x.name == dead)
    assert lease.state == "Deleted" and lease.task_id in (t.id, None)
