"""The layer contracts in pyproject.toml hold, and a broken one fails the run.

``lint-imports`` (import-linter) checks them on the real tree; the other tests plant
imports that break them in a copy of the tree (a store import in the decisions, Ray in
the model and the queue; a tool or the simulated fleet imported by the product; a
lower layer importing a higher one) and show the same command failing on exactly those.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def test_a_core_module_that_imports_the_store_or_ray_breaks_the_build(tmp_path):
    copy_tree(tmp_path)
    with open(tmp_path / "falcon_ray" / "reconcile" / "pick.py", "a") as f:
        f.write("\nfrom falcon_ray.store import Store  # noqa\n")
    with open(tmp_path / "falcon_ray" / "model.py", "a") as f:
        f.write("\nimport ray  # noqa\n")
    with open(tmp_path / "actors" / "queue.py", "a") as f:
        f.write("\nimport ray  # noqa\n")
    out = run_lint(tmp_path)
    assert out.returncode != 0
    text = out.stdout
    assert "falcon_ray.reconcile.pick -> falcon_ray.store" in text
    assert "falcon_ray.model -> ray" in text
    assert "actors.queue -> ray" in text


def test_a_product_module_that_imports_a_tool_or_the_sim_breaks_the_build(tmp_path):
    copy_tree(tmp_path)
    plant(tmp_path, "falcon_ray/health.py", "from falcon_ray.devtools import demo")
    plant(tmp_path, "actors/queue.py", "import falcon_ray.sim.fleet")
    plant(tmp_path, "falcon_ray/cli.py", "import falcon_ray.sim.cli")
    out = run_lint(tmp_path)
    assert out.returncode != 0
    text = " ".join(out.stdout.split())  # a long contract name is wrapped
    assert "The product never imports the tools or the simulated fleet BROKEN" in text
    for chain in ("falcon_ray.health -> falcon_ray.devtools", "actors.queue -> falcon_ray.sim.fleet",
                  "falcon_ray.cli -> falcon_ray.sim.cli"):  # fmt: skip
        assert chain in text, chain


def test_a_lower_layer_that_imports_a_higher_one_breaks_the_build(tmp_path):
    copy_tree(tmp_path)
    plant(tmp_path, "falcon_ray/cli_shared.py", "from falcon_ray import cli")  # the command-line cycle again
    plant(tmp_path, "falcon_ray/lifecycle.py", "from falcon_ray import scheduling")  # a value over a decision
    out = run_lint(tmp_path)
    assert out.returncode != 0
    text = " ".join(out.stdout.split())  # a long contract name is wrapped
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
