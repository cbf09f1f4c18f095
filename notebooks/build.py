"""Generate the operator notebooks (queues, fleet, task) without outputs.

The notebooks are built here, not edited in Jupyter, so a change is a reviewable
diff of this file and the committed ``.ipynb`` files never carry outputs. Every
cell only calls ``falcon_ray.inspect`` and displays what it returns.

    python notebooks/build.py          # rewrite notebooks/*.ipynb
    python notebooks/build.py --check  # exit 1 if a committed notebook differs
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

CONNECT = """\
import io
import os

import matplotlib

matplotlib.use("Agg")  # headless: figures are rendered to PNG and displayed explicitly
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, Markdown, display

from falcon_ray import inspect


def show(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    display(Image(buf.getvalue()))


# unset: a running `falcon-ray demo` (its discovery record), else Ray "auto" and namespace "falcon"
NAMESPACE = inspect.connect(os.environ.get("FALCON_RAY_ADDRESS"), os.environ.get("FALCON_NAMESPACE"))"""

STORE = """\
store = inspect.open_store(os.environ.get("FALCON_DB_URL"), NAMESPACE)"""

ENV_HELP = """\
Against a running `falcon-ray demo` nothing needs setting (it is found through its
discovery record). Otherwise set before starting Jupyter (see `docs/notebooks.md`):
`FALCON_RAY_ADDRESS` (default `auto`), `FALCON_NAMESPACE` (default `falcon`){extra}."""


# The queue-depth chart; docs/queues_chart.py runs this same cell to draw docs/img/queues-depth.png.
DEPTH_CELL = """\
depths = pd.DataFrame(inspect.queue_depths(snaps), columns=["queue", "waiting", "acquiring", "running", "aborting", "error"])
display(depths)
if len(depths):
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(depths) + 1.5))
    depths.set_index("queue")[["waiting", "acquiring", "running"]].plot.barh(stacked=True, ax=ax)
    ax.set_xlabel("tasks")
    ax.xaxis.get_major_locator().set_params(integer=True)  # whole tasks
    ax.set_title("Queue depth")
    show(fig)"""


def _nb(stem: str, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, src) in enumerate(cells):
        cell = new_markdown_cell(src) if kind == "md" else new_code_cell(src)
        cell["id"] = f"{stem}-{i}"  # stable ids: regenerating gives the same file
        nb.cells.append(cell)
    return nb


def queues() -> nbformat.NotebookNode:
    return _nb(
        "queues",
        [
            ("md", "# Falcon queues\n\nEvery QueueActor of a running controller, read live from its `snapshot()`.\n\n"
             + ENV_HELP.format(extra="")),
            ("code", CONNECT + "\nsnaps = inspect.queues(NAMESPACE)\nprint(f\"{len(snaps)} queue(s) in namespace {NAMESPACE}\")"),
            ("md", "## Depth per queue"),
            ("code", DEPTH_CELL),
            ("md", "## Each queue\n\nWaiting tasks in pick order (position 1 is granted next), the slot holder "
             "(the one task acquiring a pool) and its phase, running tasks, and the queue's node pools."),
            ("code", """\
for q in snaps:
    display(Markdown(f"### {q.get('queue') or q['actor']}"))
    if "error" in q:
        display(Markdown(f"**not answering:** `{q['error']}`"))
        continue
    display(Markdown(f"last granted actor: `{q['last_granted'] or '-'}`; last tick error: `{q['last_error'] or '-'}`"))
    display(Markdown("**waiting** (pick order)"))
    display(pd.DataFrame(q["waiting"], columns=["position", "id", "actor", "name", "waiting_s", "message"]))
    display(Markdown("**slot holder**"))
    display(pd.DataFrame(q["acquiring"], columns=["id", "actor", "name", "reason", "node_pool", "waiting_s", "message"]))
    display(Markdown("**running**"))
    display(pd.DataFrame(q["running"], columns=["id", "actor", "name", "node_pool", "message"]))
    if q["aborting"]:
        display(Markdown("**aborting**"))
        display(pd.DataFrame(q["aborting"], columns=["id", "actor", "name", "node_pool", "message"]))
    display(Markdown("**pools and leases**"))
    display(pd.DataFrame(q["leases"], columns=["name", "state", "task_id", "supply_mode", "pool_status", "nodes_ready", "created_at", "idle_since", "delete_attempts"]))"""),
        ],
    )


def fleet() -> nbformat.NotebookNode:
    return _nb(
        "fleet",
        [
            ("md", "# Falcon fleet\n\nPer cluster: registry status, reservation use, Falcon node pools "
             "by topology and supply mode, idle pools, and task outcomes from the event log.\n\n"
             + ENV_HELP.format(extra=", `FALCON_DB_URL` (the controller's database), `FALCON_OUTCOME_HOURS` (default 24)")),
            ("code", "import datetime as dt\n" + CONNECT + "\n" + STORE + "\n"
             "WINDOW = dt.timedelta(hours=float(os.environ.get(\"FALCON_OUTCOME_HOURS\", \"24\")))"),
            ("md", "## Clusters\n\nRegistry status, whether the ClusterActor is connected, and the default "
             "reservation: count, in use, headroom (count - in use, in hosts; empty until a queue asked for it)."),
            ("code", "display(pd.DataFrame(inspect.fleet(store, NAMESPACE)).set_index(\"cluster\"))"),
            ("md", "## Node pools by topology and supply mode"),
            ("code", "display(pd.DataFrame(inspect.pool_counts(store), columns=[\"cluster\", \"topology\", \"supply_mode\", \"pools\", \"in_use\", \"idle\"]))"),
            ("md", "## Idle pools\n\nPools kept after a task for a waiting task of the same topology, with how long they have been idle."),
            ("code", "display(pd.DataFrame(inspect.idle_pools(store), columns=[\"cluster\", \"topology\", \"supply_mode\", \"pool\", \"idle_s\", \"age_s\"]))"),
            ("md", "## Outcomes\n\nTerminal outcomes (`Status/Reason`) per cluster over the window; `-` is a task that "
             "failed before it had a cluster (an invalid spec, an unsupported TPU type)."),
            ("code", """\
outcomes = pd.DataFrame(inspect.outcomes_by_cluster(store, WINDOW), columns=["cluster", "outcome", "tasks"])
print(f"window: last {WINDOW}")
if len(outcomes):
    table = outcomes.pivot_table(index="cluster", columns="outcome", values="tasks", fill_value=0, aggfunc="sum")
    display(table)
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(table) + 1.5))
    table.plot.barh(stacked=True, ax=ax)
    ax.set_xlabel("tasks")
    ax.xaxis.get_major_locator().set_params(integer=True)  # whole tasks
    ax.set_title("Outcomes by cluster")
    show(fig)
else:
    display(Markdown("no task ended in the window"))"""),
        ],
    )


def task() -> nbformat.NotebookNode:
    return _nb(
        "task",
        [
            ("md", "# One Falcon task\n\nIts state, Job and pool, where its logs are, and its timeline from the event log.\n\n"
             + ENV_HELP.format(extra=", `FALCON_DB_URL` (the controller's database), `FALCON_TASK_ID` (default: the newest task)")),
            ("code", CONNECT + "\n" + STORE + "\n"
             "TASK_ID = int(os.environ.get(\"FALCON_TASK_ID\") or inspect.newest_task_id(store))\n"
             "info = inspect.task(store, TASK_ID)"),
            ("md", "## The task"),
            ("code", "display(pd.Series(info, name=f\"task {TASK_ID}\").to_frame())"),
            ("md", "## Logs\n\nEach pod of the Job writes `<prefix><pod name>.log` to the cluster's bucket "
             "(read them with `gcloud storage ls` / `gcloud storage cat`)."),
            ("code", """\
display(Markdown(f"Job `{info['job_name'] or '(not dispatched)'}` on pool `{info['node_pool'] or '-'}` in cluster `{info['cluster'] or '-'}`"))
display(Markdown(f"log prefix: `{info['log_prefix'] or '(the cluster has no log bucket)'}`"))"""),
            ("md", "## Timeline"),
            ("code", "display(pd.DataFrame(inspect.timeline(store, TASK_ID), columns=[\"at\", \"status\", \"reason\", \"seconds\", \"message\"]))"),
            ("code", """\
phases = pd.DataFrame(inspect.time_in_phases(store, TASK_ID), columns=["phase", "seconds"])
fig, ax = plt.subplots(figsize=(8, 0.5 * len(phases) + 1.5))
ax.barh(phases["phase"], phases["seconds"])
ax.invert_yaxis()
ax.set_xlabel("seconds")
ax.set_title(f"task {TASK_ID}: time in each status/reason")
show(fig)"""),
        ],
    )


NOTEBOOKS = {"queues.ipynb": queues, "fleet.ipynb": fleet, "task.ipynb": task}


def render() -> dict[str, str]:
    """File name -> the exact text the committed notebook must have."""
    return {name: nbformat.writes(make()) + "\n" for name, make in NOTEBOOKS.items()}


def main(argv: list[str]) -> int:
    stale = []
    for name, text in render().items():
        path = HERE / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale notebooks (run python notebooks/build.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
