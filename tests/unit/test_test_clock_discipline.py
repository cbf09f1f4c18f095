"""Outside ``tests/e2e`` a test reads the time and waits only in virtual time, or says why not.

The scan parses every ``.py`` under ``tests/`` and finds each direct read of the machine's
clock or wait on it:

- what ``tests/unit/test_clock_discipline.py`` finds in the product (``time.time``,
  ``time.monotonic``, ``time.sleep``, ``time.perf_counter``..., ``datetime.now`` /
  ``utcnow``, ``date.today``, called or passed on), and ``time.perf_counter_ns``,
  ``time.process_time`` / ``thread_time``;
- ``asyncio.sleep``, and ``from time import sleep`` (or any of those names) and
  ``from asyncio import sleep``, which would hide the reads from the checks above;
- ``SYSTEM.now()`` / ``time()`` / ``monotonic()`` / ``sleep()`` / ``wait()``: the product's
  real clock, called by name;
- ``x.wait(<number>)`` and ``x.wait(timeout=...)`` with no other argument: an Event's,
  a Condition's or a process's wait bounded in seconds of the machine. An injected
  clock's wait (``clock.wait(event, 2.0)``, two arguments) and a ``ManualClock``'s,
  ``ParkingClock``'s or ``VirtualClock``'s ``sleep`` / ``monotonic`` (any name but
  ``time``, ``_time``, ``asyncio``, ``SYSTEM``) are virtual time and not reported.

Each such line must carry ``# wall-clock: <why>`` (the why not empty): a test of a real
process, a socket, an HTTP server thread over loopback, Ray or the system clock itself.
A test that proves an order or a timing runs on a ``ManualClock`` (a ``ParkingClock``
when the code under test waits on threads of its own), on the simulated
fleet's clock moved by the test (a ``SimFleet`` given a ``ManualClock`` and moved by
``advance``, or ``VirtualFleet`` on a ``Scheduler``), or in the ``falcon-ray simulate``
driver. A marker on a line that reads nothing must go.

Not scanned, each for a reason:

- ``tests/e2e/``: the end-to-end layer runs Ray actors, kills and the demo on the
  machine's clock by design (docs/testing.md);
- ``tests/harness/ray_head.py``: it only starts, waits for and kills real Ray processes
  (``ray start --head``) and is itself the watchdog script that outlives a killed pytest;
  every wait in it is on a real process.

Not found: a real clock handed on implicitly (an object built without a clock, whose
default is ``SYSTEM``), and timeouts of client calls (``requests.get(timeout=)``,
``ray.get(timeout=)``), which bound a call and neither read nor sleep.

The last tests plant reads in a copy of ``tests/`` and show the scan failing on exactly them.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import shutil
import tokenize
from pathlib import Path

from tests.unit.test_clock_discipline import _is_read

REPO = Path(__file__).resolve().parents[2]
EXEMPT_DIRS = ("tests/e2e/",)
EXEMPT_FILES = ("tests/harness/ray_head.py",)

# unmarked wall-clock lines a file may still hold, by file: a debt, not a licence. Empty:
# every test outside tests/e2e waits in virtual time or says why not. An entry may only
# come down, and must when its file holds fewer.
ALLOWED: dict[str, int] = {}

_MORE_TIME_FUNCS = {"perf_counter_ns", "process_time", "process_time_ns", "thread_time", "thread_time_ns"}
_FROM_IMPORTS = {
    "time": {"time", "monotonic", "sleep", "perf_counter", "time_ns", "monotonic_ns", *_MORE_TIME_FUNCS},
    "asyncio": {"sleep"},
}
_SYSTEM_METHODS = {"now", "time", "monotonic", "sleep", "wait"}
MARKER = re.compile(r"#\s*wall-clock:(.*)$")


def _is_wall(node: ast.AST) -> bool:
    """A direct read of the machine's clock or a wait on it (see the module's docstring)."""
    if _is_read(node):
        return True
    if isinstance(node, ast.ImportFrom):
        names = _FROM_IMPORTS.get(node.module or "", set())
        return any(a.name in names for a in node.names)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        base, attr = node.value.id, node.attr
        if base in {"time", "_time"} and attr in _MORE_TIME_FUNCS:
            return True
        if base == "asyncio" and attr == "sleep":
            return True
        if base == "SYSTEM" and attr in _SYSTEM_METHODS:
            return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wait":
        args, kws = node.args, node.keywords
        if len(args) == 1 and not kws:
            a = args[0]
            return isinstance(a, ast.Constant) and isinstance(a.value, int | float) and not isinstance(a.value, bool)
        if not args and len(kws) == 1 and kws[0].arg == "timeout":
            return not (isinstance(kws[0].value, ast.Constant) and kws[0].value.value is None)
    return False


def _markers(text: str) -> dict[int, str]:
    """Line -> the why of its ``# wall-clock:`` comment (possibly empty)."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and (m := MARKER.search(tok.string)):
            out[tok.start[0]] = m.group(1).strip()
    return out


def scan(root: Path) -> list[str]:
    """Every unmarked wall-clock line under ``root/tests`` as ``file:line: ...``, and every
    marker without a why or on a line that reads nothing."""
    bad: list[str] = []
    for path in sorted((root / "tests").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(EXEMPT_DIRS) or rel in EXEMPT_FILES:
            continue
        text = path.read_text()
        lines = sorted({n.lineno for n in ast.walk(ast.parse(text, filename=rel)) if _is_wall(n)})
        marks = _markers(text)
        source = text.splitlines()
        for n in lines:
            why = marks.get(n)
            if why is None:
                bad.append(f"{rel}:{n}: reads or waits on the wall clock, unmarked: {source[n - 1].strip()}")
            elif not why:
                bad.append(f"{rel}:{n}: '# wall-clock:' without a why")
        for n in sorted(set(marks) - set(lines)):
            bad.append(f"{rel}:{n}: '# wall-clock:' on a line that reads no clock")
    return bad


def violations(found: list[str], allowed: dict[str, int] = ALLOWED) -> list[str]:
    """``found`` less the unmarked lines ``allowed`` still lets a file hold, and an entry
    of ``allowed`` larger than what its file holds."""
    unmarked: dict[str, list[str]] = {}
    for line in found:
        if ": reads or waits on the wall clock, unmarked: " in line:
            unmarked.setdefault(line.split(":", 1)[0], []).append(line)
    bad = [line for line in found if line.split(":", 1)[0] not in allowed or line not in unmarked.get(line.split(":", 1)[0], [])]
    for rel, n in sorted(allowed.items()):
        have = len(unmarked.get(rel, []))
        if have > n:
            bad += [f"{rel}: {have} unmarked wall-clock lines (allowed {n}):", *unmarked[rel]]
        elif have < n:
            bad.append(f"{rel}: ALLOWED says {n} but it holds {have} unmarked wall-clock lines: lower the entry to {have}")
    return bad


@functools.cache
def repo_scan() -> tuple[str, ...]:
    return tuple(scan(REPO))


def test_no_test_outside_e2e_reads_the_wall_clock_unmarked():
    bad = violations(list(repo_scan()))
    assert not bad, (
        f"{len(bad)} wall-clock lines: move them to virtual time (ManualClock, a SimFleet given one, "
        "VirtualFleet on a Scheduler, the simulate driver) or mark them '# wall-clock: <why>':\n" + "\n".join(bad)
    )


def test_allowed_is_a_debt_that_only_comes_down():
    found = [
        "tests/sim/a.py:3: reads or waits on the wall clock, unmarked: time.sleep(1)",
        "tests/sim/a.py:9: reads or waits on the wall clock, unmarked: time.sleep(2)",
        "tests/sim/a.py:12: '# wall-clock:' without a why",
    ]
    assert violations(found, {"tests/sim/a.py": 2}) == [found[2]]  # a bare marker is never allowed
    assert violations(found[:1], {"tests/sim/a.py": 2}) == [
        "tests/sim/a.py: ALLOWED says 2 but it holds 1 unmarked wall-clock lines: lower the entry to 1"
    ]
    assert violations(found[:2], {"tests/sim/a.py": 1}) == [
        "tests/sim/a.py: 2 unmarked wall-clock lines (allowed 1):",
        *found[:2],
    ]


def test_the_scan_sees_what_a_test_does_and_not_an_injected_clock():
    src = (
        "import asyncio, threading, time\n"
        "import datetime as dt\n"
        "from time import sleep\n"
        "from falcon_ray.clock import SYSTEM, ManualClock\n"
        "clock = ManualClock()\n"
        "e = threading.Event()\n"
        "clock.sleep(5); clock.wait(e, 2.0); clock.monotonic(); clock.now(); clock.time()\n"
        "e.wait()\n"
        "time.sleep(1)\n"
        "t = time.perf_counter_ns()\n"
        "x = dt.datetime.now()\n"
        "asyncio.sleep(0.1)\n"
        "e.wait(3)\n"
        "e.wait(timeout=3)\n"
        "SYSTEM.monotonic()\n"
        "e.wait(0.5)  # wall-clock: a real thread sets it\n"
        "time.sleep(1)  # wall-clock:\n"
        "y = 1  # wall-clock: stale\n"
    )
    flagged = sorted({n.lineno for n in ast.walk(ast.parse(src)) if _is_wall(n)})
    assert flagged == [3, 9, 10, 11, 12, 13, 14, 15, 16, 17], flagged  # not the import, not the injected clock
    assert _markers(src) == {16: "a real thread sets it", 17: "", 18: "stale"}


def test_reads_planted_in_a_copy_of_the_tests_fail_the_check(tmp_path):
    shutil.copytree(REPO / "tests", tmp_path / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    before = set(scan(tmp_path))  # the copy's own scan: another change to tests/ meanwhile does not matter
    target = tmp_path / "tests" / "unit" / "test_tpu.py"
    n = len(target.read_text().splitlines())
    with open(target, "a") as f:
        f.write("\n\ndef _planted():\n    import time\n\n    time.sleep(0.1)\n")
        f.write("    done.wait(timeout=2)  # wall-clock:   \n")
    # and in the end-to-end layer and the Ray head's harness, which are not scanned
    for rel in ("e2e/test_health.py", "harness/ray_head.py"):
        with open(tmp_path / "tests" / rel, "a") as f:
            f.write("\n\ndef _tool():\n    import time\n\n    return time.time()\n")
    new = sorted(set(scan(tmp_path)) - before)
    assert new == [
        f"tests/unit/test_tpu.py:{n + 6}: reads or waits on the wall clock, unmarked: time.sleep(0.1)",
        f"tests/unit/test_tpu.py:{n + 7}: '# wall-clock:' without a why",
    ], new
