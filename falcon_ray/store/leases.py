"""Node-pool leases: the ``falcon_node_pool_leases`` rows, one per node pool Falcon asked for.

Contract: ``create_lease`` writes the row (state Requested) before GKE's create call and is
idempotent by (cluster, name): a row written before a crash is adopted. ``move_lease`` is
a compare-and-set on the state, checked against ``lifecycle.LEASE_TRANSITIONS``
(``IllegalTransition`` before any SQL); ``touch_lease`` sets bookkeeping columns whatever
the state. Both return a ``WriteResult``, are fenced and are one statement. A Deleted row
stays: it is the record of the pool's name and of a capacity refusal
(``capacity_refused_since``). ``leases`` and ``get_lease`` are built once per Store and
shape, the cluster and name bound at execution.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import Lease
from falcon_ray.store import tables as t
from falcon_ray.store.core import LOST, IllegalTransition, StoreCore, WriteResult, field_columns, row_values


def lease_move_values(expect: Sequence[LeaseState], to: LeaseState, fields: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The columns a lease move from one of ``expect`` to ``to`` writes; ``IllegalTransition``
    for a move not in ``lifecycle.LEASE_TRANSITIONS``."""
    for src in expect:
        if not lc.lease_allowed(src, to):
            raise IllegalTransition(f"lease {src} -> {to} is not in the lifecycle table")
    values: dict[str, Any] = dict(state=to.value, updated_at=now)
    if to == LeaseState.DELETED:
        values["deleted_at"] = now
    if to == LeaseState.IDLE:
        values.setdefault("idle_since", now)
        values.setdefault("task_id", None)
    values.update(fields)
    return values


class LeaseStore(StoreCore):
    """The node-pool leases' reads and writes."""

    def create_lease(
        self, cluster_id: str, topology: str, name: str, supply_mode: str, task_id: int | None
    ) -> Lease:
        """Write the lease row (state Requested) before the create call; idempotent by name."""
        now = self.clock()
        row = dict(
            cluster_id=cluster_id,
            topology=topology,
            name=name,
            supply_mode=supply_mode,
            state=LeaseState.REQUESTED.value,
            task_id=task_id,
            created_at=now,
            updated_at=now,
        )
        lease = None
        try:
            with self.engine.begin() as c:
                res = c.execute(self._insert(t.node_pool_leases, row))
                if self.epoch is not None and res.rowcount == 0:
                    self._verify_epoch(c)
                if res.rowcount == 1 and res.lastrowid:  # the row as written: no read back
                    lease = Lease(
                        id=int(res.lastrowid), operation=None, delete_attempts=0, last_error="",
                        ready_at=None, idle_since=None, deleted_at=None, refused_at=None, refusal="", accepted_at=None, **row,
                    )
        except sa.exc.IntegrityError:
            pass  # the same name was written before a crash: adopt it
        if lease is None:
            lease = self.get_lease(cluster_id, name)
        assert lease is not None
        return lease

    def get_lease(self, cluster_id: str, name: str) -> Lease | None:
        """The lease row named ``name`` in the cluster, None when there is none."""
        L = t.node_pool_leases

        def build():
            return sa.select(*field_columns(L, Lease)).where(
                L.c.cluster_id == sa.bindparam("lease_cluster"), L.c.name == sa.bindparam("lease_name")
            )

        rows = self._read_built(("lease",), build, {"lease_cluster": cluster_id, "lease_name": name})
        return row_values(Lease, rows)[0] if rows else None

    def leases(self, cluster_id: str | None = None, live_only: bool = True) -> list[Lease]:
        """The lease rows (of ``cluster_id``; without the Deleted ones when ``live_only``), in
        id order. One statement per Store and shape, the cluster bound at execution."""
        L = t.node_pool_leases

        def build():
            q = sa.select(*field_columns(L, Lease))
            if cluster_id is not None:
                q = q.where(L.c.cluster_id == sa.bindparam("lease_cluster"))
            if live_only:
                q = q.where(L.c.state != LeaseState.DELETED.value)
            return q.order_by(L.c.id)

        rows = self._read_built(("leases", cluster_id is not None, live_only), build, {"lease_cluster": cluster_id} if cluster_id is not None else None)
        return row_values(Lease, rows)

    def move_lease(
        self, lease_id: int, expect: LeaseState | Sequence[LeaseState], to: LeaseState, **fields: Any
    ) -> WriteResult:
        """Compare-and-set a lease from one of ``expect`` to ``to``; the result says what it wrote."""
        expect = [expect] if isinstance(expect, LeaseState) else list(expect)
        now = self.clock()
        values = lease_move_values(expect, to, fields, now)
        L = t.node_pool_leases
        with self.engine.begin() as c:
            res = self._write(
                c, L.update().where(L.c.id == lease_id, L.c.state.in_([s.value for s in expect])).values(**values)
            )
        return WriteResult(True, values, now) if res.rowcount == 1 else LOST

    def touch_lease(self, lease_id: int, **fields: Any) -> WriteResult:
        """Set bookkeeping columns of a lease whatever its state; lost when no row has ``lease_id``."""
        L = t.node_pool_leases
        now = self.clock()
        values = dict(updated_at=now, **fields)
        with self.engine.begin() as c:
            res = self._write(c, L.update().where(L.c.id == lease_id).values(**values))
        return WriteResult(True, values, now) if res.rowcount == 1 else LOST

    def refused_on(self, task_id: int) -> set[str]:
        """The clusters (ids) where GKE refused the task's node pool for capacity (its lease
        rows' ``refused_at``, Deleted ones included): where a failover must not send it back."""
        L = t.node_pool_leases
        with self.engine.connect() as c:
            rows = c.execute(
                sa.select(L.c.cluster_id).where(L.c.task_id == task_id, L.c.refused_at.is_not(None)).distinct()
            ).all()
        return {str(cluster_id) for (cluster_id,) in rows}

    def capacity_refused_since(self, task_ids: Iterable[int]) -> dict[int, dt.datetime]:
        """When GKE first refused each task's node pool for capacity (its lease rows'
        ``refused_at``, Deleted ones included); tasks never refused are absent."""
        L = t.node_pool_leases
        ids = sorted(set(task_ids))
        out: dict[int, dt.datetime] = {}
        with self.engine.connect() as c:
            for i in range(0, len(ids), 500):
                rows = c.execute(
                    sa.select(L.c.task_id, sa.func.min(L.c.refused_at))
                    .where(L.c.task_id.in_(ids[i : i + 500]), L.c.refused_at.is_not(None))
                    .group_by(L.c.task_id)
                ).all()
                out.update({int(task_id): at for task_id, at in rows if at is not None})
        return out
