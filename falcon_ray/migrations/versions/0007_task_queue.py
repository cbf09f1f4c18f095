"""falcon_task_queue: which queue (cluster, topology) each assigned task belongs to.

Revision ID: falcon_0007
Revises: falcon_0006

The ``jobs`` table belongs to the upper layer, so the topology of a task lives only in
its spec text. A QueueActor that had to find its own tasks read and parsed every live
task of its cluster each round; with this table it reads only its queue's rows, and
between full reads only the assignments newer than the last ``seq`` it saw. The row is
written in the same transaction as the compare-and-set that gives the task its cluster
(the poller's intake, a move to another cluster). Live tasks assigned before this
revision get their row here, from their spec.
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "falcon_0007"
down_revision = "falcon_0006"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
LIVE = ("Pending", "Running", "Aborting")


def upgrade() -> None:
    op.create_table(
        "falcon_task_queue",
        sa.Column("seq", BigId, primary_key=True, autoincrement=True, comment="grows with each (re)assignment: a queue reads the new ones past the last it saw"),
        sa.Column("task_id", sa.BigInteger, nullable=False),
        sa.Column("cluster_id", sa.String(36), nullable=False),
        sa.Column("topology", sa.String(16), nullable=False),
        sa.UniqueConstraint("task_id", name="uq_task_queue_task"),
    )
    op.create_index("ix_task_queue_queue", "falcon_task_queue", ["cluster_id", "topology", "seq"])
    bind = op.get_bind()
    if not sa.inspect(bind).has_table("jobs"):
        return
    jobs = sa.table("jobs", sa.column("id"), sa.column("spec"), sa.column("status"), sa.column("cluster_id"))
    rows = bind.execute(
        sa.select(jobs.c.id, jobs.c.spec, jobs.c.cluster_id).where(jobs.c.status.in_(LIVE), jobs.c.cluster_id.is_not(None)).order_by(jobs.c.id)
    ).all()
    out = []
    for task_id, spec, cluster_id in rows:
        try:
            topology = str(json.loads(spec).get("topology", ""))[:16]
        except (ValueError, AttributeError, TypeError):
            continue
        out.append({"task_id": task_id, "cluster_id": cluster_id, "topology": topology})
    table = sa.table("falcon_task_queue", sa.column("task_id"), sa.column("cluster_id"), sa.column("topology"))
    for i in range(0, len(out), 1000):
        bind.execute(table.insert(), out[i : i + 1000])


def downgrade() -> None:
    op.drop_index("ix_task_queue_queue", table_name="falcon_task_queue")
    op.drop_table("falcon_task_queue")
