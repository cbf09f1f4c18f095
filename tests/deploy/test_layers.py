"""The layer contracts in pyproject.toml hold, and a broken one fails the run.

``lint-imports`` (import-linter) checks them on the real tree; the other tests plant
imports that break them in a copy of the tree (a store import in the decisions, Ray in
the model and the queue; a tool or the simulated fleet imported by the product; a
lower layer importing a higher one), all in one copy and one run, and show the command
failing on exactly those.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def run_lint(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_every_layer_contract_is_kept():
    out = run_lint(REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def copy_tree(tmp_path: Path) -> None:
    for pkg in ("falcon_ray", "actors"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")


def plant(tmp_path: Path, module: str, line: str) -> None:
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{line}  # noqa\n")


# the imports planted in one copy of the tree, one contract each (import-linter reports
# every broken contract with all its chains, so one run shows them all)
PLANTED = (
    ("falcon_ray/reconcile/pick.py", "from falcon_ray.store import Store"),  # the store in the decisions
    ("falcon_ray/model.py", "import ray"),  # Ray in the values
    ("actors/queue.py", "import ray"),  # Ray in the queue's plain object
    ("falcon_ray/health.py", "from falcon_ray.devtools import demo"),  # a tool in the product
    ("actors/queue.py", "import falcon_ray.sim.fleet"),  # the simulated fleet in an actor
    ("falcon_ray/cli.py", "import falcon_ray.sim.cli"),
    ("falcon_ray/cli_shared.py", "from falcon_ray import cli"),  # the command-line cycle again
    ("falcon_ray/lifecycle.py", "from falcon_ray import scheduling"),  # a value over a decision
)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> subprocess.CompletedProcess:
    """``lint-imports`` on a copy of the tree with every import of ``PLANTED``."""
    root = tmp_path_factory.mktemp("planted")
    copy_tree(root)
    for module, line in PLANTED:
        plant(root, module, line)
    return run_lint(root)


def broken_text(out: subprocess.CompletedProcess) -> str:
    assert out.returncode != 0, out.stdout
    return " ".join(out.stdout.split())  # a long contract name is wrapped


def test_a_core_module_that_imports_the_store_or_ray_breaks_the_build(planted):
    text = broken_text(planted)
    for chain in ("falcon_ray.reconcile.pick -> falcon_ray.store", "falcon_ray.model -> ray", "actors.queue -> ray"):
        assert chain in text, chain


def test_a_product_module_that_imports_a_tool_or_the_sim_breaks_the_build(planted):
    text = broken_text(planted)
    assert "The product never imports the tools or the simulated fleet BROKEN" in text
    for chain in ("falcon_ray.health -> falcon_ray.devtools", "actors.queue -> falcon_ray.sim.fleet",
                  "falcon_ray.cli -> falcon_ray.sim.cli"):  # fmt: skip
        assert chain in text, chain


def test_a_lower_layer_that_imports_a_higher_one_breaks_the_build(planted):
    text = broken_text(planted)
    assert "The product's layers: operator surface, supervision, actors, adapters, decisions, values BROKEN" in text
    assert "falcon_ray.cli_shared -> falcon_ray.cli" in text
    assert "falcon_ray.lifecycle -> falcon_ray.scheduling" in text


def test_no_decision_function_is_longer_than_fifty_lines():
    import ast

    long = []
    for path in sorted((REPO / "falcon_ray" / "reconcile").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 50:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, f"split these by the state they decide on: {long}"
