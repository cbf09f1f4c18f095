"""The timing sweep of docs/bench/timings.md (issue 37): one generated day on the five-cluster
fleet, played at a grid of GKE timings, with the slot's two rules. Two commands.

    python docs/bench/sweep_timings.py run OUTDIR TASKS [--rules default,strict] [--jobs 2] [--fleet F]
        For every flex-start capacity median in ``FLEX_MIN`` and node-pool create median in
        ``CREATE_MIN`` (minutes; each a log-normal with its p90 at twice the median, drawn per
        event by the fleet model), and every rule, runs ``falcon-ray simulate`` on
        ``five_clusters.yaml`` (or ``--fleet``) with those timings and writes OUTDIR/RULE-fF-cC.json. The
        rules: ``default`` (the slot serializes new capacity only) and ``strict``
        (``strict_slot: true``, the original's one task between pick and Running). The
        command run is ``$FALCON_RAY`` (default ``falcon-ray``), so another tree's controller
        can be played on the same grid (``today``: the rule before issue 37).
    python docs/bench/sweep_timings.py table OUTDIR
        The page's tables from OUTDIR/*.json: per grid point and rule, the tasks that ended
        NodePoolTimeout or NodePoolFailed (and of those, the report's ``not_delivered``: GKE did
        not deliver within ``capacity_budget_s``), time to Running p50/p90 per supply mode, the
        slowest topology's median (of those with 20 or more tasks), the bounds on p90
        (twice the slowest supply's own acquisition, create + capacity + registration + pod
        start: from the medians, and from the p90 of their sum as the fleet model draws
        them, ``DRAWS`` draws of a fixed seed), idle and used chip-hours and their ratio,
        ``ready_pool_idle_s`` and the invariants' sum.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FLEX_MIN = [2, 5, 15, 30, 60, 120]
CREATE_MIN = [5, 10, 20]
REGISTER_S = (90, 240)  # median, p90: nodes register minutes after the control plane is RUNNING
POD_START_S = 20
DRAWS = 100_000
FLEET = Path(__file__).resolve().parents[2] / "falcon_ray/devtools/simulate/fleets/five_clusters.yaml"


def _timings(flex_min: int, create_min: int) -> list[str]:
    f, c = flex_min * 60, create_min * 60
    return [
        "--timing", f"flex_capacity_wait=median:{f},p90:{2 * f}",
        "--timing", f"node_pool_create=median:{c},p90:{2 * c}",
        "--timing", f"node_register=median:{REGISTER_S[0]},p90:{REGISTER_S[1]}",
    ]  # fmt: skip


def run(outdir: str, tasks: str, rules: list[str], jobs: int, fleet: str) -> int:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "strict.yaml").write_text("strict_slot: true\n")
    (out / "default.yaml").write_text("strict_slot: false\n")
    command = shlex.split(os.environ.get("FALCON_RAY", "falcon-ray"))
    todo = []
    for rule in rules:
        for flex in FLEX_MIN:
            for create in CREATE_MIN:
                target = out / f"{rule}-f{flex}-c{create}.json"
                if target.exists():
                    continue
                config = [] if rule == "today" else ["--config", str(out / f"{rule}.yaml")]
                argv = [*command, "simulate", "--fleet", fleet, "--tasks", tasks, "--seed", "1", "--quiet",
                        *_timings(flex, create), *config, "--out", str(target)]  # fmt: skip
                todo.append(argv)

    def one(argv: list[str]) -> int:
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        print(f"rc {done.returncode}: {shlex.join(argv[-1:])}", flush=True)
        return done.returncode

    with ThreadPoolExecutor(jobs) as pool:
        codes = list(pool.map(one, todo))
    return 0 if all(c in (0, 1) for c in codes) else 2  # 1: an invariant broke (the table shows which)


def _lognormal(rng: random.Random, median: float, p90: float) -> float:
    return rng.lognormvariate(math.log(median), math.log(p90 / median) / 1.2815515655446004)


@functools.cache
def acquisition_p90(flex_min: int, create_min: int) -> float:
    """The p90 of a flex-start acquisition (create + capacity + registration + pod start),
    each drawn as the sweep's ``--timing`` flags make the fleet model draw it."""
    rng = random.Random(0)
    f, c = flex_min * 60, create_min * 60
    sums = sorted(
        _lognormal(rng, c, 2 * c) + _lognormal(rng, f, 2 * f) + _lognormal(rng, *REGISTER_S) + POD_START_S
        for _ in range(DRAWS)
    )
    return sums[int(0.9 * DRAWS)]


def _row(r: dict, flex: int, create: int) -> dict:
    ttr = r["time_to_running_s"]
    outcomes = r["outcomes"]
    failed = sum(n for k, n in outcomes.items() if k in ("Failed/NodePoolTimeout", "Failed/NodePoolFailed"))
    topo = [(v["p50"], k) for k, v in ttr["topology"].items() if v["n"] >= 20]
    worst = max(topo) if topo else (None, "")
    bound = 2 * (create * 60 + flex * 60 + REGISTER_S[0] + POD_START_S)
    supply = {k: (v["p50"], v["p90"]) for k, v in ttr["supply"].items()}
    return {
        "tasks": r["tasks"],
        "npt_npf": failed,
        "not_delivered": r.get("not_delivered"),
        "supply": supply,
        "p90_all": ttr["all"]["p90"],
        "bound": bound,
        "bound_p90": 2 * acquisition_p90(flex, create),
        "worst": worst,
        "idle": r["idle_chip_hours"],
        "used": r["used_chip_hours"],
        "ratio": round(r["idle_chip_hours"] / r["used_chip_hours"], 3) if r["used_chip_hours"] else None,
        "ready_idle": r.get("ready_pool_idle_s"),
        "invariants": sum(r["invariants"].values()),
    }


def _m(s: float | None) -> str:
    return "-" if s is None else f"{s / 60:.0f}"


def table(outdir: str) -> int:
    rows = []
    for p in sorted(Path(outdir).glob("*-f*-c*.json")):
        rule, f, c = p.stem.rsplit("-", 2)
        flex, create = int(f[1:]), int(c[1:])
        rows.append((flex, create, rule, _row(json.loads(p.read_text()), flex, create)))
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    print("| flex min | create min | rule | NPT+NPF (GKE did not deliver in budget) | flex-start p50/p90 (min) | reservation p50/p90 (min) | p90 all / bound: medians, p90 (min) "
          "| slowest topology p50 (min) | idle / used chip-h (ratio) | ready_pool_idle_s | invariants |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for flex, create, rule, r in rows:
        fs, rs = r["supply"].get("flex-start", (None, None)), r["supply"].get("reservation", (None, None))
        worst = f"{_m(r['worst'][0])} ({r['worst'][1]})" if r["worst"][0] is not None else "-"
        print(
            f"| {flex} | {create} | {rule} | {r['npt_npf']} of {r['tasks']} ({'-' if r['not_delivered'] is None else r['not_delivered']}) | {_m(fs[0])} / {_m(fs[1])} | {_m(rs[0])} / {_m(rs[1])} "
            f"| {_m(r['p90_all'])} / {_m(r['bound'])}, {_m(r['bound_p90'])} | {worst} | {r['idle']:.0f} / {r['used']:.0f} ({r['ratio']}) "
            f"| {r['ready_idle']} | {r['invariants']} |"
        )
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "run":
        rules, jobs, fleet = ["default", "strict"], 2, str(FLEET)
        rest = argv[3:]
        while rest:
            flag, value, rest = rest[0], rest[1], rest[2:]
            if flag == "--rules":
                rules = value.split(",")
            elif flag == "--jobs":
                jobs = int(value)
            elif flag == "--fleet":
                fleet = str(Path(value).resolve())
        return run(argv[1], argv[2], rules, jobs, fleet)
    if len(argv) == 2 and argv[0] == "table":
        return table(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
