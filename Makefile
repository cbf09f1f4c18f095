# make demo / make test work on a fresh clone of a fresh machine: the first run creates
# .venv and installs the package with its test extras (pinned compatible ranges in pyproject).
PYTHON ?= python3
VENV   := .venv
DEMO_ARGS ?=
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test demo lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

demo: $(STAMP)
	$(BIN)/falcon-ray demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/falcon-ray bench --db $${FALCON_BENCH_DB:-mysql+pymysql://root@127.0.0.1:3306} $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache falcon-demo.db
