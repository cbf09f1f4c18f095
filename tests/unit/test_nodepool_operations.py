"""The node-pool operation rules, table-driven: a create or delete asked for, given the
pool's newest operation; which queued operation runs next; whether an operation that ended
reached its goal; and a failed operation's next step (the operation, GKE's error and the attempts so far in, adopt / retry after a delay /
fail out)."""

from __future__ import annotations

import pytest

from falcon_ray.model import ErrorKind as E
from falcon_ray.model import OpKind, OpState
from falcon_ray.nodepools.operations import (
    Concurrency,
    DeleteAnswer,
    NextOperation,
    Queued,
    at_once,
    create_answer,
    delete_answer,
    goal_holds,
    next_operation,
    reached_goal,
    refused_as_concurrent,
    retry_delay_s,
    tighter,
)

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


ENDED = [
    # (situation, operation, the error its GKE operation ended with, goal reached)
    ("a create ended well", C, None, True),
    ("a delete ended well", D, None, True),
    ("a delete ended: the pool was gone already", D, E.NOT_FOUND, True),
    ("a delete ended with a transient error", D, E.TRANSIENT, False),
    ("a create ended with a stockout", C, E.STOCKOUT, False),
    ("a create's operation ended with 409: not an adoption", C, E.ALREADY_EXISTS, False),
    ("a create's operation ended with 404", C, E.NOT_FOUND, False),
]


@pytest.mark.parametrize(("situation", "kind", "error", "reached"), ENDED, ids=[e[0] for e in ENDED])
def test_whether_an_ended_operation_reached_its_goal(situation, kind, error, reached):
    assert reached_goal(kind, error) is reached


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


Q, R, DONE, FAILED, CANCELLED = OpState.QUEUED, OpState.RUNNING, OpState.DONE, OpState.FAILED, OpState.CANCELLED
ASKED = [
    # (situation, the pool's newest operation, a create's answer, a delete's answer, the delete cancels a create)
    ("no operation yet", None, None, None, False),
    ("a create queued", (C, Q), Q, None, True),
    ("a create running", (C, R), R, None, False),
    ("a create done", (C, DONE), DONE, None, False),
    ("a create failed: asked again, a new one", (C, FAILED), None, None, False),
    ("a create cancelled", (C, CANCELLED), None, None, False),
    ("a delete queued", (D, Q), None, Q, False),
    ("a delete running", (D, R), None, R, False),
    ("a delete done: the pool was recreated since, delete again", (D, DONE), None, None, False),
    ("a delete failed", (D, FAILED), None, None, False),
]


@pytest.mark.parametrize(("situation", "newest", "create", "delete", "cancels"), ASKED, ids=[a[0] for a in ASKED])
def test_what_a_create_or_delete_request_finds(situation, newest, create, delete, cancels):
    assert create_answer(newest) == create
    assert delete_answer(newest) == DeleteAnswer(delete, cancel_create=cancels)


def live(due_at=0.0):
    return Queued(True, due_at)


STALE = Queued(False, 0.0)
BUSY = Queued(True, 0.0, pool_busy=True)
NOW = 100.0
NEXT = [
    # (situation, the queue, operation run, the queue left in its new order)
    ("empty", [], None, ()),
    ("the first is due", [live(), live()], 0, (1,)),
    ("a stale entry is dropped on the way", [STALE, live()], 1, ()),
    ("a stale entry after the one run stays until reached", [live(), STALE, live()], 0, (1, 2)),
    ("due exactly now", [live(NOW)], 0, ()),
    ("a retry not due goes behind the rest", [live(NOW + 5), live(), live()], 1, (2, 0)),
    ("nothing due: all kept, in order", [live(NOW + 5), STALE, live(NOW + 1)], None, (0, 2)),
    ("only stale entries: the queue empties", [STALE, STALE], None, ()),
    ("two passed over keep their order", [live(NOW + 1), live(NOW + 2), live(), live()], 2, (3, 0, 1)),
    ("a due entry whose pool has an operation running waits behind the rest", [BUSY, live()], 1, (0,)),
    ("its pool still busy: kept, nothing run", [BUSY], None, (0,)),
]


@pytest.mark.parametrize(("situation", "queue", "run", "left"), NEXT, ids=[n[0] for n in NEXT])
def test_which_operation_runs_next(situation, queue, run, left):
    assert next_operation(queue, NOW) == NextOperation(run, left)


AT_ONCE = [
    # (situation, the setting, what was learned, now, operations that may run together)
    ("nothing learned: the setting", 4, Concurrency(), NOW, 4),
    ("learned, within its window: as many as ran", 4, Concurrency(1, NOW + 1), NOW, 1),
    ("learned, window over: the setting again", 4, Concurrency(1, NOW), NOW, 4),
    ("learned more than the setting: the setting", 2, Concurrency(3, NOW + 1), NOW, 2),
]


@pytest.mark.parametrize(("situation", "setting", "learned", "now", "n"), AT_ONCE, ids=[a[0] for a in AT_ONCE])
def test_how_many_operations_run_together(situation, setting, learned, now, n):
    assert at_once(setting, learned, now) == n


OURS = {"operation-1-a", "operation-2-b"}
LEARN = [
    # (situation, GKE's error, its message, this controller's other operations running, what is learned)
    ("incompatible operation naming one of ours: as many as ran", E.INCOMPATIBLE_OPERATION,
     "Cluster is running incompatible operation operation-2-b. Please wait and try again.", OURS, Concurrency(2, NOW + 60)),
    ("the older wording, naming one of ours", E.INCOMPATIBLE_OPERATION,
     "Operation operation-1-a is currently creating a node pool for cluster c. Please wait and try again once it is done.",
     OURS, Concurrency(2, NOW + 60)),
    ("incompatible operation naming none: taken as ours", E.INCOMPATIBLE_OPERATION, "Please wait and try again.", OURS, Concurrency(2, NOW + 60)),
    ("incompatible operation that is not ours (GKE's upgrade): nothing learned", E.INCOMPATIBLE_OPERATION,
     "Cluster is running incompatible operation operation-9-upgrade. Please wait and try again.", OURS, None),
    ("too many operations while 3 of ours ran: 3", E.TOO_MANY_OPERATIONS,
     'Too many operations: cluster "c" hits the concurrent operations quota 5, please try again later.',
     {"operation-1", "operation-2", "operation-3"}, Concurrency(3, NOW + 60)),
    ("refused with none of ours running: nothing learned", E.TOO_MANY_OPERATIONS, "Too many operations", set(), None),
    ("a transient error: nothing learned", E.TRANSIENT, "503", OURS, None),
    ("a stockout: nothing learned", E.STOCKOUT, "ZONE_RESOURCE_POOL_EXHAUSTED", OURS, None),
]


@pytest.mark.parametrize(("situation", "error", "message", "ours", "learned"), LEARN, ids=[x[0] for x in LEARN])
def test_what_a_refusal_teaches(situation, error, message, ours, learned):
    assert refused_as_concurrent(error, message, ours, NOW, 60.0) == learned


TIGHTER = [
    # (situation, what holds, what a refusal taught, what holds after)
    ("nothing learned: unchanged", Concurrency(2, NOW + 5), None, Concurrency(2, NOW + 5)),
    ("first refusal: its limit", Concurrency(), Concurrency(3, NOW + 60), Concurrency(3, NOW + 60)),
    ("a lower limit replaces a higher one", Concurrency(3, NOW + 5), Concurrency(1, NOW + 60), Concurrency(1, NOW + 60)),
    ("a higher limit leaves a lower one in its window", Concurrency(1, NOW + 5), Concurrency(3, NOW + 60), Concurrency(1, NOW + 5)),
    ("a window that is over is replaced", Concurrency(1, NOW), Concurrency(3, NOW + 60), Concurrency(3, NOW + 60)),
]


@pytest.mark.parametrize(("situation", "current", "learned", "after"), TIGHTER, ids=[x[0] for x in TIGHTER])
def test_what_holds_after_a_refusal(situation, current, learned, after):
    assert tighter(current, learned, NOW) == after
