"""Shared fixtures live in their own modules, one per concern.

Collection order: the long files first, longest first (each file's own order kept), the
rest of the end-to-end files next, everything else after. ``make test`` hands whole files
to the xdist workers (``TEST_WORKERS`` in the Makefile) in this order (``--dist loadfile --no-loadscope-reorder``): the short
files fill in around the long ones instead of one long file running alone at the end.
Without ``--no-loadscope-reorder`` (pytest-xdist 3.8) the files with the most tests go first,
so the one-test soak started last and ran alone for its last two minutes.
"""

pytest_plugins = ["tests.harness.db", "tests.harness.sim", "tests.harness.ray_session", "tests.harness.e2e", "tests.harness.virtual"]

# the slowest files, slowest first (measured in a make test run: the seconds between a
# worker's teardowns, summed per file): soak 205, scenarios and recovery ~100 each
# (one file of 203 s until split), gke_fidelity 73, bench 70, demo_inspect 67, capacity 58,
# store_repository 50, db_outage 49, fencing 42, placement 37, queue_rules 36
_FIRST = (
    "tests/e2e/test_chaos_soak.py",
    "tests/e2e/test_scenarios.py",
    "tests/e2e/test_recovery.py",
    "tests/e2e/test_gke_fidelity.py",
    "tests/e2e/test_bench.py",
    "tests/e2e/test_demo_inspect.py",
    "tests/e2e/test_capacity.py",
    "tests/component/test_store_repository.py",
    "tests/e2e/test_chaos_db_outage.py",
    "tests/e2e/test_fencing_two_controllers.py",
    "tests/e2e/test_placement.py",
    "tests/e2e/test_queue_rules.py",
)


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path in _FIRST:
        return _FIRST.index(path)
    return len(_FIRST) if path.startswith("tests/e2e/") else len(_FIRST) + 1


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: every file keeps its own order
