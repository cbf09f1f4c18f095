"""The fleet model's copies and the caches behind the controller's views: what comes out of
the model (an event's snapshot, a listed object, a pool's JSON, a Job's record) shares no
state with what the model keeps, and a cached view is made again when what it shows changes."""

from __future__ import annotations

import datetime as dt

import pytest

from actors.cluster import PoolOp
from falcon_ray.devtools.simulate.fleet import VirtualFleet
from falcon_ray.devtools.simulate.schedule import Scheduler, VirtualClock
from falcon_ray.errors import CloudError
from falcon_ray.kube import _created
from falcon_ray.model import ErrorKind, OpKind, OpState, OpView
from falcon_ray.sim.fleet import parse_fleet
from falcon_ray.sim.kube_store import ObjectStore, WatchEvent
from falcon_ray.sim.node_pools import google_time
from falcon_ray.sim.selectors import parse_label_selector

START = dt.datetime(2026, 1, 5)
NS = "falcon"
FLEET = {"clusters": [{"name": "c1", "project": "p-c1", "location": "us-east5-b", "tpu_type": "v6e", "chips": 64}]}


def _store() -> tuple[ObjectStore, list[WatchEvent]]:
    store = ObjectStore(history_limit=100)
    events: list[WatchEvent] = []
    store.add_listener(events.append)
    return store, events


def _pod(name: str) -> dict:
    return {"metadata": {"name": name, "namespace": NS, "labels": {"app": "x"}}, "spec": {"containers": [{"name": "c"}]}}


def test_an_events_snapshot_shares_nothing_with_the_stored_object():
    store, events = _store()
    store.create("pods", _pod("a"))
    store.mutate("pods", NS, "a", lambda p: p["metadata"]["labels"].update(app="y"))
    gone = store.delete("pods", NS, "a")
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    for ev in events:
        ev.obj["metadata"]["labels"]["app"] = "changed by a listener"
        ev.obj["spec"]["containers"].append({"name": "more"})
    assert gone is not None and gone["metadata"]["labels"] == {"app": "y"}
    assert gone["spec"]["containers"] == [{"name": "c"}]


def test_a_created_object_keeps_its_state_when_the_added_events_snapshot_changes():
    store, events = _store()
    store.create("pods", _pod("a"))
    events[0].obj["metadata"]["labels"]["app"] = "changed"
    assert store.get("pods", NS, "a")["metadata"]["labels"] == {"app": "x"}


def test_mutate_changes_a_copy_stores_it_and_leaves_the_object_it_replaced_as_it_was():
    store, events = _store()
    store.create("pods", _pod("a"))
    before = store.get("pods", NS, "a")
    assert store.mutate("pods", NS, "a", lambda p: p["metadata"]["labels"].update(app="y"))
    assert before["metadata"]["labels"] == {"app": "x"}  # the replaced object: not changed in place
    assert events[-1].prev is before
    assert store.get("pods", NS, "a")["metadata"]["labels"] == {"app": "y"}
    assert store.get("pods", NS, "a")["metadata"]["resourceVersion"] == "2"
    # a change that changes nothing stores nothing
    assert not store.mutate("pods", NS, "a", lambda p: p["metadata"]["labels"].update(app="y"))
    assert len(events) == 2


def _fleet() -> tuple[VirtualFleet, Scheduler]:
    clock = VirtualClock(START)
    scheduler = Scheduler(clock)
    return VirtualFleet(parse_fleet(FLEET), scheduler), scheduler


def _kube(fleet: VirtualFleet):
    from falcon_ray.devtools.simulate.fleet import SimKube

    return SimKube(fleet, fleet.clusters["c1"])


def _run(scheduler: Scheduler, seconds: float) -> None:
    end = scheduler.clock.monotonic() + seconds
    while scheduler.next_at() is not None and scheduler.next_at() <= end:
        scheduler.run_next()


POOL = {
    "name": "pool-a",
    "initialNodeCount": 1,
    "config": {"machineType": "ct6e-standard-4t", "labels": {"team": "a"}, "resourceLabels": {"falcon": "yes"}},
    "placementPolicy": {"tpuTopology": "2x2"},
}


def _pool(fleet: VirtualFleet):
    from falcon_ray.devtools.simulate.fleet import SimGke

    gke = SimGke(fleet)
    gke.create_node_pool("p-c1", "us-east5-b", "c1", POOL)
    return gke, fleet.clusters["c1"].pools.pools["pool-a"]


def test_a_pools_json_shares_nothing_with_the_pool_or_with_the_next_answer():
    fleet, _ = _fleet()
    _, pool = _pool(fleet)
    c = fleet.clusters["c1"]
    body = pool.to_json(c, False)
    body["config"]["labels"]["team"] = "changed"
    body["placementPolicy"]["tpuTopology"] = "8x8"
    assert pool.request["config"]["labels"] == {"team": "a"}
    again = pool.to_json(c, False)
    assert again["config"]["labels"] == {"team": "a"} and again["placementPolicy"]["tpuTopology"] == "2x2"
    pool.stats(0.0)["request"]["config"]["labels"]["team"] = "changed"
    assert pool.request["config"]["labels"] == {"team": "a"}


def test_a_listed_pools_raw_json_cannot_change_the_pool():
    fleet, scheduler = _fleet()
    gke, pool = _pool(fleet)
    _run(scheduler, 3600)
    (info,) = gke.list_node_pools("p-c1", "us-east5-b", "c1")
    info.raw["config"]["resourceLabels"]["falcon"] = "changed"
    assert pool.request["config"]["resourceLabels"] == {"falcon": "yes"}
    assert gke.list_node_pools("p-c1", "us-east5-b", "c1")[0].resource_labels == {"falcon": "yes"}


def test_a_pools_view_is_its_json_uncopied_and_a_listed_pool_copies_it_when_raw_is_read():
    fleet, scheduler = _fleet()
    gke, pool = _pool(fleet)
    _run(scheduler, 3600)
    c = fleet.clusters["c1"]
    view = pool.json_view(c, False)
    assert view == pool.to_json(c, False) and list(view) == list(pool.to_json(c, False))
    assert view["placementPolicy"] is pool.request["placementPolicy"]
    assert view["config"] is not pool.request["config"] and "machineType" in view["config"]
    (info,) = gke.list_node_pools("p-c1", "us-east5-b", "c1")
    assert info.labels == {"team": "a"} and info.labels is not pool.request["config"]["labels"]
    assert info.resource_labels == {"falcon": "yes"} and info.status == "RUNNING"
    assert dict(info.raw) == pool.to_json(c, False) and len(info.raw) == len(view)
    assert info.raw["placementPolicy"] is not pool.request["placementPolicy"]
    assert gke.get_node_pool("p-c1", "us-east5-b", "c1", "pool-a").raw["config"] == pool.to_json(c, False)["config"]


def test_listed_objects_share_nothing_with_the_store_nor_with_each_other():
    fleet, scheduler = _fleet()
    _pool(fleet)
    _run(scheduler, 3600)
    kube = _kube(fleet)
    store = fleet.clusters["c1"].store
    body = kube._json(kube.core.list_node, label_selector="cloud.google.com/gke-nodepool")
    assert len(body["items"]) == 1
    (node,) = body["items"]
    stored = store.list("nodes")[0]
    assert node == stored and node is not stored
    node["metadata"]["labels"]["x"] = "y"
    node["status"]["conditions"].clear()
    assert "x" not in stored["metadata"]["labels"] and stored["status"]["conditions"]
    again = kube._json(kube.core.list_node, label_selector="cloud.google.com/gke-nodepool")["items"][0]
    assert again == stored
    # two lists in one answer are two objects (the copy shares nothing between its places)
    store.create("pods", _pod("a"))
    store.create("pods", _pod("b"))
    a, b = kube._json(kube.core.list_namespaced_pod, NS, label_selector="app=x")["items"]
    a["metadata"]["labels"]["app"] = "changed"
    assert b["metadata"]["labels"] == {"app": "x"}


def test_a_borrowed_body_holds_the_stored_objects_and_reads_as_a_copy_would():
    fleet, scheduler = _fleet()
    _pool(fleet)
    _run(scheduler, 3600)
    kube = _kube(fleet)
    store = fleet.clusters["c1"].store
    store.create("pods", _pod("a"))
    selector = "cloud.google.com/gke-nodepool"
    borrowed = kube._borrowed_json(kube.core.list_node, label_selector=selector)
    (node,) = borrowed["items"]
    assert node is store.list("nodes")[0]
    assert borrowed == kube._json(kube.core.list_node, label_selector=selector)
    calls = dict(fleet.calls)
    nodes = kube.list_nodes(selector)
    assert fleet.calls["kubernetes"] == calls["kubernetes"] + 1  # counted as one call, as before
    assert [(n.name, n.pool, n.ready) for n in nodes] == [(node["metadata"]["name"], "pool-a", True)]
    assert kube.list_pods(NS, "app=x")[0].name == "a"
    assert kube._borrowed_json(kube.core.list_namespaced_pod, NS, label_selector="app=x")["items"][0] is store.get("pods", NS, "a")
    ref = kube.create_job({**JOB, "metadata": {**JOB["metadata"], "namespace": NS}})
    assert ref.created and ref.uid == store.get("jobs", NS, "j1")["metadata"]["uid"]
    (job,) = kube.list_jobs(NS, "falcon.dev/task-id")[0]
    assert (job.name, job.uid, job.task_id) == ("j1", ref.uid, 1)


def test_a_label_selector_is_applied_as_parsed_and_a_bad_one_is_refused_every_time():
    fleet, _ = _fleet()
    kube = _kube(fleet)
    store = fleet.clusters["c1"].store
    store.create("pods", _pod("a"))
    other = _pod("b")
    other["metadata"]["labels"] = {"app": "z"}
    store.create("pods", other)
    assert [p["metadata"]["name"] for p in kube._list("pods", NS, "app=x")["items"]] == ["a"]
    assert [p["metadata"]["name"] for p in kube._list("pods", NS, "app=z")["items"]] == ["b"]
    assert [p["metadata"]["name"] for p in kube._list("pods", NS, "app=x")["items"]] == ["a"]
    assert [p["metadata"]["name"] for p in kube._list("pods", NS, None)["items"]] == ["a", "b"]
    for _ in range(2):
        with pytest.raises(ValueError):
            kube._list("pods", NS, "app in ()")
    with pytest.raises(ValueError):
        parse_label_selector("app in ()")


JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "j1", "labels": {"falcon.dev/task-id": "1"}},
    "spec": {"template": {"spec": {"containers": [{"name": "main", "image": "img:1"}], "restartPolicy": "Never"}}},
}


def test_a_jobs_record_keeps_the_manifest_as_received_apart_from_the_stored_job():
    fleet, _ = _fleet()
    kube = _kube(fleet)
    c = fleet.clusters["c1"]
    created = kube._json(kube.batch.create_namespaced_job, NS, JOB)
    rec = c.job_records[(NS, "j1")]
    assert rec["manifest"] == JOB  # as received: no namespace, no defaults, no server metadata
    stored = c.store.get("jobs", NS, "j1")
    assert stored["metadata"]["namespace"] == NS and "uid" in stored["metadata"]
    stored_spec = stored["spec"]["template"]["spec"]
    assert stored_spec is not rec["manifest"]["spec"]["template"]["spec"]
    created["spec"]["template"]["spec"]["containers"][0]["image"] = "changed"
    rec["manifest"]["spec"]["template"]["spec"]["containers"][0]["image"] = "changed too"
    assert stored_spec["containers"][0]["image"] == "img:1"
    assert JOB["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"
    (report,) = c.stats()["jobs"]
    report["manifest"]["metadata"]["name"] = "changed"
    assert rec["manifest"]["metadata"]["name"] == "j1"
    kube._create("services", NS, {"metadata": {"name": "s1"}, "spec": {"ports": [{"port": 80}]}})
    assert list(c.job_records) == [(NS, "j1")]  # a Service makes no record


def test_a_pods_template_and_a_jobs_status_are_the_jobs_own_copies():
    fleet, scheduler = _fleet()
    _pool(fleet)
    kube = _kube(fleet)
    kube._create("jobs", NS, JOB)
    c = fleet.clusters["c1"]
    job_before = c.store.get("jobs", NS, "j1")
    snapshot = (repr(job_before["spec"]), repr(job_before.get("status")))
    _run(scheduler, 3600)
    pods = c.store.list("pods", NS)
    assert pods
    pods[0]["spec"]["containers"][0]["image"] = "changed in the pod"
    job = c.store.get("jobs", NS, "j1")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"
    assert (repr(job_before["spec"]), repr(job_before.get("status"))) == snapshot  # replaced, never changed in place
    assert job.get("status", {}).get("startTime")


def test_an_operations_view_is_made_again_when_a_field_it_shows_changes():
    op = PoolOp("pool-a", OpKind.CREATE, {"name": "pool-a"})
    first = op.view()
    assert first == OpView(OpKind.CREATE, OpState.QUEUED) and op.view() is first
    op.queued_at = 5.0  # not shown
    op.next_at = 9.0
    assert op.view() is first
    for change, shown in (
        (lambda: setattr(op, "state", OpState.RUNNING), {"state": OpState.RUNNING}),
        (lambda: setattr(op, "operation", "operation-1"), {"operation": "operation-1"}),
        (lambda: setattr(op, "attempts", 1), {"attempts": 1}),
        (lambda: setattr(op, "error_kind", ErrorKind.TRANSIENT), {"error_kind": ErrorKind.TRANSIENT}),
        (lambda: setattr(op, "error", "try again"), {"error": "try again"}),
        (lambda: setattr(op, "state", OpState.DONE), {"state": OpState.DONE}),
    ):
        before = op.view()
        change()
        after = op.view()
        assert after != before
        for name, value in shown.items():
            assert getattr(after, name) == value
    assert op.view() == OpView(op.kind, op.state, op.attempts, op.error_kind, op.error, op.operation)
    assert "_view" not in repr(op)
    assert op == PoolOp("pool-a", OpKind.CREATE, {"name": "pool-a"}, OpState.DONE, 1, ErrorKind.TRANSIENT, "try again", 9.0, "operation-1", 5.0)


def test_cached_time_texts_are_those_of_the_computation():
    for ts in (0.0, 1767571200.0, 1767571200.123456, 1767571201.5):
        assert google_time(ts) == dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert google_time(ts) == google_time(ts)
    node = {"metadata": {"creationTimestamp": "2026-01-05T10:00:00Z"}}
    assert _created(node) == dt.datetime(2026, 1, 5, 10) == _created(node)
    assert _created({"metadata": {"creationTimestamp": "2026-01-05T12:00:00+02:00"}}) == dt.datetime(2026, 1, 5, 10)
    assert _created({"metadata": {"creationTimestamp": "not a time"}}) is None
    assert _created({"metadata": {"creationTimestamp": "not a time"}}) is None
    assert _created({"metadata": {}}) is None


def test_a_not_found_pool_is_still_none_and_a_bad_cluster_still_raises():
    fleet, _ = _fleet()
    from falcon_ray.devtools.simulate.fleet import SimGke

    gke = SimGke(fleet)
    assert gke.get_node_pool("p-c1", "us-east5-b", "c1", "absent") is None
    with pytest.raises(CloudError):
        gke.list_node_pools("p-c1", "us-east5-b", "nope")


def test_a_jobs_record_keeps_its_own_copy_of_the_manifest_it_is_given():
    fleet, _ = _fleet()
    c = fleet.clusters["c1"]
    manifest = {"metadata": {"name": "j2", "labels": {"a": "b"}}, "spec": {"parallelism": 1}}
    c.record_job_create({"metadata": {"name": "j2", "namespace": NS, "uid": "u-2"}}, manifest)
    manifest["metadata"]["labels"]["a"] = "changed"
    assert c.job_records[(NS, "j2")]["manifest"] == {"metadata": {"name": "j2", "labels": {"a": "b"}}, "spec": {"parallelism": 1}}
