"""End-to-end scenarios through the demo machinery: real Ray actors, the simulated fleet
over the real GKE / Compute / Kubernetes clients, and a real database.

Only what needs the whole path lives here (the clients, the ClusterActor; crashes of real
actors and outages are in tests/e2e/test_recovery.py); the queue's rules by themselves (hand-over, ClusterBusy, the pick order,
abort mid-create, intake verdicts) are component tests in tests/component/test_queue.py.

After every scenario the same three checks hold: no Falcon node pool is alive in the
fleet, every dispatched task had its Job created exactly once, and every task's event
log moves only along edges of the lifecycle table.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import ray

from actors import names
from falcon_ray import lifecycle as lc
from falcon_ray.render import job_name
from tests.harness.e2e import assert_clean, make_fleet, phase_is, reasons, spec, wait_for

pytestmark = pytest.mark.timeout(240)

# On MariaDB, as production runs: every other scenario here runs on SQLite (the demo's
# database), so this one is the status table's only end-to-end run on MySQL; a SQLite copy
# of it proved nothing the others do not (removed 2026-12-02, ~34 s of a make test worker).
@pytest.mark.mysql
def test_status_and_failure_tables_end_to_end(controller):
    run = controller(make_fleet(a={"faults": {"deny_images": ["registry.example.com/denied"]}}), db="mysql")
    ok = run.submit("alice", spec("2x2", 1), "profiling-v6e")
    multi = run.submit("bob", spec("2x4", 1), "benchmark-v6e")
    oom = run.submit("erin", spec("2x2", 0.5, env={"FALCON_SIM_OOM": "1"}), "train-oom")
    slow = run.submit("grace", spec("2x2", 60, timeout_seconds=2), "slow-eval")
    bad = run.submit("dave", {"tpu_type": "v6e", "topology": "3x3", "image": "x", "command": ["y"], "hostNetwork": True}, "bad")
    v5p = run.submit("frank", {"tpu_type": "v5p", "topology": "2x2x1", "image": "img:1", "command": ["y"]}, "v5p")
    denied = run.submit("hank", {**spec("2x2", 1), "image": "registry.example.com/denied/app:1"}, "denied")
    not_json = run.submit("ivan", "{not json", "broken")
    assert_clean(run, timeout=90)
    t = {x.id: x for x in run.tasks()}
    assert t[ok].status == "Succeeded" and t[ok].message == ""
    path = reasons(run, ok)
    for step in ("Pending/Waiting", "Pending/Provisioning", "Pending/Dispatching", "Running", "Succeeded"):
        assert step in path, path
    assert t[multi].status == "Succeeded"
    assert (t[oom].status, t[oom].reason) == ("Failed", "JobFailed")
    assert "OOMKilled" in t[oom].message and "exit code 137" in t[oom].message
    assert (t[slow].status, t[slow].reason) == ("Failed", "Timeout")
    assert "(2s)" in t[slow].message
    assert (t[bad].status, t[bad].reason) == ("Failed", "InvalidSpec")
    assert "hostNetwork: unknown field" in t[bad].message
    assert (t[v5p].status, t[v5p].reason) == ("Failed", "UnsupportedTPUType") and "v5p" in t[v5p].message
    assert (t[not_json].status, t[not_json].reason) == ("Failed", "InvalidSpec")
    denied_row = t[denied]
    if denied_row.cluster_id == run.store.get_cluster("edge-a").id:
        assert (denied_row.status, denied_row.reason) == ("Failed", "JobSubmitFailed")
        assert "denied" in denied_row.message


def test_job_submit_failure_is_reported_and_pool_cleaned(controller):
    run = controller(make_fleet(a={"faults": {"deny_images": ["us-docker.pkg.dev/p/r/img"]}}, with_b=False))
    tid = run.submit("alice", spec("2x2", 1))
    assert_clean(run)
    t = run.store.get_task(tid)
    assert (t.status, t.reason) == ("Failed", "JobSubmitFailed")
    assert "admission webhook" in t.message


def test_abort_in_every_phase(controller):
    run = controller(make_fleet(a={"timings": {"node_pool_create": 2.5, "pod_start": 2.5}}, with_b=False))
    holder = run.submit("alice", spec("2x2", 30), "holder")
    waiting = run.submit("bob", spec("2x2", 30), "waiting")
    wait_for(run, waiting, phase_is(lc.WAITING))
    assert run.abort(waiting)
    wait_for(run, holder, phase_is(lc.PROVISIONING, lc.WAITING_FOR_NODE))
    assert run.abort(holder)  # abort while provisioning, nobody waits: the pool is deleted
    disp = run.submit("carol", spec("2x2", 30), "dispatching")
    wait_for(run, disp, phase_is(lc.DISPATCHING), timeout=40)
    assert run.abort(disp)
    running = run.submit("dan", spec("2x2", 30), "running")
    wait_for(run, running, phase_is(lc.RUNNING), timeout=40)
    assert run.abort(running)
    assert_clean(run, timeout=60)
    for tid in (waiting, holder, disp, running):
        t = run.store.get_task(tid)
        assert (t.status, t.message) == ("Aborted", "Aborted by user"), (tid, t.status, t.message)
        assert t.aborted_at is not None and t.aborting_at is not None
    assert reasons(run, waiting)[-2:] == ["Aborting", "Aborted"]
    assert run.store.get_task(waiting).node_pool_name is None
    jobs = {j["name"] for j in run.sim.stats()["clusters"]["edge-a"]["jobs"]}
    assert job_name(waiting) not in jobs and job_name(holder) not in jobs


def test_node_pool_create_failure_and_timeout(controller):
    run = controller(
        make_fleet(
            a={"faults": {"create_error": "Quota 'TPUS_PER_PROJECT' exceeded. Limit: 0.0 in region us-east5."}},
            b={"timings": {"node_pool_create": 8.0}},
        ),
        node_pool_timeout_s=3,
    )
    quota = run.submit("alice", spec("2x2", 1), "quota")  # edge-a first (name order)
    wait_for(run, quota, lambda t: t.cluster_id is not None)
    slow = run.submit("bob", spec("2x2", 1), "slow")  # edge-b (shorter queue)
    assert_clean(run, timeout=90)
    q, s = run.store.get_task(quota), run.store.get_task(slow)
    assert (q.status, q.reason) == ("Failed", "NodePoolFailed") and "TPUS_PER_PROJECT" in q.message
    assert (s.status, s.reason) == ("Failed", "NodePoolTimeout") and "(3s)" in s.message


def test_flex_start_visibility_gap_is_not_deleted_as_an_orphan(controller):
    run = controller(
        make_fleet(b={"timings": {"flex_visibility_lag": 2.5}}, with_b=True, a={"status": "maintenance"}),
        create_visibility_grace_s=8,
        orphan_scan_interval_s=0.3,
    )
    tid = run.submit("alice", spec("2x2", 1), "flex")
    t = wait_for(run, tid, lambda t: "not yet visible" in t.message, timeout=30)
    assert t.phase == lc.PROVISIONING
    assert_clean(run)
    assert run.store.get_task(tid).status == "Succeeded"
    snap = ray.get(names.lookup(names.cluster_name("edge-b"), run.settings.namespace).snapshot.remote())
    assert snap["counters"]["orphans_found"] == 0
    pool = run.sim.stats()["clusters"]["edge-b"]["node_pools"][0]
    assert pool["request"]["config"].get("flexStart") is True


def test_orphan_scan_deletes_only_leaked_falcon_pools(controller):
    from falcon_ray.gcp import GkeApi

    run = controller(make_fleet(with_b=False), create_visibility_grace_s=1, orphan_scan_interval_s=0.5)
    gke = GkeApi(endpoint=run.settings.gke_endpoint)

    def pool(name, labels):
        return {
            "name": name,
            "initialNodeCount": 1,
            "config": {"machineType": "ct6e-standard-4t", "resourceLabels": labels},
            "placementPolicy": {"tpuTopology": "2x2"},
        }

    ours = {"managed-by": "falcon", "falcon-installation": run.settings.installation}
    staging = {"managed-by": "falcon", "falcon-installation": "staging"}
    # the ones that are not ours first: GKE runs one operation at a time, and the scan's
    # delete of the leaked pool must not collide with these creates
    for name, labels in (("falcon-foreign", {}), ("team-pool", ours), ("falcon-t998-2x2", staging), ("falcon-t999-2x2", ours)):
        gke.create_node_pool("proj-a", "us-east5-b", "edge-a", pool(name, labels))
        time.sleep(1.0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "falcon-t999-2x2" in run.falcon_pools_alive():
        time.sleep(0.3)
    alive = {p["name"] for p in run.sim.stats()["clusters"]["edge-a"]["node_pools"] if p["deleted_at"] is None}
    assert "falcon-t999-2x2" not in alive
    assert {"falcon-foreign", "team-pool", "falcon-t998-2x2"} <= alive  # not ours: left alone
    for name in ("falcon-foreign", "team-pool", "falcon-t998-2x2"):  # leave the fleet clean for the shared checks
        with contextlib.suppress(Exception):
            time.sleep(0.5)
            gke.delete_node_pool("proj-a", "us-east5-b", "edge-a", name)


def test_maintenance_cluster_gets_no_new_tasks_and_waiting_ones_move(controller):
    run = controller(make_fleet(a={"timings": {"node_pool_create": 2.0}}))
    first = run.submit("alice", spec("2x2", 3), "first")
    t = wait_for(run, first, lambda t: t.cluster_id is not None)
    home = run.store.get_cluster(t.cluster_id).name
    other = "edge-b" if home == "edge-a" else "edge-a"
    behind = run.submit("bob", spec("2x2", 1), "behind")
    wait_for(run, behind, lambda t: t.cluster_id is not None)
    run.store.set_cluster_status(other, "maintenance")
    # both now sit on `home` or are moved there; put home in maintenance while `first` acquires
    b = run.store.get_task(behind)
    if run.store.get_cluster(b.cluster_id).name == other:
        wait_for(run, behind, lambda t: run.store.get_cluster(t.cluster_id or "x") is not None and run.store.get_cluster(t.cluster_id).name == home)
    run.store.set_cluster_status(other, "active")
    wait_for(run, behind, phase_is(lc.WAITING))
    run.store.set_cluster_status(home, "maintenance")
    moved = wait_for(run, behind, lambda t: t.cluster_id == run.store.get_cluster(other).id, timeout=30)
    assert moved is not None
    # a task for a type only maintenance clusters offer stays Pending with a message
    run.store.set_cluster_status(other, "offline")
    held = run.submit("carol", spec("2x2", 1), "held")
    t = wait_for(run, held, lambda t: "maintenance or offline" in t.message)
    assert t.phase == lc.NEW
    resv = run.submit("dan", spec("2x2", 1, supply_mode="reservation"), "needs-reservation")
    wait_for(run, resv, lambda t: "maintenance or offline" in t.message)
    run.store.set_cluster_status(other, "active")
    run.store.set_cluster_status(home, "active")
    assert_clean(run, timeout=90)
    assert run.store.get_task(first).status == "Succeeded"  # running tasks finish
    assert run.store.get_task(held).status == "Succeeded"


def test_waiting_message_carries_a_start_estimate_once_the_queue_has_history(controller):
    # a one-slice reservation: one task runs at a time and hands its pool to the next
    run = controller(make_fleet(a={"reservation": {"name": "res-a", "count": 1}, "chips": 16}, with_b=False, seed=5))
    # three starts make a history; the sixth still waits when the third has started
    ids = [run.submit("alice", spec("2x2", 1.5, supply_mode="reservation", timeout_seconds=60), f"eta-{i}") for i in range(6)]
    wait_for(run, ids[0], phase_is(lc.RUNNING), 60)
    assert all("expected to start" not in run.store.get_task(t).message for t in ids[1:]), "no history yet: no estimate"
    deadline, shown = time.monotonic() + 90, None
    while shown is None and time.monotonic() < deadline:
        shown = next((t for t in run.tasks() if t.phase == lc.WAITING and "expected to start around" in t.message), None)
        time.sleep(0.2)
    assert shown is not None, [(t.id, str(t.phase), t.message) for t in run.tasks()]
    started = [t for t in ids if any(e.status == "Running" for e in run.store.events(t))]
    assert len(started) >= 3, "an estimate needs three starts of the queue"
    assert "Queue position #" in shown.message and "(waiting since" in shown.message, shown.message
    assert_clean(run, timeout=120)
