"""Intake and task reads: the upper layer's side of the ``jobs`` table and the
controller's reads of it.

Contract: ``submit_task`` and ``request_abort`` write exactly what the upper layer writes
(a Pending row, or Aborting on a live task) with their event row in one transaction, and
are never fenced; ``submit_task`` is not idempotent and is never rerun after a
disconnect. The reads are single statements found through the indexes named in their
docstrings, so their cost follows the live rows, not the table; the controller's hot ones
(``intake``, ``fleet_load``, ``get_tasks``, ``live_tasks``, ``queue_claimants``) are built
once per Store and shape, their ids and clusters bound at execution. The controller's
task writes are in ``task_moves``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Reason, Status
from falcon_ray.model import Task
from falcon_ray.store import tables as t
from falcon_ray.store.core import StoreCore, field_columns, one_of, row_value, row_values


class TaskStore(StoreCore):
    """The upper layer's inserts and aborts; the poller's and the operator's task reads."""

    # --- the upper layer's side -------------------------------------------------------

    def submit_task(self, actor: str, spec: str | dict, name: str = "", timeout_seconds: int | None = None) -> int:
        """Insert a Pending task exactly as the upper layer does."""
        text = spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True)
        now = self.clock()
        with self._tx() as c:
            res = c.execute(
                t.jobs.insert().values(
                    name=name,
                    actor=actor,
                    spec=text,
                    status=Status.PENDING.value,
                    reason="",
                    message="",
                    timeout_seconds=timeout_seconds,
                    created_at=now,
                    updated_at=now,
                )
            )
            task_id = int(res.inserted_primary_key[0])
            c.execute(t.task_events.insert().values(task_id=task_id, at=now, status="Pending", reason="", message=""))
        return task_id

    def request_abort(self, task_id: int) -> bool:
        """Set Aborting as the upper layer does; only a live task can be aborted."""
        now = self.clock()
        live = [s.value for s in (Status.PENDING, Status.RUNNING)]
        msg = ""
        with self._tx() as c:
            res = c.execute(
                t.jobs.update()
                .where(t.jobs.c.id == task_id, t.jobs.c.status.in_(live))
                .values(status=Status.ABORTING.value, aborting_at=now, updated_at=now)
            )
            if res.rowcount == 1:
                c.execute(
                    t.task_events.insert().values(task_id=task_id, at=now, status="Aborting", reason="", message=msg)
                )
        return res.rowcount == 1

    # --- the controller's reads -------------------------------------------------------

    def get_task(self, task_id: int) -> Task | None:
        with self.engine.connect() as c:
            r = c.execute(t.jobs.select().where(t.jobs.c.id == task_id)).first()
        return row_value(Task, r) if r else None

    def get_tasks(self, ids: Iterable[int]) -> list[Task]:
        """The tasks ``ids`` (those that exist), in id order; the ids bound at execution."""
        ids = list(ids)
        if not ids:
            return []
        j = t.jobs
        rows = self._read_built(
            ("tasks",), lambda: sa.select(*field_columns(j, Task)).where(j.c.id.in_(sa.bindparam("ids", expanding=True))).order_by(j.c.id), {"ids": ids}
        )
        return row_values(Task, rows)

    def recent_tasks(self, limit: int = 50) -> list[Task]:
        with self.engine.connect() as c:
            rows = c.execute(t.jobs.select().order_by(t.jobs.c.id.desc()).limit(limit)).all()
        return [row_value(Task, r) for r in rows]

    def live_tasks(self, cluster_id: str | None = None) -> list[Task]:
        """Non-terminal tasks, of one cluster or of all, oldest first."""
        j = t.jobs

        def build():
            q = sa.select(*field_columns(j, Task)).where(one_of(j.c.status, [s.value for s in lc.NON_TERMINAL]))
            if cluster_id is not None:
                q = q.where(j.c.cluster_id == sa.bindparam("cluster_id"))
            return q.order_by(j.c.id)

        rows = self._read_built(("live tasks", cluster_id is not None), build, {"cluster_id": cluster_id} if cluster_id is not None else None)
        return row_values(Task, rows)

    def intake(self, limit: int = 500) -> tuple[list[Task], list[Task]]:
        """The poll: unassigned Pending tasks and all Aborting tasks, oldest first.

        Both predicates lead with ``status`` on ``ix_jobs_status_cluster``, so the cost
        follows the number of live rows, not the size of the table. The statement is built
        once per Store and limit."""
        j = t.jobs

        def build():
            cols = field_columns(j, Task)
            new_q = (
                sa.select(*cols)
                .where(j.c.status == Status.PENDING.value, j.c.cluster_id.is_(None))
                .order_by(j.c.id)
                .limit(limit)
                .subquery()
            )
            abort_q = sa.select(*cols).where(j.c.status == Status.ABORTING.value).order_by(j.c.id).limit(limit).subquery()
            return sa.union_all(sa.select(new_q), sa.select(abort_q))  # one round trip for both reads

        tasks = sorted(row_values(Task, self._read_built(("intake", limit), build)), key=lambda x: x.id)
        return [x for x in tasks if x.status == Status.PENDING], [x for x in tasks if x.status == Status.ABORTING]

    def fleet_load(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """Per queue (cluster id, topology), found through ``falcon_task_queue``: the
        assigned Pending tasks and the Running ones; and the ready Idle leases per (cluster
        id, topology). One statement (the poller's ranking inputs)."""
        j, m, L = t.jobs, t.task_queue, t.node_pool_leases

        def build():
            live = (
                sa.select(j.c.status.label("k"), m.c.cluster_id.label("cid"), m.c.topology.label("top"), sa.func.count().label("n"))
                .select_from(j.join(m, m.c.task_id == j.c.id))
                .where(one_of(j.c.status, (Status.PENDING.value, Status.RUNNING.value)), j.c.cluster_id.is_not(None))
                .group_by(j.c.status, m.c.cluster_id, m.c.topology)
            )
            idle = (
                sa.select(sa.literal("i").label("k"), L.c.cluster_id.label("cid"), L.c.topology.label("top"), sa.func.count().label("n"))
                .where(L.c.state == LeaseState.IDLE.value, L.c.ready_at.is_not(None))
                .group_by(L.c.cluster_id, L.c.topology)
            )
            return sa.union_all(live, idle)

        rows = self._read_built(("fleet load",), build)
        by_kind: dict[str, dict[tuple[str, str], int]] = {Status.PENDING.value: {}, Status.RUNNING.value: {}, "i": {}}
        for k, cid, top, n in rows:
            by_kind[k][(cid, top)] = int(n)
        return by_kind[Status.PENDING.value], by_kind[Status.RUNNING.value], by_kind["i"]

    def queue_claimants(
        self, cluster_ids: Iterable[str], reasons: Sequence[Reason] = (Reason.WAITING, Reason.PROVISIONING, Reason.CLUSTER_BUSY)
    ) -> dict[tuple[str, str], int]:
        """Per (cluster id, topology): the Pending tasks in ``reasons``; by default those
        that would take an idle pool of that queue before a newcomer. Reads the spec of
        those tasks only, so callers ask only for clusters where it matters."""
        ids = list(cluster_ids)
        if not ids:
            return {}
        j = t.jobs
        reasons = tuple(r.value for r in reasons)
        rows = self._read_built(
            ("claimants", reasons),
            lambda: sa.select(j.c.cluster_id, j.c.spec).where(
                j.c.status == Status.PENDING.value, one_of(j.c.reason, reasons), j.c.cluster_id.in_(sa.bindparam("ids", expanding=True))
            ),
            {"ids": ids},
        )
        out: dict[tuple[str, str], int] = {}
        for cid, text in rows:
            try:
                topology = str(json.loads(text).get("topology", ""))
            except (ValueError, AttributeError):
                continue
            out[(cid, topology)] = out.get((cid, topology), 0) + 1
        return out
