"""The operator notebooks: committed without outputs, in step with their generator, and
running headless against a live controller (DemoRun on the simulated fleet).

The controller is set up so every table has rows: one task has finished, one runs,
one holds the queue's slot (ClusterBusy: the one-host reservation is taken) and one
waits behind it. Each notebook then runs in its own Python kernel that joins the
session's Ray as a second driver, exactly as an operator's Jupyter would.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import nbformat
import pytest
import ray

from falcon_ray import lifecycle as lc
from falcon_ray.devtools.demo import DemoRun, demo_settings
from falcon_ray.render import job_name
from tests.harness.e2e import make_fleet, spec, wait_for

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
NAMES = ("queues.ipynb", "fleet.ipynb", "task.ipynb")


def _build_module():
    module_spec = importlib.util.spec_from_file_location("falcon_notebooks_build", NOTEBOOKS / "build.py")
    mod = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(mod)
    return mod


def test_committed_notebooks_match_the_generator_and_have_no_outputs():
    rendered = _build_module().render()
    assert sorted(rendered) == sorted(NAMES)
    for name, text in rendered.items():
        committed = (NOTEBOOKS / name).read_text()
        assert committed == text, f"{name} is stale: run python notebooks/build.py"
        nb = nbformat.reads(committed, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{name}: {cell.id} has outputs"


def _imported_modules(nb) -> set[str]:
    """The top-level modules the notebook's code cells import."""
    found = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def test_the_notebooks_extra_brings_every_module_the_notebooks_import():
    """`pip install 'falcon-ray[notebooks]'` is all a notebook needs (docs/notebooks.md): every
    module a cell imports is the standard library's, this package's, or a distribution named
    in the extra; the test extra and the image (deploy/Dockerfile) install the extra."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {re.split(r"[\[<>=!~;\s]", r, maxsplit=1)[0].lower().replace("_", "-") for r in extras["notebooks"]}
    assert {"ipykernel", "nbclient", "nbformat"} <= named  # a kernel, and what runs it headless
    assert "falcon-ray[notebooks]" in extras["test"]
    dists = packages_distributions()
    for name in NAMES:
        for module in sorted(_imported_modules(nbformat.read(NOTEBOOKS / name, as_version=4))):
            if module in sys.stdlib_module_names or module == "falcon_ray":
                continue
            provided = {d.lower().replace("_", "-") for d in dists.get(module, [])}
            assert provided & named, f"{name} imports {module} (from {sorted(provided)}), which the notebooks extra lacks"
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"pip install --no-cache-dir /home/ray/falcon-ray-src'\[notebooks\]'", dockerfile)
    assert "pip install --user" not in (ROOT / "docs" / "notebooks.md").read_text()  # nothing at run time


@pytest.fixture
def busy_controller(ray_session, tmp_path):
    fleet = make_fleet(a={"reservation": {"name": "res-a", "count": 1}, "chips": 16}, with_b=False, seed=5)
    run = DemoRun(fleet, demo_settings(), f"sqlite:///{tmp_path / 'falcon.db'}").start()
    try:
        ids = {}
        ids["done"] = run.submit("alice", spec("2x2", 0.3, supply_mode="reservation"), "nb-quick")
        wait_for(run, ids["done"], lambda t: t.status == "Succeeded")
        ids["running"] = run.submit("bob", spec("2x2", 300, supply_mode="reservation"), "nb-long")
        wait_for(run, ids["running"], lambda t: t.phase == lc.RUNNING)
        ids["busy"] = run.submit("carol", spec("2x2", 1, supply_mode="reservation"), "nb-busy")
        wait_for(run, ids["busy"], lambda t: t.phase == lc.CLUSTER_BUSY)
        ids["waiting"] = run.submit("dave", spec("2x2", 1, supply_mode="reservation"), "nb-waiting")
        wait_for(run, ids["waiting"], lambda t: t.phase == lc.WAITING and "ahead" in t.message)
        yield run, ids
    finally:
        run.stop()


def _outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif out.output_type in ("display_data", "execute_result"):
                parts.extend(str(v) for k, v in out.data.items() if k.startswith("text/"))
    return "\n".join(parts)


def _images(nb) -> int:
    return sum(
        1
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.output_type in ("display_data", "execute_result") and "image/png" in out.data
    )


@pytest.mark.timeout(150)
def test_notebooks_run_headless_against_a_live_controller(busy_controller, monkeypatch):
    from nbclient import NotebookClient

    run, ids = busy_controller
    monkeypatch.setenv("FALCON_RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    monkeypatch.setenv("FALCON_NAMESPACE", run.settings.namespace)
    monkeypatch.setenv("FALCON_DB_URL", run.db_url)
    monkeypatch.setenv("FALCON_TASK_ID", str(ids["done"]))
    monkeypatch.setenv("RAY_DEDUP_LOGS", "0")

    executed = {}
    for name in NAMES:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        # raises CellExecutionError (with the cell and its traceback) on the first failing cell
        NotebookClient(nb, timeout=90, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        executed[name] = nb

    queues = _outputs_text(executed["queues.ipynb"])
    for needle in ("queue/edge-a/2x2", "nb-long", "nb-busy", "nb-waiting", "ClusterBusy", "InUse"):
        assert needle in queues, f"queues.ipynb: {needle!r} missing"
    assert "nb-quick" not in queues  # finished tasks leave the queue
    assert _images(executed["queues.ipynb"]) == 1

    fleet = _outputs_text(executed["fleet.ipynb"])
    for needle in ("edge-a", "res-a", "active", "reservation", "Succeeded"):
        assert needle in fleet, f"fleet.ipynb: {needle!r} missing"
    assert _images(executed["fleet.ipynb"]) == 1

    task = _outputs_text(executed["task.ipynb"])
    done = ids["done"]
    for needle in ("nb-quick", job_name(done), f"gs://logs-a/logs/{done}/", "Provisioning", "Dispatching", "Succeeded"):
        assert needle in task, f"task.ipynb: {needle!r} missing"
    assert _images(executed["task.ipynb"]) == 1

    # the task notebook defaults to the newest task when FALCON_TASK_ID is unset
    monkeypatch.delenv("FALCON_TASK_ID")
    nb = nbformat.read(NOTEBOOKS / "task.ipynb", as_version=4)
    NotebookClient(nb, timeout=90, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    assert "nb-waiting" in _outputs_text(nb)
    json.dumps(nb)  # outputs stay JSON-serialisable (nothing exotic displayed)
