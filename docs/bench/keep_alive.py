"""The keep-alive comparison of docs/bench/keep-alive.md: two commands.

    python docs/bench/keep_alive.py simulate [falcon-ray simulate options]
        `falcon-ray simulate` itself, with three fields added to its report, read from the
        same run: ``idle_chip_hours_by_supply`` (the fleet's idle chip-seconds per pool,
        summed by the pool's supply mode); ``starts`` (the tasks that reached Running, split
        by how they got their pool: ``handover``, picked straight to Dispatching, or
        ``create``, through Provisioning, ClusterBusy or WaitingForNode first, which includes
        a task that switched to a pool freed while its own create waited; count, median
        and deciles of the time to Running of each, ``all_deciles`` of both; ``cluster_busy``:
        the tasks that entered ClusterBusy and the task-hours spent there); and
        ``eta_signed`` (per task whose Waiting Message
        gave a start estimate and that then ran: actual start - first promised start,
        percentiles; ``early_share``: the share that started before the promise; ``wait_*``:
        actual start - when that estimate was first shown).
    python docs/bench/keep_alive.py table DIR
        the tables of the page from DIR/POLICY-sSEED.json. Billable idle chip-hours are those
        of flex-start and on-demand pools; the criterion column counts the seeds on which a
        policy cut the median time to Running by 30% or more for at most 10% more idle
        chip-hours than ``seed`` (the original rule), all idle chip-hours / billable ones.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

POLICIES = ["delete", "seed", "flex5", "flex10", "flex20", "res60", "res1d", "both"]
SEEDS = [1, 2]
OUTCOME = {"Succeeded": "S", "Failed/JobFailed": "JF", "Aborted": "A", "Failed/NodePoolTimeout": "NPT"}


def _pct(values: list[float], q: float) -> float | None:
    return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else None


def simulate() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":  # as `falcon-ray simulate` does: a replayable run
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, *sys.argv])
    import falcon_ray.devtools.simulate.report as report
    from falcon_ray.cli import main

    original = report.build_report

    def eta_signed(sim) -> dict:
        started: dict[int, float] = {}
        for e in sim.store.events_since(report.START):
            if e.status == "Running" and e.task_id not in started:
                started[e.task_id] = report._offset(e.at)
        first: dict[int, tuple[float, float]] = {}
        for at, tid, text in sim.messages:
            est = report.estimate_s(text, at)
            if est is not None and tid in started and at <= started[tid] and tid not in first:
                first[tid] = (at, at + est)
        late = sorted(started[t] - p for t, (_, p) in first.items())
        waits = sorted(started[t] - at for t, (at, _) in first.items())
        return {
            "tasks": len(first),
            "late_p10": _pct(late, 0.1), "late_p50": _pct(late, 0.5), "late_p90": _pct(late, 0.9),
            "wait_p50": _pct(waits, 0.5), "wait_p90": _pct(waits, 0.9),
            "early_share": round(sum(1 for x in late if x < 0) / len(late), 3) if late else None,
        }  # fmt: skip

    def starts(sim) -> dict:
        events: defaultdict[int, list] = defaultdict(list)
        for e in sim.store.events_since(report.START):
            events[e.task_id].append(e)
        created = {t.id: t.created_at for t in sim.store.get_tasks(sim.ids)}
        kinds: defaultdict[str, list[float]] = defaultdict(list)
        busy = [0, 0.0]  # tasks that entered ClusterBusy, task-hours spent there
        for tid, evs in events.items():
            for i, e in enumerate(evs):
                if e.status == "Pending" and e.reason == "ClusterBusy":
                    end = evs[i + 1].at if i + 1 < len(evs) else None
                    busy[1] += ((end - e.at).total_seconds() if end else sim.simulated_s - report._offset(e.at)) / 3600.0
            if any(e.status == "Pending" and e.reason == "ClusterBusy" for e in evs):
                busy[0] += 1
            run = next((i for i, e in enumerate(evs) if e.status == "Running"), None)
            if run is None:
                continue
            # the acquisition that led to the first Running: a create passes Provisioning
            created_pool = any(e.reason in ("Provisioning", "ClusterBusy", "WaitingForNode") for e in evs[:run])
            kinds["create" if created_pool else "handover"].append((evs[run].at - created[tid]).total_seconds())
        out = {k: {"n": len(v), "p50": _pct(sorted(v), 0.5), "deciles": [_pct(sorted(v), q / 10) for q in range(1, 10)]} for k, v in sorted(kinds.items())}
        every = sorted(x for v in kinds.values() for x in v)
        out["all_deciles"] = [_pct(every, q / 10) for q in range(1, 10)]
        out["cluster_busy"] = {"tasks": busy[0], "hours": round(busy[1], 1)}
        return out

    def build_report(sim, wall_s):
        out = original(sim, wall_s)
        out["eta_signed"] = eta_signed(sim)
        out["starts"] = starts(sim)
        by_supply: defaultdict[str, float] = defaultdict(float)
        for c in sim.fleet.clusters.values():
            now = c.mono()
            for pool in c.pools.history:
                by_supply[pool.supply or "?"] += pool.idle_total(now)
        out["idle_chip_hours_by_supply"] = {k: round(v / 3600.0, 2) for k, v in sorted(by_supply.items())}
        return out

    report.build_report = build_report
    sys.argv = ["falcon-ray", *sys.argv[1:]]  # "simulate" and its options
    return main()


BILLED = ("flex-start", "on-demand")  # a reservation's hosts are paid for whether used or not


def _billed(r: dict) -> float:
    return sum(r.get("idle_chip_hours_by_supply", {}).get(k, 0.0) for k in BILLED)


def _row(pol: str, r: dict) -> str:
    t, idle, st = r["time_to_running_s"], r.get("idle_chip_hours_by_supply", {}), r.get("starts", {})
    sup = t["supply"]
    outcomes = ", ".join(f"{OUTCOME.get(k, k)} {v}" for k, v in sorted(r["outcomes"].items(), key=lambda kv: -kv[1]))
    ho, cr = st.get("handover", {}), st.get("create", {})
    busy = st.get("cluster_busy", {})
    return (
        f"| {pol} | {r['seed']} | {t['all']['p50']:.0f} / {t['all']['p90']:.0f} | "
        f"{sup.get('reservation', {}).get('p50', 0):.0f} / {sup.get('flex-start', {}).get('p50', 0):.0f} | "
        f"{ho.get('n', 0)} / {cr.get('n', 0)} ({ho.get('n', 0) / max(1, ho.get('n', 0) + cr.get('n', 0)):.0%}) | "
        f"{ho.get('p50') or 0:.0f} / {cr.get('p50') or 0:.0f} | "
        f"{r['idle_chip_hours']:.0f} = {idle.get('reservation', 0):.0f} + {_billed(r):.0f} | "
        f"{r['used_chip_hours']:.0f} | {outcomes} | {busy.get('tasks', '-')} / {busy.get('hours', '-')} |"
    )


def table(out: Path) -> None:
    def load(pol: str, s: int) -> dict | None:
        p = out / f"{pol}-s{s}.json"
        return json.loads(p.read_text()) if p.exists() else None

    print("| policy | seed | time to Running p50 / p90 (s) | p50 reservation / flex-start (s) | starts hand-over / create (share) | p50 hand-over / create (s) | idle chip-h = reservation + billable | used chip-h | outcomes | ClusterBusy tasks / task-h |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for pol in POLICIES:
        for s in SEEDS:
            if (r := load(pol, s)) is not None:
                print(_row(pol, r))
    print()
    print("| policy | p50 | idle chip-h | billable idle chip-h | idle per used chip-h | used chip-h | Succeeded | ClusterBusy task-h | criterion: all / billable (seeds met) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pol in POLICIES:
        ratios, met = [], [0, 0]
        for s in SEEDS:
            r, b = load(pol, s), load("seed", s)
            if r is None or b is None:
                continue
            per = lambda x: x["idle_chip_hours"] / x["used_chip_hours"]  # noqa: E731
            busy = lambda x: x.get("starts", {}).get("cluster_busy", {}).get("hours", 0.0)  # noqa: E731
            x = (
                r["time_to_running_s"]["all"]["p50"] / b["time_to_running_s"]["all"]["p50"],
                r["idle_chip_hours"] / b["idle_chip_hours"],
                _billed(r) / _billed(b),
                per(r) / per(b),
                r["used_chip_hours"] / b["used_chip_hours"],
                r["outcomes"].get("Succeeded", 0) / max(1, b["outcomes"].get("Succeeded", 0)),
                busy(r) / busy(b) if busy(b) else float("nan"),
            )  # fmt: skip
            ratios.append(x)
            met[0] += x[0] <= 0.7 and x[1] <= 1.1  # the criterion: p50 -30% or more, idle +10% or less
            met[1] += x[0] <= 0.7 and x[2] <= 1.1
        if ratios:
            m = [statistics.mean(x[i] for x in ratios) for i in range(7)]
            print(f"| {pol} | " + " | ".join(f"{v - 1:+.0%}" for v in m) + f" | {met[0]} / {met[1]} of {len(ratios)} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["simulate"]:
        sys.exit(simulate())
    table(Path(sys.argv[2] if len(sys.argv) > 2 else "."))
