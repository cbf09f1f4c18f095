"""The report of a simulated run: what users waited, what the fleet held idle, whether the rules held.

Contract
--------
``build_report(sim, wall_s)`` reads the run's database (the ``jobs`` rows and their event
log), the Waiting Messages the queues wrote, and the fleet model's own accounting, and
returns a JSON-ready dict whose every figure is a function of the run alone (``wall_s``
aside), rounded, so the same run gives the same bytes:

- ``seed``, ``simulated_s`` (virtual seconds from the start to the end of the run),
  ``wall_s``, ``tasks``;
- ``digest``: SHA-256 of every task's event log (seconds since the start, status, reason,
  Message) and final row, in task order;
- ``outcomes``: terminal tasks by ``Status`` or ``Status/Reason``, and the live ones;
- ``not_delivered``: of the tasks that ended NodePoolTimeout or NodePoolFailed, those
  whose capacity wait lasted the whole ``capacity_budget_s`` by their event log (as the
  judge's ``failed_for_capacity`` reads it): GKE did not deliver within the budget. The
  others are the controller's to answer for;
- ``time_to_running_s``: ``p50``, ``p90``, ``p99``, ``mean`` and ``n`` from ``created_at``
  to the first Running, for ``all``, per supply mode (the task's, else its cluster's
  default: reservation when it has one, flex-start otherwise) and per ``type/topology``;
- ``pending_s_by_reason``: per Pending reason (``New`` before the poller takes it), the
  mean over the tasks that entered it of the time each spent in it;
- ``idle_chip_hours``: the fleet's own count of chips of pools whose VMs exist while no
  pod runs on them; ``used_chip_hours``: the chips of each task's shape times its time
  Running;
- ``statements_per_task``: the controller's database statements over the run, per task;
- ``ready_pool_idle_s``: the seconds a pool whose every node was Ready sat Idle while a task
  of its (cluster, topology) waited in Waiting, summed over pools (each queue's decision
  counts them; the count holds until its next step);
- ``queue_steps``: the queues' steps the run took (``run``) and those that carried out a
  decision (``applied``): with ``wall_s``, what one step costs;
- ``eta_error_s``: over the tasks whose Waiting Message gave a start estimate ("expected
  to start around 2026-01-05 14:25 UTC, by 14:50 UTC at the latest") and that then ran, the
  median and p90 of |estimated - actual start|, from the first estimate shown and from the
  last; ``signed_p50``, the median of actual - first estimated start (positive: later than
  promised); ``coverage``, the share of the tasks whose first Message promised a latest
  start that reached Running by it; ``per_supply``, per supply mode, the first estimate's
  median error (``first_p50``) and the ``coverage``; ``per_cell``, the same and ``tasks``
  per "cluster/supply mode"; ``wait_p50``, the median time from creation to Running of the
  tasks with an estimate, and ``first_over_wait``, ``first.p50`` over it (issue 35 asks for
  at most 0.25);
- ``invariants``: the chaos soak's (``falcon_ray.devtools.chaos.check``), each a count:
  ``lost``, ``stuck``, ``second_job_creates``, ``pools_alive``, ``aborts_overwritten``,
  ``failed_for_capacity``, ``illegal_transitions`` (and the soak's others), with
  production limits: a phase is stuck past ``node_pool_timeout_s``, ``waiting_limit_s`` (a
  reservation wait whose Message promises its hosts free by an instant: that instant, when later),
  ``capacity_budget_s`` (WaitingForNode: nodes that do not come), ``create_queue_limit_s``
  (a create still waiting its turn among the cluster's node-pool operations) or the task's own timeout,
  plus ``STUCK_MARGIN_S`` (the run looks at the live tasks'
  Messages every ``driver.MONITOR_S``); ``broken``, only when one is not 0: up to three
  cases of each.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections import Counter, defaultdict
from typing import Any

from falcon_ray import tpu
from falcon_ray.devtools import chaos
from falcon_ray.lifecycle import TERMINAL, Reason
from falcon_ray.spec import SpecError, SupplyMode, parse_spec

from .driver import MONITOR_S, START, Simulation

STUCK_MARGIN_S = MONITOR_S + 60.0
_NODE_POOL_FAILURES = frozenset({Reason.NODE_POOL_TIMEOUT.value, Reason.NODE_POOL_FAILED.value})
_ESTIMATE = re.compile(r"expected to start around (\d{4}-\d\d-\d\d \d\d:\d\d) UTC")
_LATEST = re.compile(r"by (\d{4}-\d\d-\d\d \d\d:\d\d|\d\d:\d\d) UTC at the latest")


def _percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None}
    v = sorted(values)

    def rank(q: float) -> float:
        return round(v[min(len(v) - 1, max(0, int(q * len(v) + 0.999999) - 1))], 1)

    return {"n": len(v), "p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "mean": round(sum(v) / len(v), 1)}


def _offset(at) -> float:
    return round((at - START).total_seconds(), 3)


def estimate_s(message: str, at: float) -> float | None:
    """The start estimate a Waiting Message written ``at`` (seconds since the start) gives,
    in seconds after ``at``: the time it names less the Message's own."""
    m = _ESTIMATE.search(message or "")
    if m is None:
        return None
    return (dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M") - START).total_seconds() - at


def latest_s(message: str, at: float) -> float | None:
    """The latest start a Waiting Message written ``at`` gives, in seconds after ``at``
    (its time alone is on the expected start's day)."""
    m, e = _LATEST.search(message or ""), _ESTIMATE.search(message or "")
    if m is None or e is None:
        return None
    text = m.group(1) if len(m.group(1)) > 5 else f"{e.group(1)[:10]} {m.group(1)}"
    return (dt.datetime.strptime(text, "%Y-%m-%d %H:%M") - START).total_seconds() - at


def _supply(spec, cluster) -> str:
    if spec.supply_mode is not None:
        return spec.supply_mode.value
    return (SupplyMode.RESERVATION if cluster is not None and cluster.default_reservation else SupplyMode.FLEX_START).value


def build_report(sim: Simulation, wall_s: float) -> dict[str, Any]:
    store = sim.store
    tasks = store.get_tasks(sim.ids)
    events: dict[int, list[Any]] = defaultdict(list)
    for e in store.events_since(START):
        events[e.task_id].append(e)
    clusters = {c.id: c for c in store.list_clusters()}
    end = sim.simulated_s
    fleet = {"clusters": {name: c.stats() for name, c in sim.fleet.clusters.items()}}
    terminal = {str(s) for s in TERMINAL}

    digest = hashlib.sha256()
    outcomes: Counter[str] = Counter()
    not_delivered = 0
    budget_s = sim.settings.capacity_budget_s or 0.0
    ttr: dict[str, list[float]] = defaultdict(list)
    pending: dict[str, list[float]] = defaultdict(list)
    used_chip_s = 0.0
    started_at: dict[int, float] = {}
    waited: dict[int, float] = {}  # created -> first Running
    supply: dict[int, str] = {}
    cell: dict[int, str] = {}  # "cluster/supply mode"
    for t in tasks:
        evs = events.get(t.id, [])
        line = [t.id, t.name, [(_offset(e.at), e.status, e.reason or "", e.message or "") for e in evs], t.status, t.reason or "", t.message or ""]
        digest.update(json.dumps(line, separators=(",", ":")).encode() + b"\n")
        outcomes[(f"{t.status}/{t.reason}" if t.reason else str(t.status)) if str(t.status) in terminal else "live"] += 1
        if t.reason in _NODE_POOL_FAILURES and str(t.status) in terminal and chaos.budget_spent(evs, budget_s):
            not_delivered += 1
        try:
            spec = parse_spec(t.spec)
        except SpecError:
            spec = None
        per_reason: dict[str, float] = defaultdict(float)
        for i, e in enumerate(evs):
            until = _offset(evs[i + 1].at) if i + 1 < len(evs) else end
            span = max(0.0, until - _offset(e.at))
            if e.status == "Pending":
                per_reason[e.reason or "New"] += span
            elif e.status == "Running" and spec is not None:
                used_chip_s += span * _chips(spec)
        for reason, s in per_reason.items():
            pending[reason].append(s)
        running = next((e for e in evs if e.status == "Running"), None)
        if spec is not None:
            supply[t.id] = _supply(spec, clusters.get(t.cluster_id))
            cell[t.id] = f"{clusters[t.cluster_id].name if t.cluster_id in clusters else '-'}/{supply[t.id]}"
        if running is not None and spec is not None:
            wait = (running.at - t.created_at).total_seconds()
            started_at[t.id] = _offset(running.at)
            waited[t.id] = wait
            ttr["all"].append(wait)
            ttr[f"supply/{_supply(spec, clusters.get(t.cluster_id))}"].append(wait)
            ttr[f"topology/{spec.tpu_type}/{spec.topology}"].append(wait)

    time_to_running: dict[str, Any] = {"all": _percentiles(ttr.pop("all", []))}
    for prefix in ("supply", "topology"):
        time_to_running[prefix] = {k.split("/", 1)[1]: _percentiles(v) for k, v in sorted(ttr.items()) if k.startswith(prefix + "/")}
    idle_chip_s = sum(float(c.get("idle_chip_seconds") or 0.0) for c in fleet["clusters"].values())
    statements = sum(s.statements for s in sim.controller_stores)
    return {
        "seed": sim.seed,
        "simulated_s": round(end, 1),
        "wall_s": round(wall_s, 2),
        "digest": digest.hexdigest(),
        "tasks": len(tasks),
        "outcomes": dict(sorted(outcomes.items())),
        "not_delivered": not_delivered,
        "time_to_running_s": time_to_running,
        "pending_s_by_reason": {k: round(sum(v) / len(v), 1) for k, v in sorted(pending.items())},
        "idle_chip_hours": round(idle_chip_s / 3600.0, 2),
        "ready_pool_idle_s": round(sim.ready_pool_idle_s, 1),
        "used_chip_hours": round(used_chip_s / 3600.0, 2),
        "statements_per_task": round(statements / len(tasks), 1) if tasks else None,
        "queue_steps": sim.queue_steps,
        "eta_error_s": _eta_error(sim.messages, started_at, supply, cell, waited),
        **_invariants(sim, tasks, events, fleet, end),
    }


def _chips(spec) -> int:
    try:
        return tpu.lookup(spec.tpu_type, spec.topology).chips
    except tpu.UnknownShape:
        return 0


def _eta_error(
    messages: list[tuple[float, int, str]],
    started_at: dict[int, float],
    supply: dict[int, str],
    cell: dict[int, str] | None = None,
    waited: dict[int, float] | None = None,
) -> dict[str, Any]:
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    latest: dict[int, float] = {}  # the first latest start promised
    for at, tid, text in messages:
        est = estimate_s(text, at)
        if est is None or tid not in started_at or at > started_at[tid]:
            continue
        if tid not in first:
            first[tid] = at + est
            bound = latest_s(text, at)
            if bound is not None:
                latest[tid] = at + bound
        last[tid] = at + est
    out: dict[str, Any] = {"tasks": len(first)}
    for name, predicted in (("first", first), ("last", last)):
        errors = sorted(abs(p - started_at[tid]) for tid, p in predicted.items())
        stats = _percentiles(errors)
        out[name] = {"p50": stats["p50"], "p90": stats["p90"]}
    out["signed_p50"] = _percentiles([started_at[tid] - p for tid, p in first.items()])["p50"]
    waited = waited or {}
    wait = _percentiles([waited[tid] for tid in first if tid in waited])["p50"]
    out["wait_p50"] = wait
    out["first_over_wait"] = round(out["first"]["p50"] / wait, 3) if wait and out["first"]["p50"] is not None else None
    out["coverage"] = _coverage(latest, started_at, latest)
    per: dict[str, list[int]] = defaultdict(list)
    for tid in first:
        per[supply.get(tid, "")].append(tid)
    out["per_supply"] = {
        mode: {
            "first_p50": _percentiles([abs(first[tid] - started_at[tid]) for tid in ids])["p50"],
            "coverage": _coverage(latest, started_at, ids),
        }
        for mode, ids in sorted(per.items())
    }
    cells: dict[str, list[int]] = defaultdict(list)
    for tid in first:
        cells[(cell or {}).get(tid, "-")].append(tid)
    out["per_cell"] = {
        name: {"tasks": len(ids), "first_p50": _percentiles([abs(first[tid] - started_at[tid]) for tid in ids])["p50"], "coverage": _coverage(latest, started_at, ids)}
        for name, ids in sorted(cells.items())
    }
    return out


def _coverage(latest: dict[int, float], started_at: dict[int, float], ids) -> float | None:
    """The share of ``ids`` promised a latest start that reached Running by it (None: none promised)."""
    promised = [tid for tid in ids if tid in latest]
    return round(sum(1 for tid in promised if started_at[tid] <= latest[tid]) / len(promised), 3) if promised else None


def _invariants(sim: Simulation, tasks, events, fleet, end: float) -> dict[str, Any]:
    observed: dict[int, chaos.Observed] = {}
    for t in tasks:
        obs = observed[t.id] = chaos.Observed()
        # a look at the live tasks saw the row as it was before the moves of the same instant
        timeline = [(at, 0, status, reason, message) for at, status, reason, message in sim.observed.get(t.id, [])]
        timeline += [(_offset(e.at), 1, e.status, e.reason or "", e.message or "") for e in events.get(t.id, [])]
        for at, _order, status, reason, message in sorted(timeline, key=lambda x: (x[0], x[1])):
            obs.see(at, status, reason, message)
    s = sim.settings
    limits = chaos.Limits(
        node_pool_timeout=s.node_pool_timeout_s,
        margin=STUCK_MARGIN_S,
        waiting=s.waiting_limit_s,
        recovery_wait=s.recovery_pool_wait_s,
        capacity_budget=s.capacity_budget_s or 0.0,
        create_queue=s.create_queue_limit_s,
        origin=START,
    )
    result = chaos.check(tasks, events, observed, end, fleet, limits, disruptions=sim.store.disruptions([t.id for t in tasks]))
    out: dict[str, Any] = {"invariants": dict(result["invariants"])}
    if result["details"]:  # what broke, a few of each (the replay shows the rest)
        out["broken"] = {k: v[:3] for k, v in sorted(result["details"].items())}
    return out
