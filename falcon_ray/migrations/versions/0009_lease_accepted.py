"""falcon_node_pool_leases.accepted_at: when GKE accepted the pool's create.

Revision ID: falcon_0009
Revises: falcon_0008

A lease row is written before its create is sent, and the create may then wait its turn
among the cluster's node-pool operations (GKE runs one at a time per cluster) for a long
while. The create's timeout (``node_pool_timeout_s``) counts from GKE's acceptance, so
the row keeps that instant; it is written with the Requested -> Creating move, in the
same statement. Rows written before this revision have none: their timeout counts from
``created_at`` as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "falcon_0009"
down_revision = "falcon_0008"
branch_labels = None
depends_on = None

# The column type as it was when this revision was written (kept here, not imported).
TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=3), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column(
        "falcon_node_pool_leases",
        sa.Column("accepted_at", TS, nullable=True, comment="GKE accepted the create (the create's timeout counts from here)"),
    )


def downgrade() -> None:
    with op.batch_alter_table("falcon_node_pool_leases") as batch:
        batch.drop_column("accepted_at")
