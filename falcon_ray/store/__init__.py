"""Persistence: the schema (``tables``), its migrations, and the repository (``Store``,
composed in ``repository`` of one part per kind of row over ``core``)."""

from falcon_ray.store.repository import (
    DEFAULT_DB_URL,
    SLOT_TAKEN,
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
    observe_statements,
    utcnow,
)

__all__ = [
    "DEFAULT_DB_URL", "Cluster", "DbTimeouts", "Fenced", "IllegalTransition", "Lease", "QueueRead", "SLOT_TAKEN", "Store", "Task",
    "TaskEvent", "WriteResult", "clip_message", "observe_statements", "utcnow",
]
