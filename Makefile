# The two set-up commands of the README: `make demo` (or `make run`) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run demo test lint typecheck unit integration bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# README command one: a simulated vLLM and the daemon, end to end, in about a minute.
demo: $(STAMP)
	$(BIN)/specguard demo

# The daemon on its defaults: scrapes http://127.0.0.1:8000/metrics, shipped rules, log action.
run: $(STAMP)
	$(BIN)/specguard run --state-dir ./state --log-format text

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

integration: $(STAMP)
	$(BIN)/pytest tests/integration -q

test: lint typecheck
	$(BIN)/pytest -q

# Measured as ratios against a baseline in the same run; results are kept in benchmarks/results/.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_scrape_source.py --write benchmarks/results/scrape_source.md

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
