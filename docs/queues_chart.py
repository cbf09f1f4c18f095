"""Draw docs/img/queues-depth.png: the queues notebook's chart, from recorded snapshots.

The chart is drawn by the notebook's own cell (``DEPTH_CELL`` in notebooks/build.py), so
the picture in docs/demo.md is what ``queues.ipynb`` shows.

    python docs/queues_chart.py                 # redraw the PNG from docs/img/queues-snapshot.json
    python docs/queues_chart.py --record 30     # first record: watch a running `falcon-ray demo`
                                                # for 30 s (found through its discovery record)
                                                # and keep its busiest moment

For a busy moment, start ``falcon-ray demo --hold`` and run ``--record`` as soon as it
prints "Where to look" (the sample tasks fill the queues in their first seconds).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SNAPSHOT = HERE / "img" / "queues-snapshot.json"
PNG = HERE / "img" / "queues-depth.png"


def _depth_cell() -> str:
    spec = importlib.util.spec_from_file_location("falcon_notebooks_build", ROOT / "notebooks" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.DEPTH_CELL


def record(seconds: float, path: Path) -> None:
    from falcon_ray import inspect

    namespace = inspect.connect()
    best, best_load = None, -1
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        snaps = inspect.queues(namespace)
        load = sum(r["waiting"] + r["acquiring"] + r["running"] for r in inspect.queue_depths(snaps))
        if load > best_load:
            best, best_load = snaps, load
        time.sleep(0.5)
    if not best:
        sys.exit("no queue seen: is a falcon-ray demo running?")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"namespace": namespace, "recorded_at": time.time(), "queues": best}, indent=2, default=str) + "\n")
    print(f"{path}: {len(best)} queue(s), {best_load} task(s) at the busiest moment")


def draw(snapshot: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from falcon_ray import inspect

    def show(fig) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", bbox_inches="tight", dpi=100)
        plt.close(fig)

    snaps = json.loads(snapshot.read_text())["queues"]
    scope = {"pd": pd, "plt": plt, "inspect": inspect, "snaps": snaps, "show": show, "display": lambda *_: None}
    exec(compile(_depth_cell(), "queues.ipynb: depth cell", "exec"), scope)  # noqa: S102 (our own cell)
    print(f"{out}: drawn from {snapshot}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", type=float, metavar="SECONDS", help="record from a running demo first")
    ap.add_argument("--snapshot", type=Path, default=SNAPSHOT)
    ap.add_argument("--out", type=Path, default=PNG)
    args = ap.parse_args(argv)
    if args.record:
        record(args.record, args.snapshot)
    draw(args.snapshot, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
