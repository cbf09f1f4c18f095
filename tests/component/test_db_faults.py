"""Database faults on MariaDB: killed connections and an outage; nothing lost, no task failed.

- ``KILL`` of a connection in the middle of a Store method: the method is run again
  on a fresh connection and returns as if nothing happened (fails without the rerun).
- ``KILL`` of every pooled connection while idle: pre-ping replaces them.
- An outage (a loopback TCP proxy in front of MariaDB, stopped for a few seconds):
  the real poller loop keeps failing its steps, the health report says the database
  is unreachable, and after the proxy is back every task submitted meanwhile is
  assigned; none is Failed.
"""

from __future__ import annotations

import contextlib
import logging
import time
import types

import pytest
import sqlalchemy as sa

from actors.poller import IntakePoller
from actors.ticker import Ticker
from falcon_ray import health
from falcon_ray import lifecycle as lc
from falcon_ray.config import Settings
from falcon_ray.sim.tcp_proxy import TcpProxy
from falcon_ray.store import Store
from falcon_ray.store.migrate import upgrade
from tests.harness.db import MYSQL_SERVER_URL, fresh_mysql_database
from tests.harness.fakes import FakePort

pytestmark = pytest.mark.mysql
SPEC = {"tpu_type": "v6e", "topology": "2x2", "image": "img:1", "command": ["run"]}


@pytest.fixture
def mysql_url():
    with fresh_mysql_database() as url:
        upgrade(url, with_jobs_table=True)
        yield url


def _admin():
    return sa.create_engine(MYSQL_SERVER_URL, poolclass=sa.pool.NullPool)


def _kill_all(db_name: str) -> int:
    eng = _admin()
    n = 0
    try:
        with eng.connect() as c:
            me = c.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
            for (pid,) in c.exec_driver_sql(
                "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> %s", (db_name, me)
            ).all():
                with contextlib.suppress(sa.exc.DBAPIError):
                    c.exec_driver_sql(f"KILL CONNECTION {int(pid)}")
                    n += 1
    finally:
        eng.dispose()
    return n


def test_a_connection_killed_mid_method_is_rerun_on_a_fresh_one(mysql_url):
    st = Store(mysql_url)
    cluster = st.add_cluster("edge-a", "p", "us-east5-b", "v6e")
    tid = st.submit_task("alice", SPEC)
    killed = []

    @sa.event.listens_for(st.tx_engine, "before_cursor_execute")  # a task move's transaction
    def _kill_once(conn, cursor, statement, *_a):
        if not killed and statement.lstrip().upper().startswith("UPDATE JOBS"):
            cid = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
            eng = _admin()
            with eng.connect() as c:
                c.exec_driver_sql(f"KILL CONNECTION {int(cid)}")
            eng.dispose()
            killed.append(cid)

    try:
        assert st.transition(tid, lc.NEW, lc.WAITING, "waiting", cluster_id=cluster.id)
        assert killed and st.disconnects == 1
        t = st.get_task(tid)
        assert t.phase == lc.WAITING and t.cluster_id == cluster.id
        assert [e.reason for e in st.events(tid)] == ["", "Waiting"]  # one event, not two
    finally:
        st.dispose()


def test_pooled_connections_killed_while_idle_are_replaced(mysql_url):
    st = Store(mysql_url)
    try:
        st.add_cluster("edge-a", "p", "us-east5-b", "v6e")
        tid = st.submit_task("alice", SPEC)
        assert _kill_all(sa.engine.make_url(mysql_url).database) >= 1
        assert st.get_task(tid).status == "Pending"
        assert st.transition(tid, lc.NEW, lc.WAITING, "waiting", cluster_id=st.list_clusters()[0].id)
    finally:
        st.dispose()


@pytest.mark.timeout(120)
def test_an_outage_is_waited_out_and_nothing_is_lost(mysql_url):
    url = sa.engine.make_url(mysql_url)
    proxy = TcpProxy(url.port or 3306)
    proxy.start()
    via_proxy = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    direct = Store(mysql_url)  # the upper layer keeps writing, straight to the server
    direct.add_cluster("edge-a", "p", "us-east5-b", "v6e", default_reservation="res-a")
    st = Store(via_proxy)
    settings = Settings(poll_interval_s=0.1)
    poller = IntakePoller(settings, st, FakePort())
    ticker = Ticker("poll", poller.poll_once, poller.interval, logging.getLogger("test.poller"))
    sup = types.SimpleNamespace(holder="test", store=st, leader=True, lease_renewed_at=None, known={}, s=settings, actor_names=lambda: [])
    try:
        before = [direct.submit_task("alice", SPEC) for _ in range(3)]
        _until(lambda: all(direct.get_task(t).phase == lc.WAITING for t in before), 20)
        assert health.check(sup)["database"]["ok"]

        proxy.stop()  # the database is gone for the controller
        during = [direct.submit_task("bob", SPEC) for _ in range(3)]
        _until(lambda: ticker.last_error != "", 20)
        report = health.check(sup)
        assert report["database"]["ok"] is False and not report["healthy"]
        assert "OperationalError" in report["database"]["error"]
        time.sleep(3)  # wall-clock: a real MariaDB outage behind a loopback TCP proxy, a few seconds (the soak's is 30 s)
        assert all(direct.get_task(t).phase == lc.NEW for t in during)

        proxy.start()  # back on the same port
        _until(lambda: all(direct.get_task(t).phase == lc.WAITING for t in during), 30)
        _until(lambda: ticker.last_error == "", 10)
        assert health.check(sup)["database"]["ok"]
        tasks = direct.get_tasks(before + during)
        assert [t.phase for t in tasks] == [lc.WAITING] * 6, [(t.id, t.phase, t.message) for t in tasks]
        assert all(len(direct.events(t.id)) == 2 for t in tasks)  # Pending, Waiting: nothing twice
    finally:
        ticker.drain(10)
        proxy.stop()
        st.dispose()
        direct.dispose()


def _until(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout  # wall-clock: waits on a real Ticker thread and a real MariaDB
    while not cond():
        assert time.monotonic() < deadline, "timed out"  # wall-clock: a bound, not a timing claim
        time.sleep(0.1)  # wall-clock: polls a real database


def test_a_server_that_never_answers_fails_the_call_within_the_read_timeout():
    """A connection the server (or the network) leaves hanging: the driver's default is to
    wait forever, which would stop an actor's loop for good. With the timeouts it fails,
    as a lost connection, and the actor's next tick tries again."""
    import socket
    import threading

    from falcon_ray.store import DbTimeouts

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does), never says a word
    port = silent.getsockname()[1]
    store = Store(f"mysql+pymysql://falcon@127.0.0.1:{port}/falcon", timeouts=DbTimeouts(connect_s=1, read_s=0.5, write_s=0.5))
    outcome: list[BaseException | bool] = []

    def call() -> None:
        try:
            outcome.append(store.ping())
        except Exception as e:
            outcome.append(e)

    started = time.monotonic()  # wall-clock: the driver's read timeout on a real socket
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(10)
    try:
        assert not worker.is_alive(), "the call hung on a server that never answers"
        assert isinstance(outcome[0], Exception) and "timed out" in str(outcome[0]).lower(), outcome
        assert time.monotonic() - started < 5  # wall-clock: the socket read timeout (0.5 s) is the machine's
    finally:
        silent.close()
        store.dispose()
