"""`falcon-ray queues` text is a pure function of the queue snapshots; the discovery
record and the parsing of `--tasks -` lines."""

from __future__ import annotations

import json
import os

import pytest

from falcon_ray import discovery
from falcon_ray.devtools.demo import parse_task_line
from falcon_ray.queues_view import PhaseClock, render

SNAP = {
    "queue": "queue/edge-a/2x2",
    "last_granted": "alice",
    "last_error": "",
    "acquiring": [{"id": 3, "actor": "carol", "name": "busy", "status": "Pending", "reason": "ClusterBusy", "message": "reservation full", "node_pool": None, "waiting_s": 9.0}],
    "waiting": [
        {"id": 5, "actor": "dave", "name": "second", "status": "Pending", "reason": "Waiting", "message": "1 ahead", "node_pool": None, "waiting_s": 4.0, "position": 2},
        {"id": 4, "actor": "erin", "name": "first", "status": "Pending", "reason": "Waiting", "message": "next", "node_pool": None, "waiting_s": 6.0, "position": 1},
    ],
    "running": [{"id": 2, "actor": "bob", "name": "long", "status": "Running", "reason": "", "message": "Pod running", "node_pool": "falcon-t2-2x2", "waiting_s": 30.0}],
    "aborting": [],
    "leases": [{"name": "falcon-t2-2x2", "state": "InUse", "task_id": 2, "supply_mode": "reservation", "pool_status": "RUNNING", "nodes_ready": 1, "idle_since": None}],
}  # fmt: skip


def test_render_shows_slot_holder_waiting_in_given_order_running_and_pools():
    text = render([SNAP], {3: 12.5, 2: 75})
    lines = text.splitlines()
    assert lines[0].startswith("queue/edge-a/2x2  waiting 2, slot 1, running 1, pools 1  (last granted: alice)")
    slot = next(l for l in lines if l.strip().startswith("SLOT"))
    assert "#3" in slot and "Pending/ClusterBusy" in slot and "12.5s" in slot
    waits = [l for l in lines if l.strip().startswith("WAIT")]
    assert "#5" in waits[0] and " 2 " in waits[0] and "4.0s" in waits[0], "the snapshot's pick order, its positions"
    run = next(l for l in lines if l.strip().startswith("RUN"))
    assert "#2" in run and "1m15s" in run and "falcon-t2-2x2" in run
    pool = next(l for l in lines if l.strip().startswith("POOL"))
    assert "InUse" in pool and "reservation" in pool and "RUNNING" in pool
    assert render([SNAP], {3: 12.5, 2: 75}) == text  # pure


def test_render_error_rows_and_no_queues():
    assert "NOT ANSWERING: GetTimeoutError" in render([{"actor": "queue/x/2x2", "error": "GetTimeoutError: ..."}])
    assert render([]).startswith("no queues")


def test_phase_clock_restarts_when_the_phase_changes():
    clock = PhaseClock()
    assert clock.observe([SNAP], 100.0)[3] == 0.0
    assert clock.observe([SNAP], 104.0)[3] == 4.0
    moved = dict(SNAP, acquiring=[dict(SNAP["acquiring"][0], reason="Provisioning")])
    assert clock.observe([moved], 105.0)[3] == 0.0
    assert 4 not in clock.observe([moved], 106.0), "a waiting task shows its waiting time instead"


def test_discovery_record_round_trip_and_resolution(tmp_path, monkeypatch):
    for k in ("FALCON_RAY_ADDRESS", "RAY_ADDRESS", "FALCON_NAMESPACE", "FALCON_DB_URL", "FALCON_RUNTIME_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert discovery.resolve()["address"] == "auto" and discovery.resolve()["record"] is None
    path = discovery.write({"namespace": "falcon", "ray_address": "10.0.0.1:6379", "db_url": "sqlite:////x/f.db"})
    assert path.parent == tmp_path / "falcon-ray" and oct(path.stat().st_mode & 0o777) == "0o600"
    got = discovery.resolve()
    assert (got["address"], got["namespace"], got["db_url"]) == ("10.0.0.1:6379", "falcon", "sqlite:////x/f.db")
    assert discovery.resolve(address="auto")["address"] == "10.0.0.1:6379", "auto means: find it"
    assert discovery.resolve(address="10.9.9.9:6379")["record"] is None, "another Ray: the record does not apply"
    monkeypatch.setenv("FALCON_DB_URL", "mysql+pymysql://h/db")
    assert discovery.resolve()["db_url"] == "mysql+pymysql://h/db", "the environment wins"
    discovery.remove("falcon")
    assert not path.exists()
    # a record left by a killed demo is ignored and cleaned up
    stale = dict(namespace="falcon", pid=2**22 + 12345, ray_address="x:1")
    (tmp_path / "falcon-ray" / "demo-falcon.json").write_text(json.dumps(stale))
    assert discovery.find() is None and not (tmp_path / "falcon-ray" / "demo-falcon.json").exists()
    assert os.getpid()  # (the live record above carried this process's pid)


@pytest.mark.parametrize(
    "line, error",
    [
        ("not json", "stdin:7: not JSON"),
        ('{"actor": "a"}', "needs at least 'actor' and 'spec'"),
        ('{"actor": "", "spec": {}}', "'actor' must be a non-empty string"),
        ('{"actor": "a", "spec": 3}', "'spec' must be a JSON object"),
        ('{"actor": "a", "spec": {}, "submit_at": "soon"}', "'submit_at' must be a number"),
        ('{"actor": "a", "spec": {}, "abort_at": -1}', "'abort_at' must be a number"),
    ],
)
def test_task_lines_are_checked(line, error):
    with pytest.raises(ValueError, match=error.replace("(", r"\(")):
        parse_task_line(line, "stdin:7")
    assert parse_task_line('{"actor": "a", "spec": {"x": 1}, "submit_at": 2}', "f:1")["submit_at"] == 2


def test_render_shows_recovering_tasks_in_the_head_and_as_rows():
    snap = dict(SNAP, recovering=[{"id": 7, "actor": "fay", "name": "train", "status": "Pending", "reason": "Recovering", "message": "Attempt 2 of 4 after maintenance", "node_pool": "falcon-t7-2x2", "waiting_s": 50.0, "attempt": 1}])
    text = render([snap], {7: 20.0})
    assert "running 1, recovering 1," in text.splitlines()[0]
    (row,) = [line for line in text.splitlines() if "RECOVER" in line]
    assert "Pending/Recovering" in row and "Attempt 2 of 4 after maintenance" in row and "falcon-t7-2x2" in row
    assert "recovering" not in render([SNAP], {}).splitlines()[0]
