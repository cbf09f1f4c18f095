"""The read API (``falcon_ray.api``) over a real queue: a QueueReconciler on SQLite (the
``QueueBench``) gives the snapshot, the Store gives the rows, and ``inspect.ApiSource``
reads both as the controller's health port does; only the Ray lookups are replaced by the
bench's own reconciler. Called with FastAPI's TestClient (httpx), bad input included."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from falcon_ray import api
from falcon_ray import lifecycle as lc
from falcon_ray.inspect import ApiSource
from falcon_ray.model import ClusterView, ReservationView
from tests.harness.fakes import QueueBench

RES = ReservationView(count=4, in_use=1, claimed=0, machine_type="ct6e-standard-4t")


class BenchSource(ApiSource):
    """ApiSource with the bench's QueueReconciler standing in for the QueueActor."""

    def __init__(self, bench: QueueBench, cluster_snap: dict | None = None) -> None:
        super().__init__(bench.store, "unused")
        self.bench = bench
        self.cluster_snap = cluster_snap or {}
        self.sent: list[int] = []  # waiting entries each snapshot carried (what a QueueActor sends over Ray)

    def _snapshot(self, **ask) -> dict:
        snap = self.bench.queue.snapshot(**ask)
        self.sent.append(len(snap["waiting"]))
        return snap

    def queue(self, cluster, topology, task_id=None):
        if (cluster, topology) != ("edge-a", self.bench.topology):
            return None
        return self._snapshot(task_id=task_id)

    def queues(self, offset=0, limit=None, cluster=None, topology=None):
        return [dict(self._snapshot(waiting_offset=offset, waiting_limit=limit), queue=f"queue/edge-a/{self.bench.topology}")]

    def cluster_snapshots(self):
        return {"edge-a": self.cluster_snap}


@pytest.fixture
def bench(tmp_path) -> QueueBench:
    return QueueBench(f"sqlite:///{tmp_path / 'q.db'}")


def _client(bench: QueueBench, **kw) -> TestClient:
    return TestClient(api.create_app(BenchSource(bench, **kw)))


def _client_and_source(bench: QueueBench) -> tuple[TestClient, BenchSource]:
    source = BenchSource(bench)
    return TestClient(api.create_app(source)), source


def test_a_waiting_task_has_its_position_ahead_and_since_as_its_message_says(bench):
    holder = bench.submit("alice")
    waiting = [bench.submit(f"u{i}") for i in range(3)]
    bench.step(ClusterView(reservation=RES))
    assert bench.phase(holder) != str(lc.WAITING)
    c, source = _client_and_source(bench)

    r = c.get(f"/v1/tasks/{waiting[2]}")
    assert r.status_code == 200, r.text
    assert source.sent == [1], "the queue sends the asked task's entry alone, not its whole waiting list"
    body = r.json()
    t = bench.task(waiting[2])
    assert body["status"] == "Pending" and body["reason"] == "Waiting" and body["message"] == t.message
    assert body["cluster"] == "edge-a" and body["topology"] == "2x2" and body["supply_mode"] == "reservation"
    assert (body["position"], body["ahead"]) == (4, 3), body
    assert "Queue position #4, 3 task(s) ahead" in t.message  # the Message counts the same way
    # and so do the queue's snapshot (the queues CLI, the notebooks) and its one-task entry
    entries = {w["id"]: (w["position"], w["ahead"]) for w in bench.queue.snapshot()["waiting"]}
    assert entries == {w: (i + 2, i + 1) for i, w in enumerate(waiting)}, entries
    assert [(w["id"], w["position"]) for w in bench.queue.snapshot(task_id=waiting[2])["waiting"]] == [(waiting[2], 4)]
    assert bench.queue.snapshot(task_id=holder)["waiting"] == [], "the slot holder does not wait"
    assert body["eta"] is None  # no history yet: no estimate
    assert body["since"] == api.epoch(bench.store.phase_entered([t.id])[(t.id, lc.WAITING)])
    assert body["attempt"] == 0 and body["disruptions"] == []

    r = c.get(f"/v1/tasks/{holder}")
    assert r.status_code == 200 and r.json()["position"] is None and r.json()["ahead"] is None


def test_queues_pages_a_large_queue_and_says_there_is_more(bench):
    bench.submit("alice")
    waiting = [bench.submit(f"u{i}") for i in range(30)]
    bench.step(ClusterView(reservation=RES))
    c, source = _client_and_source(bench)

    r = c.get("/v1/queues", params={"limit": 10})
    assert r.status_code == 200, r.text
    assert source.sent == [10], "the queue sends the page, not its whole waiting list"
    (q,) = r.json()["queues"]
    assert (q["cluster"], q["topology"]) == ("edge-a", "2x2") and q["error"] is None
    assert q["holder"] is not None and q["holder"]["status"] == "Pending"
    assert len(q["waiting"]) == 10
    assert q["waiting_page"] == {"total": 30, "offset": 0, "limit": 10, "next_offset": 10}
    assert [w["position"] for w in q["waiting"]] == list(range(2, 12))  # the holder is ahead of all

    seen = []
    offset = 0
    while offset is not None:
        page = c.get("/v1/queues", params={"limit": 7, "offset": offset, "cluster": "edge-a", "topology": "2x2"}).json()
        (q,) = page["queues"]
        seen += [w["id"] for w in q["waiting"]]
        offset = q["waiting_page"]["next_offset"]
    assert sorted(seen) == sorted(waiting) and len(seen) == 30
    assert max(source.sent) <= 10 and source.sent[-5:] == [7, 7, 7, 7, 2]
    # a page from a source that sends every entry (an actor not asked for a page) is cut the same way
    full = dict(bench.queue.snapshot(), queue="queue/edge-a/2x2")
    assert [w.id for w in api.queue_out(full, 7, 14).waiting] == seen[14:21]

    assert c.get("/v1/queues", params={"cluster": "elsewhere"}).json() == {"queues": [], "total": 0, "truncated": False}
    assert c.get("/v1/queues", params={"limit": api.MAX_LIMIT + 1}).status_code == 422
    assert c.get("/v1/queues", params={"limit": 0}).status_code == 422
    assert c.get("/v1/queues", params={"offset": -1}).status_code == 422


def test_clusters_show_the_reservation_ledger_and_the_pools(bench):
    tid = bench.submit("alice")
    bench.step(ClusterView(reservation=RES))
    snap = {"cluster": "edge-a", "connected": True, "reservation": {"count": 4, "in_use": 1, "claimed": 2, "free": 1}}
    r = _client(bench, cluster_snap=snap).get("/v1/clusters")
    assert r.status_code == 200, r.text
    (c,) = r.json()["clusters"]
    assert (c["name"], c["status"], c["tpu_type"], c["connected"]) == ("edge-a", "active", "v6e", True)
    assert c["reservation"] == {"count": 4, "in_use": 1, "free_hosts": 1}
    assert c["pools_total"] == len(c["pools"]) >= 1
    assert any(p["task_id"] == tid and p["topology"] == "2x2" for p in c["pools"]), c["pools"]
    # the ClusterActor does not answer: the ledger as last recorded on the row (none yet here)
    r = _client(bench, cluster_snap={"actor": "cluster/edge-a", "error": "GetTimeoutError"}).get("/v1/clusters")
    assert r.json()["clusters"][0]["connected"] is None


def test_unknown_task_is_404_and_malformed_ids_422_all_json(bench):
    c = _client(bench)
    r = c.get("/v1/tasks/999999")
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    assert r.json() == {"detail": "no task 999999"}
    for bad in ("abc", "0", "-3", "1.5", str(2**63), "1%20OR%201=1"):
        r = c.get(f"/v1/tasks/{bad}")
        assert r.status_code == 422, (bad, r.status_code, r.text)
        assert r.headers["content-type"] == "application/json" and "detail" in r.json()
    r = c.get("/v1/nothing")
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}


def test_a_database_that_cannot_be_read_is_503_json(tmp_path):
    from falcon_ray.store import Store

    store = Store(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")  # cannot be opened
    try:
        r = TestClient(api.create_app(ApiSource(store, "unused"))).get("/v1/tasks/1")
    finally:
        store.dispose()
    assert r.status_code == 503 and r.headers["content-type"] == "application/json"
    assert r.json()["detail"].startswith("database: OperationalError"), r.json()
