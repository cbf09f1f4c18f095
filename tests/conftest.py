"""Shared fixtures live in their own modules, one per concern.

Collection order: the long end-to-end files first (the chaos soak, then the scenario
files), everything else after, each file's own order kept. With ``make test``'s two
xdist workers and ``--dist loadfile`` this is longest-first scheduling: the short files
fill in around the long ones instead of one long file running alone at the end.
"""

pytest_plugins = ["tests.harness.db", "tests.harness.sim", "tests.harness.ray_session", "tests.harness.e2e"]

# the slowest files, slowest first (measured: `pytest --durations`); the rest of e2e next
_FIRST = (
    "tests/e2e/test_chaos_soak.py",
    "tests/e2e/test_scenarios.py",
    "tests/e2e/test_demo_inspect.py",
    "tests/e2e/test_fencing_two_controllers.py",
    "tests/e2e/test_gke_fidelity.py",
    "tests/e2e/test_bench.py",
)


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path in _FIRST:
        return _FIRST.index(path)
    return len(_FIRST) if path.startswith("tests/e2e/") else len(_FIRST) + 1


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: every file keeps its own order
