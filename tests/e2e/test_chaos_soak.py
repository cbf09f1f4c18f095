"""The soak of issue 12 in CI: 200 mixed tasks under API faults, incompatible-operation
refusals, watch cuts, 410s, token refusals, bursts of INTERNAL create failures, actor
kills and random disruptions of running pods (host maintenance, auto-repair, capacity
reclaimed: ``chaos.DISRUPTION_RATE`` per node-hour) (``falcon_ray.devtools.chaos``), on the session's
Ray and a SQLite database, on issue 10's fleet (a reservation of 6 hosts and a flex-start
cluster of 32 chips). Every invariant must report zero; ``failed_for_capacity`` is issue
10's "no task ends NodePoolFailed for capacity", ``recovered_own_failure`` that every
recovery the controller recorded is of a run the fleet disrupted.

``make soak`` runs the long one (1,000 tasks on MariaDB, its connections killed too).

It once reported three tasks quiet for 50 s in Dispatching ("Kubernetes Job submission
refused for now ...: cluster not connected") after ClusterActor kills on a loaded machine: a
restarted ClusterActor that had not connected yet. Its Message now says which step of the
connect is running and since when, and a connect slower than 10 s is logged with its steps;
``make soak-ci`` runs this file alone.

Its first run with disruptions (seed 12, 2026-12-02) reported ``second_job_creates=1``: Job
``falcon-task-60-a1`` created on flex-start pool falcon-t6-2x4 after a reclaim, deleted when
the nodes did not come back within recovery_pool_wait_s (Recovering -> Waiting), then
created again under the same name on another pool (the attempt is the count of
disruption rows, and going back to Waiting adds none). A controller bug of the recovery
code, reported, not fixed in this file; the soak counts it as before (one name, two Jobs).
"""

from __future__ import annotations

import json

import pytest

from falcon_ray.devtools.chaos import ChaosRun, summarize

pytestmark = pytest.mark.timeout(600)  # on a loaded machine: 90 s of play, up to 360 s of drain


def test_soak_200_tasks_with_faults_and_kills(ray_session, capsys):
    # margin 60 s: this soak kills the poller every 13.5 s and runs beside three other busy
    # test workers on 2 cores, where one PollerActor restart was seen taking over 13 s: a task
    # aborted while unassigned then waits out two restarts (30-42 s seen). `make soak` keeps 30 s.
    report = ChaosRun(tasks=200, minutes=1.5, seed=12, scale=0.3, drain_s=240, margin_s=60).run_soak()
    with capsys.disabled():
        print("\n" + summarize(report))
    injected = report["faults_injected"]
    # the soak is only a proof if the faults were there
    for kind in ("api_503", "api_429", "incompatible_op", "watch_cut", "token_rejected", "killed_queue", "killed_cluster", "killed_poller", "create_error_bursts"):
        assert injected.get(kind, 0) > 0, (kind, injected)
    # disruptions of running pods, and the controller recovered runs (~8% of the runs are hit)
    assert sum(injected.get(f"disruption_{k}", 0) for k in ("maintenance", "repair", "reclaim")) > 0, injected
    assert report["recoveries"]["recoveries"] > 0, report["recoveries"]
    assert "recovered_own_failure" in report["invariants"] and "failing_task_succeeded" in report["invariants"]
    assert report["tasks"] == 200
    # a failure carries what lines it up with a stall: the kills (seconds into the play, actor)
    why = {"invariants": report["invariants"], "details": report["details"], "kill_log": report.get("kill_log")}
    assert report["ok"], json.dumps(why, default=str)[:8000]
