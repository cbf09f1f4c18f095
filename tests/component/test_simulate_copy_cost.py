"""The fleet model under the real controller keeps its store's contract, on which its cheap
copies rest: every object it stores is JSON-shaped (as ``kube_store.clone`` makes it: a copy
by ``copy_out`` is then equal to one by ``clone``, types and all), and a stored object changes
only through a store write (never in place: what an event snapshotted is still what is stored
until the next write of that object)."""

from __future__ import annotations

import marshal

from falcon_ray.config import Settings
from falcon_ray.devtools.simulate.driver import Simulation
from falcon_ray.sim.fleet import parse_fleet
from falcon_ray.sim.kube_store import WatchEvent, clone
from tests.harness.simulate import sim_task

TIMINGS = {"node_pool_create": 420.0, "node_register": 90.0, "pod_start": 20.0, "node_pool_delete": 180.0}
FLEET = {
    "clusters": [
        {"name": "res-a", "project": "p-res-a", "location": "us-east5-b", "tpu_type": "v6e", "timings": TIMINGS,
         "reservation": {"name": "res-a", "count": 4}, "chips": 16,
         "faults": {"api_error_rate": 0.05, "disruption_rate_per_node_hour": 0.2}},
        {"name": "flex-b", "project": "p-flex-b", "location": "us-central1-b", "tpu_type": "v6e", "timings": TIMINGS,
         "chips": 24, "faults": {"too_many_requests_rate": 0.05, "disruption_rate_per_node_hour": 0.2}},
    ]
}


def _bytes(obj) -> bytes:
    return marshal.dumps(obj, 2)  # type-exact: a tuple is not a list, a str subclass does not dump


class StoreWitness:
    """Listens to one cluster's store: each event's object is JSON-shaped, and the object an
    event replaces is the one the previous event of that key snapshotted, unchanged."""

    def __init__(self, store) -> None:
        self.store = store
        self.seen: dict[tuple[str, str, str], bytes] = {}
        self.events = 0
        self.plurals: set[str] = set()
        self.problems: list[str] = []
        store.add_listener(self.on_event)

    def on_event(self, ev: WatchEvent) -> None:
        self.events += 1
        self.plurals.add(ev.plural)
        md = ev.obj["metadata"]
        key = (ev.plural, md.get("namespace", ""), md["name"])
        if _bytes(clone(ev.obj)) != _bytes(ev.obj):
            self.problems.append(f"{ev.type} {key}: not JSON-shaped")
        if ev.prev is not None and key in self.seen and _bytes(ev.prev) != self.seen[key]:
            self.problems.append(f"{ev.type} {key}: the stored object was changed in place")
        if ev.type == "DELETED":
            self.seen.pop(key, None)
        else:
            self.seen[key] = _bytes(ev.obj)

    def check_stored(self) -> None:
        for (plural, ns, name), snapshot in self.seen.items():
            stored = self.store.get(plural, ns, name)
            if stored is not None and _bytes(stored) != snapshot:
                self.problems.append(f"{(plural, ns, name)}: changed in place since its last event")


def test_the_fleet_models_store_holds_json_shaped_objects_changed_only_by_its_writes():
    tasks = [sim_task(i, 120.0 * i, 900.0 + 300 * (i % 3), ("2x2", "2x4")[i % 2]) for i in range(8)]
    sim = Simulation(parse_fleet(FLEET), tasks, Settings(), 3, until_s=4 * 3600.0)
    witnesses = [StoreWitness(c.store) for c in sim.fleet.clusters.values()]
    try:
        sim.run()
        for w in witnesses:
            w.check_stored()
    finally:
        sim.dispose()
    assert sum(w.events for w in witnesses) > 100
    assert {"jobs", "pods", "nodes", "services", "events"} <= set().union(*(w.plurals for w in witnesses))
    assert [p for w in witnesses for p in w.problems] == []
