# make demo / make test work on a fresh clone of a fresh machine: the first run creates
# .venv and installs the package with its test extras (pinned compatible ranges in pyproject).
PYTHON ?= python3
VENV   := .venv
DEMO_ARGS ?=
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test demo lint bench soak soak-ci clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# Four workers (pytest-xdist), all joined to one Ray that the controller process starts
# (tests/harness/ray_session.py); a file's tests stay on one worker (module fixtures start
# one controller per file), the longest files first in the order of tests/conftest.py
# (--no-loadscope-reorder: without it xdist sends the files with the most tests first and
# the soak started last). The run is bound by CPU, most of it actor processes starting, and
# the tests wait on the simulated fleet's timings: four workers keep both cores busy where
# three leave them partly idle. The figures: docs/bench/history.md.
TEST_WORKERS ?= 4
# Byte-compiled first: every actor is a new Python process (hundreds in a run), and with
# PYTHONDONTWRITEBYTECODE set each would compile the package's sources again (~0.1 CPU-s).
# PYTHONHASHSEED=0: a virtual-time test replays byte for byte only under a fixed hash seed
# (set order reaches the simulate driver's tie-breaks); its replay line names the same seed.
test: $(STAMP)
	$(BIN)/python -m compileall -q falcon_ray actors tests
	PYTHONHASHSEED=0 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

demo: $(STAMP)
	$(BIN)/falcon-ray demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# The long soak of issue 12: 1,000 mixed tasks on MariaDB under faults, kills and killed
# database connections; exit 1 when an invariant breaks. SOAK_DB is the server; a fresh
# database falcon_soak is created in it.
SOAK_DB    ?= mysql+pymysql://root@127.0.0.1:3306
SOAK_ARGS  ?= --tasks 1000 --minutes 8 --seed 1
# The 200-task soak on SQLite (tests/e2e/test_chaos_soak.py, also in make test) alone.
soak-ci: $(STAMP)
	$(BIN)/python -m pytest -q -s tests/e2e/test_chaos_soak.py

soak: $(STAMP)
	$(BIN)/python -c "import sqlalchemy as sa; e = sa.create_engine('$(SOAK_DB)'); c = e.connect(); c.exec_driver_sql('DROP DATABASE IF EXISTS falcon_soak'); c.exec_driver_sql('CREATE DATABASE falcon_soak')"
	FALCON_CHAOS_DB=$(SOAK_DB)/falcon_soak $(BIN)/falcon-ray chaos $(SOAK_ARGS) --out soak-report.json; rc=$$?; \
	  $(BIN)/python -c "import json; r = json.load(open('soak-report.json')); print(json.dumps({k: r[k] for k in ('ok', 'invariants', 'details', 'faults_injected', 'outcomes', 'quiet_at_s')}, indent=1))"; exit $$rc

bench: $(STAMP)
	FALCON_BENCH_DB=$${FALCON_BENCH_DB:-mysql+pymysql://root@127.0.0.1:3306} $(BIN)/falcon-ray bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache falcon-demo.db soak-report.json
