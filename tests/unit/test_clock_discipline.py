"""Product code reads the time only through a given clock (falcon_ray/clock.py).

The scan parses every module of ``actors/`` and the product modules of ``falcon_ray/``
(the simulated fleet, the demo, the chaos soak and the bench are tools and run on the
real clock) and finds each direct read: ``time.time()``, ``time.monotonic()``,
``time.sleep()``, ``datetime.now()``/``utcnow()`` and the store's ``utcnow()``.

A file may not read the time more often than its ``ALLOWED`` entry says (no entry: not
at all), and an entry larger than what its file does must come down. The last
test plants a read in a copy of the tree and shows the scan failing on exactly it.
"""

from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("falcon_ray/sim/", "falcon_ray/devtools/", "falcon_ray/migrations/")
CLOCK_MODULE = "falcon_ray/clock.py"

# direct reads a file may still make, by file; empty: every product module reads the time
# through its clock. An entry is a debt to pay back: it may only come down.
ALLOWED: dict[str, int] = {}

_TIME_FUNCS = {"time", "monotonic", "sleep", "perf_counter", "time_ns", "monotonic_ns"}
_DATETIME_FUNCS = {"now", "utcnow", "today"}


def _is_read(node: ast.AST) -> bool:
    """A call of the store's ``utcnow()`` (or a bare ``monotonic()``), or any use of
    ``time.time``/``monotonic``/``sleep``... or ``datetime.now``/``utcnow``, called or passed
    on (``field(default_factory=time.monotonic)`` reads the time as surely as a call)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in {"utcnow", "monotonic", "perf_counter"}
    if not isinstance(node, ast.Attribute):
        return False
    base = node.value
    if isinstance(base, ast.Name) and base.id in {"time", "_time"} and node.attr in _TIME_FUNCS:
        return True
    if node.attr in _DATETIME_FUNCS:
        # datetime.now, dt.datetime.now, datetime.datetime.utcnow, date.today
        name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
        return name in {"datetime", "date"}
    return False


def direct_reads(root: Path) -> dict[str, list[int]]:
    """Each product file's direct time reads, as line numbers, under ``root``."""
    out: dict[str, list[int]] = {}
    for base in ("actors", "falcon_ray"):
        for path in sorted((root / base).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == CLOCK_MODULE or rel.startswith(TOOLS):
                continue
            tree = ast.parse(path.read_text(), filename=rel)
            lines = [n.lineno for n in ast.walk(tree) if _is_read(n)]
            if lines:
                out[rel] = sorted(lines)
    return out


def violations(found: dict[str, list[int]]) -> list[str]:
    bad = []
    for rel, lines in sorted(found.items()):
        allowed = ALLOWED.get(rel, 0)
        if len(lines) > allowed:
            bad.append(f"{rel}: {len(lines)} direct time reads (allowed {allowed}), lines {lines}: use the clock the object is given")
    for rel, allowed in sorted(ALLOWED.items()):
        have = len(found.get(rel, []))
        if have < allowed:
            bad.append(f"{rel}: ALLOWED says {allowed} but it reads the time directly {have} times: lower the entry to {have}")
    return bad


@functools.cache
def repo_reads() -> dict[str, list[int]]:
    """The scan of the repository itself, once for the tests that read it."""
    return direct_reads(REPO)


def test_product_code_reads_the_time_only_through_its_clock():
    assert violations(repo_reads()) == []


def test_the_clock_module_is_the_only_reader_in_the_decisions():
    found = repo_reads()
    decisions = [r for r in found if r.startswith("falcon_ray/reconcile/") or r in {
        "falcon_ray/lifecycle.py", "falcon_ray/scheduling.py", "falcon_ray/limits.py", "falcon_ray/faults.py",
        "falcon_ray/messages.py", "falcon_ray/render.py", "falcon_ray/model.py"}]  # fmt: skip
    assert decisions == [], decisions


def test_a_read_planted_in_a_copy_of_the_tree_fails_the_check(tmp_path):
    for pkg in ("falcon_ray", "actors"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "actors" / "port.py", "a") as f:
        f.write("\n\n@dataclass\nclass _Planted:\n    at: float = field(default_factory=time.monotonic)\n")
    with open(tmp_path / "falcon_ray" / "reconcile" / "pick.py", "a") as f:
        f.write("\n\ndef _planted():\n    import datetime as dt\n\n    return dt.datetime.now()\n")
    # and one in the sim, a tool, which may read the machine's clock: not reported
    with open(tmp_path / "falcon_ray" / "sim" / "fleet.py", "a") as f:
        f.write("\n\ndef _tool():\n    import time\n\n    return time.time()\n")
    bad = violations(direct_reads(tmp_path))
    assert len(bad) == 2, bad
    assert bad[0].startswith("actors/port.py: 1 direct time reads (allowed 0)"), bad
    assert bad[1].startswith("falcon_ray/reconcile/pick.py: 1 direct time reads (allowed 0)"), bad
