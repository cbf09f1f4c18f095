"""A failed node-pool operation's next step, table-driven: the operation, GKE's error and
the attempts so far in, adopt / retry after a delay / fail out."""

from __future__ import annotations

import pytest

from falcon_ray.model import ErrorKind as E
from falcon_ray.model import OpKind
from falcon_ray.nodepools.operations import goal_holds, retry_delay_s

C, D = OpKind.CREATE, OpKind.DELETE

GOAL = [
    # (situation, operation, error, its goal already holds)
    ("create meets 409: adopt the pool", C, E.ALREADY_EXISTS, True),
    ("delete meets 404: already gone", D, E.NOT_FOUND, True),
    ("create meets 404: a failure", C, E.NOT_FOUND, False),
    ("delete meets 409: a failure", D, E.ALREADY_EXISTS, False),
    ("create meets a transient error", C, E.TRANSIENT, False),
    ("delete meets a transient error", D, E.TRANSIENT, False),
]


@pytest.mark.parametrize(("situation", "kind", "error", "holds"), GOAL, ids=[g[0] for g in GOAL])
def test_goal_holds(situation, kind, error, holds):
    assert goal_holds(kind, error) is holds


INITIAL, MAX = 5.0, 60.0
RETRY = [
    # (situation, operation, error, failures so far, jitter, delay or None: fails)
    ("create, transient, first failure, no jitter", C, E.TRANSIENT, 1, 0.0, 2.5),
    ("create, transient, first failure, most jitter", C, E.TRANSIENT, 1, 1.0, 5.0),
    ("create, another operation runs", C, E.INCOMPATIBLE_OPERATION, 2, 1.0, 10.0),
    ("create, too many operations (429)", C, E.TOO_MANY_OPERATIONS, 3, 1.0, 20.0),
    ("create, the delay stops doubling at the maximum", C, E.TRANSIENT, 10, 1.0, 60.0),
    ("create, stockout: its queue waits it out", C, E.STOCKOUT, 1, 0.5, None),
    ("create, quota exceeded", C, E.QUOTA_EXCEEDED, 1, 0.5, None),
    ("create, permanent", C, E.PERMANENT, 1, 0.5, None),
    ("delete, transient", D, E.TRANSIENT, 1, 1.0, 5.0),
    ("delete, permanent: retried all the same", D, E.PERMANENT, 2, 0.0, 5.0),
    ("delete, stockout: retried", D, E.STOCKOUT, 4, 1.0, 40.0),
]


@pytest.mark.parametrize(("situation", "kind", "error", "attempts", "jitter", "delay"), RETRY, ids=[r[0] for r in RETRY])
def test_retry_delay(situation, kind, error, attempts, jitter, delay):
    assert retry_delay_s(kind, error, attempts, INITIAL, MAX, jitter) == delay
