"""pytest fixtures: databases.

- ``db_url``: an empty database URL, once on SQLite (a file in tmp_path) and once on
  MariaDB/MySQL (a freshly created, uniquely named database, dropped afterwards).
  The MySQL case carries the ``mysql`` marker (``-m "not mysql"`` leaves it out).
  When the server cannot be reached it is skipped locally, but fails when ``CI=true``
  so a broken CI database can never pass as green.
- ``store``: a :class:`falcon_ray.store.Store` on ``db_url``, migrated with the
  reference ``jobs`` table; ``waiting_task(store)`` puts one task in it, Waiting in the
  queue (``STORE_CLUSTER``, 2x2).

The server is ``FALCON_TEST_MYSQL_URL`` (default ``mysql+pymysql://root@127.0.0.1:3306``).
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from falcon_ray import lifecycle as lc
from falcon_ray.store import Store
from falcon_ray.store.migrate import upgrade
from falcon_ray.store.repository import tls_connect_args

STORE_CLUSTER = "00000000-0000-0000-0000-00000000c001"
STORE_SPEC = {"tpu_type": "v6e", "topology": "2x2", "image": "img:1"}


def waiting_task(store: Store, actor: str = "alice") -> int:
    """A new task moved to Waiting in the queue (``STORE_CLUSTER``, 2x2); its id."""
    tid = store.submit_task(actor, STORE_SPEC, name="t")
    assert store.transition(tid, lc.NEW, lc.WAITING, "queued", cluster_id=STORE_CLUSTER, topology="2x2")
    return tid


MYSQL_SERVER_URL = os.environ.get("FALCON_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306")
_PREFIX = "falcon_test_"
_NAME_RE = re.compile(rf"^{_PREFIX}(\d+)_[0-9a-f]+$")
_reachable: dict[str, str | None] = {}  # server url -> None when reachable, else the error


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def _server_engine() -> sa.Engine:
    args = {"connect_timeout": 5, "read_timeout": 10, "write_timeout": 10, **tls_connect_args(MYSQL_SERVER_URL)}
    return sa.create_engine(MYSQL_SERVER_URL, poolclass=NullPool, connect_args=args)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_server() -> str | None:
    """None when the server answers; the error text otherwise. Also drops databases
    left behind by test processes that died before their teardown."""
    if MYSQL_SERVER_URL in _reachable:
        return _reachable[MYSQL_SERVER_URL]
    try:
        engine = _server_engine()
        with engine.connect() as conn:
            names = [r[0] for r in conn.exec_driver_sql("SHOW DATABASES")]
            for name in names:
                m = _NAME_RE.match(name)
                if m and not _pid_alive(int(m.group(1))):
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        engine.dispose()
        _reachable[MYSQL_SERVER_URL] = None
    except Exception as e:  # any failure to reach or use the server
        _reachable[MYSQL_SERVER_URL] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return _reachable[MYSQL_SERVER_URL]


def _drop(name: str) -> None:
    engine = _server_engine()
    try:
        with engine.connect() as conn:
            # a connection someone forgot to close would make DROP wait on its locks
            me = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
            rows = conn.exec_driver_sql(
                "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> %s", (name, me)
            ).all()
            for (pid,) in rows:
                with contextlib.suppress(sa.exc.DBAPIError):
                    conn.exec_driver_sql(f"KILL CONNECTION {int(pid)}")
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        engine.dispose()


@contextlib.contextmanager
def fresh_mysql_database() -> Iterator[str]:
    """Create a uniquely named empty database, yield its URL, drop it afterwards.

    Skips (or, with CI=true, fails) when the server is unreachable."""
    problem = _check_server()
    if problem is not None:
        msg = f"MariaDB/MySQL at {MYSQL_SERVER_URL} is unreachable ({problem})"
        if in_ci():
            pytest.fail(msg + "; CI=true requires it", pytrace=False)
        pytest.skip(msg)
    name = f"{_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:10]}"
    engine = _server_engine()
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        engine.dispose()
    try:
        yield f"{MYSQL_SERVER_URL.rstrip('/')}/{name}?charset=utf8mb4"
    finally:
        _drop(name)


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def db_url(request, tmp_path) -> Iterator[str]:
    """An empty database: SQLite file, or a fresh MariaDB/MySQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'falcon.db'}"
    else:
        with fresh_mysql_database() as url:
            yield url


@pytest.fixture
def store(db_url) -> Iterator[Store]:
    """A Store on ``db_url`` with every table, the reference ``jobs`` table included."""
    upgrade(db_url, with_jobs_table=True)
    s = Store(db_url)
    try:
        yield s
    finally:
        s.dispose()
