"""The node-pool operations of one edge cluster: which is queued, which runs next, and
what one does after GKE answered with an error.

Contract
--------
- ``create_answer`` / ``delete_answer``: a create or delete asked for a pool, given the
  pool's newest operation (its kind and state, or None). A create is already served by
  a create queued, running or done; a delete by a delete queued or running. Otherwise a
  new operation is queued, and a delete cancels a create that has not started.
- ``next_operation``: the operations start in queue order, up to ``at_once`` of them
  running together (GKE runs node-pool operations on distinct pools of a cluster side by
  side, up to its per-cluster quota of concurrent operations). The next is the first live
  entry (still its pool's newest operation, not cancelled) that is due and whose pool has
  no operation running (GKE refuses a second one on the same pool); entries no longer live
  are dropped as they are passed; the live entries passed over (waiting for their retry
  time or for their pool) go to the back, behind the entries that follow the one chosen.
- ``at_once``: how many may run together: the setting, or fewer for a while after GKE
  refused one as concurrent (``Concurrency``): a cluster that answers "too many
  operations" while this controller's own operations run, or "incompatible operation"
  naming one of them, is taken to allow as many as were running, until ``probe_s`` has
  passed; then the setting is tried again. An incompatible operation that is not this
  controller's (GKE's own upgrade or repair) teaches nothing: the retry waits it out.
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

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from falcon_ray.model import BUSY_KINDS, OP_IN_FLIGHT, RETRYABLE_KINDS, ErrorKind, OpKind, OpState

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
    pool_busy: bool = False  # another operation of its pool is running


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
        if entry.due_at <= now and not entry.pool_busy:
            return NextOperation(i, (*range(i + 1, len(queue)), *passed))
        passed.append(i)
    return NextOperation(None, tuple(passed))


@dataclass(frozen=True)
class Concurrency:
    """How many node-pool operations GKE was last seen to take at once on a cluster."""

    limit: int | None = None  # learned from a refusal; None: the setting holds
    until: float = 0.0  # monotonic time at which the setting is tried again


def at_once(setting: int, learned: Concurrency, now: float) -> int:
    """The operations that may run together at monotonic time ``now``."""
    if learned.limit is None or now >= learned.until:
        return setting
    return max(1, min(setting, learned.limit))


_NAMED_OPERATION = re.compile(r"\b(operation-[0-9a-z-]+)")


def refused_as_concurrent(
    error: ErrorKind, message: str, ours: Collection[str], now: float, probe_s: float
) -> Concurrency | None:
    """What a refusal teaches: GKE refused an operation as busy while this controller's
    operations ``ours`` (GKE's operation names) ran, so it takes that many at most (at
    least one) for ``probe_s``. None: nothing learned: another error, none of ours ran,
    or an incompatible operation GKE names that is not ours (its own upgrade or repair,
    or someone else's: waited out by the retry, not a limit of the cluster)."""
    if error not in BUSY_KINDS or not ours:
        return None
    if error == ErrorKind.INCOMPATIBLE_OPERATION:
        named = _NAMED_OPERATION.search(message)
        if named is not None and named.group(1) not in ours:
            return None
    return Concurrency(len(ours), now + probe_s)


def tighter(current: Concurrency, learned: Concurrency | None, now: float) -> Concurrency:
    """What holds after a refusal taught ``learned``: it replaces a window that is over or
    a larger limit; a lower limit still in its window stays."""
    if learned is None or (current.limit is not None and now < current.until and current.limit <= learned.limit):
        return current
    return learned


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
