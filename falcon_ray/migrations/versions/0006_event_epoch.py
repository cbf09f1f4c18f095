"""falcon_task_events.epoch: the leader epoch of the controller that wrote each event.

Revision ID: falcon_0006
Revises: falcon_0005

Every status change a controller's actor writes is guarded by its leader epoch (a write
under an older epoch than the lease's loses); the event row of a won write now records
that epoch, so the audit trail shows which controller made each step, and a step written
under a fenced epoch after a newer holder took the lease would be visible. NULL: written
by the upper layer or the command line (submit, abort), which act under no epoch.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "falcon_0006"
down_revision = "falcon_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("falcon_task_events") as batch:
        batch.add_column(
            sa.Column("epoch", sa.BigInteger, nullable=True, comment="leader epoch of the writer; NULL: the upper layer or the CLI")
        )


def downgrade() -> None:
    with op.batch_alter_table("falcon_task_events") as batch:
        batch.drop_column("epoch")
