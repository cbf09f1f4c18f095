"""The event log and the fleet's disruptions: ``falcon_task_events`` and ``falcon_task_disruptions``.

Contract: event rows are written by the task moves (``task_moves``), in the move's own
transaction; this module reads them: a task's log, when each task last entered each phase
(the durable source of every timer that decides), the queue's recent history.
``record_disruption`` writes that the fleet ended run ``attempt`` of a task, fenced and
idempotent by (task, attempt). Reads of many ids go 500 ids per statement.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import Phase, Status
from falcon_ray.model import Disruption, TaskEvent
from falcon_ray.store import tables as t
from falcon_ray.store.core import StoreCore, row_value


class EventStore(StoreCore):
    """The event log's reads, the disruptions' reads and writes."""

    def events(self, task_id: int) -> list[TaskEvent]:
        e = t.task_events
        with self.engine.connect() as c:
            rows = c.execute(e.select().where(e.c.task_id == task_id).order_by(e.c.id)).all()
        return [row_value(TaskEvent, r) for r in rows]

    def events_since(self, since: dt.datetime) -> list[TaskEvent]:
        e = t.task_events
        with self.engine.connect() as c:
            rows = c.execute(e.select().where(e.c.at >= since).order_by(e.c.id)).all()
        return [row_value(TaskEvent, r) for r in rows]

    def phase_entered(self, task_ids: Iterable[int]) -> dict[tuple[int, Phase], dt.datetime]:
        """When each task last entered each phase it has been in, from the event log."""
        e = t.task_events
        ids = sorted(set(task_ids))
        out: dict[tuple[int, Phase], dt.datetime] = {}
        with self.engine.connect() as c:
            for i in range(0, len(ids), 500):
                rows = c.execute(
                    sa.select(e.c.task_id, e.c.status, e.c.reason, sa.func.max(e.c.at))
                    .where(e.c.task_id.in_(ids[i : i + 500]))
                    .group_by(e.c.task_id, e.c.status, e.c.reason)
                ).all()
                for task_id, status, reason, at in rows:
                    try:
                        out[(int(task_id), lc.phase_of(status, reason))] = at
                    except ValueError:
                        continue  # a status or reason Falcon does not know: not a phase of ours
        return out

    def record_disruption(self, task_id: int, attempt: int, kind: str, node: str, job: str, detail: str) -> bool:
        """Write that the fleet ended run ``attempt`` of a task; idempotent by (task, attempt):
        a second write of the same run changes nothing and returns False."""
        row = dict(
            task_id=task_id, attempt=attempt, kind=kind[:16], node=node[:128], job=job[:64],
            detail=detail[:1000], at=self.clock(), epoch=self.epoch,
        )
        try:
            with self.engine.begin() as c:
                res = c.execute(self._insert(t.task_disruptions, row))
                if self.epoch is not None and res.rowcount == 0:
                    self._verify_epoch(c)
                return True
        except sa.exc.IntegrityError:
            return False  # written before (a step repeated after a crash)

    def entered_and_disruptions(
        self, entered_ids: Iterable[int], disrupted_ids: Iterable[int]
    ) -> tuple[dict[tuple[int, Phase], dt.datetime], dict[int, tuple[Disruption, ...]]]:
        """``phase_entered(entered_ids)`` and ``disruptions(disrupted_ids)`` in one statement
        per 500 ids (a UNION ALL of the two reads), for a reader that needs both."""
        e, d = t.task_events, t.task_disruptions
        a, b = sorted(set(entered_ids)), sorted(set(disrupted_ids))
        if not a or not b:
            return (self.phase_entered(a) if a else {}), (self.disruptions(b) if b else {})
        entered: dict[tuple[int, Phase], dt.datetime] = {}
        found: dict[int, list[Disruption]] = {}
        null = sa.null()
        with self.engine.connect() as c:
            for i in range(0, max(len(a), len(b)), 500):
                parts = []
                if a[i : i + 500]:
                    parts.append(
                        sa.select(
                            sa.literal(0).label("src"), e.c.task_id, e.c.status.label("s1"), e.c.reason.label("s2"),
                            null.label("s3"), null.label("s4"), sa.literal(0).label("n"), sa.func.max(e.c.at).label("at"),
                        )
                        .where(e.c.task_id.in_(a[i : i + 500]))
                        .group_by(e.c.task_id, e.c.status, e.c.reason)
                    )
                if b[i : i + 500]:
                    parts.append(
                        sa.select(
                            sa.literal(1).label("src"), d.c.task_id, d.c.kind, d.c.node, d.c.job, d.c.detail, d.c.attempt, d.c.at,
                        ).where(d.c.task_id.in_(b[i : i + 500]))
                    )
                stmt = sa.union_all(*parts) if len(parts) > 1 else parts[0]
                for src, task_id, s1, s2, s3, s4, n, at in c.execute(stmt).all():
                    if int(src) == 0:
                        try:
                            entered[(int(task_id), lc.phase_of(s1, s2 or ""))] = at
                        except ValueError:
                            continue  # a status or reason Falcon does not know: not a phase of ours
                    else:
                        found.setdefault(int(task_id), []).append(Disruption(int(n), s1, s2, s3, s4, at))
        return entered, {tid: tuple(sorted(ds, key=lambda x: x.attempt)) for tid, ds in found.items()}

    def disruptions(self, task_ids: Iterable[int]) -> dict[int, tuple[Disruption, ...]]:
        """The fleet's disruptions of each task's runs, oldest first; tasks without any are absent."""
        d = t.task_disruptions
        ids = sorted(set(task_ids))
        out: dict[int, list[Disruption]] = {}
        with self.engine.connect() as c:
            for i in range(0, len(ids), 500):
                rows = c.execute(
                    sa.select(d.c.task_id, d.c.attempt, d.c.kind, d.c.node, d.c.job, d.c.detail, d.c.at)
                    .where(d.c.task_id.in_(ids[i : i + 500]))
                    .order_by(d.c.task_id, d.c.attempt)
                ).all()
                for r in rows:
                    out.setdefault(int(r.task_id), []).append(Disruption(int(r.attempt), r.kind, r.node, r.job, r.detail, r.at))
        return {tid: tuple(ds) for tid, ds in out.items()}

    def queue_history(
        self, cluster_id: str, topology: str, since: dt.datetime, limit: int
    ) -> list[tuple[int, str, str, list[TaskEvent]]]:
        """The queue's last ``limit`` tasks that reached Running at or after ``since``: (task
        id, the supply mode of its pool, its spec text, its event log in order). Bounded:
        a range of ``ix_events_at`` (Running events of the window), then the events of at
        most ``limit`` tasks through ``ix_events_task``: two statements in all."""
        e, j, L = t.task_events, t.jobs, t.node_pool_leases
        started = (
            sa.select(e.c.task_id, L.c.supply_mode, j.c.spec)
            .select_from(
                e.join(j, j.c.id == e.c.task_id).join(L, sa.and_(L.c.cluster_id == j.c.cluster_id, L.c.name == j.c.node_pool_name))
            )
            .where(e.c.status == Status.RUNNING.value, e.c.at >= since, j.c.cluster_id == cluster_id, L.c.topology == topology)
            .order_by(e.c.at.desc())
            .limit(limit * 2)
        )
        with self.engine.connect() as c:
            seen: dict[int, tuple[str, str]] = {}
            for task_id, mode, spec in c.execute(started).all():
                if len(seen) < limit:
                    seen.setdefault(int(task_id), (str(mode), spec or ""))
            if not seen:
                return []
            rows = c.execute(e.select().where(e.c.task_id.in_(list(seen))).order_by(e.c.id)).all()
        by_task: dict[int, list[TaskEvent]] = {}
        for r in rows:
            by_task.setdefault(int(r.task_id), []).append(row_value(TaskEvent, r))
        return [(tid, mode, spec, by_task.get(tid, [])) for tid, (mode, spec) in sorted(seen.items())]
