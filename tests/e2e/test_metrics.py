"""Falcon's Prometheus metrics as Prometheus sees them.

A controller runs on the simulated fleet inside the session's Ray (started with a
metrics export port, see tests/harness/ray_session.py); after a task that succeeds and one
that fails, the node's ``/metrics`` endpoint must serve the Falcon series with their
labels (Ray prefixes each name with ``ray_`` and adds labels of its own). A static
check keeps every declared metric wired to a call site.

The session's Ray is shared by every test worker, so the same node serves the series of
other tests' controllers too: this test's cluster has a name of its own (``edge-metrics``)
and the series without a cluster (the poller's) count only samples of this controller's
PollerActor process (Ray's ``WorkerId`` label, which its snapshot reports).
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from actors import names
from falcon_ray import metrics
from falcon_ray.devtools.demo import DemoRun, demo_settings
from tests.harness.e2e import make_fleet, spec

ROOT = Path(__file__).resolve().parents[2]


def test_every_declared_metric_has_a_call_site():
    src = (ROOT / "falcon_ray" / "metrics.py").read_text()
    bodies = dict(re.findall(r"^def (\w+)\((.*?)(?=^def |\Z)", src, re.S | re.M))
    callers = "\n".join(
        p.read_text() for p in [*ROOT.joinpath("actors").glob("*.py"), *ROOT.joinpath("falcon_ray").glob("*.py")]
        if p.name != "metrics.py"
    )
    unrecorded = []
    for name in metrics.DEFINITIONS:
        recorders = [f for f, body in bodies.items() if not f.startswith("_") and f'"{name}"' in body]
        if not any(re.search(rf"\bmetrics\.{f}\(", callers) for f in recorders):
            unrecorded.append(name)
    assert not unrecorded, f"declared in metrics.DEFINITIONS but never recorded: {unrecorded}"


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] for the ray_falcon_* series."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name.startswith("ray_falcon_"):
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _total(series, name: str, **labels: str) -> float | None:
    """Sum of the samples of ``name`` whose labels include ``labels`` (None: no such series)."""
    hits = [v for lab, v in series.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    return sum(hits) if hits else None


CLUSTER = "edge-metrics"
EDGE = {"cluster": CLUSTER, "topology": "2x2"}
# (sample name, labels, lowest acceptable value summed over matching series)
# Gauges, read while a task runs: Ray 2.60 drops a gauge series from /metrics about 20 s
# after its last set(), so they are checked while their call sites are still setting them.
LIVE = [
    ("ray_falcon_queue_tasks", {**EDGE, "state": "running"}, 1),
    ("ray_falcon_queue_tasks", {**EDGE, "state": "waiting"}, 0),
    ("ray_falcon_queue_tasks", {**EDGE, "state": "acquiring"}, 0),
    ("ray_falcon_node_pools_alive", {"cluster": CLUSTER}, 1),
    ("ray_falcon_reservation_headroom_hosts", {"cluster": CLUSTER, "reservation": "res-a"}, 0),
]
# Counters and histograms, read when every task is over.
DONE = [
    ("ray_falcon_task_outcomes_total", {**EDGE, "status": "Succeeded", "reason": ""}, 2),
    ("ray_falcon_task_outcomes_total", {**EDGE, "status": "Failed", "reason": "JobFailed"}, 1),
    ("ray_falcon_task_outcomes_total", {"cluster": "", "status": "Failed", "reason": "InvalidSpec"}, 1),
    ("ray_falcon_task_transitions_total", {**EDGE, "status": "Pending", "reason": "Provisioning"}, 1),
    ("ray_falcon_task_transitions_total", {**EDGE, "status": "Running", "reason": ""}, 3),
    ("ray_falcon_gke_operations_total", {"cluster": CLUSTER, "kind": "create", "result": "done", "error_kind": "none"}, 1),
    ("ray_falcon_gke_operations_total", {"cluster": CLUSTER, "kind": "delete", "result": "done"}, 1),
    ("ray_falcon_node_pools_created_total", {"cluster": CLUSTER}, 1),
    ("ray_falcon_node_pools_deleted_total", {"cluster": CLUSTER}, 1),
    ("ray_falcon_watch_relists_total", {"cluster": CLUSTER}, 1),
    ("ray_falcon_poll_rows_total", {}, 4),
    ("ray_falcon_poll_duration_seconds_count", {}, 1),
    ("ray_falcon_queue_tick_seconds_count", EDGE, 1),
    ("ray_falcon_time_to_running_seconds_count", EDGE, 3),
    ("ray_falcon_time_to_running_seconds_bucket", {**EDGE, "le": "+Inf"}, 3),
    ("ray_falcon_pending_reason_seconds_count", {**EDGE, "reason": "Provisioning"}, 1),
]


def _await_series(port: int, expected: list, poller_worker: str, timeout: float = 40.0) -> dict:
    """Scrape until every expected series reaches its value; fail listing what is missing.
    A series without a cluster counts only the samples of ``poller_worker`` (a WorkerId)."""
    deadline = time.monotonic() + timeout
    while True:
        series = _scrape(port)
        missing = []
        for name, labels, low in expected:
            own = {} if labels.get("cluster") else {"WorkerId": poller_worker}
            value = _total(series, name, **labels, **own)
            if value is None or value < low:
                missing.append((name, labels, f"want >= {low}, got {value}"))
        if not missing:
            return series
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout:.0f} s: {missing}; Falcon series seen: {sorted(series)}")
        time.sleep(1)


@pytest.mark.timeout(180)
def test_falcon_series_on_the_metrics_export_port(ray_session, tmp_path):
    port = ray_session["metrics_port"]
    fleet = make_fleet(a={"name": CLUSTER, "reservation": {"name": "res-a", "count": 4}, "chips": 16}, with_b=False, seed=7)
    run = DemoRun(fleet, demo_settings(), f"sqlite:///{tmp_path / 'falcon.db'}").start()
    try:
        poller = ray.get(names.lookup(names.POLLER, run.settings.namespace).snapshot.remote(), timeout=30)
        worker = poller["process"]["ray_worker_id"]
        # long enough that the gauges are exported while it runs, on a loaded machine too
        long = run.submit("dave", spec("2x2", 30), "metrics-long")
        # 8 s runs, sixteen queue ticks, inside the long one's 30 s: a queue sees them Running
        # on a loaded machine too (a run that ends before its queue's next look goes
        # Dispatching -> Succeeded/Failed, no Running, and the Running counts below miss it)
        ok = run.submit("alice", spec("2x2", 8), "metrics-ok")
        oom = run.submit("bob", spec("2x2", 8, env={"FALCON_SIM_OOM": "1"}), "metrics-oom")
        bad = run.submit("carol", {"tpu_type": "v6e", "topology": "3x3", "image": "x", "command": ["y"]}, "metrics-bad")
        assert run.wait(lambda: run.store.get_task(long).status == "Running", 30)
        _await_series(port, LIVE, worker, timeout=25)

        assert run.wait_done(60), [(t.id, t.status, t.reason, t.message) for t in run.tasks()]
        got = {t.id: (t.status, t.reason) for t in run.tasks()}
        assert got == {
            long: ("Succeeded", ""),
            ok: ("Succeeded", ""),
            oom: ("Failed", "JobFailed"),
            bad: ("Failed", "InvalidSpec"),
        }
        series = _await_series(port, DONE, worker, timeout=40)

        # histograms carry their buckets (metrics.TIME_BUCKETS); Ray adds labels of its own
        les = {float(lab["le"]) for lab, _ in series["ray_falcon_time_to_running_seconds_bucket"]}
        assert set(metrics.TIME_BUCKETS) | {float("inf")} <= les, les
        labels = series["ray_falcon_task_outcomes_total"][0][0]
        assert {"SessionName", "Version", "WorkerId"} <= set(labels), labels
    finally:
        run.stop()
