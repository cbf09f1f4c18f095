"""Health of a live controller (DemoRun on the simulated fleet, session Ray).

``health.check`` must see the lease held and every actor answering, with each
ClusterActor's last GKE / Kubernetes call and its Job watch recent; ``health.serve``
must answer /healthz and /readyz with JSON, /readyz turning 503 once the lease is
released; a live task past the limit of its wait (counted from its event log) is listed
as overdue (a running one never is: its own timeout bounds it); and ``falcon-ray health --json`` run as its own
process against the same Ray and database agrees.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import ray
import sqlalchemy as sa
import yaml

from falcon_ray import health
from falcon_ray import lifecycle as lc
from falcon_ray.devtools.demo import DemoRun, demo_settings
from tests.harness.e2e import make_fleet, spec

LIMITS = {"waiting_limit_s": 600.0, "reservation_wait_limit_s": 86400.0}

pytestmark = pytest.mark.timeout(150)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=15) as r:
            assert r.headers["Content-Type"] == "application/json"
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        assert e.headers["Content-Type"] == "application/json"
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def live(ray_session, tmp_path_factory):
    """A controller with a running task, one holding the slot (ClusterBusy) and one waiting.
    One serves the module: the read-only tests come first, the one that backdates the event
    log and releases the lease comes last (pytest keeps file order)."""
    fleet = make_fleet(a={"reservation": {"name": "res-a", "count": 1}, "chips": 16}, with_b=False, seed=11)
    db = tmp_path_factory.mktemp("health") / "falcon.db"
    run = DemoRun(fleet, demo_settings(**LIMITS), f"sqlite:///{db}").start()
    try:
        ids = {
            "running": run.submit("alice", spec("2x2", 300, supply_mode="reservation"), "hc-running"),
            "busy": run.submit("bob", spec("2x2", 1, supply_mode="reservation"), "hc-busy"),
            "waiting": run.submit("carol", spec("2x2", 1, supply_mode="reservation"), "hc-waiting"),
        }
        for key, phase in (("running", lc.RUNNING), ("busy", lc.CLUSTER_BUSY), ("waiting", lc.WAITING)):
            assert run.wait(lambda k=key, p=phase: run.store.get_task(ids[k]).phase == p, 30), run.report()["tasks"]
        yield run, ids
    finally:
        run.stop()


def _backdate(run: DemoRun, task_ids: list[int], seconds: float) -> None:
    """Move the tasks' event log (when they entered each phase) back in time."""
    with run.store.engine.begin() as c:
        c.execute(
            sa.text(
                "UPDATE falcon_task_events SET at = :at WHERE task_id IN (" + ",".join(str(int(i)) for i in task_ids) + ")"
            ),
            {"at": run.store.clock().replace(microsecond=0) - dt.timedelta(seconds=seconds)},
        )


def test_health_cli_as_its_own_process(live, tmp_path):
    run, _ = live
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump({"namespace": run.settings.namespace}))
    address = ray.get_runtime_context().gcs_address
    cmd = [
        sys.executable, "-c", "from falcon_ray.cli import main; main()", "health", "--json",
        "--ray-address", address,
        "--db", run.db_url,
        "--config", str(config),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # --ray-address alone must do
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=90, env=env, cwd=Path(__file__).resolve().parents[2]
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["leader"]["holder"] == run.supervisor.holder
    assert set(report["actors"]) >= {"poller", "cluster/edge-a", "queue/edge-a/2x2"}, (report, proc.stderr[-2000:])
    assert all(a["ok"] for a in report["actors"].values()), report["actors"]
    assert report["healthy"] and proc.returncode == 0, (report, proc.stderr[-2000:])


def test_queues_cli_shows_the_slot_holder_and_the_waiting_task(live):
    run, ids = live
    address = ray.get_runtime_context().gcs_address
    cmd = [
        sys.executable, "-c", "from falcon_ray.cli import main; main()", "queues", "--json",
        "--ray-address", address, "--namespace", run.settings.namespace,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=90, env=env, cwd=Path(__file__).resolve().parents[2]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (queue,) = json.loads(proc.stdout)
    assert queue["queue"] == "queue/edge-a/2x2"
    assert [t["id"] for t in queue["running"]] == [ids["running"]]
    assert [t["id"] for t in queue["acquiring"]] == [ids["busy"]] and queue["acquiring"][0]["reason"] == "ClusterBusy"
    # counted as its Message counts: the slot holder ahead of it
    assert [(t["id"], t["position"], t["ahead"]) for t in queue["waiting"]] == [(ids["waiting"], 2, 1)]
    assert any(l["state"] == "InUse" for l in queue["leases"])


def test_health_check_serve_overdue_tasks_and_readiness_after_the_lease_is_released(live):
    run, ids = live
    sup = run.supervisor

    report = health.check(sup)
    assert report["healthy"] and report["ready"], report
    assert report["database"] == {"ok": True}
    assert report["leader"]["held"] and report["leader"]["holder"] == sup.holder == report["holder"]
    assert set(report["actors"]) >= {"poller", "cluster/edge-a", "queue/edge-a/2x2"}, report["actors"]
    assert all(a["ok"] for a in report["actors"].values()), report["actors"]
    edge = report["actors"]["cluster/edge-a"]
    assert edge["connected"] and not edge["connect_error"] and edge["connect_stage"] == "connected"
    assert len(edge["connect_timings"]) == 4, edge  # the seconds of each step of its connect
    assert 0 <= edge["last_gke_ok_age_s"] < 30 and 0 <= edge["last_kubernetes_ok_age_s"] < 30, edge
    assert edge["watch_age_s"] is not None and 0 <= edge["watch_age_s"] < 60, edge
    assert report["overdue_tasks"] == []
    json.dumps(report)  # the probe's body

    # a live task past the limit of its wait is overdue; a running one never is
    _backdate(run, [ids["waiting"], ids["running"]], 7200)
    overdue = {t["id"]: t for t in health.check(sup)["overdue_tasks"]}
    assert ids["waiting"] in overdue, overdue
    row = overdue[ids["waiting"]]
    assert row["reason"] == "Waiting" and row["wait"] == "queue" and row["age_s"] > 7000 and row["limit_s"] == 600
    assert ids["running"] not in overdue and ids["busy"] not in overdue

    port = _free_port()
    server = health.serve(sup, port=port, host="127.0.0.1")
    try:
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and body["healthy"], body
        status, body = _get(f"http://127.0.0.1:{port}/readyz")
        assert status == 200 and body["ready"] and body["leader"]["held"], body
        with pytest.raises(urllib.error.HTTPError) as nf:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert nf.value.code == 404

        # stop leading: the supervisor loop ends, then the lease is released (actors stay up)
        run.stop_event.set()
        run.thread.join(15)
        sup.shutdown(drain=False, kill=False)
        assert run.store.leader() is None
        deadline = time.monotonic() + 10  # the server caches a report for 2 s
        while time.monotonic() < deadline:
            status, body = _get(f"http://127.0.0.1:{port}/readyz")
            if status == 503:
                break
            time.sleep(0.5)
        assert status == 503 and not body["ready"] and not body["leader"]["held"], body
        status, body = _get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and body["healthy"], body  # a controller waiting for the lease is alive
    finally:
        server.shutdown()
        server.server_close()
