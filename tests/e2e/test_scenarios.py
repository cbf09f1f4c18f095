"""End-to-end scenarios through the demo machinery: real Ray actors, the simulated fleet
over the real GKE / Compute / Kubernetes clients, and a real database.

Only what needs Ray and the whole path lives here: the status and failure tables on
MariaDB through Ray actors and the real clients over HTTP, asserting outcomes. Crashes of
real actors are in tests/e2e/test_recovery.py. Every scenario whose claim is an order or a
timing (a task's path, aborts in each phase, create failures and timeouts, the orphan scan,
clusters in maintenance, start estimates) is played in virtual time by
tests/component/test_virtual_scenarios.py; the queue's rules by themselves are component
tests in tests/component/test_queue.py.

After the scenario the same three checks hold: no Falcon node pool is alive in the fleet,
every dispatched task had its Job created exactly once, and every task's event log moves
only along edges of the lifecycle table.
"""

from __future__ import annotations

import pytest

from tests.harness.e2e import assert_clean, make_fleet, reasons, spec

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
    # the phases the queue itself writes on the way (a 1 s run may end before its queue sees
    # it Running: the whole path, Running included, is proved in virtual time,
    # tests/component/test_virtual_scenarios.py)
    for step in ("Pending/Waiting", "Pending/Provisioning", "Pending/Dispatching", "Succeeded"):
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
