"""The Store's shared core: engines, transactions, fencing, reruns, dialects, counting.

Every part of the Store (``tasks``, ``task_moves``, ``queues``, ``leases``, ``registry``,
``events``, ``leader``) is a mixin over ``StoreCore`` and writes only through it.

Transactions
------------
Each public method is one short transaction; nothing holds a connection between calls,
so any process may die at any line. On MySQL the connections run in driver autocommit:
a read or a one-statement write is one statement on the wire (no ROLLBACK or COMMIT
after it), and a write of several statements runs in ``_tx`` on a second pool whose
connections are not in autocommit: its first statement opens the transaction, one
COMMIT ends it (no BEGIN is sent), and it is rolled back whole when a statement in it
fails. On SQLite both are one engine (WAL, one writer at a time).

Database faults
---------------
MySQL connections are opened and used with timeouts (``DbTimeouts``: connect, read,
write; the actors take them from Settings ``db_*_timeout_s``): a server that stops
answering mid-statement fails the statement with a disconnect instead of blocking its
thread forever. Connections are checked out with ``pool_pre_ping`` (a connection the
server dropped while idle is replaced before use). A public method whose statement meets
a disconnect anyway (``DBAPIError.connection_invalidated``) is run again, whole, on a
fresh connection, up to ``DISCONNECT_RETRIES`` times (``rerun_on_disconnect``); every
method is one short transaction whose writes are compare-and-set or idempotent by name,
so a rerun after a commit whose answer was lost just loses its compare-and-set ("re-read
and decide again"). A method that is not idempotent (``submit_task``, the upper layer's
insert) is not rerun. When the database stays unreachable the error propagates: the
actors' loops log it, keep their state and try again at their next tick.
``disconnects`` counts the reruns.

Fencing
-------
The leader lease row (``falcon_leader_lease``, name ``controller``) carries an ``epoch``
that grows by one with each new holder (``leader.acquire_leader``). A Store built with
``epoch=N`` (the actors' stores) adds ``EXISTS (SELECT 1 FROM falcon_leader_lease WHERE
name = 'controller' AND epoch = N)`` to every task, lease, registry-ledger and
queue-state write it makes (``_fenced``: UPDATEs get it in their WHERE clause;
``_insert``: INSERTs become INSERT ... SELECT ... WHERE it), so the check and the write
are one statement: on InnoDB the subquery takes a shared lock on the lease row that a
newer holder's UPDATE waits for; on SQLite the statement runs under the database's write
lock. A guarded write that changes no row reads the lease once (``_verify_epoch``): when
its epoch is no longer ``N`` the Store records why in ``fenced`` and raises ``Fenced``;
every later write raises at once without SQL. A Store without an epoch (CLI, upper
layer, tests) writes unguarded. The hot writes are built once per Store, shape and
epoch (``_write_built``): the guard is part of the statement built, for that epoch.

``check_fence(max_age_s)`` is the same check for callers about to act outside the
database (GKE, Kubernetes). A lease read that shows this Store's epoch held answers it
without SQL until ``expires_at`` less ``FENCE_MARGIN_S`` on this Store's clock: no other
controller can hold the lease before it expires (``acquire_leader`` takes it from
another holder only once ``expires_at`` has passed on the taker's clock; the only other
way, ``release_leader``, is called by a controller after it stopped its own actors).
The margin covers the two hosts' clocks and a call already under way. Every write keeps
its guard in the statement whatever ``check_fence`` answered.

Counting
--------
``statements`` counts the SQL statements this Store sent (COMMIT and ROLLBACK included,
which is what MySQL's ``Questions`` counts; a ping is not a statement); ``breakdown``
counts them by the public method that sent them (the outermost one of the calling
thread, ``-`` outside any) and kind (SELECT, INSERT, UPDATE, DELETE, COMMIT, ...), keyed
``"method KIND"``. ``observe_statements(fn)`` adds a process-wide observer that every
Store of the process calls as ``fn(store, method, kind)`` for each statement it counts
(a profiler's seam: the Store knows nothing of what the observer does with it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from falcon_ray.clock import SYSTEM
from falcon_ray.messages import MAX_MESSAGE
from falcon_ray.store import tables as t

DEFAULT_DB_URL = "sqlite:///falcon.db"
LEADER = "controller"  # the name of the leader lease row every fenced write checks


def utcnow() -> dt.datetime:
    """The machine's wall time as the database stores it (naive UTC, milliseconds)."""
    return SYSTEM.now()


class IllegalTransition(ValueError):
    """A move that is not in ``lifecycle``'s tables; raised before any SQL."""


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


def row_value(cls, row) -> Any:
    """A frozen value of dataclass ``cls`` from a row that has (at least) its fields."""
    return cls(**{k: row._mapping[k] for k in cls.__dataclass_fields__})


def field_columns(table: sa.Table, cls) -> list[sa.Column]:
    """``table``'s columns named by dataclass ``cls``'s fields, in the fields' order: what
    a read selects first for ``row_values``."""
    return [table.c[name] for name in cls.__dataclass_fields__]


def one_of(column, values) -> Any:
    """``column IN (values)`` with the values as constants of the statement: the SQL of
    ``column.in_(values)``, whose list SQLAlchemy would expand again at each execution."""
    return column.in_([sa.literal(v, column.type) for v in values])


def row_values(cls, rows) -> list[Any]:
    """Frozen values of dataclass ``cls``, one per row whose leading columns are its fields
    in their order (``field_columns``): equal to ``cls(*row[:n])``. The generated
    ``__init__`` of a frozen dataclass sets each field through ``object.__setattr__``;
    this fills the value's dict at once and runs its ``__post_init__`` as ``__init__``
    does (a queue's read makes hundreds of them per round)."""
    names = tuple(cls.__dataclass_fields__)
    post = getattr(cls, "__post_init__", None)
    new = object.__new__
    out = []
    for r in rows:
        value = new(cls)
        value.__dict__.update(zip(names, r, strict=False))  # a row may carry more columns after them
        if post is not None:
            post(value)
        out.append(value)
    return out


def clip_message(message: str) -> str:
    """The Message as the store writes it: at most ``MAX_MESSAGE`` characters."""
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


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
            # its paired moves join two guarded one-row tables with no join condition on purpose
            kwargs.update(pool_size=1, max_overflow=3, enable_from_linting=False)
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


def rerun_on_disconnect(fn, retries: int = DISCONNECT_RETRIES):
    """Run a Store method again, whole, when its connection turned out to be dead (at most
    ``retries`` times); the outermost such method of a thread names the statements it sends
    (``breakdown``)."""

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        calling = self._calling
        outer = getattr(calling, "method", None) is None
        if outer:
            calling.method = fn.__name__
        try:
            for attempt in range(retries + 1):
                try:
                    return fn(self, *args, **kwargs)
                except sa.exc.DBAPIError as e:
                    if not e.connection_invalidated or attempt == retries:
                        raise
                    self.disconnects += 1
        finally:
            if outer:
                calling.method = None

    return method


def rerun_public_methods(cls: type, not_rerun: frozenset[str]) -> type:
    """Wrap every public method of ``cls`` (its own and its bases') in
    ``rerun_on_disconnect``, on ``cls`` itself, except those in ``not_rerun``, which still
    name their statements but run once."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        for name, fn in vars(klass).items():
            if name.startswith("_") or name in seen or not callable(fn) or isinstance(fn, (staticmethod, type)):
                continue
            seen.add(name)
            setattr(cls, name, rerun_on_disconnect(fn, 0 if name in not_rerun else DISCONNECT_RETRIES))
    return cls


StatementObserver = Callable[[Any, str, str], None]
_OBSERVERS: list[StatementObserver] = []


def observe_statements(fn: StatementObserver) -> Callable[[], None]:
    """Call ``fn(store, method, kind)`` for every statement any Store of this process
    counts from now on; returns the function that stops it."""
    _OBSERVERS.append(fn)

    def stop() -> None:
        with contextlib.suppress(ValueError):
            _OBSERVERS.remove(fn)

    return stop


class StoreCore:
    """One database, many short transactions. Safe to share between threads."""

    def __init__(self, url: str, clock=utcnow, epoch: int | None = None, timeouts: DbTimeouts | None = None) -> None:
        self.url = url
        self.timeouts = timeouts
        self.engine = make_engine(url, timeouts)
        self.clock = clock  # the wall time of every row written
        self._monotonic = getattr(clock, "monotonic", SYSTEM.monotonic)  # the fence's age
        self.statements = 0
        self.breakdown: dict[str, int] = {}
        self.disconnects = 0  # methods rerun after a disconnect
        self.epoch = epoch  # the leader epoch this Store writes under; None: unfenced
        self.fenced = ""  # why this Store may not write any more, once known
        self._fence_checked_at = 0.0
        self._fence_holds_until: dt.datetime | None = None  # the last lease read holds until then (wall time)
        self._calling = threading.local()  # .method: the outermost public method of this thread
        self.autocommit = self.engine.dialect.name in ("mysql", "mariadb")
        self.tx_engine = make_engine(url, timeouts, autocommit=False) if self.autocommit else self.engine
        self._count_statements(self.engine, commits=not self.autocommit)
        if self.tx_engine is not self.engine:
            self._count_statements(self.tx_engine, commits=True)

    def _bump(self, kind: str) -> None:
        self.statements += 1
        method = getattr(self._calling, "method", None) or "-"
        key = f"{method} {kind}"
        self.breakdown[key] = self.breakdown.get(key, 0) + 1
        for fn in _OBSERVERS:
            fn(self, method, kind)

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

    @property
    def _mark(self) -> str:
        """The driver's positional parameter marker, for the statements built as text."""
        return "?" if self.engine.dialect.paramstyle == "qmark" else "%s"

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
        return self._checked(c, c.execute(self._fenced(stmt)))

    def _checked(self, c, res):
        """A guarded write's result; one that changed no row reads the lease (a lost race, or fenced)."""
        if self.epoch is not None and res.rowcount == 0:
            self._verify_epoch(c)
        return res

    def _built(self, key: tuple, build):
        """The statement ``build()`` makes, built once per Store and ``key`` (statements of
        one shape differ only in the values bound at execution): SQLAlchemy memoizes a
        statement object's cache key, so a statement used again is neither built, coerced
        nor walked again, only executed. ``key`` names everything the statement holds as
        a constant."""
        cache = self.__dict__.setdefault("_statements", {})
        stmt = cache.get(key)
        if stmt is None:
            stmt = cache[key] = build()
        return stmt

    def _read_built(self, key: tuple, build, params: dict[str, Any] | None = None) -> list[Any]:
        """The rows of a read built once (``_built``) and executed with ``params`` (its
        per-call values, each a ``bindparam`` of that name), in a connection of its own."""
        stmt = self._built(("read", *key), build)
        with self.engine.connect() as c:
            return c.execute(stmt, params or {}).all()

    def _write_built(self, c, key: tuple, build, params: dict[str, Any]):
        """``_write`` of a statement built once (``_built``) and executed with ``params``:
        ``build()`` makes the unguarded statement, whose every per-call value is a
        ``bindparam`` named in ``params``; the epoch guard is built into it (the cached
        statement is this epoch's), and a Store known to be fenced still refuses at once."""
        if self.epoch is not None and self.fenced:
            raise Fenced(self.fenced)
        stmt = self._built(("write", self.epoch, *key), lambda: self._fenced(build()))
        return self._checked(c, c.execute(stmt, params))

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
        self.engine.dispose()
        if self.tx_engine is not self.engine:
            self.tx_engine.dispose()

    def ping(self) -> bool:
        with self.engine.connect() as c:
            c.execute(sa.text("SELECT 1"))
        return True
