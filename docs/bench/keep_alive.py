"""The keep-alive comparison of docs/bench/keep-alive.md: two commands.

    python docs/bench/keep_alive.py simulate [falcon-ray simulate options]
        `falcon-ray simulate` itself, with two fields added to its report, read from the
        same run: ``idle_chip_hours_by_supply`` (the fleet's idle chip-seconds per pool,
        summed by the pool's supply mode) and ``eta_signed`` (per task whose Waiting Message
        gave a start estimate and that then ran: actual start - first promised start,
        percentiles; ``early_share``: the share that started before the promise; ``wait_*``:
        actual start - when that estimate was first shown).
    python docs/bench/keep_alive.py table DIR
        the tables of the page from DIR/POLICY-sSEED.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

POLICIES = ["delete", "seed", "flex2", "flex5", "flex10", "flex20", "res20", "res60", "both", "flex10y", "bothy"]
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
            est = report.estimate_s(text)
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

    def build_report(sim, wall_s):
        out = original(sim, wall_s)
        out["eta_signed"] = eta_signed(sim)
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


def _row(pol: str, r: dict) -> str:
    t, idle, eta, signed = r["time_to_running_s"], r.get("idle_chip_hours_by_supply", {}), r["eta_error_s"], r.get("eta_signed", {})
    sup = t["supply"]
    outcomes = ", ".join(f"{OUTCOME.get(k, k)} {v}" for k, v in sorted(r["outcomes"].items(), key=lambda kv: -kv[1]))
    return (
        f"| {pol} | {r['seed']} | {t['all']['p50']:.0f} / {t['all']['p90']:.0f} | "
        f"{sup.get('reservation', {}).get('p50', 0):.0f} / {sup.get('flex-start', {}).get('p50', 0):.0f} | "
        f"{r['idle_chip_hours']:.0f} = {idle.get('reservation', 0):.0f} + {idle.get('flex-start', 0):.0f} | "
        f"{r['used_chip_hours']:.0f} | {outcomes} | {eta['first']['p50']:.0f} / {eta['first']['p90']:.0f} ({eta['tasks']}) | "
        f"{signed.get('late_p50', '-')} ({signed.get('early_share', '-')}) |"
    )


def table(out: Path) -> None:
    def load(pol: str, s: int) -> dict | None:
        p = out / f"{pol}-s{s}.json"
        return json.loads(p.read_text()) if p.exists() else None

    print("| policy | seed | time to Running p50 / p90 (s) | p50 reservation / flex-start (s) | idle chip-h = reservation + flex-start | used chip-h | outcomes | start estimate error p50 / p90, first (tasks) | start - promise p50 (share early) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pol in POLICIES:
        for s in SEEDS:
            if (r := load(pol, s)) is not None:
                print(_row(pol, r))
    print()
    print("| policy | p50 | idle chip-h | idle flex-start chip-h | idle per used chip-h | used chip-h | Succeeded |")
    print("|---|---|---|---|---|---|---|")
    for pol in POLICIES:
        ratios = []
        for s in SEEDS:
            r, b = load(pol, s), load("seed", s)
            if r is None or b is None:
                continue
            flex = lambda x: x.get("idle_chip_hours_by_supply", {}).get("flex-start", 0.0)  # noqa: E731
            per = lambda x: x["idle_chip_hours"] / x["used_chip_hours"]  # noqa: E731
            ratios.append((
                r["time_to_running_s"]["all"]["p50"] / b["time_to_running_s"]["all"]["p50"],
                r["idle_chip_hours"] / b["idle_chip_hours"],
                flex(r) / flex(b),
                per(r) / per(b),
                r["used_chip_hours"] / b["used_chip_hours"],
                r["outcomes"].get("Succeeded", 0) / max(1, b["outcomes"].get("Succeeded", 0)),
            ))  # fmt: skip
        if ratios:
            m = [statistics.mean(x[i] for x in ratios) for i in range(6)]
            print(f"| {pol} | " + " | ".join(f"{v - 1:+.0%}" for v in m) + " |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["simulate"]:
        sys.exit(simulate())
    table(Path(sys.argv[2] if len(sys.argv) > 2 else "."))
