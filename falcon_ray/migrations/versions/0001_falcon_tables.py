"""Falcon's own tables: cluster registry, node-pool leases, queue fairness, leader lease, task events.

Revision ID: falcon_0001
Revises: (base of the ``falcon`` branch)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "falcon_0001"
down_revision = None
branch_labels = ("falcon",)
depends_on = None

# The column types as they were when this revision was written (kept here, not
# imported, so that a later change to tables.py needs a new revision).
TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=3), "mysql", "mariadb")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
MESSAGE = 4000


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("id", sa.String(36), primary_key=True, comment="UUID"),
        sa.Column("name", sa.String(63), nullable=False, unique=True, comment="GKE cluster name"),
        sa.Column("project", sa.String(63), nullable=False, comment="GCP project id"),
        sa.Column("location", sa.String(63), nullable=False, comment="GKE location (zone or region)"),
        sa.Column("tpu_type", sa.String(16), nullable=False, comment="TPU type offered, e.g. v6e"),
        sa.Column("gcs_bucket", sa.String(222), nullable=False, server_default="", comment="bucket for Job logs"),
        sa.Column(
            "default_reservation",
            sa.String(128),
            nullable=False,
            server_default="",
            comment="empty: flex-start by default; set: reservation by default",
        ),
        sa.Column(
            "status", sa.String(16), nullable=False, server_default="active", comment="active|maintenance|offline"
        ),
        sa.Column(
            "namespace", sa.String(63), nullable=False, server_default="falcon-jobs", comment="namespace for Jobs"
        ),
        sa.Column(
            "service_account",
            sa.String(63),
            nullable=False,
            server_default="falcon-job",
            comment="KSA the Jobs run as",
        ),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "falcon_node_pool_leases",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("cluster_id", sa.String(36), nullable=False),
        sa.Column("topology", sa.String(16), nullable=False),
        sa.Column(
            "name", sa.String(40), nullable=False, comment="GKE node pool name, fixed before the create call"
        ),
        sa.Column("supply_mode", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("task_id", sa.BigInteger, nullable=True, comment="task holding the pool; null when idle"),
        sa.Column("operation", sa.String(128), nullable=True, comment="last GKE operation name"),
        sa.Column("delete_attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.String(1024), nullable=False, server_default=""),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("ready_at", TS, nullable=True),
        sa.Column("idle_since", TS, nullable=True),
        sa.Column("deleted_at", TS, nullable=True),
        sa.UniqueConstraint("cluster_id", "name", name="uq_lease_cluster_name"),
    )
    op.create_index("ix_lease_cluster_state", "falcon_node_pool_leases", ["cluster_id", "state"])
    op.create_table(
        "falcon_queue_state",
        sa.Column("cluster_id", sa.String(36), primary_key=True),
        sa.Column("topology", sa.String(16), primary_key=True),
        sa.Column("last_granted_actor", sa.String(128), nullable=False, server_default=""),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "falcon_leader_lease",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("renewed_at", TS, nullable=False),
    )
    op.create_table(
        "falcon_task_events",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.BigInteger, nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False, server_default=""),
        sa.Column("message", sa.String(MESSAGE), nullable=False, server_default=""),
    )
    op.create_index("ix_events_task", "falcon_task_events", ["task_id", "id"])
    op.create_index("ix_events_at", "falcon_task_events", ["at"])


def downgrade() -> None:
    op.drop_table("falcon_task_events")
    op.drop_table("falcon_leader_lease")
    op.drop_table("falcon_queue_state")
    op.drop_table("falcon_node_pool_leases")
    op.drop_table("clusters")
