"""clusters.reservation_*: what the cluster's reservation holds and its ledger, as last read.

Revision ID: falcon_0005
Revises: falcon_0004

The ClusterActor writes these columns when it reads the reservation from Compute (and
when its ledger of Falcon's own claims changes): the machine type the reservation holds
(``specificReservation.instanceProperties.machineType``), so the poller places a task
only where the reservation can serve its shape, and the ledger (count, in use, claimed
by Falcon), so ``falcon-ray clusters list`` shows it without a running controller.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "falcon_0005"
down_revision = "falcon_0004"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=3), "mysql", "mariadb")


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(
            sa.Column(
                "reservation_machine_type",
                sa.String(64),
                nullable=False,
                server_default="",
                comment="machine type the reservation holds, as Compute reported it; empty: not read yet",
            )
        )
        batch.add_column(sa.Column("reservation_count", sa.Integer, nullable=True, comment="reservation size in VMs, last read"))
        batch.add_column(sa.Column("reservation_in_use", sa.Integer, nullable=True, comment="VMs GKE counts in use, last read"))
        batch.add_column(
            sa.Column("reservation_claimed", sa.Integer, nullable=True, comment="hosts Falcon's pools claim that GKE does not count yet")
        )
        batch.add_column(sa.Column("reservation_seen_at", Timestamp, nullable=True, comment="when these figures last changed"))


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        for name in ("reservation_seen_at", "reservation_claimed", "reservation_in_use", "reservation_count", "reservation_machine_type"):
            batch.drop_column(name)
