"""The read API's contract against `falcon-ray run` as an operator starts it (its own
process, the health port from the settings, the token from the file ``api_token_file``
names), on the simulated fleet: the probes stay open, /v1 wants the token, an unknown
task is 404 and a malformed id 422, a task reads as the upper layer follows it, and a
queue of many waiting tasks comes back one bounded page at a time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness import api_contract as contract
from tests.harness.e2e import make_fleet, run_command_setup, spec
from tests.harness.ray_head import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "api-contract-token-0123456789"
WAITING = 40


@pytest.mark.timeout(300)
def test_read_api_of_falcon_ray_run(ray_session, tmp_path):
    # one host in the reservation: the first task runs, the next holds the slot, the rest wait
    fleet = make_fleet(a={"reservation": {"name": "res-a", "count": 1}, "chips": 16}, with_b=False, seed=31)
    token_file = tmp_path / "api-token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    namespace = f"falcon-api-{os.getpid()}"
    sim, store, _db_url, cmd = run_command_setup(fleet, tmp_path, namespace, health_port=port, api_token_file=str(token_file))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log_path = tmp_path / "run.log"
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        running = store.submit_task("alice", spec("2x2", 600, supply_mode="reservation"), name="api-running")
        holder = store.submit_task("bob", spec("2x2", 1, supply_mode="reservation"), name="api-holder")
        waiting = [
            store.submit_task(f"u{i % 7}", spec("2x2", 1, supply_mode="reservation"), name=f"api-wait-{i}")
            for i in range(WAITING)
        ]
        contract.wait_until(
            "the controller ready", lambda: proc.poll() is None and contract.client(base).get("/readyz").status_code == 200, 120
        )
        contract.check_probes_open(base)
        contract.check_token(base, TOKEN)
        contract.check_bad_input(base, TOKEN)
        contract.check_openapi(base)

        contract.wait_until("a running task", lambda: contract.task(base, TOKEN, running)["status"] == "Running", 90)
        q = contract.check_large_queue(base, TOKEN, at_least=WAITING)
        assert (q["cluster"], q["topology"]) == ("edge-a", "2x2")
        assert q["holder"] is not None and q["holder"]["id"] == holder, q["holder"]
        assert [t["id"] for t in q["running"]] == [running]
        assert any(p["task_id"] == running and p["state"] == "InUse" for p in q["pools"]), q["pools"]

        last = contract.task(base, TOKEN, waiting[-1])
        row = store.get_task(waiting[-1])
        assert (last["status"], last["reason"], last["message"]) == (row.status, row.reason, row.message)
        assert (last["cluster"], last["topology"], last["supply_mode"]) == ("edge-a", "2x2", "reservation")
        assert last["ahead"] == WAITING and last["position"] == WAITING + 1, last  # the holder and every other waiting
        assert f"Queue position #{WAITING + 1}, {WAITING} task(s) ahead" in row.message
        assert last["since"] is not None and abs(last["since"] - time.time()) < 600
        assert last["eta"] is None or set(last["eta"]) == {"expected_at", "latest_at"}
        run_row = contract.task(base, TOKEN, running)
        assert run_row["position"] is None and run_row["supply_mode"] == "reservation" and run_row["attempt"] == 0

        (edge,) = contract.check_clusters(base, TOKEN, {"edge-a"}).values()
        assert edge["status"] == "active" and edge["tpu_type"] == "v6e" and edge["connected"] is True
        assert edge["reservation"] is not None and edge["reservation"]["count"] == 1, edge

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        sim.stop()
        store.dispose()
    assert f"read API /v1 on port {port}" in log_path.read_text()
