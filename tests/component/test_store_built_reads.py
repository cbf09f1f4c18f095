"""The Store's hot reads are built once per shape (``_read_built``, ``_built``) and executed
with their values bound; their rows become values through ``row_values``. A cached read
must still hold nothing of one call but its shape: each call reads its own cluster, queue,
lease name or task ids, and reads what was written since the call before.

Every test runs on SQLite and on MariaDB/MySQL (the ``store`` fixture)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Reason
from falcon_ray.model import Cluster, Lease, Task
from falcon_ray.store import Store
from falcon_ray.store import tables as t
from falcon_ray.store.core import field_columns, row_value, row_values

TOPOLOGIES = ("2x2", "2x4")


@pytest.fixture
def fleet(store: Store) -> dict[str, Cluster]:
    """Two clusters, each with two queues: two Waiting tasks, one Provisioning task with its
    lease and one Deleted lease per queue. Task actors and lease names say where they are."""
    out = {}
    for name in ("east", "west"):
        c = out[name] = store.add_cluster(name, "proj", "us-central1", "v6e")
        for top in TOPOLOGIES:
            where = f"{name}-{top}"
            for i in range(2):
                queued(store, c, top, f"{where}-w{i}")
            held = queued(store, c, top, f"{where}-p")
            assert store.transition(held, lc.WAITING, lc.PROVISIONING, "picked")
            store.create_lease(c.id, top, f"falcon-{where}-held", "flex-start", held)
            gone = store.create_lease(c.id, top, f"falcon-{where}-gone", "flex-start", None)
            assert store.move_lease(gone.id, LeaseState.REQUESTED, LeaseState.DELETING)
            assert store.move_lease(gone.id, LeaseState.DELETING, LeaseState.DELETED)
    return out


def queued(store: Store, cluster: Cluster, topology: str, actor: str) -> int:
    tid = store.submit_task(actor, {"tpu_type": "v6e", "topology": topology, "image": "img:1"}, name=actor)
    assert store.transition(tid, lc.NEW, lc.WAITING, "queued", cluster_id=cluster.id, topology=topology)
    return tid


def actors(tasks) -> set[str]:
    return {x.actor for x in tasks}


def test_queue_snapshot_reads_each_queue_its_own_rows(store, fleet):
    """Every queue read twice, the second time after the others (their statements cached):
    only its own tasks, leases and last granted actor; the incremental read likewise."""
    for _ in range(2):
        for name, c in fleet.items():
            for top in TOPOLOGIES:
                where = f"{name}-{top}"
                snap = store.queue_snapshot(name, top)
                assert actors(snap.tasks) == {f"{where}-w0", f"{where}-w1", f"{where}-p"}
                assert all(x.cluster_id == c.id for x in snap.tasks)
                assert [x.name for x in snap.leases] == [f"falcon-{where}-held"]
                assert snap.last_granted == f"{where}-p"
                assert [x.name for x in snap.clusters] == ["east", "west"]
                assert all(x.spec for x in snap.tasks)
                ids = [x.id for x in snap.tasks]
                again = store.queue_snapshot(name, top, ids, clusters=snap.clusters)
                assert [x.id for x in again.tasks] == ids and not any(x.spec for x in again.tasks)
                delta = store.queue_snapshot(name, top, ids, delta=(0, ids[:1]), clusters=snap.clusters)
                assert actors(delta.tasks) == actors(snap.tasks)
                assert store.queue_leases(c.id, top) == snap.leases


def test_queue_snapshot_reads_what_was_written_since(store, fleet):
    east = fleet["east"]
    snap = store.queue_snapshot("east", "2x2")
    ids = [x.id for x in snap.tasks]
    waiting = next(x for x in snap.tasks if x.phase == lc.WAITING)
    assert store.update_task(waiting.id, lc.WAITING, "moved up")
    new = queued(store, east, "2x2", "late")
    full = store.queue_snapshot("east", "2x2", ids, clusters=snap.clusters)
    assert {x.id: x.message for x in full.tasks}[waiting.id] == "moved up"
    assert [x.id for x in full.tasks] == [*ids, new] and full.seq > snap.seq
    assert next(x for x in full.tasks if x.id == new).spec  # a new row comes with its spec
    delta = store.queue_snapshot("east", "2x2", [*ids, new], delta=(snap.seq, [waiting.id]), clusters=snap.clusters)
    assert {x.id for x in delta.tasks} == {waiting.id, new}
    assert store.request_abort(waiting.id)
    aborted = {x.id: x.status for x in store.queue_snapshot("east", "2x2", clusters=snap.clusters).tasks}
    assert aborted[waiting.id] == lc.Status.ABORTING

    held = snap.leases[0]
    assert store.move_lease(held.id, LeaseState.REQUESTED, LeaseState.CREATING)
    assert [x.state for x in store.queue_leases(east.id, "2x2")] == [LeaseState.CREATING]
    assert [x.state for x in store.queue_snapshot("east", "2x2", clusters=snap.clusters).leases] == [LeaseState.CREATING]
    assert store.set_cluster_status("west", "offline")
    assert [x.status for x in store.queue_snapshot("east", "2x2").clusters] == ["active", "offline"]


def test_a_refused_lease_of_an_acquiring_task_is_read_by_its_queue_alone(store, fleet):
    east = fleet["east"]
    held = store.get_lease(east.id, "falcon-east-2x2-held")
    assert store.move_lease(held.id, LeaseState.REQUESTED, LeaseState.DELETING)
    assert store.move_lease(held.id, LeaseState.DELETING, LeaseState.DELETED)
    assert [x.name for x in store.queue_leases(east.id, "2x2")] == ["falcon-east-2x2-held"]
    assert [x.name for x in store.queue_leases(east.id, "2x4")] == ["falcon-east-2x4-held"]
    assert store.request_abort(held.task_id)
    assert store.queue_leases(east.id, "2x2") == []  # no longer acquiring: the Deleted row is not read


def test_leases_and_get_lease_read_the_cluster_and_name_asked(store, fleet):
    east, west = fleet["east"], fleet["west"]
    for c in (east, west, east):
        live = store.leases(c.id)
        assert {x.name for x in live} == {f"falcon-{c.name}-{top}-held" for top in TOPOLOGIES}
        assert all(x.cluster_id == c.id for x in store.leases(c.id, live_only=False))
        assert len(store.leases(c.id, live_only=False)) == 4
    assert len(store.leases()) == 4 and len(store.leases(live_only=False)) == 8
    same = [store.create_lease(c.id, "2x2", "falcon-same", "reservation", None) for c in (east, west)]
    assert store.get_lease(east.id, "falcon-same") == same[0] and store.get_lease(west.id, "falcon-same") == same[1]
    assert store.get_lease(west.id, "falcon-east-2x2-held") is None
    assert store.get_lease(east.id, "falcon-east-2x4-held").topology == "2x4"
    assert store.move_lease(same[0].id, LeaseState.REQUESTED, LeaseState.CREATING)
    assert store.get_lease(east.id, "falcon-same").state == LeaseState.CREATING
    assert store.get_lease(west.id, "falcon-same").state == LeaseState.REQUESTED
    assert next(x for x in store.leases(east.id) if x.name == "falcon-same").state == LeaseState.CREATING


def test_other_topology_waiting_reads_the_other_queues_of_the_cluster_asked(store, fleet):
    east, west = fleet["east"], fleet["west"]
    assert store.other_topology_waiting(east.id, "2x2") and store.other_topology_waiting(east.id, "2x4")
    assert store.other_topology_waiting(east.id, "4x4")
    lone = store.add_cluster("lone", "proj", "us-central1", "v6e")
    queued(store, lone, "2x2", "lone-w0")
    assert not store.other_topology_waiting(lone.id, "2x2")  # its own queue, not west's or east's
    assert store.other_topology_waiting(lone.id, "2x4")
    for tid in [x.id for x in store.live_tasks(west.id) if x.phase == lc.WAITING]:
        assert store.request_abort(tid)
    assert store.other_topology_waiting(west.id, "2x2")  # the Provisioning ones still wait
    assert not store.other_topology_waiting(lone.id, "2x2")
    (tid,) = [x.id for x in store.live_tasks(lone.id)]
    assert store.request_abort(tid)
    assert not store.other_topology_waiting(lone.id, "2x4")  # no longer Pending


def test_task_reads_bind_their_ids_and_cluster(store, fleet):
    east, west = fleet["east"], fleet["west"]
    mine = store.live_tasks(east.id)
    theirs = store.live_tasks(west.id)
    assert len(mine) == len(theirs) == 6 and {x.cluster_id for x in mine} == {east.id}
    assert {x.cluster_id for x in theirs} == {west.id}
    assert store.live_tasks() == sorted(mine + theirs, key=lambda x: x.id)
    assert store.get_tasks([theirs[2].id, mine[0].id]) == sorted([theirs[2], mine[0]], key=lambda x: x.id)
    assert store.get_tasks([mine[1].id]) == [mine[1]] and store.get_tasks([]) == []
    assert store.update_task(mine[0].id, mine[0].phase, "fresh")
    assert store.get_tasks([mine[0].id])[0].message == "fresh"
    assert store.live_tasks(east.id)[0].message == "fresh"
    assert store.request_abort(mine[0].id)
    assert store.live_tasks(east.id)[0].status == lc.Status.ABORTING
    new, aborting = store.intake()
    assert new == [] and [x.id for x in aborting] == [mine[0].id]
    late = store.submit_task("late", {"tpu_type": "v6e", "topology": "2x2", "image": "img:1"})
    assert [x.id for x in store.intake()[0]] == [late]


def test_queue_claimants_count_the_clusters_and_reasons_asked(store, fleet):
    east, west = fleet["east"], fleet["west"]
    both = {(c.id, top): 3 for c in (east, west) for top in TOPOLOGIES}
    assert store.queue_claimants([east.id, west.id]) == both
    assert store.queue_claimants([west.id]) == {k: n for k, n in both.items() if k[0] == west.id}
    assert store.queue_claimants([east.id], [Reason.PROVISIONING]) == {(east.id, top): 1 for top in TOPOLOGIES}
    assert store.queue_claimants([west.id], [Reason.WAITING]) == {(west.id, top): 2 for top in TOPOLOGIES}
    tid = next(x.id for x in store.live_tasks(west.id) if x.phase == lc.WAITING and x.actor.startswith("west-2x4"))
    assert store.transition(tid, lc.WAITING, lc.PROVISIONING, "picked")
    assert store.queue_claimants([west.id], [Reason.WAITING]) == {(west.id, "2x2"): 2, (west.id, "2x4"): 1}


def test_bound_reads_build_one_statement_per_shape(store, fleet):
    """Reads of other clusters, names and ids reuse the statement the first call built."""
    east, west = fleet["east"], fleet["west"]

    def reads(c: Cluster, ids: list[int]) -> None:
        store.leases(c.id)
        store.get_lease(c.id, f"falcon-{c.name}")
        store.other_topology_waiting(c.id, "2x2")
        store.queue_claimants([c.id])
        store.live_tasks(c.id)
        store.get_tasks(ids)

    reads(east, [1])
    built = len(store.__dict__["_statements"])
    reads(west, [1, 2, 3])
    assert len(store.__dict__["_statements"]) == built


def test_row_values_are_the_values_the_dataclass_makes(store, fleet):
    for table, cls in ((t.jobs, Task), (t.node_pool_leases, Lease), (t.clusters, Cluster)):
        with store.engine.connect() as c:
            rows = c.execute(sa.select(*field_columns(table, cls), sa.literal(7).label("extra"))).all()
        values = row_values(cls, rows)
        assert len(values) == len(rows) > 0
        assert values == [cls(*r[: len(cls.__dataclass_fields__)]) for r in rows] == [row_value(cls, r) for r in rows]
        for v, r in zip(values, rows, strict=True):
            assert vars(v) == vars(cls(*r[:-1]))  # the same fields, enums converted by __post_init__
    task = row_values(Task, [store.get_tasks([1])[0].__dict__.values()])[0]
    assert task.phase == lc.WAITING and isinstance(task.status, lc.Status) and isinstance(task.reason, Reason)


def test_fleet_load_reads_the_depth_and_idle_pools_of_now(store, fleet):
    east, west = fleet["east"], fleet["west"]
    every = {(c.id, top): 3 for c in (east, west) for top in TOPOLOGIES}
    assert store.fleet_load() == (every, {}, {})
    lease = store.get_lease(west.id, "falcon-west-2x4-held")
    assert store.move_lease(lease.id, LeaseState.REQUESTED, LeaseState.CREATING)
    assert store.move_lease(lease.id, LeaseState.CREATING, LeaseState.READY, ready_at=store.clock())
    assert store.move_lease(lease.id, LeaseState.READY, LeaseState.IDLE)
    assert store.request_abort(lease.task_id)
    assert store.fleet_load() == ({**every, (west.id, "2x4"): 2}, {}, {(west.id, "2x4"): 1})


def test_the_reservation_holds_reads_name_each_clusters_own_busy_tasks_and_reservation_pools(store, fleet):
    """``reservation_waiters``: the cluster's ClusterBusy tasks with their queue's topology,
    spec supply mode and ClusterBusy entry; ``reservation_occupants``: its reservation pools
    that hold hosts or are being deleted, with their live task's submission and timeout."""
    east, west = fleet["east"], fleet["west"]
    busy = store.submit_task("east-busy", {"tpu_type": "v6e", "topology": "2x4", "image": "img:1", "command": ["run"], "supply_mode": "reservation", "timeout_seconds": 7200})
    assert store.transition(busy, lc.NEW, lc.WAITING, "queued", cluster_id=east.id, topology="2x4")
    assert store.transition(busy, lc.WAITING, lc.PROVISIONING, "picked")
    assert store.transition(busy, lc.PROVISIONING, lc.CLUSTER_BUSY, "no room")
    for _ in range(2):  # the second time from the cached statements
        (w,) = store.reservation_waiters(east.id)
        assert (w.task_id, w.topology, w.supply_mode) == (busy, "2x4", "reservation") and w.since is not None
        assert store.reservation_waiters(west.id) == []
    pool = store.create_lease(east.id, "2x4", "falcon-east-busy", "reservation", busy)
    store.create_lease(east.id, "2x2", "falcon-east-free", "reservation", None)
    gone = store.create_lease(east.id, "2x2", "falcon-east-deleting", "reservation", None)
    assert store.move_lease(gone.id, LeaseState.REQUESTED, LeaseState.DELETING)
    store.create_lease(west.id, "2x2", "falcon-west-res", "reservation", None)
    for _ in range(2):
        got = {o.pool: o for o in store.reservation_occupants(east.id)}
        assert set(got) == {"falcon-east-busy", "falcon-east-free", "falcon-east-deleting"}  # not flex-start, not west
        assert (got[pool.name].task_id, got[pool.name].timeout_s, got[pool.name].dispatched_at) == (busy, 7200, None)
        assert got["falcon-east-free"].task_id is None and got["falcon-east-free"].timeout_s > 0
        assert [o.pool for o in store.reservation_occupants(west.id)] == ["falcon-west-res"]
