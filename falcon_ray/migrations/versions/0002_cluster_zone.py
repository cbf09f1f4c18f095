"""clusters.zone: the zone an operator picks for pools of a regional cluster.

Revision ID: falcon_0002
Revises: falcon_0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "falcon_0002"
down_revision = "falcon_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "clusters",
        sa.Column(
            "zone",
            sa.String(63),
            nullable=False,
            server_default="",
            comment="zone for pools without a reservation (regional clusters); empty: the cluster's zone or first node location",
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("zone")
