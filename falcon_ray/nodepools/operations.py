"""What a node-pool operation does after GKE answered with an error.

Contract
--------
- ``goal_holds``: some errors mean the operation's goal already holds: a create that meets
  ALREADY_EXISTS adopts the pool (it was created before a restart); a delete that meets
  NOT_FOUND is done. Neither is a failure.
- ``retry_delay_s``: after a failure, a create is retried only for errors that pass
  (``model.RETRYABLE_KINDS``: transient, busy, rate-limited); any other error fails it (a
  stockout is waited out by its queue, which asks again under a new name). A delete is
  retried whatever the error. The delay doubles from ``initial_s`` with every attempt up
  to ``max_s``, and a jitter in [0, 1) spreads it over its upper half.
"""

from __future__ import annotations

from falcon_ray.model import RETRYABLE_KINDS, ErrorKind, OpKind


def goal_holds(kind: OpKind, error: ErrorKind) -> bool:
    """True when ``error`` from GKE means the operation ``kind`` has nothing left to do."""
    return (kind == OpKind.CREATE and error == ErrorKind.ALREADY_EXISTS) or (
        kind == OpKind.DELETE and error == ErrorKind.NOT_FOUND
    )


def retry_delay_s(
    kind: OpKind, error: ErrorKind, attempts: int, initial_s: float, max_s: float, jitter: float
) -> float | None:
    """Seconds to wait before attempt ``attempts + 1`` of a failed operation (``attempts``
    counts the failures so far, at least 1); None: the operation fails for good."""
    if kind == OpKind.CREATE and error not in RETRYABLE_KINDS:
        return None
    delay = min(initial_s * 2 ** (attempts - 1), max_s)
    return delay * (0.5 + jitter / 2)
