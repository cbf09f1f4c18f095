"""The demo's scenarios whose claim is an order or a timing, in virtual time: the status
table's path, a refused image, an abort in every phase, a create that fails and one that
times out, flex-start's visibility gap and the orphan scan, clusters in maintenance, the
Waiting Message's start estimate; and a node-pool delete GKE keeps refusing.

Moved from the Ray end-to-end tests (tests/e2e/test_scenarios.py, test_recovery.py): the
product's poller, queues and cluster gateways in ``falcon-ray simulate``'s driver against
the fleet model (``tests/harness/virtual.py``), at production settings and GKE's timings. A
test that acts mid-run (an abort, a cluster's status, the fleet's faults) does so at a
virtual second the run fixes, or at the first look (``when``) at which the task is in the
phase the step is about, and records that phase. A failure prints the command that
replays it.
"""

from __future__ import annotations

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.render import job_name
from tests.harness.virtual import cluster, spec, task, when

CREATE_S = 420.0


def two_clusters(a: dict | None = None, b: dict | None = None) -> dict:
    return {
        "clusters": [
            cluster("edge-a", **{"reservation": {"name": "res-a", "count": 4}, "chips": 64, **(a or {})}),
            cluster("edge-b", **{"location": "us-central1-b", "chips": 32, **(b or {})}),
        ]
    }


def one_cluster(**kw) -> dict:
    return {"clusters": [cluster("edge-a", **{"reservation": {"name": "res-a", "count": 4}, "chips": 64, **kw})]}


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_status_and_failure_tables(scenario, seed):
    """Every row of the status and failure tables the demo shows, and a task's whole path:
    Waiting, Provisioning, Dispatching, Running, Succeeded, in that order (its run lasts
    ten minutes, so its queue sees it Running)."""
    fleet = two_clusters(a={"faults": {"deny_images": ["registry.example.com/denied"]}})
    tasks = [
        task("profiling-v6e", "alice", 0, spec("2x2", 600)),
        task("benchmark-v6e", "bob", 0, spec("2x4", 600)),
        task("train-oom", "erin", 0, spec("2x2", 300, env={"FALCON_SIM_OOM": "1"})),
        task("slow-eval", "grace", 0, spec("2x2", 3600, timeout_seconds=600)),
        task("bad", "dave", 0, {"tpu_type": "v6e", "topology": "3x3", "image": "x", "command": ["y"], "hostNetwork": True}),
        task("v5p", "frank", 0, {"tpu_type": "v5p", "topology": "2x2x1", "image": "img:1", "command": ["y"]}),
        task("denied", "hank", 0, {**spec("2x2", 600), "image": "registry.example.com/denied/app:1"}),
        task("broken", "ivan", 0, "{not json"),
    ]
    run = scenario(fleet, tasks, seed)
    run.assert_clean()
    t = {x.name: x for x in run.tasks()}
    assert t["profiling-v6e"].status == "Succeeded" and t["profiling-v6e"].message == ""
    path = [p for p in run.phases("profiling-v6e") if p in ("Pending/Waiting", "Pending/Provisioning", "Pending/Dispatching", "Running", "Succeeded")]
    assert path == ["Pending/Waiting", "Pending/Provisioning", "Pending/Dispatching", "Running", "Succeeded"], run.history("profiling-v6e")
    assert t["benchmark-v6e"].status == "Succeeded"
    assert (t["train-oom"].status, t["train-oom"].reason) == ("Failed", "JobFailed")
    assert "OOMKilled" in t["train-oom"].message and "exit code 137" in t["train-oom"].message
    assert (t["slow-eval"].status, t["slow-eval"].reason) == ("Failed", "Timeout")
    assert "(600s)" in t["slow-eval"].message, t["slow-eval"].message
    assert (t["bad"].status, t["bad"].reason) == ("Failed", "InvalidSpec") and "hostNetwork: unknown field" in t["bad"].message
    assert (t["v5p"].status, t["v5p"].reason) == ("Failed", "UnsupportedTPUType") and "v5p" in t["v5p"].message
    assert (t["broken"].status, t["broken"].reason) == ("Failed", "InvalidSpec")
    denied = t["denied"]
    if denied.cluster_id == run.store.get_cluster("edge-a").id:
        assert (denied.status, denied.reason) == ("Failed", "JobSubmitFailed") and "denied" in denied.message


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_job_submit_failure_is_reported_and_pool_cleaned(scenario, seed):
    run = scenario(one_cluster(faults={"deny_images": ["us-docker.pkg.dev/p/r/img"]}), [task("denied", "alice", 0, spec("2x2", 600))], seed)
    run.assert_clean()
    t = run.task("denied")
    assert (t.status, t.reason) == ("Failed", "JobSubmitFailed")
    assert "admission webhook" in t.message


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_abort_in_every_phase(scenario, seed):
    """One cluster, one topology; pods take 5 minutes to start, so each phase lasts long
    enough to be aborted in: a Waiting task, the slot holder while it provisions (nobody
    waits: its pool is deleted), then a task while its Job is dispatched, one while it runs.
    Each abort is made at the first look (every 5 virtual seconds) that finds the task in
    its phase."""
    aborted_in: dict[str, str] = {}

    def abort(name: str):
        def do(run):
            aborted_in[name] = str(run.task(name).phase)
            assert run.store.request_abort(run.id(name))

        return do

    def phase_in(name: str, *phases):
        return lambda run: name in {t.name for t in run.tasks()} and run.task(name).phase in phases

    tasks = [
        task("holder", "alice", 0, spec("2x2", 1800)),
        task("waiting", "bob", 0, spec("2x2", 1800)),
        task("dispatching", "carol", 300, spec("2x2", 1800)),
        task("running", "dan", 300, spec("2x2", 1800)),
    ]
    actions = [
        (1, when(phase_in("waiting", lc.WAITING), abort("waiting"))),
        (100, when(phase_in("holder", lc.PROVISIONING, lc.WAITING_FOR_NODE), abort("holder"))),
        (301, when(phase_in("dispatching", lc.DISPATCHING), abort("dispatching"))),
        (301, when(phase_in("running", lc.RUNNING), abort("running"))),
    ]
    run = scenario(one_cluster(timings={"pod_start": 300.0}), tasks, seed, actions=actions)
    assert aborted_in == {"waiting": "Pending/Waiting", "holder": "Pending/Provisioning", "dispatching": "Pending/Dispatching", "running": "Running"}, (aborted_in, run.history())
    run.assert_clean()
    for name in ("waiting", "holder", "dispatching", "running"):
        t = run.task(name)
        assert (t.status, t.message) == ("Aborted", "Aborted by user"), (name, t.status, t.message)
        assert t.aborted_at is not None and t.aborting_at is not None
    assert run.phases("waiting")[-2:] == ["Aborting", "Aborted"]
    assert run.task("waiting").node_pool_name is None
    jobs = {j["name"] for j in run.stats("edge-a")["jobs"]}
    assert job_name(run.id("waiting")) not in jobs and job_name(run.id("holder")) not in jobs


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_node_pool_create_failure_and_timeout(scenario, seed):
    """edge-a refuses creates for quota; edge-b's creates take three times the production
    ``node_pool_timeout_s``: the first ends NodePoolFailed with GKE's words, the second
    NodePoolTimeout naming the limit."""
    s = Settings()
    fleet = two_clusters(
        a={"faults": {"create_error": "Quota 'TPUS_PER_PROJECT' exceeded. Limit: 0.0 in region us-east5."}},
        b={"timings": {"node_pool_create": 3 * s.node_pool_timeout_s}},
    )
    tasks = [task("quota", "alice", 0, spec("2x2", 600)), task("slow", "bob", 30, spec("2x2", 600))]  # edge-a first (name order); then edge-b (shorter queue)
    run = scenario(fleet, tasks, seed, s)
    run.assert_clean()
    q, slow = run.task("quota"), run.task("slow")
    assert q.cluster_id == run.store.get_cluster("edge-a").id and slow.cluster_id == run.store.get_cluster("edge-b").id
    assert (q.status, q.reason) == ("Failed", "NodePoolFailed") and "TPUS_PER_PROJECT" in q.message
    assert (slow.status, slow.reason) == ("Failed", "NodePoolTimeout") and "(60m)" in slow.message, slow.message
    assert run.entered("slow", "Failed/NodePoolTimeout") >= s.node_pool_timeout_s, run.history()


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_flex_start_visibility_gap_is_not_deleted_as_an_orphan(scenario, seed):
    """GKE ends a flex-start pool's create after 30 s but lists the pool only 90 s after
    accepting it; the orphan scan runs every minute, and within ``create_visibility_grace_s`` the pool is not yet visible,
    not lost (every loop at every tick, as production's Tickers run them): nothing is deleted as an orphan and the task succeeds."""
    seen: list[str] = []

    def not_visible(run):
        t = run.task("flex")
        return t.phase == lc.PROVISIONING and "not yet visible" in t.message

    fleet = two_clusters(a={"status": "maintenance"}, b={"timings": {"node_pool_create": 30.0, "flex_visibility_lag": 90.0}})
    actions = [(1, when(not_visible, lambda run: seen.append(run.task("flex").message), every=1.0))]
    run = scenario(fleet, [task("flex", "alice", 0, spec("2x2", 600))], seed, actions=actions, exact=True)  # every queue tick writes its Message
    assert seen, run.history()
    run.assert_clean()
    assert run.task("flex").status == "Succeeded"
    assert run.sim.gateways["edge-b"].counters["orphans_found"] == 0
    (pool,) = run.stats("edge-b")["node_pools"]
    assert pool["request"]["config"].get("flexStart") is True


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_orphan_scan_deletes_only_leaked_falcon_pools(scenario, seed):
    """Four pools made outside the controller: one with Falcon's labels and name (leaked:
    deleted once past the grace), and three that are not this installation's (another
    label, none, another installation's): left alone."""
    s = Settings()
    ours = {"managed-by": "falcon", "falcon-installation": s.installation}
    staging = {"managed-by": "falcon", "falcon-installation": "staging"}
    made = [("falcon-foreign", {}), ("team-pool", ours), ("falcon-t998-2x2", staging), ("falcon-t999-2x2", ours)]
    # GKE runs one operation at a time: one create every 10 minutes
    actions = [(600.0 * i, lambda run, n=name, lab=labels: run.create_pool("edge-a", n, lab)) for i, (name, labels) in enumerate(made)]
    run = scenario(one_cluster(), [], seed, s, actions=actions, until_s=4 * 3600.0)
    alive = {p["name"] for p in run.stats("edge-a")["node_pools"] if p["deleted_at"] is None}
    assert "falcon-t999-2x2" not in alive
    assert {"falcon-foreign", "team-pool", "falcon-t998-2x2"} <= alive  # not ours: left alone
    assert run.sim.gateways["edge-a"].counters["orphans_deleted"] == 1
    leaked = run.pool("edge-a", "falcon-t999-2x2")
    assert leaked["delete_requested_at"] - leaked["created_at"] >= s.create_visibility_grace_s


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_maintenance_cluster_gets_no_new_tasks_and_waiting_ones_move(scenario, seed):
    """With edge-b in maintenance two tasks go to edge-a: the first runs, the second waits
    behind it. edge-b comes back and edge-a goes into maintenance: the waiting task moves to
    edge-b, the running one finishes where it is. With edge-b offline too, a task stays
    Pending and says why (whatever its supply) until a cluster is active again."""

    def swap(run):
        run.seen["behind"] = (run.task("behind").phase, run.task("behind").cluster_id)
        run.store.set_cluster_status("edge-b", "active")
        run.store.set_cluster_status("edge-a", "maintenance")

    def held(run):
        run.seen["held"] = [(run.task(n).phase, run.task(n).message) for n in ("held", "needs-reservation")]
        run.store.set_cluster_status("edge-b", "active")
        run.store.set_cluster_status("edge-a", "active")

    tasks = [
        task("first", "alice", 1, spec("2x2", 1800)),
        task("behind", "bob", 2, spec("2x2", 600)),
        task("held", "carol", 1000, spec("2x2", 600)),
        task("needs-reservation", "dan", 1000, spec("2x2", 600, supply_mode="reservation")),
    ]
    actions = [
        (0, lambda run: run.store.set_cluster_status("edge-b", "maintenance")),
        (100, swap),
        (900, lambda run: run.store.set_cluster_status("edge-b", "offline")),
        (1300, held),
    ]
    run = scenario(two_clusters(), tasks, seed, actions=actions)
    edge_a, edge_b = run.store.get_cluster("edge-a").id, run.store.get_cluster("edge-b").id
    assert run.seen["behind"] == (lc.WAITING, edge_a), run.history()
    assert run.task("behind").cluster_id == edge_b and run.task("behind").status == "Succeeded", run.history()
    first = run.task("first")
    assert first.status == "Succeeded" and first.cluster_id == edge_a  # running tasks finish
    assert run.entered("behind", "Running") < run.entered("first", "Succeeded")  # it did not wait for edge-a
    for phase, message in run.seen["held"]:
        assert phase == lc.NEW and "maintenance or offline" in message, run.seen["held"]
    assert run.task("held").status == "Succeeded" and run.task("needs-reservation").status == "Succeeded"
    run.assert_clean()


@pytest.mark.parametrize("seed", [5], ids=lambda s: f"seed{s}")
def test_waiting_message_carries_a_start_estimate_once_the_queue_has_history(scenario, seed):
    """A one-slice reservation runs one task at a time and hands its pool to the next. No
    estimate before the queue has history; once three have started, a waiting task's
    Message gives one, with its position and since when it waits."""
    fleet = one_cluster(reservation={"name": "res-a", "count": 1})
    tasks = [task(f"eta-{i}", "alice", 0, spec("2x2", 600, supply_mode="reservation")) for i in range(6)]

    def first_running(run):
        run.seen["early"] = [run.task(f"eta-{i}").message for i in range(1, 6)]

    def estimate_shown(run):
        return any(t.phase == lc.WAITING and "expected to start around" in t.message for t in run.tasks())

    def shown(run):
        run.seen["shown"] = next(t for t in run.tasks() if t.phase == lc.WAITING and "expected to start around" in t.message)
        run.seen["started"] = [t.name for t in run.tasks() if any(e.status == "Running" for e in run.store.events(t.id))]

    actions = [
        (1, when(lambda run: run.task("eta-0").phase == lc.RUNNING, first_running)),
        (1, when(estimate_shown, shown)),
    ]
    run = scenario(fleet, tasks, seed, actions=actions)
    assert all("expected to start" not in m for m in run.seen["early"]), "no history yet: no estimate"
    assert len(run.seen["started"]) >= 3, "an estimate needs three starts of the queue"
    message = run.seen["shown"].message
    assert "Queue position #" in message and "(waiting since" in message, message
    run.assert_clean()


@pytest.mark.parametrize("seed", [3], ids=lambda s: f"seed{s}")
def test_pool_delete_that_keeps_failing_is_retried_and_reported(scenario, seed):
    """While the task runs every GKE call starts answering 503: its run ends Succeeded (the
    status follows the Job, not the pool), the pool's delete is retried, and after
    ``pool_delete_report_after`` failures the Message says the pool is not yet deleted and
    that Falcon keeps retrying. GKE answers again an hour later: the pool goes. Its nodes'
    wait on the way in said what it waited for."""

    def faults_on(run):
        run.seen["before"] = run.task("t").phase
        run.cluster("edge-a").set_faults(api_error_rate=1.0)

    def reported(run):
        t = run.task("t")
        run.seen["row"] = t
        run.seen["alive"] = run.falcon_pools()
        run.cluster("edge-a").set_faults(api_error_rate=0.0)

    run = scenario(one_cluster(), [task("t", "alice", 0, spec("2x2", 1200))], seed, actions=[(800, faults_on), (800 + 1200 + 3600, reported)])
    assert run.seen["before"] == lc.RUNNING, run.history()
    t = run.seen["row"]
    assert t.status == "Succeeded", "the terminal status follows the Job, not the pool"
    assert "not yet deleted" in t.message and t.node_pool_name in t.message and "Falcon keeps retrying" in t.message, t.message
    assert run.seen["alive"] == [t.node_pool_name]
    waited = [e.message for e in run.store.events(t.id) if lc.phase_of(e.status, e.reason) == lc.WAITING_FOR_NODE]
    assert waited and "control-plane RUNNING but 0/1 expected node(s) registered (Ready=0)" in waited[0], waited
    run.assert_clean()
    lease = run.store.leases(live_only=False)[0]
    assert lease.delete_attempts >= Settings().pool_delete_report_after and lease.last_error
