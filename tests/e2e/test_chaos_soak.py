"""The soak of issue 12 in CI: 200 mixed tasks under API faults, incompatible-operation
refusals, watch cuts, 410s, token refusals, bursts of INTERNAL create failures and actor
kills (``falcon_ray.chaos``), on the session's Ray and a SQLite database, on issue 10's
fleet (a reservation of 6 hosts and a flex-start cluster of 32 chips). Every invariant must
report zero; ``failed_for_capacity`` is issue 10's "no task ends NodePoolFailed for capacity".

``make soak`` runs the long one (1,000 tasks on MariaDB, its connections killed too).

It once reported three tasks quiet for 50 s in Dispatching ("Kubernetes Job submission
refused for now ...: cluster not connected") after ClusterActor kills on a loaded machine: a
restarted ClusterActor that had not connected yet. Its Message now says which step of the
connect is running and since when, and a connect slower than 10 s is logged with its steps;
``make soak-ci`` runs this file alone.
"""

from __future__ import annotations

import json

import pytest

from falcon_ray.chaos import ChaosRun, summarize

pytestmark = pytest.mark.timeout(420)


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
    assert report["tasks"] == 200
    # a failure carries what lines it up with a stall: the kills (seconds into the play, actor)
    why = {"invariants": report["invariants"], "details": report["details"], "kill_log": report.get("kill_log")}
    assert report["ok"], json.dumps(why, default=str)[:8000]
