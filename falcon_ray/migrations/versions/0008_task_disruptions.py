"""falcon_task_disruptions: each run of a task that the fleet ended, one row per run.

Revision ID: falcon_0008
Revises: falcon_0007

A task's run ends either by the task's own doing (an exit code, OOM: the task fails) or
by the fleet's (host maintenance, a node repaired or lost, flex-start capacity taken back,
the pool gone: the task is recovered with a new attempt, up to its ``max_recoveries``).
A row here is the durable record of the second kind: which run (``attempt``, 0 the
first), what happened, on which node, the Job that ran it and when. The number of rows of
a task is its next attempt, so the row is written before the task leaves the run, and
the key (task_id, attempt) makes writing it twice harmless.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "falcon_0008"
down_revision = "falcon_0007"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=3), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "falcon_task_disruptions",
        sa.Column("task_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False, comment="the run the fleet ended: 0 the first"),
        sa.Column("kind", sa.String(16), nullable=False, comment="maintenance | repair | reclaim | preempted | evicted | pool-lost"),
        sa.Column("node", sa.String(128), nullable=False, server_default=""),
        sa.Column("job", sa.String(64), nullable=False, server_default="", comment="the Job of that run"),
        sa.Column("detail", sa.String(1000), nullable=False, server_default=""),
        sa.Column("at", TS, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=True, comment="leader epoch of the writer"),
    )


def downgrade() -> None:
    op.drop_table("falcon_task_disruptions")
