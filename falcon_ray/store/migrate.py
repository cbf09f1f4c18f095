"""Schema migrations, run programmatically (no alembic.ini on disk).

Contract
--------
``upgrade(url, with_jobs_table=False)`` brings a database to the newest schema and
returns the revisions it applied (an empty list when there was nothing to do, so a
second run is a no-op). Two independent Alembic branches live in
``falcon_ray/migrations/versions``:

- ``falcon``: Falcon's own tables (``clusters`` and the ``falcon_*`` tables), always;
- ``jobs``: the reference ``jobs`` table of the upper layer, only when asked for.

Both are recorded in Falcon's own version table (``falcon_alembic_version``), so an
upper layer that runs Alembic with the default ``alembic_version`` table in the same
database is never disturbed. ``drift(url)`` compares a database with
``store.tables.metadata`` the way ``alembic revision --autogenerate`` would, and
``missing_tables(url)`` tells the CLI whether a database was ever migrated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.pool import NullPool

from falcon_ray.store import tables as t
from falcon_ray.store.core import tls_connect_args

VERSION_TABLE = "falcon_alembic_version"
SCRIPT_LOCATION = str(Path(__file__).resolve().parent.parent / "migrations")
FALCON_BRANCH = "falcon"
JOBS_BRANCH = "jobs"


def include_name(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """Look only at the tables ``tables.py`` declares; ignore everything else in the database."""
    if type_ == "table":
        return name in t.metadata.tables
    return True


def alembic_config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url, poolclass=NullPool, connect_args=tls_connect_args(url))


def heads() -> dict[str, str]:
    """The newest revision of each branch, by branch label."""
    script = ScriptDirectory.from_config(alembic_config())
    out: dict[str, str] = {}
    for rev in script.get_revisions("heads"):
        for label in rev.branch_labels:
            out[label] = rev.revision
    return out


def current(url: str) -> list[str]:
    """The revisions recorded in the database (empty when never migrated)."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return sorted(ctx.get_current_heads())
    finally:
        engine.dispose()


def upgrade(url: str, with_jobs_table: bool = False) -> list[str]:
    """Apply every missing revision of Falcon's branch (and of the jobs branch when asked)."""
    targets = [f"{FALCON_BRANCH}@head"] + ([f"{JOBS_BRANCH}@head"] if with_jobs_table else [])
    engine = _engine(url)
    applied: list[str] = []
    try:
        for target in targets:
            with engine.begin() as conn:
                cfg = alembic_config(conn)
                command.upgrade(cfg, target)
                applied.extend(cfg.attributes.get("applied", []))
    finally:
        engine.dispose()
    return applied


def _same_default(context, inspected_column, metadata_column, inspected_default, metadata_default, rendered):
    """Compare server defaults by value: Alembic's own check misreads SQLite's ``DEFAULT ''``."""
    if metadata_column.server_default is None or inspected_default is None:
        return None  # let Alembic decide (it reports a default added or dropped)
    want = str(getattr(metadata_column.server_default, "arg", ""))
    got = inspected_default.strip()
    while got.startswith("(") and got.endswith(")"):
        got = got[1:-1].strip()
    if len(got) >= 2 and got[0] == got[-1] and got[0] in "'\"":
        got = got[1:-1]
    return got != want


def drift(url: str, with_jobs_table: bool = True) -> list[Any]:
    """Differences between the database and ``tables.metadata`` (empty when they agree)."""
    target = t.metadata
    if not with_jobs_table:
        target = sa.MetaData()
        for table in t.FALCON_TABLES:
            table.to_metadata(target)
    wanted = set(target.tables)

    def _include(name, type_, parent_names):
        return name in wanted if type_ == "table" else True

    engine = _engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "compare_server_default": _same_default,
                    "include_name": _include,
                    "version_table": VERSION_TABLE,
                },
            )
            return compare_metadata(ctx, target)
    finally:
        engine.dispose()


def missing_tables(url: str, with_jobs_table: bool = True) -> list[str]:
    """Tables of ``tables.py`` absent from the database, Falcon's first, then ``jobs``."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            have = set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()
    wanted = [tb.name for tb in t.FALCON_TABLES] + ([t.jobs.name] if with_jobs_table else [])
    return [name for name in wanted if name not in have]
