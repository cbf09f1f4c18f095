"""The read API's contract (docs/api.md), checked with a real HTTP client against a live
server: ``falcon-ray run`` (tests/e2e/test_api.py) and ``falcon-ray demo``
(tests/e2e/test_demo_inspect.py) both pass every check here."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

TASK_FIELDS = {
    "id", "name", "actor", "status", "reason", "message", "cluster", "topology", "supply_mode",
    "position", "ahead", "eta", "since", "attempt", "disruptions",
}  # fmt: skip
QUEUE_FIELDS = {"cluster", "topology", "error", "holder", "waiting", "waiting_page", "running", "running_total", "pools", "pools_total"}
CLUSTER_FIELDS = {"name", "status", "tpu_type", "connected", "reservation", "pools", "pools_total"}


def client(base: str, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base, headers=headers, timeout=30)


def wait_until(what: str, pred: Callable[[], object], timeout: float = 90) -> object:
    deadline = time.monotonic() + timeout  # wall-clock: e2e only, a live controller
    last: object = None
    while time.monotonic() < deadline:  # wall-clock: a live server over HTTP
        try:
            last = pred()
        except httpx.HTTPError as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.5)  # wall-clock: a live server over HTTP
    raise AssertionError(f"{what}: not after {timeout}s (last: {str(last)[:2000]})")


def _json(r: httpx.Response) -> dict:
    assert r.headers["content-type"] == "application/json", (r.status_code, r.headers, r.text[:500])
    return r.json()


def check_probes_open(base: str) -> None:
    """/healthz and /readyz answer without a token (the kubelet has none)."""
    with client(base) as c:
        for path in ("/healthz", "/readyz"):
            r = c.get(path)
            assert r.status_code == 200, (path, r.status_code, r.text[:2000])
            assert "healthy" in _json(r)


def check_token(base: str, token: str) -> None:
    """/v1 refuses no token and a wrong one (401, JSON, WWW-Authenticate) and takes the right one."""
    for path in ("/v1/queues", "/v1/clusters", "/v1/tasks/1"):
        with client(base) as c:
            r = c.get(path)
        assert r.status_code == 401 and "detail" in _json(r), (path, r.status_code, r.text[:500])
        assert r.headers["www-authenticate"].startswith("Bearer"), r.headers
        with client(base, token + "-not") as c:
            r = c.get(path)
        assert r.status_code == 401 and 'error="invalid_token"' in r.headers["www-authenticate"], (path, r.text[:500])
    with client(base, token) as c:
        assert c.get("/v1/clusters").status_code == 200


def check_bad_input(base: str, token: str | None) -> None:
    """An unknown task is 404, a malformed id or query 422, each with a JSON body."""
    with client(base, token) as c:
        r = c.get("/v1/tasks/987654321")
        assert r.status_code == 404 and _json(r) == {"detail": "no task 987654321"}, r.text[:500]
        for bad in ("abc", "0", "-1", "1.5", str(2**64)):
            r = c.get(f"/v1/tasks/{bad}")
            assert r.status_code in (400, 422) and "detail" in _json(r), (bad, r.status_code, r.text[:500])
        for params in ({"limit": 100_000}, {"limit": 0}, {"offset": -1}, {"limit": "many"}):
            r = c.get("/v1/queues", params=params)
            assert r.status_code in (400, 422) and "detail" in _json(r), (params, r.status_code, r.text[:500])
        assert c.get("/v1/clusters", params={"limit": 100_000}).status_code in (400, 422)


def check_openapi(base: str) -> None:
    with client(base) as c:
        doc = _json(c.get("/openapi.json"))
    assert {"/v1/tasks/{task_id}", "/v1/queues", "/v1/clusters"} <= set(doc["paths"]), sorted(doc["paths"])
    assert TASK_FIELDS <= set(doc["components"]["schemas"]["TaskOut"]["properties"])


def task(base: str, token: str | None, task_id: int) -> dict:
    with client(base, token) as c:
        r = c.get(f"/v1/tasks/{task_id}")
    assert r.status_code == 200, (task_id, r.status_code, r.text[:1000])
    body = _json(r)
    assert set(body) == TASK_FIELDS, sorted(body)
    assert body["id"] == task_id and isinstance(body["attempt"], int) and isinstance(body["disruptions"], list)
    return body


def check_large_queue(base: str, token: str | None, at_least: int, limit: int = 5) -> dict:
    """A queue with more waiting tasks than ``limit``: the page holds ``limit`` of them and says
    where the next page starts; paging through it returns every waiting task once."""
    with client(base, token) as c:

        def big():
            body = _json(c.get("/v1/queues", params={"limit": limit}))
            return next((q for q in body["queues"] if q["waiting_page"]["total"] >= at_least), None)

        q = wait_until(f"a queue with {at_least} waiting tasks", big)
        assert isinstance(q, dict) and set(q) == QUEUE_FIELDS, q
        assert len(q["waiting"]) == limit and q["waiting_page"]["next_offset"] == limit, q["waiting_page"]
        assert len(q["running"]) <= limit and len(q["pools"]) <= limit
        seen: list[int] = []
        offset = 0
        for _ in range(1000):
            page = _json(c.get("/v1/queues", params={"limit": 50, "offset": offset, "cluster": q["cluster"], "topology": q["topology"]}))
            (one,) = page["queues"]
            assert len(one["waiting"]) <= 50
            seen += [w["id"] for w in one["waiting"]]
            offset = one["waiting_page"]["next_offset"]
            if offset is None:
                break
        assert len(seen) == len(set(seen)) >= at_least, seen  # the queue holds still: its head runs for long
        return q


def check_clusters(base: str, token: str | None, names: set[str]) -> dict[str, dict]:
    with client(base, token) as c:
        body = _json(c.get("/v1/clusters", params={"limit": 3}))
    found = {x["name"]: x for x in body["clusters"]}
    assert names <= set(found), sorted(found)
    for x in found.values():
        assert set(x) == CLUSTER_FIELDS and len(x["pools"]) <= 3, x
        if x["reservation"] is not None:
            assert set(x["reservation"]) == {"count", "in_use", "free_hosts"}, x
    return found
