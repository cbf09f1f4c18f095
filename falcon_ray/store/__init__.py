"""Persistence: the schema (``tables``), its migrations, and the repository (``Store``)."""

from falcon_ray.store.repository import (
    DEFAULT_DB_URL,
    Cluster,
    DbTimeouts,
    Fenced,
    IllegalTransition,
    Lease,
    QueueRead,
    Store,
    Task,
    TaskEvent,
    WriteResult,
    clip_message,
    utcnow,
)

__all__ = ["DEFAULT_DB_URL", "Cluster", "DbTimeouts", "Fenced", "IllegalTransition", "Lease", "QueueRead", "Store", "Task", "TaskEvent", "WriteResult", "clip_message", "utcnow"]
