"""The reference ``jobs`` table (owned by the upper layer; created only with --with-jobs-table).

Revision ID: jobs_0001
Revises: (base of the ``jobs`` branch)

The upper layer defines ``jobs`` in production. This revision exists so that the
demo, the tests and a fresh installation have the exact columns and indexes Falcon
reads and writes. It refuses to run over an existing ``jobs`` table instead of
guessing whether that table matches.

What an upper layer must expect of the rows Falcon writes (docs/schema.md): ``status``
``Pending`` may follow ``Running`` (reason ``Recovering``: the fleet ended the run, a new
attempt comes; ``dispatched_at`` and ``job_uid`` are then cleared and set again for that
attempt), and ``Failed`` has the reason ``Disrupted`` when the fleet ended more runs than
the task's ``max_recoveries``. ``timeout_seconds`` counts per attempt.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "jobs_0001"
down_revision = None
branch_labels = ("jobs",)
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=3), "mysql", "mariadb")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
LONG_TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
MESSAGE = 4000


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("jobs"):
        raise RuntimeError(
            "a jobs table already exists (it belongs to the upper layer); "
            "run the upgrade without --with-jobs-table"
        )
    op.create_table(
        "jobs",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(255), nullable=False, server_default=""),
        sa.Column("actor", sa.String(128), nullable=False, comment="who submitted; the fairness key"),
        sa.Column("spec", LONG_TEXT, nullable=False, comment="TaskSpec JSON text"),
        sa.Column("status", sa.String(16), nullable=False, server_default="Pending"),
        sa.Column("reason", sa.String(32), nullable=False, server_default=""),
        sa.Column("message", sa.String(MESSAGE), nullable=False, server_default=""),
        sa.Column("cluster_id", sa.String(36), nullable=True),
        sa.Column("node_pool_name", sa.String(64), nullable=True),
        sa.Column("job_uid", sa.String(64), nullable=True),
        sa.Column("timeout_seconds", sa.Integer, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("dispatched_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("aborting_at", TS, nullable=True),
        sa.Column("aborted_at", TS, nullable=True),
    )
    op.create_index("ix_jobs_status_cluster", "jobs", ["status", "cluster_id", "id"])
    op.create_index("ix_jobs_cluster_status", "jobs", ["cluster_id", "status"])
    op.create_index("ix_jobs_updated", "jobs", ["updated_at"])


def downgrade() -> None:
    op.drop_table("jobs")
