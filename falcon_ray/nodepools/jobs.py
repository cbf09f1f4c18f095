"""Which view of a task's Job the gateway's Job cache keeps.

Contract
--------
A task may have several Jobs over its life, one per attempt (``falcon.dev/attempt``); the
cache keeps one view per task, the newest attempt's, and the watch's events may arrive
for an older attempt's Job after a newer one's.

- ``replaces(before, view)``: a view of the same or a later attempt replaces the cached
  one (a later event of the same attempt is newer news); an older attempt's never does.
- ``kept_after_event(before, event)``: the view the cache keeps after one watch event. A
  DELETED event removes the cached view only when it is of the same Job (by name): the
  delete of an older attempt's Job leaves the newer attempt's in place.
"""

from __future__ import annotations

from falcon_ray.model import JobPhase, JobView


def replaces(before: JobView | None, view: JobView) -> bool:
    """True when ``view`` takes the place of the cached ``before`` (None: nothing cached)."""
    return before is None or before.attempt <= view.attempt


def kept_after_event(before: JobView | None, event: JobView) -> JobView | None:
    """The task's cached view after the watch reported ``event`` (None: no view)."""
    if event.phase == JobPhase.DELETED:
        return None if before is None or before.name == event.name else before
    return event if replaces(before, event) else before
