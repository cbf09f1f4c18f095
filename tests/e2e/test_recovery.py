"""End-to-end recovery: real actors killed mid-task (Ray restarts them), a second controller
waiting for the leader lease, a cluster nobody can reach (the real GKE client's answer from
a cluster the sim does not have). A node-pool delete GKE keeps refusing is played in
virtual time (tests/component/test_virtual_scenarios.py).

Same machinery and the same closing checks as tests/e2e/test_scenarios.py (no Falcon pool
alive, one Job per dispatched task, event logs along the lifecycle table); split from it so
``make test``'s workers share its length.
"""

from __future__ import annotations

import time

import pytest
import ray

from actors import names
from falcon_ray import lifecycle as lc
from falcon_ray.devtools.demo import DemoRun
from tests.harness.e2e import assert_clean, make_fleet, phase_is, spec, wait_for

pytestmark = pytest.mark.timeout(240)


def _kill(run: DemoRun, name: str) -> None:
    h = names.lookup(name, run.settings.namespace)
    assert h is not None, name
    ray.kill(h, no_restart=False)  # Ray restarts it (max_restarts=-1): __init__ is the recovery


# On MariaDB (the restarted actor reads its lease back from the production database); the
# other kills here run on SQLite, so a SQLite copy of this one added nothing (removed 2026-12-02)
@pytest.mark.mysql
def test_queue_actor_killed_while_its_pool_is_created(controller):
    run = controller(make_fleet(a={"timings": {"node_pool_create": 2.5}}, with_b=False), db="mysql")
    tid = run.submit("alice", spec("2x2", 1))
    # the first pick waits for the controller's actors to start: at the suite's start, with
    # every worker starting its own, that passed 30 s
    wait_for(run, tid, lambda t: t.node_pool_name is not None and t.reason == "Provisioning", timeout=90)
    time.sleep(0.3)
    _kill(run, names.queue_name("edge-a", "2x2"))
    stats = assert_clean(run, timeout=90)
    assert run.store.get_task(tid).status == "Succeeded"
    creates = [o for o in stats["clusters"]["edge-a"]["pool_ops"] if o["type"] == "CREATE_NODE_POOL" and o["status"] == "DONE" and not o["error"]]
    assert len(creates) == 1, creates
    assert run.wait(lambda: [l.state for l in run.store.leases(live_only=False)] == ["Deleted"], 20)


def test_queue_actor_killed_while_the_job_runs(controller):
    run = controller(make_fleet(with_b=False))
    # a 15 s run: its queue sees it Running (the kill lands mid-run) on a loaded machine too
    tid = run.submit("alice", spec("2x2", 15))
    wait_for(run, tid, phase_is(lc.RUNNING))
    _kill(run, names.queue_name("edge-a", "2x2"))
    assert_clean(run, timeout=60)
    assert run.store.get_task(tid).status == "Succeeded"


def test_cluster_actor_killed_mid_watch(controller):
    run = controller(make_fleet(with_b=False))
    tid = run.submit("alice", spec("2x2", 15))  # as above: Running is held long enough to be seen
    wait_for(run, tid, phase_is(lc.RUNNING))
    _kill(run, names.cluster_name("edge-a"))
    assert_clean(run, timeout=60, serial_pool_ops=False)
    assert run.store.get_task(tid).status == "Succeeded"


def test_second_controller_waits_for_the_leader_lease(controller):
    from actors.supervisor import Supervisor

    run = controller(make_fleet(with_b=False))
    second = Supervisor(run.settings, run.db_url, holder="second")
    assert not second.wait_for_lead(timeout=1.5)
    assert run.store.leader()["holder"] == run.supervisor.holder
    run.supervisor.shutdown(drain=False, kill=False)  # the first one stops cleanly and releases
    assert second.wait_for_lead(timeout=10)
    second.store.release_leader("second")


def test_unreachable_cluster_is_reported_then_fails_the_task_with_node_pool_timeout(controller):
    run = controller(make_fleet(a={"status": "offline"}, with_b=False), node_pool_timeout_s=6)
    run.store.add_cluster("ghost", "proj-x", "us-east5-b", "v6e")  # registered, but GKE has no such cluster
    tid = run.submit("alice", spec("2x2", 1))
    t = wait_for(run, tid, lambda t: t.message.startswith("Cannot reach cluster ghost") and "Permission denied" in t.message, timeout=30)
    assert t.phase == lc.PROVISIONING
    # the connect's error names the step that failed and the attempt
    assert "cannot connect to cluster ghost (attempt " in t.message and "reading the cluster from the GKE API" in t.message, t.message
    t = wait_for(run, tid, lambda t: t.terminal, timeout=30)
    assert (t.status, t.reason) == ("Failed", "NodePoolTimeout")
    assert "GKE API of cluster ghost unreachable" in t.message
    assert run.store.leases(live_only=False) == []  # nothing was ever created
    run.store.set_cluster_status("ghost", "offline")
    assert_clean(run)
