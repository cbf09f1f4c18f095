"""No function in ``actors/`` or the product modules of ``falcon_ray/`` is over 50 lines.

A function is counted from its ``def`` line to its last line, docstring and comments
included. The tools (the simulated fleet, the demo, the chaos soak, the bench, the
virtual-time simulator) and the migrations (frozen once released) are not counted.
``ALLOWED`` lists the functions still over the limit with their length now: an entry may
only come down, and goes once its function is split.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("falcon_ray/sim/", "falcon_ray/devtools/", "falcon_ray/migrations/")
LIMIT = 50

# "file:function" -> its length today; every entry is a debt to pay back
ALLOWED: dict[str, int] = {
}


def long_functions(root: Path) -> dict[str, int]:
    """Every product function over the limit under ``root``, as ``file:name`` -> lines
    (the longest when a file has two of one name)."""
    out: dict[str, int] = {}
    for base in ("actors", "falcon_ray"):
        for path in sorted((root / base).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(TOOLS):
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    key = f"{rel}:{node.name}"
                    if length > LIMIT and length > out.get(key, 0):
                        out[key] = length
    return out


def violations(found: dict[str, int]) -> list[str]:
    bad = [
        f"{key}: {length} lines (limit {LIMIT}, allowed {ALLOWED.get(key, LIMIT)}): split it"
        for key, length in sorted(found.items()) if length > ALLOWED.get(key, LIMIT)
    ]
    bad += [
        f"{key}: ALLOWED says {allowed} but it is {found.get(key, 0) or 'within the limit'}: lower or drop the entry"
        for key, allowed in sorted(ALLOWED.items()) if found.get(key, 0) < allowed
    ]
    return bad


def test_no_product_function_is_over_the_limit():
    assert violations(long_functions(REPO)) == []


def test_a_long_function_fails_the_check(tmp_path):
    (tmp_path / "actors").mkdir()
    (tmp_path / "falcon_ray" / "sim").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "actors" / "planted.py").write_text(f"def planted():\n{body}\n")
    (tmp_path / "falcon_ray" / "sim" / "tool.py").write_text(f"def tool():\n{body}\n")
    found = long_functions(tmp_path)
    assert found == {"actors/planted.py:planted": LIMIT + 1}
    assert violations(found)[0].startswith("actors/planted.py:planted: 51 lines")
