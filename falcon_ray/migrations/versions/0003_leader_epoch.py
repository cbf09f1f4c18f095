"""falcon_leader_lease.epoch: the fencing token of the leader lease.

Revision ID: falcon_0003
Revises: falcon_0002

Each new holder of the lease increments ``epoch``; a renewal by the same holder keeps
it. Every task, lease and event write of the actors requires the epoch they were
started under to still be the lease's (see ``store.repository``), so actors of a
controller that lost the lease cannot write any more.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "falcon_0003"
down_revision = "falcon_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "falcon_leader_lease",
        sa.Column(
            "epoch",
            sa.BigInteger,
            nullable=False,
            server_default="0",
            comment="fencing token: grows by one with each new holder; every controller write requires it",
        ),
    )


def downgrade() -> None:
    with op.batch_alter_table("falcon_leader_lease") as batch:
        batch.drop_column("epoch")
