"""`falcon-ray run` as an operator starts it: its own process, joined to a Ray cluster,
a database and a fleet. It must take the leader lease, run a task to the end, log JSON
lines, and on SIGTERM let the actors finish their step, stop them and release the lease.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from actors import names
from tests.harness.e2e import make_fleet, run_command_setup, spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_run_command_leads_runs_a_task_and_stops_cleanly_on_sigterm(ray_session, tmp_path):
    fleet = make_fleet(with_b=False, seed=21)
    namespace = f"falcon-run-{os.getpid()}"
    sim, store, _db_url, cmd = run_command_setup(fleet, tmp_path, namespace, health_port=0)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        tid = store.submit_task("alice", spec("2x2", 1), name="via-run")
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not store.get_task(tid).terminal:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.3)
        t = store.get_task(tid)
        assert t.status == "Succeeded", (t.status, t.reason, t.message, log_path.read_text()[-3000:])
        assert store.leader() is not None
        assert {"poller", "cluster/edge-a", "queue/edge-a/2x2"} <= set(names.list_falcon_actors(namespace))
        lines = _json_log_lines(tid)
        assert any(l.get("cluster") == "edge-a" and l.get("topology") == "2x2" and l.get("actor") == "alice" for l in lines), (
            "every lifecycle line of the task is a JSON object with its task id, cluster, topology and actor"
        )
        assert any("-> Succeeded" in l.get("message", "") for l in lines), lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        sim.stop()
    out = log_path.read_text()
    assert "letting in-flight steps finish" in out
    assert store.leader() is None, "a clean stop releases the leader lease"
    assert names.list_falcon_actors(namespace) == [], "a clean stop stops the actors"
    store.dispose()


def _json_log_lines(task_id: int) -> list[dict]:
    """The JSON log lines about ``task_id`` in this Ray session's worker logs."""
    from ray._private.worker import global_worker

    logs = Path(global_worker.node.get_session_dir_path()) / "logs"
    found = []
    for path in logs.glob("worker-*"):
        for raw in path.read_text(errors="replace").splitlines():
            if '"falcon_task_id"' not in raw:
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if line.get("falcon_task_id") == task_id:  # Ray's own "task_id" is its task, not ours
                found.append(line)
    return found
