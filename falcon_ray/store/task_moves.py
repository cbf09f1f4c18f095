"""The controller's task writes: compare-and-set moves with their event rows.

Contract
--------
- A move is a compare-and-set: ``transition(id, expect, to, ...)`` runs ``UPDATE jobs
  ... WHERE id = ? AND`` the expected phases (status, and the reason for statuses that
  carry one) and returns a ``WriteResult``: whether it won, the columns it wrote and
  when. A lost write means "re-read and decide again", never an error. Only moves in
  ``lifecycle.TASK_TRANSITIONS`` are accepted; another raises ``IllegalTransition``
  before any SQL. No Falcon move starts from Aborting except Aborting -> Aborted, so a
  controller write never overwrites the upper layer's abort.
- Every status or reason change appends a row to ``falcon_task_events`` in the same
  transaction, with the writer's leader epoch (NULL without one); a self-loop, an
  ``update_task`` and a message refresh (``refresh_messages``) write none.
- A move that gives the task a cluster records its queue (``falcon_task_queue``, a new
  ``seq``) in the same transaction: the queue's incremental read finds it.
- ``transition_with_lease`` is a task move and a lease move decided together (a
  hand-over, a pool that came up): one compare-and-set over both rows, both won or both
  lost, never one without the other.
- Every write here is fenced (``core``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Phase, Status
from falcon_ray.store import tables as t
from falcon_ray.store.core import (
    LEADER,
    LOST,
    Fenced,
    IllegalTransition,
    StoreCore,
    WriteResult,
    clip_message,
)
from falcon_ray.store.leases import lease_move_values


class _PairLost(Exception):
    """The second compare-and-set of a paired move lost: the transaction rolls back."""


def task_move_values(expect: Sequence[Phase], to: Phase, message: str, fields: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """The columns a task move from one of ``expect`` to ``to`` writes; ``IllegalTransition``
    for a move not in ``lifecycle.TASK_TRANSITIONS``."""
    for src in expect:
        if not lc.allowed(src, to):
            raise IllegalTransition(f"{src} -> {to} is not in the lifecycle table")
    values: dict[str, Any] = dict(status=to.status.value, reason=to.reason.value, message=clip_message(message), updated_at=now)
    if to.status in lc.TERMINAL:
        values.setdefault("finished_at", now)
    if to == lc.ABORTED:
        values["aborted_at"] = now
    values.update(fields)
    return values


class TaskMoves(StoreCore):
    """Task moves, batched moves, bookkeeping updates and Message refreshes."""

    @staticmethod
    def _phase_predicate(expect: Sequence[Phase]):
        j = t.jobs
        by_status: dict[Status, set[str]] = {}
        for p in expect:
            by_status.setdefault(p.status, set()).add(p.reason.value)
        clauses = []
        for st, reasons in by_status.items():
            if st in (Status.PENDING, Status.FAILED):
                # one reason as "=": an IN list is expanded at every execution of the statement
                reason = j.c.reason == next(iter(reasons)) if len(reasons) == 1 else j.c.reason.in_(sorted(reasons))
                clauses.append(sa.and_(j.c.status == st.value, reason))
            else:
                clauses.append(j.c.status == st.value)
        return sa.or_(*clauses)

    def _cas_task(self, c, task_id: int, expect: Sequence[Phase], values: dict[str, Any]):
        """``UPDATE jobs SET <values> WHERE id = <task_id> AND`` one of ``expect``, fenced
        (``_write``), as one statement built per Store and shape (the columns set, the
        expected phases, the epoch) and executed with the id and the values bound: the
        hot writes skip SQLAlchemy's per-call construction. A value that is itself SQL
        is not a bound value: that write is built for its call alone."""
        j = t.jobs
        if any(isinstance(v, sa.sql.ClauseElement) for v in values.values()):
            return self._write(c, j.update().where(j.c.id == task_id, self._phase_predicate(expect)).values(**values))
        names, phases = tuple(sorted(values)), tuple(expect)

        def build():
            return (
                j.update()
                .where(j.c.id == sa.bindparam("cas_id"), self._phase_predicate(phases))
                .values(**{k: sa.bindparam(f"set_{k}") for k in names})
            )

        params = {f"set_{k}": v for k, v in values.items()}
        params["cas_id"] = task_id
        return self._write_built(c, ("jobs cas", names, phases), build, params)

    def transition(
        self,
        task_id: int,
        expect: Phase | Sequence[Phase],
        to: Phase,
        message: str,
        topology: str | None = None,
        **fields: Any,
    ) -> WriteResult:
        """Move a task from one of ``expect`` to ``to``; the result says whether this write
        won, what it wrote and when (``moved``: out of another phase, with its event row). A move
        that gives the task a cluster (``cluster_id``) records its queue in the same
        transaction (``topology``, read from the spec when not given)."""
        expect = [expect] if isinstance(expect, Phase) else list(expect)
        now = self.clock()
        values = task_move_values(expect, to, message, fields, now)
        # A self-loop edge (e.g. ClusterBusy -> ClusterBusy) only refreshes the row: the
        # event log records status/reason changes, so a move out of another phase is tried
        # first and logged, and a row already in ``to`` is updated without an event.
        moving = [p for p in expect if p != to]
        staying = len(moving) < len(expect)
        won = False
        with self._tx() as c:
            if moving:
                won = self._cas_task(c, task_id, moving, values).rowcount == 1
                if won and to == lc.ABORTED:
                    self._aborted_events(c, task_id, now, message)
                elif won:
                    self._event(c, task_id, now, to, message)
                    if fields.get("cluster_id") is not None:
                        self._enqueue(c, [(task_id, fields["cluster_id"], topology)])
            moved = won
            if not won and staying:
                won = self._cas_task(c, task_id, [to], values).rowcount == 1
        return WriteResult(True, values, now, moved) if won else LOST

    def transition_with_lease(
        self,
        task_id: int,
        expect: Phase | Sequence[Phase],
        to: Phase,
        message: str,
        lease_id: int,
        lease_expect: LeaseState | Sequence[LeaseState],
        lease_to: LeaseState,
        lease_fields: dict[str, Any] | None = None,
        **fields: Any,
    ) -> tuple[WriteResult, WriteResult]:
        """A ``transition`` and a ``move_lease`` as one compare-and-set: both win or neither.
        The task's move leaves its phase (no self-loop) and gives no cluster. On MySQL both rows are changed by one multi-table UPDATE (the join of the
        two guarded rows: one statement fewer); elsewhere by two UPDATEs in one transaction,
        rolled back when the second loses. The task's event row is in the same transaction.
        Returns the task's result and the lease's."""
        expect = [expect] if isinstance(expect, Phase) else list(expect)
        lease_expect = [lease_expect] if isinstance(lease_expect, LeaseState) else list(lease_expect)
        if to in expect or "cluster_id" in fields:
            raise IllegalTransition(f"{expect} -> {to} cannot be paired with a lease move")
        now = self.clock()
        values = task_move_values(expect, to, message, fields, now)
        leased = lease_move_values(lease_expect, lease_to, dict(lease_fields or {}), now)
        j, L = t.jobs, t.node_pool_leases
        task_cas = sa.and_(j.c.id == task_id, self._phase_predicate(expect))
        lease_cas = sa.and_(L.c.id == lease_id, L.c.state.in_([s.value for s in lease_expect]))
        try:
            with self._tx() as c:
                if self.autocommit:  # MySQL: UPDATE jobs, leases SET ... WHERE <both guards>
                    both = {j.c[k]: v for k, v in values.items()} | {L.c[k]: v for k, v in leased.items()}
                    changed = self._write(c, j.update().where(task_cas, lease_cas).values(both)).rowcount
                    if changed not in (0, 2):  # cannot happen for a join of two one-row guards
                        raise _PairLost
                    won = changed == 2
                else:
                    won = self._write(c, j.update().where(task_cas).values(**values)).rowcount == 1
                    if won and self._write(c, L.update().where(lease_cas).values(**leased)).rowcount != 1:
                        raise _PairLost
                if won and to == lc.ABORTED:
                    self._aborted_events(c, task_id, now, message)
                elif won:
                    self._event(c, task_id, now, to, message)
        except _PairLost:
            won = False
        if not won:
            return LOST, LOST
        return WriteResult(True, values, now, True), WriteResult(True, leased, now)

    def transition_many(
        self, moves: Sequence[tuple[int, Phase, Phase, str, dict[str, Any]]], topologies: Sequence[str | None] = ()
    ) -> list[bool]:
        """Several ``transition``s (each one expected phase, never a self-loop, never to
        Aborted) in one transaction: one compare-and-set UPDATE per ``MOVE_CHUNK`` moves of
        the same kind (``id IN (...) AND`` the expected phase, each row's own Message and
        fields by ``CASE id``), then the won moves' event rows in one multi-row INSERT, and
        the queues of the won moves that give a cluster (``topologies[i]`` for move i, else
        read from the spec) in one more. Returns, per move, whether it won."""
        for _, src, to, _, _ in moves:
            if src == to or to == lc.ABORTED or not lc.allowed(src, to):
                raise IllegalTransition(f"{src} -> {to} is not a batchable lifecycle move")
        if not moves:
            return []
        now = self.clock()
        won = [False] * len(moves)
        kinds: dict[tuple[Phase, Phase, tuple[str, ...]], list[int]] = {}
        for i, (_, src, to, _, fields) in enumerate(moves):
            kinds.setdefault((src, to, tuple(sorted(fields))), []).append(i)
        tops = list(topologies) + [None] * (len(moves) - len(topologies))
        with self._tx() as c:
            for (src, to, keys), idx in kinds.items():
                for k in range(0, len(idx), self.MOVE_CHUNK):
                    chunk = idx[k : k + self.MOVE_CHUNK]
                    for i in self._move_chunk(c, [moves[i] for i in chunk], src, to, keys, now):
                        won[chunk[i]] = True
            events = [
                dict(task_id=m[0], at=now, status=m[2].status.value, reason=m[2].reason.value, message=clip_message(m[3]), epoch=self.epoch)
                for m, w in zip(moves, won, strict=True)
                if w
            ]
            if events:
                c.execute(t.task_events.insert(), events)
            placed = [(m[0], m[4]["cluster_id"], top) for m, w, top in zip(moves, won, tops, strict=True) if w and m[4].get("cluster_id") is not None]
            self._enqueue(c, placed)
        return won

    def _raw_phase_guard(self, ph: Phase, mark: str) -> tuple[str, list[Any]]:
        """The WHERE clause of a driver-level compare-and-set on a row's phase, with the
        leader fence as ``_fenced()`` adds it to every UPDATE, and its parameters."""
        guard, params = f"status = {mark}", [ph.status.value]
        if ph.status in (Status.PENDING, Status.FAILED):
            guard += f" AND reason = {mark}"
            params.append(ph.reason.value)
        if self.epoch is not None:
            if self.fenced:
                raise Fenced(self.fenced)
            guard += f" AND EXISTS (SELECT 1 FROM falcon_leader_lease WHERE name = {mark} AND epoch = {mark})"
            params += [LEADER, self.epoch]
        return guard, params

    MOVE_CHUNK = 500  # moves per UPDATE in transition_many

    def _move_chunk(self, c, chunk, src: Phase, to: Phase, keys: tuple[str, ...], now) -> list[int]:
        """One compare-and-set UPDATE for moves of one kind; the positions in ``chunk`` that won."""
        mark = self._mark
        sets, params = [f"status = {mark}", f"reason = {mark}", f"updated_at = {mark}"], [to.status.value, to.reason.value, now]
        if to.status in lc.TERMINAL and "finished_at" not in keys:
            sets.append(f"finished_at = {mark}")
            params.append(now)
        for col, pick in [("message", lambda m: clip_message(m[3]))] + [(key, lambda m, key=key: m[4][key]) for key in keys]:
            if col not in t.jobs.c:
                raise ValueError(f"jobs has no column {col!r}")
            sets.append(f"{col} = CASE id {' '.join([f'WHEN {mark} THEN {mark}'] * len(chunk))} ELSE {col} END")
            for m in chunk:
                params += (m[0], pick(m))
        ids = [m[0] for m in chunk]
        guard, guard_params = self._raw_phase_guard(src, mark)
        where = f"id IN ({', '.join([mark] * len(ids))}) AND {guard}"
        params += [*ids, *guard_params]
        changed = c.exec_driver_sql(f"UPDATE jobs SET {', '.join(sets)} WHERE {where}", tuple(params)).rowcount
        if changed == len(chunk):
            return list(range(len(chunk)))
        if changed == 0:
            if self.epoch is not None:
                self._verify_epoch(c)
            return []
        # some lost (aborted meanwhile): the rows this statement moved are in ``to`` since ``now``
        j = t.jobs
        moved = {
            int(r[0])
            for r in c.execute(sa.select(j.c.id).where(j.c.id.in_(ids), self._phase_predicate([to]), j.c.updated_at == now)).all()
        }
        return [i for i, m in enumerate(chunk) if m[0] in moved]

    def _event(self, c, task_id: int, at: dt.datetime, to: Phase, message: str) -> None:
        """The event row of a won move, in the move's transaction, with this Store's epoch."""
        # one INSERT statement per Store, its columns named by the parameters
        c.execute(
            self._built(("event",), t.task_events.insert),
            dict(task_id=task_id, at=at, status=to.status.value, reason=to.reason.value, message=clip_message(message), epoch=self.epoch),
        )

    def _aborted_events(self, c, task_id: int, at: dt.datetime, message: str) -> None:
        """The Aborted move's event rows, in the move's transaction and one statement: the
        upper layer may set Aborting with its own SQL, writing no event, so the audit trail
        gets its Aborting step (at ``aborting_at``) first when the log lacks one, then the
        Aborted one (an INSERT of a UNION ALL: the rows in that order)."""
        e, j = t.task_events, t.jobs
        lacking = (
            sa.select(
                j.c.id, sa.func.coalesce(j.c.aborting_at, sa.literal(at, e.c.at.type)), sa.literal(Status.ABORTING.value),
                sa.literal(""), sa.literal(""), sa.literal(self.epoch, e.c.epoch.type),
            )
            .where(j.c.id == task_id, ~sa.exists().where(e.c.task_id == task_id, e.c.status == Status.ABORTING.value))
        )
        aborted = sa.select(
            sa.literal(task_id), sa.literal(at, e.c.at.type), sa.literal(lc.ABORTED.status.value),
            sa.literal(lc.ABORTED.reason.value), sa.literal(clip_message(message)), sa.literal(self.epoch, e.c.epoch.type),
        )
        cols = ["task_id", "at", "status", "reason", "message", "epoch"]
        c.execute(e.insert().from_select(cols, sa.union_all(lacking, aborted)))

    def _enqueue(self, c, placed: Sequence[tuple[int, str, str | None]]) -> None:
        """Record each task's queue (task id, cluster id, topology) in ``falcon_task_queue``,
        in the caller's transaction, with a new ``seq``: the queue's incremental read finds
        it. A topology not given is read from the task's spec."""
        if not placed:
            return
        m, j = t.task_queue, t.jobs
        missing = [tid for tid, _, top in placed if top is None]
        tops: dict[int, str] = {}
        if missing:
            for tid, text in c.execute(sa.select(j.c.id, j.c.spec).where(j.c.id.in_(missing))).all():
                try:
                    tops[int(tid)] = str(json.loads(text).get("topology", ""))[:16]
                except (ValueError, AttributeError, TypeError):
                    tops[int(tid)] = ""
        rows = [dict(task_id=tid, cluster_id=cid, topology=top if top is not None else tops.get(tid, "")) for tid, cid, top in placed]
        name = self.engine.dialect.name
        if name in ("mysql", "mariadb", "sqlite"):
            # one statement: a task's earlier row (unique task_id) is deleted and the new one
            # inserted with a new seq (REPLACE on MySQL, INSERT OR REPLACE on SQLite)
            verb = "REPLACE" if name != "sqlite" else "INSERT OR REPLACE"
            mark = self._mark
            c.exec_driver_sql(
                f"{verb} INTO {m.name} (task_id, cluster_id, topology) VALUES ({mark}, {mark}, {mark})",
                [(r["task_id"], r["cluster_id"], r["topology"]) for r in rows],
            )
            return
        c.execute(m.delete().where(m.c.task_id.in_([r["task_id"] for r in rows])))
        c.execute(m.insert(), rows)

    def update_task(self, task_id: int, expect: Phase | Sequence[Phase], message: str | None = None, **fields: Any) -> WriteResult:
        """Change message and/or bookkeeping columns without changing the phase (CAS on phase)."""
        expect = [expect] if isinstance(expect, Phase) else list(expect)
        now = self.clock()
        values: dict[str, Any] = dict(fields, updated_at=now)
        if message is not None:
            values["message"] = clip_message(message)
        with self.engine.begin() as c:
            res = self._cas_task(c, task_id, expect, values)
        return WriteResult(True, values, now) if res.rowcount == 1 else LOST

    def refresh_messages(self, updates: Sequence[tuple[int, Phase, str]]) -> int:
        """Batched message refresh: one transaction, one UPDATE per phase and 500 rows, each
        row guarded by its phase (``id IN (...) AND`` the phase).

        Rows whose phase moved meanwhile keep their message. Returns rows changed."""
        if not updates:
            return 0
        now = self.clock()
        by_phase: dict[Phase, list[tuple[int, str]]] = {}
        for tid, ph, msg in updates:
            by_phase.setdefault(ph, []).append((tid, clip_message(msg)))
        changed = 0
        # driver-level SQL with positional markers: building (or even parsing the bind names
        # of) 500 CASE branches costs more than the statement itself
        mark = self._mark
        with self.engine.begin() as c:  # each chunk is guarded on its own: no transaction needed around them
            for ph, items in by_phase.items():
                for i in range(0, len(items), self.MESSAGE_CHUNK):
                    chunk = items[i : i + self.MESSAGE_CHUNK]
                    params: list[Any] = []
                    for tid, msg in chunk:
                        params += (tid, msg)
                    params.append(now)
                    guard, guard_params = self._raw_phase_guard(ph, mark)
                    params += [*(tid for tid, _ in chunk), *guard_params]
                    branches = " ".join([f"WHEN {mark} THEN {mark}"] * len(chunk))
                    ids = ", ".join([mark] * len(chunk))
                    sql = (
                        f"UPDATE jobs SET message = CASE id {branches} ELSE message END, updated_at = {mark} "
                        f"WHERE id IN ({ids}) AND {guard}"
                    )
                    changed += c.exec_driver_sql(sql, tuple(params)).rowcount
            if self.epoch is not None and changed == 0:
                self._verify_epoch(c)
        return changed

    MESSAGE_CHUNK = 500  # rows per UPDATE: the CASE is evaluated per row, so it stays short

    def unassign(self, task_id: int, message: str, expect: Phase = lc.WAITING) -> WriteResult:
        """Back to Pending with no cluster (the cluster left service, or its reservation
        cannot serve the task's shape): the poller ranks it again."""
        return self.transition(task_id, expect, lc.NEW, message, cluster_id=None)

    def move_task(self, task_id: int, from_cluster_id: str, to_cluster_id: str, message: str, topology: str | None = None) -> bool:
        """ClusterBusy on one cluster -> Waiting on another: one compare-and-set on the
        phase and the cluster (and no pool named), with its event row in the same
        transaction. A lost one (aborted, moved or provisioning meanwhile) changes nothing."""
        if not lc.allowed(lc.CLUSTER_BUSY, lc.WAITING):
            raise IllegalTransition(f"{lc.CLUSTER_BUSY} -> {lc.WAITING} is not in the lifecycle table")
        j, now = t.jobs, self.clock()
        stmt = (
            j.update()
            .where(j.c.id == task_id, j.c.cluster_id == from_cluster_id, self._phase_predicate([lc.CLUSTER_BUSY]))
            .values(
                status=lc.WAITING.status.value,
                reason=lc.WAITING.reason.value,
                message=clip_message(message),
                cluster_id=to_cluster_id,
                node_pool_name=None,
                updated_at=now,
            )
        )
        with self._tx() as c:
            won = self._write(c, stmt).rowcount == 1
            if won:
                self._event(c, task_id, now, lc.WAITING, message)
                self._enqueue(c, [(task_id, to_cluster_id, topology)])
        return won
