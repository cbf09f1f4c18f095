"""The read API's shaping and its app, without Ray or a database: a fake source holds rows
(the model's own dataclasses) and snapshot dicts of the QueueActor's and ClusterActor's
shape; the app is called through FastAPI's TestClient (httpx)."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
from fastapi.testclient import TestClient

from falcon_ray import api, messages
from falcon_ray.model import Cluster, Disruption, Lease, Task

NOW = dt.datetime(2026, 12, 1, 12, 0, 0)
SPEC = json.dumps({"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["run"]})
EDGE = Cluster("c1", "edge-a", "proj", "us-east5-b", "v6e", "logs", "res-a", "active", "falcon-jobs", "falcon-job", NOW, NOW)


def row(tid: int, status: str = "Pending", reason: str = "Waiting", message: str = "", **kw) -> Task:
    fields = dict(
        id=tid, name=f"t{tid}", actor="alice", spec=SPEC, status=status, reason=reason, message=message,
        cluster_id="c1", node_pool_name=None, job_uid=None, timeout_seconds=None, created_at=NOW, updated_at=NOW,
        dispatched_at=None, finished_at=None, aborting_at=None, aborted_at=None,
    )  # fmt: skip
    return Task(**(fields | kw))


def entry(tid: int, reason: str = "Waiting", **kw) -> dict:
    """A task of a QueueActor snapshot (actors/queue.py ``_task_view``)."""
    return {"id": tid, "name": f"t{tid}", "actor": "alice", "status": "Pending", "reason": reason, "message": "",
            "node_pool": None, "waiting_s": 12.0, "in_phase_s": 3.5} | kw  # fmt: skip


def snapshot(waiting: int = 3, eta: dict | None = None) -> dict:
    return {
        "cluster": "edge-a", "topology": "2x2", "last_granted": "", "db_statements": 0, "recovering": [], "aborting": [],
        "acquiring": [entry(1, "Provisioning", node_pool="falcon-2x2-1")],
        "waiting": [entry(10 + i, position=i + 1, **({"eta": eta} if eta else {})) for i in range(waiting)],
        "running": [entry(2, "", status="Running", node_pool="falcon-2x2-0", attempt=0)],
        "leases": [{"name": "falcon-2x2-0", "state": "InUse", "task_id": 2, "supply_mode": "flex-start", "operation": None,
                    "created_at": "2026-12-01T11:00:00", "idle_since": None, "pool_status": "RUNNING", "nodes_ready": 1,
                    "delete_attempts": 0}],
    }  # fmt: skip


class FakeSource:
    def __init__(self, tasks=(), snap=None, cluster_snaps=None, leases=()) -> None:
        self.tasks = {t.id: t for t in tasks}
        self.snap = snap
        self.cluster_snaps = cluster_snaps or {}
        self._leases = list(leases)
        self.asked: list[tuple[str, str]] = []

    def get_task(self, task_id):
        return self.tasks.get(task_id)

    def clusters(self):
        return [EDGE]

    def since(self, task):
        return NOW - dt.timedelta(seconds=30)

    def disruptions(self, task_id):
        return (Disruption(0, "maintenance", "node-1", "job-1", "host maintenance", NOW),) if task_id == 2 else ()

    def leases(self):
        return self._leases

    def queue(self, cluster, topology, task_id=None):
        self.asked.append((cluster, topology))
        return self.snap

    def queues(self, offset=0, limit=None, cluster=None, topology=None):
        self.asked.append(("queues", cluster, topology))
        return [self.snap] if self.snap else []

    def cluster_snapshots(self):
        return self.cluster_snaps


# ---- shaping ----------------------------------------------------------------------------------


def test_eta_prefers_the_structured_range_then_the_message_range_then_none():
    assert api.eta_of({"eta": {"expected_at": 100.0, "latest_at": 400.0}}) == api.Eta(expected_at=100.0, latest_at=400.0)
    assert api.eta_of({"eta": {"expected_at": None, "latest_at": None}}) is None
    at = dt.datetime(2026, 12, 1, 12, 25, tzinfo=dt.UTC)
    for lang in ("en", "zh"):
        for latest, then in (("12:50", at + dt.timedelta(minutes=25)), ("2026-12-02 01:30", at + dt.timedelta(hours=13, minutes=5))):
            text = "Queue position #2" + messages.text("expected_start", lang, at="2026-12-01 12:25", latest=latest) + " (waiting since ...)"
            assert api.eta_of({"message": text}) == api.Eta(expected_at=at.timestamp(), latest_at=then.timestamp()), (lang, latest)
    assert api.eta_of({"message": "Queue position #2, 1 task(s) ahead (x)"}) is None


def test_task_out_counts_position_as_the_message_does_and_reads_eta_from_its_entry():
    snap = snapshot(eta={"expected_at": 1000.0, "latest_at": 2000.0})
    out = api.task_out(row(12), EDGE, snap, NOW, ())
    assert (out.position, out.ahead) == (4, 3)  # the slot holder and two waiting ahead
    assert out.eta == api.Eta(expected_at=1000.0, latest_at=2000.0)
    assert out.supply_mode == "reservation" and out.topology == "2x2" and out.cluster == "edge-a"
    assert out.since == api.epoch(NOW)
    # a running task: no position, its pool's supply mode, its disruptions
    d = (Disruption(0, "maintenance", "node-1", "job-1", "host maintenance", NOW),)
    out = api.task_out(row(2, "Running", "", node_pool_name="falcon-2x2-0"), EDGE, snap, NOW, d)
    assert out.position is None and out.eta is None and out.supply_mode == "flex-start"
    assert out.attempt == 1 and out.disruptions[0].kind == "maintenance"
    # a queue that did not answer: no position; the Message's estimate still reads
    msg = "Queue position #2" + messages.text("expected_start", "en", at="2026-12-01 12:25", latest="12:40")
    out = api.task_out(row(12, message=msg), EDGE, {"actor": "queue/edge-a/2x2", "error": "timeout"}, None, ())
    assert out.position is None and out.eta is not None and out.eta.latest_at - out.eta.expected_at == 900
    # an unreadable spec and no cluster: nulls, never an error
    out = api.task_out(row(5, "Failed", "InvalidSpec", spec="{not json", cluster_id=None), None, None, None, ())
    assert (out.topology, out.supply_mode, out.cluster) == (None, None, None)


def test_queue_out_bounds_every_list_and_pages_waiting():
    snap = snapshot(waiting=25)
    snap["running"] = [entry(100 + i, "", status="Running") for i in range(30)]
    q = api.queue_out(snap, limit=10, offset=20)
    assert [w.id for w in q.waiting] == [30, 31, 32, 33, 34]
    assert q.waiting_page == api.Page(total=25, offset=20, limit=10, next_offset=None)
    assert len(q.running) == 10 and q.running_total == 30
    assert q.holder is not None and q.holder.id == 1
    assert q.pools[0].created_at == api.epoch(dt.datetime(2026, 12, 1, 11))
    err = api.queue_out({"actor": "queue/edge-b/4x4", "error": "GetTimeoutError"})
    assert (err.cluster, err.topology, err.error, err.waiting) == ("edge-b", "4x4", "GetTimeoutError", [])


def test_reservation_live_else_recorded_else_none():
    live = {"reservation": {"count": 8, "in_use": 3, "claimed": 2, "free": 3}}
    assert api.reservation_of(EDGE, live) == api.Reservation(count=8, in_use=3, free_hosts=3)
    assert api.reservation_of(EDGE, None) is None
    from dataclasses import replace

    recorded = replace(EDGE, reservation_count=4, reservation_in_use=4, reservation_claimed=1)
    assert api.reservation_of(recorded, None) == api.Reservation(count=4, in_use=4, free_hosts=0)
    assert api.reservation_of(replace(EDGE, default_reservation=""), live) is None


# ---- the app ------------------------------------------------------------------------------------


def test_openapi_documents_every_endpoint_and_field():
    doc = TestClient(api.create_app(FakeSource(), probes=lambda: {"healthy": True, "ready": True})).get("/openapi.json").json()
    assert {"/v1/tasks/{task_id}", "/v1/queues", "/v1/clusters", "/healthz", "/readyz"} <= set(doc["paths"])
    props = doc["components"]["schemas"]["TaskOut"]["properties"]
    for field in ("id", "name", "actor", "status", "reason", "message", "cluster", "topology", "supply_mode",
                  "position", "ahead", "eta", "since", "attempt", "disruptions"):  # fmt: skip
        assert field in props, field
    assert set(doc["components"]["schemas"]["Eta"]["properties"]) == {"expected_at", "latest_at"}
    assert set(doc["components"]["schemas"]["Reservation"]["properties"]) == {"count", "in_use", "free_hosts"}
    assert "404" in doc["paths"]["/v1/tasks/{task_id}"]["get"]["responses"]
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_endpoints_answer_from_the_source():
    source = FakeSource([row(12), row(2, "Running", "", node_pool_name="falcon-2x2-0")], snapshot(),
                        {"edge-a": {"connected": True, "reservation": {"count": 4, "in_use": 1, "claimed": 0}}},
                        [Lease(7, "c1", "2x2", "falcon-2x2-0", "flex-start", "InUse", 2, None, 0, "", NOW, NOW, NOW, None, None)])  # fmt: skip
    c = TestClient(api.create_app(source))
    t = c.get("/v1/tasks/12").json()
    assert (t["position"], t["ahead"], t["eta"]) == (4, 3, None) and source.asked == [("edge-a", "2x2")]
    assert c.get("/v1/tasks/2").json()["disruptions"][0]["at"] == api.epoch(NOW)
    (q,) = c.get("/v1/queues").json()["queues"]
    assert q["holder"]["id"] == 1 and [w["id"] for w in q["waiting"]] == [10, 11, 12]
    (cl,) = c.get("/v1/clusters").json()["clusters"]
    assert cl["reservation"] == {"count": 4, "in_use": 1, "free_hosts": 3} and cl["pools"][0]["task_id"] == 2
    assert c.get("/v1/tasks/3").status_code == 404


def test_queues_asks_the_source_only_for_the_cluster_and_topology_wanted():
    """A filtered /v1/queues names its cluster and topology to the source, which asks only
    those QueueActors (``inspect.queue_named``), not every queue of the controller."""
    source = FakeSource([], snapshot())
    c = TestClient(api.create_app(source))
    c.get("/v1/queues", params={"cluster": "edge-a", "topology": "2x2"})
    c.get("/v1/queues", params={"cluster": "edge-b"})
    c.get("/v1/queues")
    assert source.asked == [("queues", "edge-a", "2x2"), ("queues", "edge-b", None), ("queues", None, None)]


def test_queue_actor_names_are_matched_by_cluster_and_topology():
    from falcon_ray.inspect import queue_named

    assert queue_named("queue/edge-a/2x2") and queue_named("queue/edge-a/2x2", "edge-a", "2x2")
    assert queue_named("queue/edge-a/2x2x1", "edge-a") and queue_named("queue/edge-a/4x4", topology="4x4")
    assert not queue_named("queue/edge-a/2x2", "edge-b") and not queue_named("queue/edge-a/2x2", topology="2x2x1")
    assert not queue_named("cluster/edge-a") and not queue_named("queue/edge-a") and not queue_named("poller", "edge-a")


def test_a_terminal_task_does_not_ask_its_queue():
    source = FakeSource([row(4, "Succeeded", "")], snapshot())
    assert TestClient(api.create_app(source)).get("/v1/tasks/4").json()["position"] is None
    assert source.asked == []


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("s3cret-token\n")
    return path


def test_the_token_guards_v1_and_never_the_probes(token_file):
    probes = {"healthy": True, "ready": False}
    c = TestClient(api.create_app(FakeSource([row(12)], snapshot()), token_file=str(token_file), probes=lambda: probes))
    r = c.get("/v1/tasks/12")
    assert r.status_code == 401 and r.json()["detail"].startswith("a bearer token is required")
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = c.get("/v1/queues", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"]
    assert c.get("/v1/clusters", headers={"Authorization": "Basic czNjcmV0LXRva2Vu"}).status_code == 401
    ok = {"Authorization": "Bearer s3cret-token"}
    assert c.get("/v1/tasks/12", headers=ok).status_code == 200
    assert c.get("/v1/tasks/99", headers=ok).status_code == 404
    assert c.get("/healthz").status_code == 200 and c.get("/readyz").status_code == 503
    assert c.get("/readyz").json() == probes
    assert c.get("/openapi.json").status_code == 200

    # a rotated token takes effect without a restart; an unreadable file closes /v1
    token_file.write_text("rotated-token-longer")
    os.utime(token_file, ns=(1, 1))
    assert c.get("/v1/tasks/12", headers=ok).status_code == 401
    assert c.get("/v1/tasks/12", headers={"Authorization": "Bearer rotated-token-longer"}).status_code == 200
    token_file.unlink()
    r = c.get("/v1/tasks/12", headers={"Authorization": "Bearer rotated-token-longer"})
    assert r.status_code == 503 and "token file" in r.json()["detail"]
    assert c.get("/healthz").status_code == 200


def test_probes_fail_closed_when_the_report_raises():
    def broken():
        raise RuntimeError("no database")

    c = TestClient(api.create_app(FakeSource(), probes=broken))
    r = c.get("/healthz")
    assert r.status_code == 503 and r.json() == {"error": "no database"}
