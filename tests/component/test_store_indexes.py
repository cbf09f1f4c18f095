"""The poll statements documented in docs/schema.md use an index, never a full scan."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa

from falcon_ray.store import tables as t

POLL_SQL = {
    "intake": "SELECT * FROM jobs WHERE status = 'Pending' AND cluster_id IS NULL ORDER BY id LIMIT 500",
    "aborting": "SELECT * FROM jobs WHERE status = 'Aborting' ORDER BY id LIMIT 500",
    "queue re-read": "SELECT * FROM jobs WHERE cluster_id = 'c-1' "
    "AND status IN ('Pending', 'Running', 'Aborting') ORDER BY id",
    "events": "SELECT * FROM falcon_task_events WHERE task_id = 7 ORDER BY id",
    "queue newest seq": "SELECT MAX(seq) FROM falcon_task_queue WHERE cluster_id = 'c-1' AND topology = '2x2'",
    "queue new assignments": "SELECT * FROM falcon_task_queue WHERE cluster_id = 'c-1' AND topology = '2x2' AND seq > 2900",
}


def _fill(engine: sa.Engine, n: int = 3000) -> None:
    rows = []
    for i in range(n):
        status = "Succeeded" if i % 50 else ("Pending" if i % 100 else "Running")
        rows.append(
            {
                "name": "",
                "actor": f"a{i % 7}",
                "spec": "{}",
                "status": status,
                "reason": "",
                "message": "",
                "cluster_id": None if status == "Pending" and i % 3 else f"c-{i % 4}",
            }
        )
    now = dt.datetime(2030, 1, 1)
    with engine.begin() as conn:
        conn.execute(t.jobs.insert(), [dict(r, created_at=now, updated_at=now) for r in rows])
        conn.execute(
            t.task_events.insert(), [{"task_id": i % 500, "at": now, "status": "Pending"} for i in range(n)]
        )
        conn.execute(t.task_queue.insert(), [{"task_id": i + 1, "cluster_id": f"c-{i % 4}", "topology": "2x2"} for i in range(n)])
        # MySQL: fresh statistics, as a long-running server has. SQLite: none, as Falcon
        # never runs ANALYZE there (docs/schema.md says why).
        if engine.dialect.name != "sqlite":
            conn.exec_driver_sql("ANALYZE TABLE jobs, falcon_task_events, falcon_task_queue")


@pytest.mark.parametrize("query", list(POLL_SQL), ids=str)
def test_poll_statements_use_an_index(store, query):
    engine = store.engine
    _fill(engine)
    sql = POLL_SQL[query]
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            plan = [r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
            assert any(p.startswith("SEARCH") and "USING" in p for p in plan), plan
            assert not any(p.startswith(("SCAN jobs", "SCAN falcon_task_events", "SCAN falcon_task_queue")) for p in plan), plan
        else:
            plan = [dict(r._mapping) for r in conn.exec_driver_sql("EXPLAIN " + sql)]
            assert len(plan) == 1, plan
            if "optimized away" in (plan[0].get("Extra") or ""):  # MAX over an index prefix: read from the index
                return
            assert plan[0]["type"] in ("ref", "range", "eq_ref", "const"), plan
            assert plan[0]["key"], plan


def test_documented_sql_is_in_the_doc():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text(encoding="utf-8")
    assert "SELECT ... FROM jobs WHERE status = 'Pending' AND cluster_id IS NULL ORDER BY id LIMIT :n;" in doc
    assert "SELECT ... FROM jobs WHERE status = 'Aborting' ORDER BY id LIMIT :n;" in doc
    assert "WHERE cluster_id = :cluster_id AND status IN ('Pending', 'Running', 'Aborting') ORDER BY id;" in doc
