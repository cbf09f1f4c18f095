"""The node-pool operations of one edge cluster: which is queued, which runs next, and
what one does after GKE answered with an error.

Contract
--------
- ``create_answer`` / ``delete_answer``: a create or delete asked for a pool, given the
  pool's newest operation (its kind and state, or None). A create is already served by
  a create queued, running or done; a delete by a delete queued or running. Otherwise a
  new operation is queued, and a delete cancels a create that has not started.
- ``next_operation``: the operations run one at a time, in queue order. The next is the
  first live entry (still its pool's newest operation, not cancelled) that is due; entries
  no longer live are dropped as they are passed; the live entries passed over (waiting
  for their retry time) go to the back, behind the entries that follow the one chosen.
- ``goal_holds``: some errors mean the operation's goal already holds: a create that meets
  ALREADY_EXISTS adopts the pool (it was created before a restart); a delete that meets
  NOT_FOUND is done. Neither is a failure.
- ``reached_goal``: an operation GKE accepted and then ended reached its goal when it
  ended without an error, or, for a delete, with NOT_FOUND (the pool was gone already). A
  create's operation that ends with an error failed, whatever the error: the pool it
  made, if any, is not the one asked for.
- ``retry_delay_s``: after a failure, a create is retried only for errors that pass
  (``model.RETRYABLE_KINDS``: transient, busy, rate-limited); any other error fails it (a
  stockout is waited out by its queue, which asks again under a new name). A delete is
  retried whatever the error. The delay doubles from ``initial_s`` with every attempt up
  to ``max_s``, and a jitter in [0, 1) spreads it over its upper half.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from falcon_ray.model import OP_IN_FLIGHT, RETRYABLE_KINDS, ErrorKind, OpKind, OpState

# the pool's newest operation, as (kind, state); None: the pool has none
Newest = tuple[OpKind, OpState] | None


def create_answer(newest: Newest) -> OpState | None:
    """A create asked for a pool: the state of the operation that already serves it (a
    create queued, running or done), or None: queue a new create."""
    if newest is not None and newest[0] == OpKind.CREATE and newest[1] in (*OP_IN_FLIGHT, OpState.DONE):
        return newest[1]
    return None


@dataclass(frozen=True)
class DeleteAnswer:
    serving: OpState | None  # the state of the delete already queued or running; None: queue one
    cancel_create: bool = False  # the pool's create has not started: cancel it


def delete_answer(newest: Newest) -> DeleteAnswer:
    """A delete asked for a pool: served by a delete in flight, else a new delete that
    cancels a create still queued."""
    if newest is not None and newest[0] == OpKind.DELETE and newest[1] in OP_IN_FLIGHT:
        return DeleteAnswer(newest[1])
    return DeleteAnswer(None, cancel_create=newest == (OpKind.CREATE, OpState.QUEUED))


@dataclass(frozen=True)
class Queued:
    """An entry of the operation queue, as the choice of the next one sees it."""

    live: bool  # still its pool's newest operation, and not cancelled
    due_at: float  # monotonic time from which it may run (its retry time; 0: at once)


@dataclass(frozen=True)
class NextOperation:
    run: int | None  # the index of the entry to run now; None: nothing is due
    queue: tuple[int, ...]  # the indices of the entries left queued, in their new order


def next_operation(queue: Sequence[Queued], now: float) -> NextOperation:
    """The entry to run at monotonic time ``now`` and the queue that remains (the
    module's contract)."""
    passed: list[int] = []
    for i, entry in enumerate(queue):
        if not entry.live:
            continue
        if entry.due_at <= now:
            return NextOperation(i, (*range(i + 1, len(queue)), *passed))
        passed.append(i)
    return NextOperation(None, tuple(passed))


def goal_holds(kind: OpKind, error: ErrorKind) -> bool:
    """True when ``error`` from GKE means the operation ``kind`` has nothing left to do."""
    return (kind == OpKind.CREATE and error == ErrorKind.ALREADY_EXISTS) or (
        kind == OpKind.DELETE and error == ErrorKind.NOT_FOUND
    )


def reached_goal(kind: OpKind, error: ErrorKind | None) -> bool:
    """True when a followed operation that ended with ``error`` (None: none) needs no retry."""
    return error is None or (kind == OpKind.DELETE and goal_holds(kind, error))


def retry_delay_s(
    kind: OpKind, error: ErrorKind, attempts: int, initial_s: float, max_s: float, jitter: float
) -> float | None:
    """Seconds to wait before attempt ``attempts + 1`` of a failed operation (``attempts``
    counts the failures so far, at least 1); None: the operation fails for good."""
    if kind == OpKind.CREATE and error not in RETRYABLE_KINDS:
        return None
    delay = min(initial_s * 2 ** (attempts - 1), max_s)
    return delay * (0.5 + jitter / 2)
