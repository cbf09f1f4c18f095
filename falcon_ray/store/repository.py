"""The repository: ``Store``, every read and write Falcon makes to the database.

``Store`` is composed of one part per kind of row it stores, over one shared core:

- ``core``: engines, transactions, fencing, reruns on a dropped connection, dialect
  differences, statement counting (the contracts every part keeps);
- ``tasks``: the upper layer's inserts and aborts, the controller's task reads;
- ``task_moves``: compare-and-set task moves with their event rows;
- ``queues``: a QueueActor's round read and its last granted actor;
- ``leases``: node-pool leases;
- ``registry``: clusters and their reservation ledger;
- ``events``: the event log and the fleet's disruptions;
- ``leader``: the leader lease.

Every public method runs again, whole, after a dropped connection (``core``), except
``submit_task`` (not idempotent), ``dispose`` and ``ping``.
"""

from __future__ import annotations

from falcon_ray.lifecycle import Reason
from falcon_ray.model import Cluster, Lease, Task, TaskEvent
from falcon_ray.store.core import (
    DEFAULT_DB_URL,
    DISCONNECT_RETRIES,
    LEADER,
    LOST,
    DbTimeouts,
    Fenced,
    IllegalTransition,
    StoreCore,
    WriteResult,
    clip_message,
    make_engine,
    observe_statements,
    rerun_public_methods,
    tls_connect_args,
    utcnow,
)
from falcon_ray.store.events import EventStore
from falcon_ray.store.leader import LeaderStore
from falcon_ray.store.leases import LeaseStore
from falcon_ray.store.queues import SLOT_TAKEN, QueueRead, QueueStore
from falcon_ray.store.registry import CLUSTER_STATUSES, RegistryStore
from falcon_ray.store.task_moves import TaskMoves
from falcon_ray.store.tasks import TaskStore


class Store(TaskStore, TaskMoves, QueueStore, LeaseStore, RegistryStore, EventStore, LeaderStore, StoreCore):
    """One database, many short transactions. Safe to share between threads."""


rerun_public_methods(Store, not_rerun=frozenset({"submit_task", "dispose", "ping"}))

__all__ = [
    "CLUSTER_STATUSES", "DEFAULT_DB_URL", "DISCONNECT_RETRIES", "LEADER", "LOST", "Cluster", "DbTimeouts", "Fenced",
    "IllegalTransition", "Lease", "QueueRead", "Reason", "SLOT_TAKEN", "Store", "Task", "TaskEvent", "WriteResult", "clip_message",
    "make_engine", "observe_statements", "tls_connect_args", "utcnow",
]
