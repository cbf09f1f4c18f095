"""Alembic environment for Falcon-Ray's own migrations.

Run through :func:`falcon_ray.store.migrate.upgrade`, which hands over an open
connection in ``config.attributes["connection"]``; no ini file and no URL live on
disk. Falcon keeps its revision bookkeeping in its own version table so that it
never collides with the upper layer's Alembic history in a shared database.
"""

from __future__ import annotations

from alembic import context

from falcon_ray.store.migrate import VERSION_TABLE, include_name
from falcon_ray.store.tables import metadata

config = context.config


def _record(ctx, step, heads, run_args) -> None:  # noqa: ARG001 - Alembic's callback signature
    if step.is_upgrade:
        config.attributes.setdefault("applied", []).append(step.up_revision_id)


def run() -> None:
    if context.is_offline_mode():
        raise RuntimeError("Falcon-Ray migrations run online only (falcon-ray db upgrade)")
    connection = config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("no connection given; run migrations through falcon_ray.store.migrate.upgrade")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        on_version_apply=_record,
        compare_type=True,
        compare_server_default=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run()
