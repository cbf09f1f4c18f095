"""A run's readiness between its Job's events, table-driven: the event (phase, ready and
expected pods) and what was remembered in; what is remembered and what to read of the run
out (``faults.track_run``)."""

from __future__ import annotations

import datetime as dt

import pytest

from falcon_ray.faults import EvidenceRead, RunReadiness, RunStep, track_run
from falcon_ray.model import JobPhase as P

T0 = dt.datetime(2026, 1, 1, 12, 0)
NOW = T0 + dt.timedelta(minutes=3)
NEVER = RunReadiness()
WAS_READY = RunReadiness(once_fully_ready=True)
SHORT = RunReadiness(True, T0)
NONE, ONCE, FRESH = EvidenceRead.NONE, EvidenceRead.ONCE, EvidenceRead.FRESH

STEPS = [
    # (situation, phase, ready, expected, remembered, step)
    ("pods still starting: not faltering", P.RUNNING, 1, 4, NEVER, RunStep(NEVER, NONE)),
    ("every pod ready: remembered", P.RUNNING, 4, 4, NEVER, RunStep(WAS_READY, NONE, forget_evidence=True)),
    ("short after full: falters from now, read afresh", P.RUNNING, 3, 4, WAS_READY, RunStep(RunReadiness(True, NOW), FRESH)),
    ("still short: since when it first was", P.RUNNING, 2, 4, SHORT, RunStep(SHORT, FRESH)),
    ("ready again: recovered, what was read goes", P.RUNNING, 4, 4, SHORT, RunStep(WAS_READY, NONE, forget_evidence=True)),
    ("failed: read once, memory kept", P.FAILED, 0, 4, SHORT, RunStep(SHORT, ONCE)),
    ("failed before it was ever ready", P.FAILED, 0, 4, NEVER, RunStep(NEVER, ONCE)),
    ("deleted: nothing to read", P.DELETED, 0, 4, SHORT, RunStep(SHORT, NONE)),
    ("succeeded, every pod counted ready", P.SUCCEEDED, 4, 4, WAS_READY, RunStep(WAS_READY, NONE, forget_evidence=True)),
]


@pytest.mark.parametrize(("situation", "phase", "ready", "expected", "before", "step"), STEPS, ids=[s[0] for s in STEPS])
def test_what_an_event_changes_in_a_runs_readiness(situation, phase, ready, expected, before, step):
    assert track_run(phase, ready, expected, before, NOW) == step
