"""The production image carries only what production runs, and its `falcon-ray` works.

deploy/Dockerfile builds the package from a build context that deploy/Dockerfile.dockerignore
filters. No Docker here: the test makes that context the way BuildKit does for the files the
Dockerfile copies, runs setuptools' build of the package's modules and data (what the wheel
holds) into a temporary directory, and checks what came out: no ``falcon_ray.sim``, no
``falcon_ray.devtools``, the migrations and the actors present. Then it runs `falcon-ray` from
that build alone: the product's commands are there, and a tool command says in one line that
the tools are not installed in this image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
IGNORE_FILE = REPO / "deploy" / "Dockerfile.dockerignore"
PRODUCT_COMMANDS = {"abort", "clusters", "db", "health", "queues", "render", "run", "status", "submit"}
TOOL_COMMANDS = {"bench", "chaos", "demo", "sim", "simulate"}


def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as a regex over a context-relative path ('*' stays in one
    path segment, '**' crosses them); a pattern that matches a directory matches what it holds."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + "(?:/.*)?")


def ignore_rules() -> list[tuple[bool, re.Pattern]]:
    """(excludes, pattern) per line of the ignore file, in order: the last match decides."""
    rules = []
    for line in IGNORE_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((not negated, _pattern_regex(line.lstrip("!").strip("/"))))
    return rules


def in_context(rel: str, rules: list[tuple[bool, re.Pattern]]) -> bool:
    excluded = False
    for excludes, regex in rules:
        if regex.fullmatch(rel):
            excluded = excludes
    return not excluded


def copied_sources() -> list[str]:
    """What the Dockerfile's COPY lines take from the context."""
    copied: list[str] = []
    for m in re.finditer(r"^COPY (?:--chown=\S+ )?(.+) (\S+)$", DOCKERFILE.read_text(), re.M):
        copied += m.group(1).split()
    return copied


def build_context(dest: Path) -> None:
    rules = ignore_rules()
    for name in copied_sources():
        src = REPO / name
        paths = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
        for path in paths:
            rel = path.relative_to(REPO).as_posix()
            if in_context(rel, rules):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest / rel)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The package's modules and data as the image's build makes them (setuptools build_py)."""
    root = tmp_path_factory.mktemp("image")
    context, lib = root / "context", root / "lib"
    context.mkdir()
    build_context(context)
    out = subprocess.run(
        [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py", "--build-lib", str(lib)],
        cwd=context, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return lib


# Runs `falcon-ray` once per argument list (click's runner) in a process whose falcon_ray is
# the build's; prints [exit code, stdout, stderr] per list as JSON. The checkout's editable
# install adds an import finder that would find a module missing from the build in the
# checkout; the image has no such finder, so the run drops it.
RUNNER = """
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
import falcon_ray
assert falcon_ray.__file__.startswith(sys.argv[1]), falcon_ray.__file__
from click.testing import CliRunner
from falcon_ray.cli import main
results = []
for args in json.loads(sys.argv[2]):
    r = CliRunner().invoke(main, args)
    results.append([r.exit_code, r.stdout, r.stderr])
print(json.dumps(results))
"""


def falcon_ray_cli(lib: Path, *arg_lists: list[str]) -> list[tuple[int, str, str]]:
    """`falcon-ray ARGS` for each list, with the built package alone (run away from the checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FALCON_", "RAY_"))}
    env["PYTHONPATH"] = str(lib)
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, str(lib), json.dumps(arg_lists)],
        cwd=lib.parent, env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [tuple(r) for r in json.loads(out.stdout)]


def test_the_ignore_file_keeps_the_tools_and_the_sim_out_of_the_context():
    rules = ignore_rules()
    for rel in ("falcon_ray/sim/fleet.py", "falcon_ray/devtools/demo/sample_tasks.jsonl", "falcon_ray/devtools/chaos.py",
                "falcon_ray/__pycache__/cli.cpython-311.pyc", "tests/unit/test_spec.py", "notebooks/queues.ipynb"):  # fmt: skip
        assert not in_context(rel, rules), rel
    for rel in ("pyproject.toml", "README.md", "falcon_ray/cli.py", "falcon_ray/migrations/env.py",
                "falcon_ray/store/repository.py", "actors/queue.py"):  # fmt: skip
        assert in_context(rel, rules), rel


def test_the_built_package_has_the_product_and_no_tools(built):
    files = {p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file()}
    assert not [f for f in files if f.startswith(("falcon_ray/sim/", "falcon_ray/devtools/"))]
    assert {"falcon_ray/cli.py", "falcon_ray/controller_cli.py", "actors/supervisor.py", "actors/remote.py"} <= files
    assert "falcon_ray/migrations/env.py" in files
    assert any(f.startswith("falcon_ray/migrations/versions/") for f in files)


def test_falcon_ray_in_the_image_has_the_product_commands_and_refuses_the_tools(built):
    tools = sorted(TOOL_COMMANDS)
    db = f"sqlite:///{built.parent / 'image.db'}"
    (code, text, err), (upgrade_code, _, upgrade_err), *refused = falcon_ray_cli(
        built, ["--help"], ["db", "upgrade", "--db", db], *([name, "--fleet", "x.yaml"] for name in tools)
    )
    assert code == 0, err
    listed = set(re.findall(r"^  (\w[\w-]*)\s", text.split("Commands:", 1)[1], re.M))
    assert listed == PRODUCT_COMMANDS, listed
    assert upgrade_code == 0, upgrade_err  # the migrations are in the build
    for name, (code, _, err) in zip(tools, refused, strict=True):
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1, (name, code, err)
        assert f"`falcon-ray {name}` is a development tool" in lines[0] and "not installed in this image" in lines[0]
