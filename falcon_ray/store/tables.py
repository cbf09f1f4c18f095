"""SQLAlchemy Core tables: the upper layer's ``jobs`` and Falcon's own tables.

Contract
--------
This module is the single definition of the schema; the Alembic migrations in
``falcon_ray/migrations`` create exactly these tables and indexes, and a test
compares the two. ``jobs`` belongs to the upper layer: Falcon ships it as a
reference migration (``--with-jobs-table``) and never alters it otherwise. Every
timestamp is naive UTC with millisecond precision.

Indexes and the queries they serve (docs/schema.md shows the SQL):
- ``ix_jobs_status_cluster`` (status, cluster_id, id): the poller's intake
  (``status='Pending' AND cluster_id IS NULL``) and abort routing
  (``status='Aborting'``) read only live rows, however many finished rows pile up.
- ``ix_jobs_cluster_status`` (cluster_id, status): a QueueActor's re-read of its
  cluster's live tasks.
- ``ix_jobs_updated`` (updated_at): operators' "what changed" queries.
- ``falcon_task_queue`` maps a task to its queue (cluster, topology); written with the
  compare-and-set that sets the task's cluster. ``ix_task_queue_queue`` (cluster_id,
  topology, seq): a QueueActor reads only its own rows, and between full reads only the
  assignments newer than the last ``seq`` it saw.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

metadata = sa.MetaData()

# Naive UTC, milliseconds. DATETIME(3) on MySQL/MariaDB, TEXT-backed on SQLite.
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=3), "mysql", "mariadb")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER only
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")

MESSAGE_WIDTH = 4000

clusters = sa.Table(
    "clusters",
    metadata,
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
    sa.Column("status", sa.String(16), nullable=False, server_default="active", comment="active|maintenance|offline"),
    sa.Column("namespace", sa.String(63), nullable=False, server_default="falcon-jobs", comment="namespace for Jobs"),
    sa.Column(
        "service_account", sa.String(63), nullable=False, server_default="falcon-job", comment="KSA the Jobs run as"
    ),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column(
        "zone",
        sa.String(63),
        nullable=False,
        server_default="",
        comment="zone for pools without a reservation (regional clusters); empty: the cluster's zone or first node location",
    ),
    sa.Column(
        "reservation_machine_type",
        sa.String(64),
        nullable=False,
        server_default="",
        comment="machine type the reservation holds, as Compute reported it; empty: not read yet",
    ),
    sa.Column("reservation_count", sa.Integer, nullable=True, comment="reservation size in VMs, last read"),
    sa.Column("reservation_in_use", sa.Integer, nullable=True, comment="VMs GKE counts in use, last read"),
    sa.Column(
        "reservation_claimed", sa.Integer, nullable=True, comment="hosts Falcon's pools claim that GKE does not count yet"
    ),
    sa.Column("reservation_seen_at", Timestamp, nullable=True, comment="when these figures last changed"),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(255), nullable=False, server_default=""),
    sa.Column("actor", sa.String(128), nullable=False, comment="who submitted; the fairness key"),
    sa.Column("spec", LongText, nullable=False, comment="TaskSpec JSON text"),
    sa.Column("status", sa.String(16), nullable=False, server_default="Pending"),
    sa.Column("reason", sa.String(32), nullable=False, server_default=""),
    sa.Column("message", sa.String(MESSAGE_WIDTH), nullable=False, server_default=""),
    sa.Column("cluster_id", sa.String(36), nullable=True),
    sa.Column("node_pool_name", sa.String(64), nullable=True),
    sa.Column("job_uid", sa.String(64), nullable=True),
    sa.Column("timeout_seconds", sa.Integer, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("dispatched_at", Timestamp, nullable=True),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.Column("aborting_at", Timestamp, nullable=True),
    sa.Column("aborted_at", Timestamp, nullable=True),
    sa.Index("ix_jobs_status_cluster", "status", "cluster_id", "id"),
    sa.Index("ix_jobs_cluster_status", "cluster_id", "status"),
    sa.Index("ix_jobs_updated", "updated_at"),
)

node_pool_leases = sa.Table(
    "falcon_node_pool_leases",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("cluster_id", sa.String(36), nullable=False),
    sa.Column("topology", sa.String(16), nullable=False),
    sa.Column("name", sa.String(40), nullable=False, comment="GKE node pool name, fixed before the create call"),
    sa.Column("supply_mode", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("task_id", sa.BigInteger, nullable=True, comment="task holding the pool; null when idle"),
    sa.Column("operation", sa.String(128), nullable=True, comment="last GKE operation name"),
    sa.Column("delete_attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.String(1024), nullable=False, server_default=""),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("ready_at", Timestamp, nullable=True),
    sa.Column("idle_since", Timestamp, nullable=True),
    sa.Column("deleted_at", Timestamp, nullable=True),
    sa.Column("refused_at", Timestamp, nullable=True, comment="GKE refused the create for capacity (stockout)"),
    sa.Column("refusal", sa.String(1024), nullable=False, server_default="", comment="GKE's words for that refusal"),
    sa.Column("accepted_at", Timestamp, nullable=True, comment="GKE accepted the create (the create's timeout counts from here)"),
    sa.UniqueConstraint("cluster_id", "name", name="uq_lease_cluster_name"),
    sa.Index("ix_lease_cluster_state", "cluster_id", "state"),
)

queue_state = sa.Table(
    "falcon_queue_state",
    metadata,
    sa.Column("cluster_id", sa.String(36), primary_key=True),
    sa.Column("topology", sa.String(16), primary_key=True),
    sa.Column("last_granted_actor", sa.String(128), nullable=False, server_default=""),
    sa.Column("updated_at", Timestamp, nullable=False),
)

leader_lease = sa.Table(
    "falcon_leader_lease",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("holder", sa.String(128), nullable=False),
    sa.Column("expires_at", Timestamp, nullable=False),
    sa.Column("renewed_at", Timestamp, nullable=False),
    sa.Column(
        "epoch",
        sa.BigInteger,
        nullable=False,
        server_default="0",
        comment="fencing token: grows by one with each new holder; every controller write requires it",
    ),
)

task_events = sa.Table(
    "falcon_task_events",
    metadata,
    sa.Column("id", BigId, primary_key=True, autoincrement=True),
    sa.Column("task_id", sa.BigInteger, nullable=False),
    sa.Column("at", Timestamp, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(32), nullable=False, server_default=""),
    sa.Column("message", sa.String(MESSAGE_WIDTH), nullable=False, server_default=""),
    sa.Column("epoch", sa.BigInteger, nullable=True, comment="leader epoch of the writer; NULL: the upper layer or the CLI"),
    sa.Index("ix_events_task", "task_id", "id"),
    sa.Index("ix_events_at", "at"),
)

task_queue = sa.Table(
    "falcon_task_queue",
    metadata,
    sa.Column("seq", BigId, primary_key=True, autoincrement=True, comment="grows with each (re)assignment: a queue reads the new ones past the last it saw"),
    sa.Column("task_id", sa.BigInteger, nullable=False),
    sa.Column("cluster_id", sa.String(36), nullable=False),
    sa.Column("topology", sa.String(16), nullable=False),
    sa.UniqueConstraint("task_id", name="uq_task_queue_task"),
    sa.Index("ix_task_queue_queue", "cluster_id", "topology", "seq"),
)

task_disruptions = sa.Table(
    "falcon_task_disruptions",
    metadata,
    sa.Column("task_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False, comment="the run the fleet ended: 0 the first"),
    sa.Column("kind", sa.String(16), nullable=False, comment="maintenance | repair | reclaim | preempted | evicted | pool-lost"),
    sa.Column("node", sa.String(128), nullable=False, server_default=""),
    sa.Column("job", sa.String(64), nullable=False, server_default="", comment="the Job of that run"),
    sa.Column("detail", sa.String(1000), nullable=False, server_default=""),
    sa.Column("at", Timestamp, nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=True, comment="leader epoch of the writer"),
)

FALCON_TABLES = (clusters, node_pool_leases, queue_state, leader_lease, task_events, task_queue, task_disruptions)
UPPER_LAYER_TABLES = (jobs,)
