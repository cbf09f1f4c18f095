"""The Alembic migrations create exactly what store/tables.py declares, on both databases."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from falcon_ray.store import migrate
from falcon_ray.store import tables as t

FALCON = {tb.name for tb in t.FALCON_TABLES}


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _exec(url: str, sql: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


def test_full_upgrade_matches_metadata(db_url):
    applied = migrate.upgrade(db_url, with_jobs_table=True)
    assert applied == ["falcon_0001", "falcon_0002", "falcon_0003", "falcon_0004", "falcon_0005", "falcon_0006", "falcon_0007", "falcon_0008", "falcon_0009", "jobs_0001"]  # every revision, in order
    assert set(migrate.heads().values()) <= set(applied)
    assert _tables(db_url) == FALCON | {"jobs", migrate.VERSION_TABLE}
    assert migrate.drift(db_url) == []
    assert migrate.missing_tables(db_url) == []
    assert migrate.current(db_url) == sorted(migrate.heads().values())


def test_second_run_is_a_noop(db_url):
    migrate.upgrade(db_url, with_jobs_table=True)
    assert migrate.upgrade(db_url, with_jobs_table=True) == []
    assert migrate.upgrade(db_url) == []


def test_jobs_table_only_with_the_flag_and_added_later(db_url):
    assert migrate.upgrade(db_url)[-1] == migrate.heads()["falcon"]
    assert _tables(db_url) == FALCON | {migrate.VERSION_TABLE}
    assert migrate.missing_tables(db_url) == ["jobs"]
    assert migrate.missing_tables(db_url, with_jobs_table=False) == []
    assert migrate.drift(db_url, with_jobs_table=False) == []

    assert migrate.upgrade(db_url, with_jobs_table=True) == [migrate.heads()["jobs"]]
    assert "jobs" in _tables(db_url)
    assert migrate.drift(db_url) == []


def test_drift_check_is_not_blind(db_url):
    """Negative control: the comparison used above does notice a missing index."""
    migrate.upgrade(db_url, with_jobs_table=True)
    _exec(db_url, "DROP INDEX ix_jobs_updated ON jobs" if "mysql" in db_url else "DROP INDEX ix_jobs_updated")
    diffs = migrate.drift(db_url)
    assert any(d[0] == "add_index" and d[1].name == "ix_jobs_updated" for d in diffs), diffs


def test_missing_tables_on_an_empty_database(db_url):
    assert migrate.missing_tables(db_url) == [*(tb.name for tb in t.FALCON_TABLES), "jobs"]
    assert migrate.current(db_url) == []


def test_upper_layers_alembic_history_is_left_alone(db_url):
    _exec(db_url, "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
    _exec(db_url, "INSERT INTO alembic_version VALUES ('upper_layer_42')")
    migrate.upgrade(db_url, with_jobs_table=True)
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all() == [
                "upper_layer_42"
            ]
    finally:
        engine.dispose()
    assert migrate.drift(db_url) == []  # tables Falcon does not declare are not its business


def test_existing_jobs_table_is_not_overwritten(db_url):
    engine = sa.create_engine(db_url)
    try:
        t.jobs.create(engine)
    finally:
        engine.dispose()
    migrate.upgrade(db_url)  # Falcon's own branch does not care
    with pytest.raises(RuntimeError, match="already exists"):
        migrate.upgrade(db_url, with_jobs_table=True)


def test_revisions_are_two_independent_branches():
    heads = migrate.heads()
    assert set(heads) == {"falcon", "jobs"}


def test_task_queue_backfilled_from_live_assigned_tasks(db_url):
    """falcon_0007 records the queue of every live task that already has a cluster (from
    its spec), and of no other task, so a queue's first read after the upgrade finds them."""
    import datetime as dt
    import json

    engine = sa.create_engine(db_url)
    now = dt.datetime(2026, 1, 1)
    try:
        t.jobs.create(engine)
        rows = [
            ("Pending", "Waiting", "c-1", "2x4"),
            ("Running", "", "c-1", "2x2"),
            ("Succeeded", "", "c-1", "2x2"),  # finished: no row
            ("Pending", "", None, "2x2"),  # not assigned yet: the poller writes it
        ]
        with engine.begin() as c:
            for status, reason, cid, top in rows:
                spec = json.dumps({"tpu_type": "v6e", "topology": top, "image": "i", "command": ["x"]})
                c.execute(t.jobs.insert().values(actor="a", spec=spec, status=status, reason=reason, cluster_id=cid, created_at=now, updated_at=now))
        migrate.upgrade(db_url)
        with engine.connect() as c:
            got = c.execute(sa.select(t.task_queue.c.task_id, t.task_queue.c.cluster_id, t.task_queue.c.topology).order_by(t.task_queue.c.task_id)).all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in got] == [(1, "c-1", "2x4"), (2, "c-1", "2x2")]
