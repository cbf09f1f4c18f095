"""Shared fixtures live in their own modules, one per concern.

Collection order: the long files first, longest first (each file's own order kept), the
rest of the end-to-end files next, everything else after. ``make test`` hands whole files
to the xdist workers (``TEST_WORKERS`` in the Makefile) in this order (``--dist loadfile --no-loadscope-reorder``): the short
files fill in around the long ones instead of one long file running alone at the end.
Without ``--no-loadscope-reorder`` (pytest-xdist 3.8) the files with the most tests go first,
so the one-test soak started last and ran alone for its last two minutes.
"""

pytest_plugins = ["tests.harness.db", "tests.harness.sim", "tests.harness.ray_session", "tests.harness.e2e", "tests.harness.virtual"]

# the slowest files, slowest first (measured in a tests/e2e run on 2 workers of a loaded
# 2-core machine, seconds of each file's tests summed): soak 196, bench 168, fencing 105,
# db_outage 67, recovery 60, demo_inspect 60, notebooks 55, store_repository 50 (a make
# test), secrets 43, metrics 42, run_command 35. The scenarios whose claim is an order or
# a timing play in virtual time (tests/component/test_virtual_*.py), a few seconds each.
_FIRST = (
    "tests/e2e/test_chaos_soak.py",
    "tests/e2e/test_bench.py",
    "tests/e2e/test_fencing_two_controllers.py",
    "tests/e2e/test_chaos_db_outage.py",
    "tests/e2e/test_recovery.py",
    "tests/e2e/test_demo_inspect.py",
    "tests/e2e/test_notebooks.py",
    "tests/component/test_store_repository.py",
    "tests/e2e/test_secrets_out_of_ray.py",
    "tests/e2e/test_metrics.py",
    "tests/e2e/test_run_command.py",
)


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    if path in _FIRST:
        return _FIRST.index(path)
    return len(_FIRST) if path.startswith("tests/e2e/") else len(_FIRST) + 1


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_rank)  # stable: every file keeps its own order
