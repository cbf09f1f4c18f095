"""The gateway's Job cache, table-driven: the cached view of a task's Job and a watch
event in, the view kept out."""

from __future__ import annotations

import pytest

from falcon_ray.model import JobPhase, JobView
from falcon_ray.nodepools.jobs import kept_after_event, replaces


def job(name: str, attempt: int, phase: JobPhase = JobPhase.RUNNING, ready: int = 1) -> JobView:
    return JobView(7, name, "ns", f"uid-{name}", phase, 1, ready, 1, attempt=attempt)


A0, A1 = job("t7-0", 0), job("t7-1", 1)
A0_LATER = job("t7-0", 0, ready=0)
A0_GONE, A1_GONE = job("t7-0", 0, JobPhase.DELETED), job("t7-1", 1, JobPhase.DELETED)

EVENTS = [
    # (situation, cached view, event, view kept)
    ("first sight of the task's Job", None, A0, A0),
    ("a later event of the same Job", A0, A0_LATER, A0_LATER),
    ("the next attempt's Job replaces the last", A0, A1, A1),
    ("an older attempt's late event is ignored", A1, A0_LATER, A1),
    ("the cached Job deleted: nothing kept", A0, A0_GONE, None),
    ("a delete seen with nothing cached", None, A0_GONE, None),
    ("the older attempt's delete keeps the newer Job", A1, A0_GONE, A1),
    ("the newer Job's delete while the older is cached drops it (same name only)", A0, A1_GONE, A0),
]


@pytest.mark.parametrize(("situation", "before", "event", "kept"), EVENTS, ids=[e[0] for e in EVENTS])
def test_the_view_kept_after_an_event(situation, before, event, kept):
    assert kept_after_event(before, event) == kept


@pytest.mark.parametrize(
    ("before", "view", "replaced"),
    [(None, A0, True), (A0, A0_LATER, True), (A0, A1, True), (A1, A0, False)],
    ids=["nothing cached", "same attempt", "later attempt", "older attempt"],
)
def test_which_view_a_relist_keeps(before, view, replaced):
    assert replaces(before, view) is replaced
