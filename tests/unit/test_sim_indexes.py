"""The fleet model's indexes and per-object caches answer what a scan of the store would: the
store's sorted keys, the pods of a Job, the nodes of Running pods, a pod's TPU request, the
operations GKE reports, the pools whose idle time is still counted and the scheduler's pending
pods and TPU in use per node."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from falcon_ray.devtools.simulate.fleet import SimGke, VirtualFleet
from falcon_ray.devtools.simulate.schedule import Scheduler
from falcon_ray.sim.autoscaler import unschedulable
from falcon_ray.sim.kube_store import ObjectStore
from falcon_ray.sim.workloads import owner_job, tpu_request
from tests.harness.simulate import POOL_2X2, run_for, virtual_fleet

FLEET = {
    "clusters": [{"name": "c1", "project": "p-c1", "location": "us-east5-b", "tpu_type": "v6e", "chips": 64}]
}
POOL = POOL_2X2


def _fleet() -> tuple[VirtualFleet, Scheduler]:
    return virtual_fleet(FLEET)


_run = run_for


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


def test_the_schedulers_pending_pods_and_tpu_in_use_follow_every_write():
    fleet, _ = _fleet()
    c = fleet.clusters["c1"]
    w = c.workloads
    store, rng = c.store, random.Random(11)
    live: list[tuple[str, str]] = []
    stamps = ["2026-01-05T00:00:00Z", "2026-01-05T00:00:01Z"]
    saw_unschedulable = False
    c.stamp = lambda: rng.choice(stamps)  # type: ignore[method-assign]  # ties in creation time, sorted by name
    for i in range(300):
        step = rng.random()
        if step < 0.35 or not live:
            ns = rng.choice(["x", "y"])
            pod = _pod(f"p{i % 40}", ns, rng.choice(["u1", None]), tpu=rng.choice(["0", "4", "8"]))
            if rng.random() < 0.3:
                pod["spec"]["nodeName"] = rng.choice(["n1", "n2"])
            if (ns, pod["metadata"]["name"]) not in live:
                store.create("pods", pod)
                live.append((ns, pod["metadata"]["name"]))
        elif step < 0.45:
            ns, name = live.pop(rng.randrange(len(live)))
            store.delete("pods", ns, name)
        elif step < 0.75:
            node = rng.choice(["n1", "n2", None, ""])
            phase = rng.choice(["Running", "Succeeded", "Failed", "Pending", None])

            def move(p, node=node, phase=phase):
                p["spec"]["nodeName"] = node
                if phase is None:
                    p["status"].pop("phase", None)
                else:
                    p["status"]["phase"] = phase

            store.mutate("pods", *rng.choice(live), move)
        elif step < 0.85:
            store.mutate("pods", *rng.choice(live), lambda p: p["metadata"].update(deletionTimestamp="t"))
        elif step < 0.95:
            tpu = rng.choice(["4", "16"])

            def more(p, tpu=tpu):
                p["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] = tpu

            store.mutate("pods", *rng.choice(live), more)
        elif step < 0.97:
            pod = store.get("pods", *rng.choice(live))
            w._bound.symmetric_difference_update({pod["metadata"]["uid"]})
        else:
            reason = rng.choice(["Unschedulable", "Other"])

            def mark(p, reason=reason):
                p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": reason}]

            store.mutate("pods", *rng.choice(live), mark)
        used, pending = w._scan_for_schedule()
        assert not w._unreadable
        indexed_used, indexed_pending = w._schedule_inputs()
        assert +indexed_used == +used and all(indexed_used[n] == used[n] for n in ("n1", "n2", "n3"))
        assert indexed_pending == pending
        # the autoscaler's reading of the same index: its unschedulable pods and the busy nodes
        a = c.autoscaler
        assert list(filter(unschedulable, a._pods()[0])) == list(filter(unschedulable, store.list("pods")))
        assert a._pods()[1] is False
        busy = {
            (p.get("spec") or {}).get("nodeName")
            for p in store.list("pods")
            if (p.get("status") or {}).get("phase", "Pending") not in ("Succeeded", "Failed")
        }
        assert a._busy(None) == {n for n in busy if n} == {n for n in a._busy(store.list("pods")) if n}
        saw_unschedulable = saw_unschedulable or any(unschedulable(p) for p in a._pods()[0])
        assert [p["metadata"]["name"] for p in indexed_pending] == [p["metadata"]["name"] for p in pending]
    assert set(w._held) <= {"n1", "n2"}  # a node no pod holds any more is dropped
    assert saw_unschedulable


def test_a_pod_the_index_cannot_read_sends_the_scheduler_back_to_the_scan():
    fleet, _ = _fleet()
    c = fleet.clusters["c1"]
    w = c.workloads
    c.store.create("pods", _pod("a", "x", None))
    c.store.create("pods", _pod("b", "x", None))
    c.store.mutate("pods", "x", "b", lambda p: p.update(spec=["not", "an", "object"]))
    assert w._unreadable == {("x", "b")}
    with pytest.raises(AttributeError):
        w._scan_for_schedule()
    with pytest.raises(AttributeError):
        w._schedule_inputs()  # raised where the scan raises
    c.store.delete("pods", "x", "b")
    assert not w._unreadable
    assert w._schedule_inputs() == w._scan_for_schedule() == (Counter(), [c.store.get("pods", "x", "a")])
    c.store.create("pods", _pod("b", "x", None))
    c.store.mutate("pods", "x", "b", lambda p: p.update(spec=["not", "an", "object"]))
    assert c.autoscaler._pods() == (c.store.list("pods"), True)  # the autoscaler scans them all too
    with pytest.raises(AttributeError):
        c.autoscaler._run_pass()


def test_a_selected_listing_is_the_scans_after_any_label_writes():
    from falcon_ray.devtools.simulate.fleet import SimKube
    from falcon_ray.sim.selectors import parse_label_selector

    fleet, _ = _fleet()
    c = fleet.clusters["c1"]
    store, rng = c.store, random.Random(3)
    kube = SimKube(fleet, c)
    selectors = [
        None,
        "job-name=a",
        "job-name=b",
        "job-name in (a,b)",
        "job-name",
        "!job-name",
        "job-name!=a",
        "job-name=a,app=x",
        "app,job-name notin (a)",
        "app=x,job-name",
    ]
    live: list[tuple[str, str]] = []
    saw_odd = False
    for i in range(250):
        step = rng.random()
        if step < 0.35 or not live:
            ns = rng.choice(["x", "y"])
            pod = _pod(f"p{i % 30}", ns, None)
            labels = {
                k: v
                for k, v in (("job-name", rng.choice("ab")), ("app", rng.choice("xy")))
                if rng.random() < 0.7
            }
            if labels:
                pod["metadata"]["labels"] = labels
            if (ns, pod["metadata"]["name"]) not in live:
                store.create("pods", pod)
                live.append((ns, pod["metadata"]["name"]))
        elif step < 0.5:
            ns, name = live.pop(rng.randrange(len(live)))
            store.delete("pods", ns, name)
        elif step < 0.8:
            new = rng.choice(
                [{}, {"job-name": "a"}, {"job-name": "b", "app": "x"}, {"app": "y"}, {"job-name": ["a"]}]
            )

            def relabel(p, new=new):
                if new:
                    p["metadata"]["labels"] = dict(new)
                else:
                    p["metadata"].pop("labels", None)

            store.mutate("pods", *rng.choice(live), relabel)
        else:
            store.mutate("pods", *rng.choice(live), lambda p: p["status"].update(phase="Running"))
        for text in selectors:
            selector = parse_label_selector(text)
            for ns in ("x", "y", None):
                expected = [
                    o for o in store.list("pods", ns) if selector.matches(o["metadata"].get("labels"))
                ]
                if ns is None:
                    assert kube._list("pods", None, text)["items"] == expected
                    continue
                got = kube._list_namespaced_pod(ns, label_selector=text)["items"]
                assert got == expected and [o is e for o, e in zip(got, expected, strict=True)] == [
                    True
                ] * len(got)
        saw_odd = saw_odd or bool(store._odd_labels["pods"])
        # the index holds exactly the labelled pods, by label and value
        for key in ("job-name", "app"):
            for value in ("a", "b", "x", "y"):
                want = {
                    (o["metadata"]["namespace"], o["metadata"]["name"])
                    for o in store.list("pods")
                    if (o["metadata"].get("labels") or {}).get(key) == value
                }
                odd = store._odd_labels["pods"]
                assert store.labelled("pods", key, (value,)) - odd == want - odd
    assert saw_odd  # a pod whose labels cannot be indexed was listed too
