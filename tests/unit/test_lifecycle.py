"""The lifecycle tables: the invariants the rest of Falcon relies on."""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from pathlib import Path

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState, Phase, Reason, Status

EDGES = lc.TASK_TRANSITIONS
PHASES = {p for edge in EDGES for p in edge}


def reachable(start, edges) -> set:
    seen = {start}
    todo = deque([start])
    while todo:
        cur = todo.popleft()
        for src, dst in edges:
            if src == cur and dst not in seen:
                seen.add(dst)
                todo.append(dst)
    return seen


def falcon_edges():
    return {e for e, who in EDGES.items() if not who.startswith(lc.UPPER)}


def test_only_falcon_edge_out_of_aborting_is_to_aborted():
    out = [(s, d) for (s, d) in falcon_edges() if s.status is Status.ABORTING]
    assert out == [(lc.ABORTING, lc.ABORTED)]
    assert lc.sources_of(lc.ABORTED) == (lc.ABORTING,)


def test_only_the_upper_layer_sets_aborting_and_from_every_live_phase():
    into = {s for (s, d), who in EDGES.items() if d == lc.ABORTING}
    assert into == set(lc.LIVE_PHASES)
    assert all(EDGES[(s, lc.ABORTING)].startswith(lc.UPPER) for s in into)
    assert all(d == lc.ABORTING for (s, d), who in EDGES.items() if who.startswith(lc.UPPER))


def test_reason_only_in_pending_and_failed():
    for p in PHASES:
        if p.reason:
            assert p.status in (Status.PENDING, Status.FAILED), p
        if p.status is Status.FAILED:
            assert p.reason in lc.FAILURE_REASONS, p
        if p.status is Status.PENDING:
            assert p.reason not in lc.FAILURE_REASONS, p


def test_every_non_terminal_phase_reaches_a_terminal_one_by_falcon_moves_alone():
    for p in PHASES:
        if p.status not in lc.TERMINAL:
            ends = {q for q in reachable(p, falcon_edges()) if q.status in lc.TERMINAL}
            assert ends, f"{p} cannot finish"


def test_nothing_leaves_a_terminal_phase():
    assert not [(s, d) for (s, d) in EDGES if s.status in lc.TERMINAL]


def test_every_phase_is_reachable_from_a_new_task():
    assert reachable(lc.NEW, EDGES) == PHASES


def test_every_reason_appears_in_some_edge():
    used = {p.reason for p in PHASES}
    assert used == set(Reason)


def test_every_status_appears():
    assert {p.status for p in PHASES} == set(Status)


def test_acquisition_phases_are_the_slot_holders():
    assert {p.reason for p in lc.ACQUIRING_PHASES} == lc.ACQUIRING
    assert all(p.status is Status.PENDING for p in lc.PENDING_PHASES)
    assert set(lc.LIVE_PHASES) | {lc.ABORTING} == {p for p in PHASES if p.status in lc.NON_TERMINAL}


def test_phase_of_ignores_a_reason_left_behind():
    assert lc.phase_of("Aborting", "Provisioning") == lc.ABORTING
    assert lc.phase_of("Running", "Dispatching") == lc.RUNNING
    assert lc.phase_of("Pending", None) == lc.NEW
    assert lc.phase_of("Failed", "Timeout") == lc.failed(Reason.TIMEOUT)
    assert str(lc.WAITING) == "Pending/Waiting" and str(lc.RUNNING) == "Running"


def test_allowed_matches_the_table():
    assert lc.allowed(lc.WAITING, lc.PROVISIONING)
    assert lc.allowed(lc.PROVISIONING, lc.WAITING)  # a create GKE is too slow with: the pool given back (issue 37)
    assert not lc.allowed(lc.DISPATCHING, lc.WAITING)
    assert isinstance(next(iter(EDGES)), tuple) and all(isinstance(p, Phase) for p in next(iter(EDGES)))


# --- node-pool leases --------------------------------------------------------------------

LEDGES = lc.LEASE_TRANSITIONS


def test_lease_table_covers_every_state():
    assert {s for e in LEDGES for s in e} == set(LeaseState)


def test_lease_requested_is_the_only_start_and_deleted_the_only_end():
    assert not [e for e in LEDGES if e[1] is LeaseState.REQUESTED]
    assert not [e for e in LEDGES if e[0] is LeaseState.DELETED]
    for state in lc.LEASE_LIVE:
        assert LeaseState.DELETED in reachable(state, LEDGES), state
    assert reachable(LeaseState.REQUESTED, LEDGES) == set(LeaseState)


def test_only_deleting_leads_to_deleted():
    assert {s for (s, d) in LEDGES if d is LeaseState.DELETED} == {LeaseState.DELETING}
    assert lc.lease_allowed(LeaseState.DELETING, LeaseState.DELETING)
    assert not lc.lease_allowed(LeaseState.IN_USE, LeaseState.REQUESTED)


# --- rendering -------------------------------------------------------------------------


def test_markdown_table_has_one_row_per_edge():
    rows = lc.markdown_table().splitlines()
    assert len(rows) == len(EDGES) + 2
    assert len(lc.lease_markdown_table().splitlines()) == len(LEDGES) + 2
    assert all(r.startswith("| ") and r.endswith(" |") for r in rows)


def test_module_prints_both_tables():
    out = subprocess.run(
        [sys.executable, "-m", "falcon_ray.lifecycle"], capture_output=True, text=True, check=True
    ).stdout
    assert out == lc.markdown_table() + "\n\n" + lc.lease_markdown_table() + "\n"


def test_schema_doc_embeds_the_current_tables():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text(encoding="utf-8")
    assert lc.markdown_table() in doc, "docs/schema.md is stale: paste `python -m falcon_ray.lifecycle`"
    assert lc.lease_markdown_table() in doc, "docs/schema.md is stale: paste `python -m falcon_ray.lifecycle`"
