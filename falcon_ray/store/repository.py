"""The repository: every read and write Falcon makes to the database.

Contract
--------
- Task moves are compare-and-set: ``transition(id, expect, to, ...)`` runs
  ``UPDATE jobs ... WHERE id = ? AND status IN (...)`` (with the reason for
  statuses that carry one) and returns a ``WriteResult``: whether it won, the columns
  it wrote and when (``update_task``, ``move_lease`` and ``touch_lease`` too). A lost
  write means "re-read and decide again", never an error. Only moves in ``lifecycle.TASK_TRANSITIONS``
  are accepted; asking for another raises ``IllegalTransition`` before any SQL.
- Because no Falcon move starts from Aborting except Aborting -> Aborted, a
  controller write can never overwrite the upper layer's abort.
- Every status or reason change appends a row to ``falcon_task_events`` in the same
  transaction, with the writer's leader epoch (NULL without one); message refreshes
  (``refresh_messages``) do not.
- Lease moves are compare-and-set on the lease state, checked against
  ``lifecycle.LEASE_TRANSITIONS``.
- Each method is one short transaction; nothing holds a connection between calls,
  so any process may die at any line. On MySQL the connections run in driver
  autocommit: a read or a one-statement write is one statement on the wire (no
  ROLLBACK or COMMIT after it), and a write of several statements (a task move and its
  event row) runs on a second pool whose connections are not in autocommit (``_tx``):
  its first statement opens the transaction, one COMMIT ends it (no BEGIN is sent), and
  it is rolled back whole when a statement in it fails.
- ``statements`` counts the SQL statements this Store executed (for the cost report);
  ``breakdown`` counts them by the public method that sent them (the outermost one of
  the calling thread, ``-`` outside any) and by kind (SELECT, INSERT, UPDATE, DELETE,
  COMMIT, ROLLBACK, ...), keyed ``"method KIND"``.

Database faults
---------------
MySQL connections are opened and used with timeouts (``DbTimeouts``: connect, read,
write; the actors take them from Settings ``db_*_timeout_s``): a server that stops
answering mid-statement (a hung connection, a network partition) fails the statement
with a disconnect instead of blocking its thread forever. Connections are checked out
with ``pool_pre_ping`` (a connection the server
killed or dropped while idle is replaced before use). A method whose statement meets
a disconnect anyway (``DBAPIError.connection_invalidated``: the connection was
killed mid-use, the server restarted) is run again, whole, on a fresh connection,
up to ``DISCONNECT_RETRIES`` times; every method is one short transaction whose
writes are compare-and-set or idempotent by name, so a rerun after a commit whose
answer was lost just loses its compare-and-set ("re-read and decide again").
``submit_task`` (the upper layer's insert, not idempotent) is not rerun. When the
database stays unreachable the error propagates: the actors' loops log it, keep
their state and try again at their next tick; no task is failed for it.
``disconnects`` counts the reruns.

Fencing
-------
The leader lease row (``falcon_leader_lease``, name ``controller``) carries an
``epoch`` that grows by one with each new holder (``acquire_leader``; a renewal by the
same holder keeps it, a release keeps it too). A Store built with ``epoch=N`` (the
actors' stores) adds ``EXISTS (SELECT 1 FROM falcon_leader_lease WHERE name =
'controller' AND epoch = N)`` to every task, lease and queue-state write it makes
(``_fenced``: UPDATEs get it in their WHERE clause, INSERTs become INSERT ... SELECT
... WHERE it), so the check and the write are one statement: on InnoDB the
subquery takes a shared lock on the lease row that a newer holder's UPDATE waits
for; on SQLite the statement runs under the database's write lock. The event rows
are written in the same transaction as the task write that won. A guarded write that
changes no row reads the lease once: when its epoch is no longer ``N`` the Store
records why in ``fenced`` and raises ``Fenced``; every later write raises at once
without SQL. ``check_fence(max_age_s)`` is the same check for callers about to act
outside the database (GKE, Kubernetes). A Store without an epoch (CLI, upper layer,
tests) writes unguarded.

A lease read that shows this Store's epoch held (a holder, ``expires_at``) answers
``check_fence`` without SQL until ``expires_at`` less ``FENCE_MARGIN_S`` on this Store's
clock. That is sound because no other controller can hold the lease before it expires:
``acquire_leader`` takes it from another holder only once ``expires_at`` has passed on
the taker's clock, and the only other way, ``release_leader``, is called by a controller
after it has stopped its own actors (``Supervisor.shutdown``). The margin covers the two
hosts' clocks and a call already under way; a lease past its expiry is read at every
check until it is renewed. Every write keeps its guard in the statement whatever
``check_fence`` answered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from falcon_ray import lifecycle as lc
from falcon_ray.clock import SYSTEM
from falcon_ray.lifecycle import LeaseState, Phase, Reason, Status
from falcon_ray.messages import MAX_MESSAGE
from falcon_ray.model import Cluster, ClusterStatus, Disruption, Lease, Task, TaskEvent
from falcon_ray.store import tables as t

CLUSTER_STATUSES = tuple(s.value for s in ClusterStatus)
DEFAULT_DB_URL = "sqlite:///falcon.db"


def utcnow() -> dt.datetime:
    """The machine's wall time as the database stores it (naive UTC, milliseconds)."""
    return SYSTEM.now()


class IllegalTransition(ValueError):
    pass


LEADER = "controller"


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
    last_granted: str
    seq: int
    entries: dict[int, tuple[dt.datetime | None, bool]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """What one compare-and-set write did: whether it ``won``, the columns it wrote
    (``values``, empty when it lost), the time it stamped on the row (``at``), and whether
    it changed the task's phase (``moved``: its event row says the phase was entered at
    ``at``). True when it won, so ``if store.transition(...)`` reads as before. A value
    returned to the one caller that wrote: nothing of it is kept on the Store."""

    won: bool
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    at: dt.datetime | None = None
    moved: bool = False

    def __bool__(self) -> bool:
        return self.won


LOST = WriteResult(False)


class Fenced(RuntimeError):
    """A newer controller holds the leader lease: this Store's epoch may not write any more."""


def _no_entry():
    """The (entered, disrupted) columns of a row read without them: NULLs typed as the
    filled ones, so a UNION ALL reads a datetime in either (SQLite returns text otherwise)."""
    return sa.type_coerce(sa.null(), t.task_events.c.at.type), sa.type_coerce(sa.null(), sa.Integer())


def _row(cls, row) -> Any:
    return cls(**{k: row._mapping[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class DbTimeouts:
    """Seconds a MySQL/MariaDB connection may take to open, to answer, to take a statement."""

    connect_s: float = 10.0
    read_s: float = 30.0
    write_s: float = 30.0


def tls_connect_args(url: str | sa.URL) -> dict[str, Any]:
    """The PyMySQL arguments of Falcon's TLS policy: TLS when the URL asks for it, else none.

    A URL with any ``ssl*`` query option (``?ssl_ca=/etc/falcon/server-ca.pem``, with
    ``ssl_verify_identity=true`` to check the host name too; SQLAlchemy hands them to
    PyMySQL) gets exactly that TLS and PyMySQL refuses a server without it. A URL without
    one gets a plain connection, as PyMySQL 1.1 made it: PyMySQL 1.2 tries TLS on every
    connection instead ("preferred": no certificate check, plain text when the server has
    no TLS), and building that TLS context costs ~42 ms of CPU per connection (measured
    2026-12-02 against a MariaDB without TLS; 0.4 ms without it), paid again by every
    restarted actor and every ``NullPool`` engine, while a TLS that checks no certificate
    stops no one who can intercept the connection. Not MySQL over PyMySQL: nothing."""
    u = sa.engine.make_url(url)
    if not u.drivername.endswith("+pymysql") or any(k.startswith("ssl") for k in u.query):
        return {}
    return {"ssl_disabled": True}


def make_engine(url: str, timeouts: DbTimeouts | None = None, autocommit: bool = True) -> Engine:
    """An engine for ``url``; on MySQL in driver autocommit unless ``autocommit`` is False
    (the Store's second pool, for its writes of several statements)."""
    kwargs: dict[str, Any] = {"future": True, "pool_reset_on_return": None}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    else:
        if url.startswith(("mysql+pymysql", "mariadb+pymysql")):
            t = timeouts or DbTimeouts()
            # pymysql waits forever by default: a hung server would hang the actor's thread
            kwargs["connect_args"] = {"connect_timeout": t.connect_s, "read_timeout": t.read_s, "write_timeout": t.write_s}
            kwargs["connect_args"].update(tls_connect_args(url))
        # No reset-on-return ROLLBACK: every Store method ends its own transaction (begin()
        # commits, connect() rolls back its read on close), so the pool's extra ROLLBACK on
        # each return was one wasted statement per call. The ping is COM_PING, not a statement.
        # Driver autocommit: a read is one statement (no ROLLBACK after it), a one-statement
        # write is its own transaction (no COMMIT). A write of several statements runs on the
        # other pool, whose connections are not in autocommit: its first statement opens the
        # transaction (no BEGIN on the wire) and one COMMIT ends it (``Store._tx``).
        kwargs.update(pool_pre_ping=True, pool_recycle=1800)
        # A pool opens a connection only when its threads overlap: a single-threaded actor (a
        # QueueActor) holds two, one in each pool; the transaction pool keeps one idle at most.
        if autocommit:
            kwargs.update(pool_size=4, max_overflow=4, isolation_level="AUTOCOMMIT")
        else:
            kwargs.update(pool_size=1, max_overflow=3)
    engine = sa.create_engine(url, **kwargs)
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # WAL lets readers run beside the one writer
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    return engine


DISCONNECT_RETRIES = 2


def _rerun_on_disconnect(fn):
    """Run a Store method again, whole, when its connection turned out to be dead."""

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        calling = self._calling
        outer = getattr(calling, "method", None) is None
        if outer:
            calling.method = fn.__name__
        try:
            for attempt in range(DISCONNECT_RETRIES + 1):
                try:
                    return fn(self, *args, **kwargs)
                except sa.exc.DBAPIError as e:
                    if not e.connection_invalidated or attempt == DISCONNECT_RETRIES:
                        raise
                    self.disconnects += 1
        finally:
            if outer:
                calling.method = None

    return method


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


clip_message = _clip  # the Message as the store writes it


class Store:
    """One database, many short transactions. Safe to share between threads."""

    def __init__(self, url: str, clock=utcnow, epoch: int | None = None, timeouts: DbTimeouts | None = None) -> None:
        self.url = url
        self.timeouts = timeouts
        self.engine = make_engine(url, timeouts)
        self.clock = clock  # the wall time of every row written
        # durations (fence age, the bench's counts): the clock's own when it is a Clock
        self._monotonic = getattr(clock, "monotonic", SYSTEM.monotonic)
        self.statements = 0
        self.disconnects = 0  # methods rerun after a disconnect
        self.epoch = epoch  # the leader epoch this Store writes under; None: unfenced
        self.fenced = ""  # why this Store may not write any more, once known
        self._fence_checked_at = 0.0
        self._fence_holds_until: dt.datetime | None = None  # the last lease read holds until then (wall time)

        # The benchmark (falcon_ray.devtools.bench) sets FALCON_STATEMENT_COUNTS to a directory: each
        # Store then keeps its running count in a file there, so the count of an actor that
        # is killed (a retired queue) is not lost.
        # Beside it, ``<pid>-<id>.json`` holds ``breakdown`` (rewritten at most every
        # ``BREAKDOWN_WRITE_S`` and at ``dispose``).
        self._count_fd: int | None = None
        self._breakdown_path = ""
        self._breakdown_at = 0.0
        self.breakdown: dict[str, int] = {}
        self._calling = threading.local()  # .method: the outermost public method of this thread
        counts_dir = os.environ.get("FALCON_STATEMENT_COUNTS")
        if counts_dir:
            path = os.path.join(counts_dir, f"{os.getpid()}-{id(self)}.cnt")
            self._count_fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            self._breakdown_path = path[: -len(".cnt")] + ".json"

        self.autocommit = self.engine.dialect.name in ("mysql", "mariadb")
        self.tx_engine = make_engine(url, timeouts, autocommit=False) if self.autocommit else self.engine
        self._count_statements(self.engine, commits=not self.autocommit)
        if self.tx_engine is not self.engine:
            self._count_statements(self.tx_engine, commits=True)

    BREAKDOWN_WRITE_S = 0.5

    def _bump(self, kind: str) -> None:
        self.statements += 1
        key = f"{getattr(self._calling, 'method', '-')} {kind}"
        self.breakdown[key] = self.breakdown.get(key, 0) + 1
        if self._count_fd is not None:
            os.pwrite(self._count_fd, b"%20d\n" % self.statements, 0)
            if self._monotonic() - self._breakdown_at >= self.BREAKDOWN_WRITE_S:
                self._write_breakdown()

    def _write_breakdown(self) -> None:
        if not self._breakdown_path:
            return
        self._breakdown_at = self._monotonic()
        tmp = f"{self._breakdown_path}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.breakdown, f)
            os.replace(tmp, self._breakdown_path)
        except OSError:  # the bench that reads these counts has ended and removed their directory
            self._breakdown_path = ""

    def _count_statements(self, engine: Engine, commits: bool) -> None:
        """Count every statement ``engine`` sends; with ``commits`` its COMMITs and ROLLBACKs
        too (MySQL's ``Questions`` counts them; a ping is not a statement). On an autocommit
        engine the driver commits each statement itself and SQLAlchemy's ends are no-ops.
        The dialect instance belongs to this engine alone."""

        @event.listens_for(engine, "before_cursor_execute")
        def _count(_conn, _cursor, statement, *_a, **_k):
            head = statement.lstrip(" (\n")[:8].split(None, 1)
            self._bump(head[0].upper() if head else "?")

        dialect = engine.dialect
        if not commits:
            dialect.do_commit = dialect.do_rollback = lambda dbapi_conn: None  # type: ignore[method-assign]
            return
        commit, rollback = dialect.do_commit, dialect.do_rollback

        def _commit(dbapi_conn):
            self._bump("COMMIT")
            commit(dbapi_conn)

        def _rollback(dbapi_conn):
            self._bump("ROLLBACK")
            rollback(dbapi_conn)

        dialect.do_commit, dialect.do_rollback = _commit, _rollback  # type: ignore[method-assign]

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:
        """One transaction for a write of several statements, committed at the end and rolled
        back whole when a statement in it fails: on MySQL a connection of the pool that is not
        in autocommit (its first statement opens the transaction, so no BEGIN is sent)."""
        with self.tx_engine.begin() as c:
            yield c

    def __getstate__(self):  # Ray pickles actors' constructor arguments, not engines
        return {"url": self.url, "clock": self.clock, "epoch": self.epoch, "timeouts": self.timeouts}

    def __setstate__(self, state):
        self.__init__(state["url"], state["clock"], state.get("epoch"), state.get("timeouts"))

    # --- fencing -------------------------------------------------------------------

    def _epoch_holds(self):
        ll = t.leader_lease
        return sa.exists().where(ll.c.name == LEADER, ll.c.epoch == self.epoch)

    def _fenced(self, stmt):
        """The one place where an UPDATE gets the epoch guard in its WHERE clause."""
        if self.epoch is None:
            return stmt
        if self.fenced:
            raise Fenced(self.fenced)
        return stmt.where(self._epoch_holds())

    def _insert(self, table, values: dict[str, Any], ins=sa.insert):
        """A one-row INSERT; fenced, it is INSERT ... SELECT <values> WHERE <epoch holds>."""
        if self.epoch is None:
            return ins(table).values(**values)
        if self.fenced:
            raise Fenced(self.fenced)
        cols = list(values)
        row = sa.select(*[sa.literal(values[k], type_=table.c[k].type) for k in cols]).where(self._epoch_holds())
        return ins(table).from_select(cols, row)

    def _write(self, c, stmt):
        """Execute a guarded write; when it changed no row, tell a lost race from fencing."""
        res = c.execute(self._fenced(stmt))
        if self.epoch is not None and res.rowcount == 0:
            self._verify_epoch(c)
        return res

    def _verify_epoch(self, c) -> None:
        ll = t.leader_lease
        row = c.execute(sa.select(ll.c.epoch, ll.c.holder, ll.c.expires_at).where(ll.c.name == LEADER)).first()
        self._fence_checked_at = self._monotonic()
        self._fence_holds_until = None
        if row is None or int(row.epoch) != self.epoch:
            now_held = f"epoch {row.epoch} ({row.holder or 'released'})" if row else "no lease row"
            self.fenced = f"fenced: started under leader epoch {self.epoch}, the lease is now at {now_held}"
            raise Fenced(self.fenced)
        if row.holder and row.expires_at is not None:
            self._fence_holds_until = row.expires_at - dt.timedelta(seconds=self.FENCE_MARGIN_S)

    FENCE_MARGIN_S = 2.0  # a lease read is trusted until its expiry less this (clocks of two hosts, a call under way)

    def check_fence(self, max_age_s: float = 0.0) -> None:
        """Raise ``Fenced`` when a newer controller holds the lease; no-op for an unfenced
        Store. Reads the lease row unless it was read less than ``max_age_s`` ago or the
        last read still holds: it showed this epoch held until ``expires_at``, and that
        time less ``FENCE_MARGIN_S`` has not come (see Fencing in the module docstring)."""
        if self.fenced:
            raise Fenced(self.fenced)
        if self.epoch is None or self._monotonic() - self._fence_checked_at < max_age_s:
            return
        until = self._fence_holds_until
        if until is not None and self.clock() < until:
            return
        with self.engine.connect() as c:
            self._verify_epoch(c)

    def dispose(self) -> None:
        self._write_breakdown()
        self.engine.dispose()
        if self.tx_engine is not self.engine:
            self.tx_engine.dispose()

    def ping(self) -> bool:
        with self.engine.connect() as c:
            c.execute(sa.text("SELECT 1"))
        return True

    # --- clusters ------------------------------------------------------------------

    def add_cluster(
        self,
        name: str,
        project: str,
        location: str,
        tpu_type: str,
        gcs_bucket: str = "",
        default_reservation: str = "",
        status: str = "active",
        namespace: str = "falcon-jobs",
        service_account: str = "falcon-job",
        zone: str = "",
    ) -> Cluster:
        if status not in CLUSTER_STATUSES:
            raise ValueError(f"status must be one of {', '.join(CLUSTER_STATUSES)}, got {status!r}")
        now = self.clock()
        values = dict(
            id=str(uuid.uuid4()),
            name=name,
            project=project,
            location=location,
            tpu_type=tpu_type,
            gcs_bucket=gcs_bucket or "",
            default_reservation=default_reservation or "",
            status=status,
            namespace=namespace,
            service_account=service_account,
            created_at=now,
            updated_at=now,
            zone=zone or "",
        )
        with self.engine.begin() as c:
            c.execute(t.clusters.insert().values(**values))
        return Cluster(**values)

    def list_clusters(self) -> list[Cluster]:
        with self.engine.connect() as c:
            rows = c.execute(t.clusters.select().order_by(t.clusters.c.name)).all()
        return [_row(Cluster, r) for r in rows]

    def get_cluster(self, name_or_id: str) -> Cluster | None:
        q = t.clusters.select().where(sa.or_(t.clusters.c.name == name_or_id, t.clusters.c.id == name_or_id))
        with self.engine.connect() as c:
            r = c.execute(q).first()
        return _row(Cluster, r) if r else None

    def set_cluster_zone(self, name: str, zone: str) -> bool:
        with self.engine.begin() as c:
            res = c.execute(
                t.clusters.update().where(t.clusters.c.name == name).values(zone=zone or "", updated_at=self.clock())
            )
        return res.rowcount == 1

    def record_reservation(
        self, cluster_id: str, machine_type: str, count: int | None, in_use: int | None, claimed: int | None
    ) -> bool:
        """The ClusterActor's last reading of its reservation: the machine type it holds and
        the ledger. Written only when a figure changed (``reservation_seen_at`` says when);
        the operator's ``updated_at`` is left alone. Fenced like every controller write."""
        c_ = t.clusters.c
        values = dict(
            reservation_machine_type=machine_type or "", reservation_count=count, reservation_in_use=in_use, reservation_claimed=claimed
        )
        changed = sa.or_(*(sa.not_(getattr(c_, k).is_not_distinct_from(v)) for k, v in values.items()))
        stmt = t.clusters.update().where(c_.id == cluster_id, changed).values(**values, reservation_seen_at=self.clock())
        with self.engine.begin() as c:
            res = self._write(c, stmt)
        return res.rowcount == 1

    def set_cluster_status(self, name: str, status: str) -> bool:
        if status not in CLUSTER_STATUSES:
            raise ValueError(f"status must be one of {', '.join(CLUSTER_STATUSES)}, got {status!r}")
        with self.engine.begin() as c:
            res = c.execute(
                t.clusters.update()
                .where(t.clusters.c.name == name)
                .values(status=status, updated_at=self.clock())
            )
        return res.rowcount == 1

    # --- tasks: the upper layer's side ---------------------------------------------

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

    # --- tasks: the controller's reads ---------------------------------------------

    def get_task(self, task_id: int) -> Task | None:
        with self.engine.connect() as c:
            r = c.execute(t.jobs.select().where(t.jobs.c.id == task_id)).first()
        return _row(Task, r) if r else None

    def get_tasks(self, ids: Iterable[int]) -> list[Task]:
        ids = list(ids)
        if not ids:
            return []
        with self.engine.connect() as c:
            rows = c.execute(t.jobs.select().where(t.jobs.c.id.in_(ids)).order_by(t.jobs.c.id)).all()
        return [_row(Task, r) for r in rows]

    def recent_tasks(self, limit: int = 50) -> list[Task]:
        with self.engine.connect() as c:
            rows = c.execute(t.jobs.select().order_by(t.jobs.c.id.desc()).limit(limit)).all()
        return [_row(Task, r) for r in rows]

    def intake(self, limit: int = 500) -> tuple[list[Task], list[Task]]:
        """The poll: unassigned Pending tasks and all Aborting tasks, oldest first.

        Both predicates lead with ``status`` on ``ix_jobs_status_cluster``, so the cost
        follows the number of live rows, not the size of the table."""
        j = t.jobs
        new_q = (
            j.select()
            .where(j.c.status == Status.PENDING.value, j.c.cluster_id.is_(None))
            .order_by(j.c.id)
            .limit(limit)
            .subquery()
        )
        abort_q = j.select().where(j.c.status == Status.ABORTING.value).order_by(j.c.id).limit(limit).subquery()
        both = sa.union_all(sa.select(new_q), sa.select(abort_q))  # one round trip for both reads
        with self.engine.connect() as c:
            rows = c.execute(both).all()
        tasks = sorted((_row(Task, r) for r in rows), key=lambda x: x.id)
        return [x for x in tasks if x.status == Status.PENDING], [x for x in tasks if x.status == Status.ABORTING]

    def pending_depth(self) -> dict[str, int]:
        """Assigned Pending tasks per cluster id (the poller's queue-depth ranking input)."""
        j = t.jobs
        q = (
            sa.select(j.c.cluster_id, sa.func.count())
            .where(j.c.status == Status.PENDING.value, j.c.cluster_id.is_not(None))
            .group_by(j.c.cluster_id)
        )
        with self.engine.connect() as c:
            return {cid: int(n) for cid, n in c.execute(q).all()}

    def fleet_load(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        """``pending_depth()`` and the ready Idle leases per (cluster id, topology), in one
        statement (the poller's ranking inputs)."""
        j, L = t.jobs, t.node_pool_leases
        depth = (
            sa.select(sa.literal("d").label("k"), j.c.cluster_id.label("cid"), sa.literal("").label("top"), sa.func.count().label("n"))
            .where(j.c.status == Status.PENDING.value, j.c.cluster_id.is_not(None))
            .group_by(j.c.cluster_id)
        )
        idle = (
            sa.select(sa.literal("i").label("k"), L.c.cluster_id.label("cid"), L.c.topology.label("top"), sa.func.count().label("n"))
            .where(L.c.state == LeaseState.IDLE.value, L.c.ready_at.is_not(None))
            .group_by(L.c.cluster_id, L.c.topology)
        )
        with self.engine.connect() as c:
            rows = c.execute(sa.union_all(depth, idle)).all()
        return (
            {cid: int(n) for k, cid, _, n in rows if k == "d"},
            {(cid, top): int(n) for k, cid, top, n in rows if k == "i"},
        )

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
        j, q, m = t.jobs, t.queue_state, t.task_queue
        known = known_specs if isinstance(known_specs, (set, frozenset, dict)) else set(known_specs)  # no copy per round
        cols = [c for c in j.c if c.name != "spec"]
        with self.engine.connect() as c:
            if clusters is None:
                clusters = [_row(Cluster, r) for r in c.execute(t.clusters.select().order_by(t.clusters.c.name)).all()]
            cluster = next((x for x in clusters if x.name == cluster_name), None)
            if cluster is None:
                return QueueRead(clusters, [], [], "", 0)
            rows = c.execute(self._queue_rows(cluster.id, topology, cols, bool(known), delta)).all()
            newest = 0
            if delta is None:  # the queue's newest assignment, live or not (an index's last entry)
                newest = c.execute(sa.select(sa.func.max(m.c.seq)).where(m.c.cluster_id == cluster.id, m.c.topology == topology)).scalar() or 0
            unknown = sorted({r.id for r in rows if r.id not in known and not r.spec})
            specs: dict[int, str] = {}
            for i in range(0, len(unknown), 1000):
                specs.update(c.execute(sa.select(j.c.id, j.c.spec).where(j.c.id.in_(unknown[i : i + 1000]))).all())
            leases = c.execute(self._queue_leases(cluster.id, topology)).all() if with_leases else None
            granted = None
            if with_granted:
                granted = c.execute(
                    sa.select(q.c.last_granted_actor).where(q.c.cluster_id == cluster.id, q.c.topology == topology)
                ).first()
        tasks, seq, entries = self._queue_tasks_of(rows, [c.name for c in cols], specs, int(newest))
        leases_read = [_row(Lease, r) for r in leases] if leases is not None else None
        return QueueRead(clusters, tasks, leases_read, granted[0] if granted else "", seq, entries)

    def _queue_rows(self, cluster_id: str, topology: str, cols, specs_known: bool, delta: tuple[int, Iterable[int]] | None):
        """``queue_snapshot``'s one statement for the task rows (see there)."""
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
                sa.select(*cols, spec, m.c.seq, entered.label("entered"), disrupted.label("disrupted"))
                .select_from(j.join(m, sa.and_(m.c.task_id == j.c.id, m.c.cluster_id == j.c.cluster_id)))
                .where(j.c.cluster_id == cluster_id, m.c.cluster_id == cluster_id, m.c.topology == topology, j.c.status.in_(live))
            )

        if delta is None:
            return base(not specs_known).order_by(j.c.id)
        # what others change in a queue's rows: the upper layer aborts (Aborting), the
        # poller and other queues add Waiting tasks (a new seq); every other move is this
        # queue's own and its ids are in ``ids``
        after, ids = delta[0], sorted(set(delta[1]))
        parts = [self._queue_rows_in(cluster_id, topology, cols, [Status.ABORTING.value, Status.RUNNING.value])]
        parts.append(base(True).where(m.c.seq > after))
        if ids:
            parts.append(base(False).where(j.c.id.in_(ids)))
        return sa.union_all(*parts)

    @staticmethod
    def _queue_tasks_of(rows, names: list[str], specs: dict[int, str], newest: int):
        """The tasks of ``_queue_rows``' rows (a row with its spec wins over one without), in
        id order, the newest ``seq`` among them and ``newest``, and the ``QueueRead.entries``
        of the rows read with their spec."""
        tasks: dict[int, Task] = {}
        entries: dict[int, tuple[dt.datetime | None, bool]] = {}
        seq, n = newest, len(names)
        for r in rows:
            spec, row_seq, entered, disrupted = r[n:]
            if r[0] not in tasks or spec:
                tasks[r[0]] = Task(spec=spec or specs.get(r[0], ""), **dict(zip(names, r[:n], strict=True)))
            if disrupted is not None:
                entries[r[0]] = (entered, bool(disrupted))
            seq = max(seq, int(row_seq))
        return sorted(tasks.values(), key=lambda x: x.id), seq, entries

    @staticmethod
    def _queue_rows_in(cluster_id: str, topology: str, cols, statuses: list[str]):
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
        return sa.select(*cols, sa.literal("").label("spec"), seq.label("seq"), entered.label("entered"), disrupted.label("disrupted")).where(
            j.c.cluster_id == cluster_id, j.c.status.in_(statuses), seq.is_not(None)
        )

    @staticmethod
    def _queue_leases(cluster_id: str, topology: str):
        """A queue's live leases, and every lease row (Deleted too) of the cluster's
        acquiring tasks: the refused ones are the durable record of a capacity wait, and no
        new create may reuse the name of any of them (a lease row is adopted by its name)."""
        j, L = t.jobs, t.node_pool_leases
        acquiring = sa.select(j.c.id).where(
            j.c.cluster_id == cluster_id,
            j.c.status == Status.PENDING.value,
            j.c.reason.in_([r.value for r in lc.ACQUIRING]),
        )
        return (
            L.select()
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
            return [_row(Lease, r) for r in c.execute(self._queue_leases(cluster_id, topology)).all()]

    def other_topology_waiting(self, cluster_id: str, topology: str) -> bool:
        """Whether a task of another topology of the cluster is Pending in its queue (it
        contends for the cluster's nodes). Stops at the first such row. Found from the other
        topologies' ``falcon_task_queue`` ranges (two, on each side of this one), never
        from the cluster's Pending rows, which are mostly this queue's own waiting tasks."""
        j, m = t.jobs, t.task_queue
        q = (
            sa.select(j.c.id)
            .select_from(m.join(j, sa.and_(m.c.task_id == j.c.id, m.c.cluster_id == j.c.cluster_id)))
            .where(
                m.c.cluster_id == cluster_id,
                sa.or_(m.c.topology < topology, m.c.topology > topology),
                j.c.cluster_id == cluster_id,
                j.c.status == Status.PENDING.value,
                j.c.reason != "",
            )
            .limit(1)
        )
        with self.engine.connect() as c:
            return c.execute(q).first() is not None

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
            mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
            c.exec_driver_sql(
                f"{verb} INTO {m.name} (task_id, cluster_id, topology) VALUES ({mark}, {mark}, {mark})",
                [(r["task_id"], r["cluster_id"], r["topology"]) for r in rows],
            )
            return
        c.execute(m.delete().where(m.c.task_id.in_([r["task_id"] for r in rows])))
        c.execute(m.insert(), rows)

    def live_tasks(self, cluster_id: str | None = None) -> list[Task]:
        """Non-terminal tasks, of one cluster or of all, oldest first."""
        j = t.jobs
        live = [s.value for s in lc.NON_TERMINAL]
        q = j.select().where(j.c.status.in_(live))
        if cluster_id is not None:
            q = q.where(j.c.cluster_id == cluster_id)
        with self.engine.connect() as c:
            rows = c.execute(q.order_by(j.c.id)).all()
        return [_row(Task, r) for r in rows]

    # --- tasks: compare-and-set moves ------------------------------------------------

    @staticmethod
    def _phase_predicate(expect: Sequence[Phase]):
        j = t.jobs
        by_status: dict[Status, set[str]] = {}
        for p in expect:
            by_status.setdefault(p.status, set()).add(p.reason.value)
        clauses = []
        for st, reasons in by_status.items():
            if st in (Status.PENDING, Status.FAILED):
                clauses.append(sa.and_(j.c.status == st.value, j.c.reason.in_(sorted(reasons))))
            else:
                clauses.append(j.c.status == st.value)
        return sa.or_(*clauses)

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
        for src in expect:
            if not lc.allowed(src, to):
                raise IllegalTransition(f"{src} -> {to} is not in the lifecycle table")
        now = self.clock()
        values: dict[str, Any] = dict(status=to.status.value, reason=to.reason.value, message=_clip(message), updated_at=now)
        if to.status in lc.TERMINAL:
            values.setdefault("finished_at", now)
        if to == lc.ABORTED:
            values["aborted_at"] = now
        values.update(fields)
        # A self-loop edge (e.g. ClusterBusy -> ClusterBusy) only refreshes the row: the
        # event log records status/reason changes, so a move out of another phase is tried
        # first and logged, and a row already in ``to`` is updated without an event.
        moving = [p for p in expect if p != to]
        staying = len(moving) < len(expect)
        won = False
        with self._tx() as c:
            if moving:
                res = self._write(
                    c, t.jobs.update().where(t.jobs.c.id == task_id, self._phase_predicate(moving)).values(**values)
                )
                won = res.rowcount == 1
                if won and to == lc.ABORTED:
                    self._record_abort_request(c, task_id, now, self.epoch)
                if won:
                    self._event(c, task_id, now, to, message)
                    if fields.get("cluster_id") is not None:
                        self._enqueue(c, [(task_id, fields["cluster_id"], topology)])
            moved = won
            if not won and staying:
                res = self._write(
                    c, t.jobs.update().where(t.jobs.c.id == task_id, self._phase_predicate([to])).values(**values)
                )
                won = res.rowcount == 1
        return WriteResult(True, values, now, moved) if won else LOST

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
                dict(task_id=m[0], at=now, status=m[2].status.value, reason=m[2].reason.value, message=_clip(m[3]), epoch=self.epoch)
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
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
        sets, params = [f"status = {mark}", f"reason = {mark}", f"updated_at = {mark}"], [to.status.value, to.reason.value, now]
        if to.status in lc.TERMINAL and "finished_at" not in keys:
            sets.append(f"finished_at = {mark}")
            params.append(now)
        for col, pick in [("message", lambda m: _clip(m[3]))] + [(key, lambda m, key=key: m[4][key]) for key in keys]:
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
        c.execute(
            t.task_events.insert().values(
                task_id=task_id, at=at, status=to.status.value, reason=to.reason.value, message=_clip(message), epoch=self.epoch
            )
        )

    @staticmethod
    def _record_abort_request(c, task_id: int, now, epoch: int | None) -> None:
        """The upper layer may set Aborting with its own SQL, writing no event; the audit
        trail still gets its Aborting step, at ``aborting_at``, before the Aborted one."""
        e = t.task_events
        seen = c.execute(
            sa.select(e.c.id).where(e.c.task_id == task_id, e.c.status == Status.ABORTING.value).limit(1)
        ).first()
        if seen is None:
            at = c.execute(sa.select(t.jobs.c.aborting_at).where(t.jobs.c.id == task_id)).scalar() or now
            c.execute(e.insert().values(task_id=task_id, at=at, status=Status.ABORTING.value, reason="", message="", epoch=epoch))

    def update_task(self, task_id: int, expect: Phase | Sequence[Phase], message: str | None = None, **fields: Any) -> WriteResult:
        """Change message and/or bookkeeping columns without changing the phase (CAS on phase)."""
        expect = [expect] if isinstance(expect, Phase) else list(expect)
        now = self.clock()
        values: dict[str, Any] = dict(fields, updated_at=now)
        if message is not None:
            values["message"] = _clip(message)
        with self.engine.begin() as c:
            res = self._write(c, t.jobs.update().where(t.jobs.c.id == task_id, self._phase_predicate(expect)).values(**values))
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
            by_phase.setdefault(ph, []).append((tid, _clip(msg)))
        changed = 0
        # driver-level SQL with positional markers: building (or even parsing the bind names
        # of) 500 CASE branches costs more than the statement itself
        mark = "?" if self.engine.dialect.paramstyle == "qmark" else "%s"
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
                message=_clip(message),
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
        reasons = [r.value for r in reasons]
        q = sa.select(j.c.cluster_id, j.c.spec).where(
            j.c.status == Status.PENDING.value, j.c.reason.in_(reasons), j.c.cluster_id.in_(ids)
        )
        out: dict[tuple[str, str], int] = {}
        with self.engine.connect() as c:
            for cid, text in c.execute(q).all():
                try:
                    topology = str(json.loads(text).get("topology", ""))
                except (ValueError, AttributeError):
                    continue
                out[(cid, topology)] = out.get((cid, topology), 0) + 1
        return out

    def events(self, task_id: int) -> list[TaskEvent]:
        e = t.task_events
        with self.engine.connect() as c:
            rows = c.execute(e.select().where(e.c.task_id == task_id).order_by(e.c.id)).all()
        return [_row(TaskEvent, r) for r in rows]

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
            by_task.setdefault(int(r.task_id), []).append(_row(TaskEvent, r))
        return [(tid, mode, spec, by_task.get(tid, [])) for tid, (mode, spec) in sorted(seen.items())]

    def events_since(self, since: dt.datetime) -> list[TaskEvent]:
        e = t.task_events
        with self.engine.connect() as c:
            rows = c.execute(e.select().where(e.c.at >= since).order_by(e.c.id)).all()
        return [_row(TaskEvent, r) for r in rows]

    # --- node-pool leases ------------------------------------------------------------

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
                        ready_at=None, idle_since=None, deleted_at=None, refused_at=None, refusal="", **row,
                    )
        except sa.exc.IntegrityError:
            pass  # the same name was written before a crash: adopt it
        if lease is None:
            lease = self.get_lease(cluster_id, name)
        assert lease is not None
        return lease

    def get_lease(self, cluster_id: str, name: str) -> Lease | None:
        q = t.node_pool_leases.select().where(
            t.node_pool_leases.c.cluster_id == cluster_id, t.node_pool_leases.c.name == name
        )
        with self.engine.connect() as c:
            r = c.execute(q).first()
        return _row(Lease, r) if r else None

    def leases(self, cluster_id: str | None = None, live_only: bool = True) -> list[Lease]:
        q = t.node_pool_leases.select()
        if cluster_id is not None:
            q = q.where(t.node_pool_leases.c.cluster_id == cluster_id)
        if live_only:
            q = q.where(t.node_pool_leases.c.state != LeaseState.DELETED.value)
        with self.engine.connect() as c:
            rows = c.execute(q.order_by(t.node_pool_leases.c.id)).all()
        return [_row(Lease, r) for r in rows]

    def move_lease(
        self, lease_id: int, expect: LeaseState | Sequence[LeaseState], to: LeaseState, **fields: Any
    ) -> WriteResult:
        """Compare-and-set a lease from one of ``expect`` to ``to``; the result says what it wrote."""
        expect = [expect] if isinstance(expect, LeaseState) else list(expect)
        for src in expect:
            if not lc.lease_allowed(src, to):
                raise IllegalTransition(f"lease {src} -> {to} is not in the lifecycle table")
        now = self.clock()
        values: dict[str, Any] = dict(state=to.value, updated_at=now)
        if to == LeaseState.DELETED:
            values["deleted_at"] = now
        if to == LeaseState.IDLE:
            values.setdefault("idle_since", now)
            values.setdefault("task_id", None)
        values.update(fields)
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

    # --- queue fairness ----------------------------------------------------------------

    def last_granted(self, cluster_id: str, topology: str) -> str:
        q = t.queue_state
        with self.engine.connect() as c:
            r = c.execute(
                sa.select(q.c.last_granted_actor).where(q.c.cluster_id == cluster_id, q.c.topology == topology)
            ).first()
        return r[0] if r else ""

    def set_last_granted(self, cluster_id: str, topology: str, actor: str) -> None:
        """Upsert the queue's last-granted actor in one statement.

        An UPDATE-then-INSERT in one transaction deadlocks on InnoDB when two writers
        race on a missing row (both hold the gap lock), which also drops the savepoint;
        the dialects' native upserts are atomic."""
        q = t.queue_state
        now = self.clock()
        values = dict(cluster_id=cluster_id, topology=topology, last_granted_actor=actor, updated_at=now)
        name = self.engine.dialect.name
        # each dialect's insert is imported for its engine only: PostgreSQL's package alone
        # costs every process that opens a Store ~0.1 CPU-s at start
        if name in ("mysql", "mariadb"):
            from sqlalchemy.dialects.mysql import insert as mysql_insert

            stmt = self._insert(q, values, mysql_insert)
            stmt = stmt.on_duplicate_key_update(last_granted_actor=actor, updated_at=now)
        elif name in ("sqlite", "postgresql"):
            if name == "sqlite":
                from sqlalchemy.dialects.sqlite import insert as ins
            else:
                from sqlalchemy.dialects.postgresql import insert as ins
            stmt = self._insert(q, values, ins)
            stmt = stmt.on_conflict_do_update(
                index_elements=[q.c.cluster_id, q.c.topology],
                set_=dict(last_granted_actor=actor, updated_at=now),
            )
        else:  # pragma: no cover - the dialects above are the ones Falcon supports
            with self.engine.begin() as c:
                res = c.execute(
                    q.update()
                    .where(q.c.cluster_id == cluster_id, q.c.topology == topology)
                    .values(last_granted_actor=actor, updated_at=now)
                )
                if res.rowcount == 0:
                    c.execute(q.insert().values(**values))
            return
        for attempt in range(3):
            try:
                with self.engine.begin() as c:
                    if c.execute(stmt).rowcount == 0 and self.epoch is not None:
                        self._verify_epoch(c)
                return
            except sa.exc.OperationalError as e:  # a deadlock victim may simply retry
                if attempt == 2 or "1213" not in str(getattr(e, "orig", e)):
                    raise

    # --- leader lease ----------------------------------------------------------------

    def acquire_leader(self, holder: str, ttl_s: float, name: str = "controller") -> bool:
        """Take or renew the leader lease; True when ``holder`` holds it afterwards."""
        ll = t.leader_lease
        now = self.clock()
        expires = now + dt.timedelta(seconds=ttl_s)
        with self.engine.begin() as c:
            # a new holder (taking an expired or released lease) bumps the epoch: the fence
            # against every actor of the previous holder; a renewal keeps it
            res = c.execute(
                ll.update()
                .where(ll.c.name == name, sa.or_(ll.c.holder == holder, ll.c.expires_at < now))
                .ordered_values(  # epoch first: MySQL assigns left to right and would see the new holder
                    (ll.c.epoch, ll.c.epoch + sa.case((ll.c.holder == holder, 0), else_=1)),
                    (ll.c.holder, holder),
                    (ll.c.expires_at, expires),
                    (ll.c.renewed_at, now),
                )
            )
            if res.rowcount == 1:
                return True
            exists = c.execute(sa.select(ll.c.holder).where(ll.c.name == name)).first()
        if exists:
            return False
        try:
            with self.engine.begin() as c:
                c.execute(ll.insert().values(name=name, holder=holder, expires_at=expires, renewed_at=now, epoch=1))
            return True
        except sa.exc.IntegrityError:
            return False

    def release_leader(self, holder: str, name: str = "controller") -> None:
        """Give the lease up at once. The row stays (holder empty, expired) so the epoch
        keeps growing: the next holder's epoch is newer than every actor started before."""
        ll = t.leader_lease
        now = self.clock()
        with self.engine.begin() as c:
            c.execute(
                ll.update()
                .where(ll.c.name == name, ll.c.holder == holder)
                .values(holder="", expires_at=now - dt.timedelta(seconds=1), renewed_at=now)
            )

    def leader(self, name: str = "controller") -> dict[str, Any] | None:
        """The lease (holder, expires_at, renewed_at, epoch), or None when nobody holds it."""
        ll = t.leader_lease
        with self.engine.connect() as c:
            r = c.execute(ll.select().where(ll.c.name == name)).first()
        return dict(r._mapping) if r and r.holder else None

    def leader_epoch(self, holder: str, name: str = "controller") -> int | None:
        """The epoch of the lease when ``holder`` holds it, else None."""
        ll = t.leader_lease
        with self.engine.connect() as c:
            r = c.execute(sa.select(ll.c.epoch).where(ll.c.name == name, ll.c.holder == holder)).first()
        return int(r[0]) if r else None


for _name, _fn in list(vars(Store).items()):
    if callable(_fn) and not _name.startswith("_") and _name not in ("submit_task", "dispose", "ping"):
        setattr(Store, _name, _rerun_on_disconnect(_fn))
del _name, _fn

__all__ = [
    "Store", "QueueRead", "WriteResult", "DbTimeouts", "clip_message", "Fenced", "Task", "Cluster", "Lease", "TaskEvent", "IllegalTransition", "DEFAULT_DB_URL", "Reason",
]
