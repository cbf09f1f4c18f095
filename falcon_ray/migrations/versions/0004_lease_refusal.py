"""falcon_node_pool_leases.refused_at / refusal: the durable record of a capacity wait.

Revision ID: falcon_0004
Revises: falcon_0003

A create that GKE refuses for capacity (a stockout) keeps its task waiting
(ClusterBusy) and is asked again later under a new pool name. The refused pool's
lease row keeps when and why it was refused, so the number of refusals, the time of
the first and of the last one (the backoff and the capacity budget) survive any restart.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "falcon_0004"
down_revision = "falcon_0003"
branch_labels = None
depends_on = None

# The column type as it was when this revision was written (kept here, not imported).
TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=3), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column(
        "falcon_node_pool_leases",
        sa.Column("refused_at", TS, nullable=True, comment="GKE refused the create for capacity (stockout)"),
    )
    op.add_column(
        "falcon_node_pool_leases",
        sa.Column("refusal", sa.String(1024), nullable=False, server_default="", comment="GKE's words for that refusal"),
    )


def downgrade() -> None:
    with op.batch_alter_table("falcon_node_pool_leases") as batch:
        batch.drop_column("refusal")
        batch.drop_column("refused_at")
