"""The fleet model's indexes and per-object caches answer what a scan of the store would: the
store's sorted keys, the pods of a Job, the nodes of Running pods, a pod's TPU request, the
operations GKE reports and the pools whose idle time is still counted."""

from __future__ import annotations

import datetime as dt
import random

from falcon_ray.devtools.simulate.fleet import SimGke, VirtualFleet
from falcon_ray.devtools.simulate.schedule import Scheduler, VirtualClock
from falcon_ray.sim.fleet import parse_fleet
from falcon_ray.sim.kube_store import ObjectStore
from falcon_ray.sim.workloads import owner_job, tpu_request

START = dt.datetime(2026, 1, 5)
FLEET = {
    "clusters": [{"name": "c1", "project": "p-c1", "location": "us-east5-b", "tpu_type": "v6e", "chips": 64}]
}
POOL = {
    "name": "pool-a",
    "initialNodeCount": 1,
    "config": {"machineType": "ct6e-standard-4t"},
    "placementPolicy": {"tpuTopology": "2x2"},
}


def _fleet() -> tuple[VirtualFleet, Scheduler]:
    scheduler = Scheduler(VirtualClock(START))
    return VirtualFleet(parse_fleet(FLEET), scheduler), scheduler


def _run(scheduler: Scheduler, seconds: float) -> None:
    end = scheduler.clock.monotonic() + seconds
    while scheduler.next_at() is not None and scheduler.next_at() <= end:
        scheduler.run_next()


def _pod(name: str, ns: str, owner: str | None, tpu: str = "4") -> dict:
    md: dict = {"name": name, "namespace": ns}
    if owner is not None:
        md["ownerReferences"] = [{"kind": "Job", "name": "j-" + owner, "uid": owner, "controller": True}]
    return {
        "metadata": md,
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"google.com/tpu": tpu}}}]},
        "status": {"phase": "Pending"},
    }


def test_a_listing_is_in_key_order_after_any_creates_updates_and_deletes():
    store = ObjectStore(history_limit=10)
    rng = random.Random(3)
    names = [(rng.choice(["a", "b", "c"]), f"p{i}") for i in range(60)]
    for ns, name in names:
        store.create("pods", _pod(name, ns, None))
        if rng.random() < 0.3:
            victim = rng.choice(names)
            store.delete("pods", *victim)
        if rng.random() < 0.3:
            store.mutate("pods", ns, name, lambda p: p["status"].update(phase="Running"))
        keys = sorted(store._objects["pods"])
        assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in store.list("pods")] == keys
        for space in ("a", "b", "z"):
            assert [o["metadata"]["name"] for o in store.list("pods", space)] == [
                n for s, n in keys if s == space
            ]


def test_a_jobs_pods_and_the_running_nodes_follow_every_write():
    fleet, _ = _fleet()
    c = fleet.clusters["c1"]
    store, rng = c.store, random.Random(5)
    live: list[tuple[str, str]] = []
    for i in range(80):
        step = rng.random()
        if step < 0.45 or not live:
            ns = rng.choice(["x", "y"])
            store.create("pods", _pod(f"p{i}", ns, rng.choice(["u1", "u2", None])))
            live.append((ns, f"p{i}"))
        elif step < 0.6:
            ns, name = live.pop(rng.randrange(len(live)))
            store.delete("pods", ns, name)
        elif step < 0.8:
            node = rng.choice(["n1", "n2", None])

            def run(p, node=node):
                p["spec"]["nodeName"] = node
                p["status"]["phase"] = rng.choice(["Running", "Succeeded", "Pending"])

            store.mutate("pods", *rng.choice(live), run)
        else:
            store.mutate("pods", *rng.choice(live), lambda p: p["metadata"].pop("ownerReferences", None))
        pods = store.list("pods")
        for ns in ("x", "y"):
            for uid in ("u1", "u2"):
                expected = [p for p in store.list("pods", ns) if (owner_job(p) or ("", ""))[1] == uid]
                assert c.workloads._job_pods(ns, uid) == expected
        running = {
            (p["metadata"]["namespace"], p["metadata"]["name"]): (p.get("spec") or {}).get("nodeName")
            for p in pods
            if p["status"].get("phase") == "Running"
        }
        assert c._running_pods == running and c.running_nodes() == set(running.values())


def test_a_deleted_or_ended_pod_no_longer_holds_its_node_running():
    fleet, _ = _fleet()
    c = fleet.clusters["c1"]
    for name in ("a", "b"):
        c.store.create("pods", _pod(name, "x", "u1"))

        def run(p):
            p["spec"]["nodeName"] = "n1"
            p["status"]["phase"] = "Running"

        c.store.mutate("pods", "x", name, run)
    assert c.running_nodes() == {"n1"}
    c.store.delete("pods", "x", "a")
    assert c.running_nodes() == {"n1"}
    c.store.mutate("pods", "x", "b", lambda p: p["status"].update(phase="Succeeded"))
    assert c.running_nodes() == set() and c._running_pods == {}


def test_a_pods_tpu_request_is_worked_out_again_after_a_write():
    fleet, _ = _fleet()
    c = fleet.clusters["c1"]
    pod = c.store.create("pods", _pod("p", "x", "u1", tpu="4"))
    assert c.workloads.pod_tpu(pod) == 4

    def more(p):
        p["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] = "8"

    c.store.mutate("pods", "x", "p", more)
    again = c.store.get("pods", "x", "p")
    assert c.workloads.pod_tpu(again) == tpu_request(again) == 8
    c.store.delete("pods", "x", "p")
    assert "p" not in c.workloads._tpu


def test_get_operation_answers_what_the_operations_json_says():
    fleet, scheduler = _fleet()
    gke = SimGke(fleet)
    name = gke.create_node_pool("p-c1", "us-east5-b", "c1", POOL)
    c = fleet.clusters["c1"]
    for when in (0, 3600):
        _run(scheduler, when)
        op = c.pools.operations[name]
        body = op.to_json(False)
        info = gke.get_operation("p-c1", "us-east5-b", name)
        assert (info.name, info.status, info.target, info.operation_type, info.detail) == (
            body["name"],
            body["status"],
            body["targetLink"],
            body["operationType"],
            "",
        )
        assert info.done == (body["status"] == "DONE") and info.error is None


def test_idle_accounting_still_counts_every_pool_that_can_change():
    fleet, scheduler = _fleet()
    gke = SimGke(fleet)
    gke.create_node_pool("p-c1", "us-east5-b", "c1", POOL)
    c = fleet.clusters["c1"]
    _run(scheduler, 3600)
    c.refresh_idle()
    assert [p.name for p in c._idle_open] == ["pool-a"]
    gke.delete_node_pool("p-c1", "us-east5-b", "c1", "pool-a")
    _run(scheduler, 3600)
    c.refresh_idle()
    pool = c.pools.history[0]
    assert pool.deleted_at is not None and pool.idle_mark is None and c._idle_open == []
    settled = pool.idle_chip_seconds
    _run(scheduler, 600)
    c.refresh_idle()
    assert pool.idle_chip_seconds == settled and c.idle_chip_seconds() == round(settled, 3)


def test_a_listed_pool_shows_each_status_it_goes_through():
    fleet, scheduler = _fleet()
    gke = SimGke(fleet)
    gke.create_node_pool("p-c1", "us-east5-b", "c1", POOL)
    c = fleet.clusters["c1"]
    seen = []
    for step in range(3):
        if step == 2:
            gke.delete_node_pool("p-c1", "us-east5-b", "c1", "pool-a")
        for info in gke.list_node_pools("p-c1", "us-east5-b", "c1"):
            pool = c.pools.pools[info.name]
            assert info.status == pool.status and dict(info.raw) == pool.to_json(c, False)
            assert gke.get_node_pool("p-c1", "us-east5-b", "c1", "pool-a").status == pool.status
            seen.append(info.status)
        _run(scheduler, 3600)
    assert seen[1:] == ["RUNNING", "STOPPING"]
