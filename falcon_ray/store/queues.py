"""What a QueueActor reads each round, and the queue's own state row.

Contract: ``queue_snapshot`` reads, in one connection, the registry, the queue's live
tasks (found through ``falcon_task_queue``, so only this queue's rows; incrementally with
``delta``), its leases and its last granted actor, and returns a frozen ``QueueRead``.
Nothing here writes. Every statement is built once per Store and queue or shape
(``StoreCore._built``), its per-call values bound at execution, and read into the model's
values by ``row_values``.

The last granted actor (the pick rule's round robin) is not a row of its own: it is the
actor of the queue's task whose move most recently took the queue's slot, that is, the
newest event row of one of its tasks entering Provisioning or Dispatching (a pick moves
Waiting to one of them; only the slot's holder moves there afterwards). The pick's own
event row, written in the pick's transaction, is therefore its durable record; a reader
that applies its own won moves (the QueueActor's mirror) keeps it without reading it
again. The read looks back ``GRANTED_LOOKBACK`` at most: a queue that granted nothing
for that long starts its round robin afresh.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable

import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Status
from falcon_ray.model import Cluster, Lease, ReservationOccupant, ReservationWaiter, Task
from falcon_ray.spec import DEFAULT_TIMEOUT_SECONDS, SpecError, SupplyMode, TaskSpec, parse_spec
from falcon_ray.store import tables as t
from falcon_ray.store.core import StoreCore, field_columns, one_of, row_values
from falcon_ray.store.registry import registry_select

SLOT_TAKEN = frozenset({lc.PROVISIONING, lc.DISPATCHING})  # a move here takes (or keeps) the queue's slot
_N_FIELDS = len(Task.__dataclass_fields__)  # a rows statement's leading columns are Task's fields
_SPEC = tuple(Task.__dataclass_fields__).index("spec")  # ... the spec among them ("" when not read)


@dataclasses.dataclass(frozen=True)
class QueueRead:
    """One ``queue_snapshot``: the registry, the queue's task rows (all of them, or the
    incremental part), its leases, its last granted actor, and the newest ``seq`` of
    ``falcon_task_queue`` among the rows read. ``entries``: for the rows read with their
    spec (new to the reader), when each entered its current phase as the event log says
    (None when the log has no such entry) and whether the fleet disrupted any of its runs."""

    clusters: list[Cluster]
    tasks: list[Task]
    leases: list[Lease] | None
    last_granted: str | None  # None: not read (``with_granted`` False)
    seq: int
    entries: dict[int, tuple[dt.datetime | None, bool]] = dataclasses.field(default_factory=dict)


def _spec_of(spec_text: str | None) -> TaskSpec | None:
    """A task's spec as the queue reads it (``parse_spec``); None for one that does not
    parse (the queue fails such a task; here it holds nothing and has the default limit)."""
    try:
        return parse_spec(spec_text or "{}")
    except SpecError:
        return None


def _no_entry():
    """The (entered, disrupted) columns of a row read without them: NULLs typed as the
    filled ones, so a UNION ALL reads a datetime in either (SQLite returns text otherwise)."""
    return sa.type_coerce(sa.null(), t.task_events.c.at.type), sa.type_coerce(sa.null(), sa.Integer())


class QueueStore(StoreCore):
    """The queue's snapshot read, its side reads, and its last granted actor."""

    def queue_snapshot(
        self,
        cluster_name: str,
        topology: str,
        known_specs: Iterable[int] = (),
        delta: tuple[int, Iterable[int]] | None = None,
        clusters: list[Cluster] | None = None,
        with_granted: bool = True,
        with_leases: bool = True,
    ) -> QueueRead:
        """What a QueueActor reads each round, in one connection: the registry (unless
        ``clusters`` is given), its queue's live tasks (``spec`` is read only for ids not in
        ``known_specs``; the others carry an empty spec), the queue's live leases (plus the
        Deleted ones that GKE refused for capacity, of tasks still acquiring) and its last
        granted actor (unless ``with_granted`` is False; the leases unless ``with_leases``
        is False, then ``leases`` is None).

        The tasks are found through ``falcon_task_queue``, so only this queue's rows are
        read. With ``delta = (seq, ids)`` the read is incremental: the queue's Aborting and
        Running tasks, those assigned to it after ``seq``, and the tasks ``ids`` (the
        caller's earlier slot holders and the tasks it wrote since); the caller keeps the
        other rows it has and drops every task of ``ids`` that is not returned. One
        statement either way (a UNION ALL for the delta), plus one for new specs."""
        known = known_specs if isinstance(known_specs, (set, frozenset, dict)) else set(known_specs)  # no copy per round
        with self.engine.connect() as c:
            if clusters is None:
                clusters = row_values(Cluster, c.execute(self._built(("clusters",), registry_select)).all())
            cluster = next((x for x in clusters if x.name == cluster_name), None)
            if cluster is None:
                return QueueRead(clusters, [], [], "" if with_granted else None, 0)
            newest = 0
            if delta is None:
                # the queue's newest assignment, live or not (an index's last entry), read
                # before the rows: the two statements share no snapshot, and a figure read
                # after them could name a task assigned in between that the rows lack (every
                # incremental read from it would skip that task until the next full read)
                newest = c.execute(self._newest(cluster.id, topology)).scalar() or 0
            rows = c.execute(*self._queue_rows(cluster.id, topology, bool(known), delta)).all()
            unknown = sorted({r[0] for r in rows if not r[_SPEC] and r[0] not in known})
            specs: dict[int, str] = {}
            for i in range(0, len(unknown), 1000):
                specs.update(c.execute(self._built(("specs",), self._specs_stmt), {"ids": unknown[i : i + 1000]}).all())
            leases = row_values(Lease, c.execute(self._queue_leases(cluster.id, topology)).all()) if with_leases else None
            granted = (c.execute(*self._granted(cluster.id, topology)).scalar() or "") if with_granted else None
        tasks, seq, entries = self._queue_tasks_of(rows, specs, int(newest))
        return QueueRead(clusters, tasks, leases, granted, seq, entries)

    @staticmethod
    def _specs_stmt():
        j = t.jobs
        return sa.select(j.c.id, j.c.spec).where(j.c.id.in_(sa.bindparam("ids", expanding=True)))

    def _newest(self, cluster_id: str, topology: str):
        m = t.task_queue
        return self._built(
            ("newest", cluster_id, topology),
            lambda: sa.select(sa.func.max(m.c.seq)).where(m.c.cluster_id == cluster_id, m.c.topology == topology),
        )

    def _queue_rows(self, cluster_id: str, topology: str, specs_known: bool, delta: tuple[int, Iterable[int]] | None):
        """``queue_snapshot``'s one statement for the task rows (see there), and its bound values."""
        if delta is None:
            return self._built(("all rows", cluster_id, topology, specs_known), lambda: self._rows_stmt(cluster_id, topology, specs_known, None)), {}
        after, ids = delta[0], sorted(set(delta[1]))
        stmt = self._built(("changed rows", cluster_id, topology, bool(ids)), lambda: self._rows_stmt(cluster_id, topology, True, bool(ids)))
        return stmt, ({"after": after, "ids": ids} if ids else {"after": after})

    @staticmethod
    def _task_columns(spec) -> list:
        """Task's columns in its fields' order, ``spec`` in place of the spec column: the
        leading columns of every rows statement (its ``seq``, ``entered``, ``disrupted`` follow)."""
        return [spec if c.name == "spec" else c for c in field_columns(t.jobs, Task)]

    def _rows_stmt(self, cluster_id: str, topology: str, specs_known: bool, with_ids: bool | None):
        """The rows statement: all of the queue's live rows (``with_ids`` None), or the
        incremental read, its ``after`` seq and its ``ids`` (when ``with_ids``) bound at execution."""
        j, m, e, dis = t.jobs, t.task_queue, t.task_events, t.task_disruptions
        live = [s.value for s in lc.NON_TERMINAL]

        def base(with_spec: bool):  # the spec text, phase entry and disruptions only where not known yet
            spec = j.c.spec if with_spec else sa.literal("").label("spec")
            entered, disrupted = _no_entry()
            if with_spec:  # from ix_events_task and the disruptions' (task, attempt) key, per new row
                entered = sa.type_coerce(
                    sa.select(sa.func.max(e.c.at))
                    .where(e.c.task_id == j.c.id, e.c.status == j.c.status, e.c.reason == j.c.reason)
                    .scalar_subquery(),
                    e.c.at.type,
                )
                disrupted = sa.case((sa.exists().where(dis.c.task_id == j.c.id), 1), else_=0)
            return (
                sa.select(*self._task_columns(spec), m.c.seq, entered.label("entered"), disrupted.label("disrupted"))
                .select_from(j.join(m, sa.and_(m.c.task_id == j.c.id, m.c.cluster_id == j.c.cluster_id)))
                .where(j.c.cluster_id == cluster_id, m.c.cluster_id == cluster_id, m.c.topology == topology, one_of(j.c.status, live))
            )

        if with_ids is None:
            return base(not specs_known).order_by(j.c.id)
        # what others change in a queue's rows: the upper layer aborts (Aborting), the
        # poller and other queues add Waiting tasks (a new seq); every other move is this
        # queue's own and its ids are in ``ids``
        parts = [self._queue_rows_in(cluster_id, topology, [Status.ABORTING.value, Status.RUNNING.value])]
        parts.append(base(True).where(m.c.seq > sa.bindparam("after", type_=m.c.seq.type)))
        if with_ids:
            parts.append(base(False).where(j.c.id.in_(sa.bindparam("ids", expanding=True))))
        return sa.union_all(*parts)

    @staticmethod
    def _queue_tasks_of(rows, specs: dict[int, str], newest: int):
        """The tasks of ``_queue_rows``' rows (a row with its spec wins over one without; one
        without takes its spec from ``specs``), in id order, the newest ``seq`` among them
        and ``newest``, and the ``QueueRead.entries`` of the rows read with their spec."""
        kept: dict[int, tuple] = {}
        entries: dict[int, tuple[dt.datetime | None, bool]] = {}
        seq = newest
        for r in rows:
            row_seq, entered, disrupted = r[_N_FIELDS:]
            if r[0] not in kept or r[_SPEC]:
                spec = r[_SPEC] or specs.get(r[0], "")
                kept[r[0]] = r if spec == r[_SPEC] else (*r[:_SPEC], spec, *r[_SPEC + 1 : _N_FIELDS])
            if disrupted is not None:
                entries[r[0]] = (entered, bool(disrupted))
            seq = max(seq, int(row_seq))
        return row_values(Task, (kept[i] for i in sorted(kept))), seq, entries

    @classmethod
    def _queue_rows_in(cls, cluster_id: str, topology: str, statuses: list[str]):
        """The queue's tasks in ``statuses`` (few), with their ``seq`` and no spec, found from
        the jobs index by status and checked against ``falcon_task_queue`` one row at a
        time: the join would let SQLite (no table statistics) walk every row of the queue."""
        j, m = t.jobs, t.task_queue
        seq = (
            sa.select(m.c.seq)
            .where(m.c.task_id == j.c.id, m.c.cluster_id == cluster_id, m.c.topology == topology)
            .scalar_subquery()
        )
        entered, disrupted = _no_entry()
        return sa.select(*cls._task_columns(sa.literal("").label("spec")), seq.label("seq"), entered.label("entered"), disrupted.label("disrupted")).where(
            j.c.cluster_id == cluster_id, one_of(j.c.status, statuses), seq.is_not(None)
        )

    def _queue_leases(self, cluster_id: str, topology: str):
        """A queue's live leases, and every lease row (Deleted too) of the cluster's
        acquiring tasks: the refused ones are the durable record of a capacity wait, and no
        new create may reuse the name of any of them (a lease row is adopted by its name)."""
        return self._built(("leases", cluster_id, topology), lambda: self._leases_stmt(cluster_id, topology))

    @staticmethod
    def _leases_stmt(cluster_id: str, topology: str):
        j, L = t.jobs, t.node_pool_leases
        acquiring = sa.select(j.c.id).where(
            j.c.cluster_id == cluster_id,
            j.c.status == Status.PENDING.value,
            one_of(j.c.reason, [r.value for r in lc.ACQUIRING]),
        )
        return (
            sa.select(*field_columns(L, Lease))
            .where(
                L.c.cluster_id == cluster_id,
                L.c.topology == topology,
                sa.or_(
                    L.c.state != LeaseState.DELETED.value,
                    L.c.task_id.in_(acquiring),
                ),
            )
            .order_by(L.c.id)
        )

    def queue_leases(self, cluster_id: str, topology: str) -> list[Lease]:
        """``queue_snapshot``'s leases alone."""
        with self.engine.connect() as c:
            return row_values(Lease, c.execute(self._queue_leases(cluster_id, topology)).all())

    def other_topology_waiting(self, cluster_id: str, topology: str) -> bool:
        """Whether a task of another topology of the cluster is Pending in its queue (it
        contends for the cluster's nodes). Stops at the first such row. Found from the other
        topologies' ``falcon_task_queue`` ranges (two, on each side of this one), never
        from the cluster's Pending rows, which are mostly this queue's own waiting tasks."""
        j, m = t.jobs, t.task_queue
        cid, top = sa.bindparam("other_cluster", type_=m.c.cluster_id.type), sa.bindparam("other_topology", type_=m.c.topology.type)
        rows = self._read_built(("other topology waiting",), lambda: (
            sa.select(j.c.id)
            .select_from(m.join(j, sa.and_(m.c.task_id == j.c.id, m.c.cluster_id == j.c.cluster_id)))
            .where(
                m.c.cluster_id == cid,
                sa.or_(m.c.topology < top, m.c.topology > top),
                j.c.cluster_id == cid,
                j.c.status == Status.PENDING.value,
                j.c.reason != "",
            )
            .limit(1)
        ), {"other_cluster": cluster_id, "other_topology": topology})  # fmt: skip
        return bool(rows)

    def reservation_waiters(self, cluster_id: str) -> list[ReservationWaiter]:
        """The cluster's ClusterBusy tasks (``reservation_waiters_of``)."""
        return self.reservation_waiters_of([cluster_id]).get(cluster_id, [])

    def reservation_waiters_of(self, cluster_ids: Iterable[str]) -> dict[str, list[ReservationWaiter]]:
        """Per cluster id, its ClusterBusy tasks (at most one a queue: ClusterBusy holds the
        queue's slot), each with its queue's topology, its submission time, the supply mode
        its spec names and when it entered ClusterBusy (the newest such event), in
        submission order: what the reservation hold reads (``reconcile.hold``). One
        statement for all the clusters; the spec is read for these few rows only."""
        ids = sorted(set(cluster_ids))
        if not ids:
            return {}
        j, m, e = t.jobs, t.task_queue, t.task_events
        busy = lc.CLUSTER_BUSY
        rows = self._read_built(("reservation waiters",), lambda: (
            sa.select(
                j.c.cluster_id, j.c.id, m.c.topology, j.c.created_at, j.c.spec,
                sa.type_coerce(
                    sa.select(sa.func.max(e.c.at))
                    .where(e.c.task_id == j.c.id, e.c.status == busy.status.value, e.c.reason == busy.reason.value)
                    .scalar_subquery(),
                    e.c.at.type,
                ),
            )
            .select_from(j.join(m, sa.and_(m.c.task_id == j.c.id, m.c.cluster_id == j.c.cluster_id)))
            .where(j.c.cluster_id.in_(sa.bindparam("waiters_clusters", expanding=True)), j.c.status == busy.status.value, j.c.reason == busy.reason.value)
            .order_by(j.c.created_at, j.c.id)
        ), {"waiters_clusters": ids})  # fmt: skip
        out: dict[str, list[ReservationWaiter]] = {}
        for r in rows:
            spec = _spec_of(r[4])
            mode = spec.supply_mode.value if spec is not None and spec.supply_mode is not None else None
            out.setdefault(r[0], []).append(ReservationWaiter(r[1], r[2], r[3], mode, r[5]))
        return out

    def reservation_occupants(self, cluster_id: str) -> list[ReservationOccupant]:
        """The cluster's reservation pools that hold hosts (``LEASE_HOLDS_RESERVATION``, and
        the ones being deleted, whose nodes GKE counts until they are gone), each with its
        live task's Job submission time and timeout (its spec's), in lease order:
        when each pool comes free at the latest, for the reservation hold's backfill
        (``reconcile.hold``). One statement, over the cluster's lease rows."""
        L, j = t.node_pool_leases, t.jobs
        cid = sa.bindparam("occupants_cluster", type_=L.c.cluster_id.type)
        live = [x.value for x in lc.NON_TERMINAL]
        holding = [x.value for x in (*lc.LEASE_HOLDS_RESERVATION, LeaseState.DELETING)]  # a deleting pool's nodes still count
        rows = self._read_built(("reservation occupants",), lambda: (
            sa.select(L.c.name, L.c.topology, j.c.id, j.c.dispatched_at, j.c.spec, L.c.created_at, L.c.updated_at)
            .select_from(L.outerjoin(j, sa.and_(j.c.id == L.c.task_id, one_of(j.c.status, live))))
            .where(L.c.cluster_id == cid, L.c.supply_mode == SupplyMode.RESERVATION.value, one_of(L.c.state, holding))
            .order_by(L.c.id)
        ), {"occupants_cluster": cluster_id})  # fmt: skip
        out = []
        for r in rows:
            spec = _spec_of(r[4]) if r[2] is not None else None
            out.append(ReservationOccupant(r[0], r[1], r[2], r[3], spec.timeout_seconds if spec else DEFAULT_TIMEOUT_SECONDS, r[5], r[6]))
        return out

    GRANTED_LOOKBACK = dt.timedelta(days=1)  # how far back the last granted actor is looked for

    def _granted(self, cluster_id: str, topology: str):
        """The queue's last granted actor (see the module docstring), in one statement: the
        newest Provisioning or Dispatching entry among the events of ``ix_events_at``'s
        range, of a task whose queue is this one. The statement and its bound values."""
        e, j, m = t.task_events, t.jobs, t.task_queue
        taken = [p.reason.value for p in SLOT_TAKEN]
        stmt = self._built(("granted", cluster_id, topology), lambda: (
            sa.select(j.c.actor)
            .select_from(e.join(m, m.c.task_id == e.c.task_id).join(j, j.c.id == e.c.task_id))
            .where(
                e.c.at >= sa.bindparam("since", type_=e.c.at.type),
                e.c.status == Status.PENDING.value,
                one_of(e.c.reason, taken),
                m.c.cluster_id == cluster_id,
                m.c.topology == topology,
            )
            .order_by(e.c.at.desc(), e.c.id.desc())
            .limit(1)
        ))  # fmt: skip
        return stmt, {"since": self.clock() - self.GRANTED_LOOKBACK}

    def last_granted(self, cluster_id: str, topology: str) -> str:
        """The queue's last granted actor, "" when it granted nothing within ``GRANTED_LOOKBACK``."""
        with self.engine.connect() as c:
            return c.execute(*self._granted(cluster_id, topology)).scalar() or ""
