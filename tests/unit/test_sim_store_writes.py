"""The store's writes without a working copy's full compare (``mutate``'s spec compared once,
``replace`` of one top-level field) store, skip and stamp exactly as the plain ``mutate`` did:
a copy, the change, ``==`` against the stored object, and ``update`` comparing the specs again."""

from __future__ import annotations

import random
from typing import Any

from falcon_ray.sim.kube_store import ObjectStore, WatchEvent, copy_out

NS = "falcon"


class _PlainStore(ObjectStore):
    """The store as it was: mutate's copy compared whole, update's spec compared again."""

    def mutate(self, plural, namespace, name, change):  # type: ignore[override]
        current = self.get(plural, namespace, name)
        if current is None:
            return False
        new = copy_out(current)
        change(new)
        if new == current:
            return False
        self.update(plural, new, current)
        return True

    def update(self, plural, obj, prev, *, same_spec=False):  # type: ignore[override]
        return super().update(plural, obj, prev)

    def replace(self, plural, namespace, name, key, value):  # type: ignore[override]
        def change(obj: dict[str, Any]) -> None:
            obj[key] = value

        return self.mutate(plural, namespace, name, change)


def _stores() -> list[tuple[ObjectStore, list[WatchEvent]]]:
    out = []
    for cls in (ObjectStore, _PlainStore):
        store = cls(
            history_limit=1000, stamp=lambda: "2026-01-05T00:00:00Z", new_uid=iter(range(10**6)).__next__
        )
        events: list[WatchEvent] = []
        store.add_listener(events.append)
        out.append((store, events))
    return out


def _pod(name: str) -> dict:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "i"}], "nodeName": None},
        "status": {"phase": "Pending"},
    }


def _field(obj: dict, key: str) -> dict:
    """``obj[key]``, made a dict when ``replace`` left something else there."""
    if not isinstance(obj.get(key), dict):
        obj[key] = {}
    return obj[key]


def _changes(rng: random.Random):
    """Changes of every kind: none, the same value again, status, labels, spec, a field added,
    one removed, a key moved to the end with its value (equal, in another order)."""
    value = rng.choice(["Pending", "Running", 1, 1.0, True, None, {"a": [1, 2]}])
    kind = rng.randrange(9)
    if kind == 0:
        return lambda o: None
    if kind == 1:
        return lambda o: _field(o, "status").update(phase=value)
    if kind == 2:
        return lambda o: o["metadata"]["labels"].update(app=rng.choice(["x", "y"]))
    if kind == 3:
        return lambda o: _field(o, "spec").update(nodeName=value)
    if kind == 4:
        return lambda o: o.update(extra=value)
    if kind == 5:
        return lambda o: o.pop("extra", None)
    if kind == 6:
        return lambda o: o.update(status=o.pop("status", None))
    if kind == 7:
        return lambda o: o.pop("spec", None)
    return lambda o: o.update(spec={"containers": [{"name": "c", "image": "i"}], "nodeName": value})


def test_mutate_and_replace_store_and_skip_as_the_plain_mutate_did():
    rng = random.Random(7)
    (fast, fast_events), (plain, plain_events) = _stores()
    for store in (fast, plain):
        for name in ("a", "b"):
            store.create("pods", _pod(name))
    for step in range(600):
        name = rng.choice(["a", "b", "missing"])
        if rng.random() < 0.5:
            seed = rng.random()
            results = [s.mutate("pods", NS, name, _changes(random.Random(seed))) for s in (fast, plain)]
        else:
            key = rng.choice(["status", "spec", "extra", "metadata"])
            value = rng.choice([{"phase": "Pending"}, {"phase": "Running"}, {"containers": []}, None, 1, 1.0])
            if key == "metadata" and name != "missing":
                value = copy_out(fast.get("pods", NS, name)["metadata"])
                value["labels"] = {"app": rng.choice(["x", "y"])}
            results = [s.replace("pods", NS, name, key, copy_out(value)) for s in (fast, plain)]
        assert results[0] == results[1], step
        assert fast.list("pods") == plain.list("pods"), step
        assert [list(o) for o in fast.list("pods")] == [list(o) for o in plain.list("pods")], (
            step
        )  # key order
        assert fast.rv == plain.rv
    assert [(e.rv, e.type, e.obj) for e in fast_events] == [(e.rv, e.type, e.obj) for e in plain_events]
    generations = {o["metadata"]["generation"] for o in fast.list("pods")}
    assert 150 < len(fast_events) < 600 and max(generations) > 1  # some writes stored, some skipped


def test_replace_stores_the_value_given_and_leaves_the_replaced_object_as_it_was():
    (store, events), _ = _stores()
    store.create(
        "jobs", {"metadata": {"name": "j", "namespace": NS}, "spec": {"parallelism": 1}, "status": {}}
    )
    before = store.get("jobs", NS, "j")
    status = {"active": 1}
    assert store.replace("jobs", NS, "j", "status", status)
    after = store.get("jobs", NS, "j")
    assert after["status"] is status and before["status"] == {} and events[-1].prev is before
    assert after["metadata"]["generation"] == 1 and after["metadata"]["resourceVersion"] == "2"
    assert not store.replace("jobs", NS, "j", "status", {"active": 1})
    assert store.replace("jobs", NS, "j", "spec", {"parallelism": 2})
    assert store.get("jobs", NS, "j")["metadata"]["generation"] == 2
    assert not store.replace("jobs", NS, "gone", "status", {})
