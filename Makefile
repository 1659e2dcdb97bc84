# Crucible — the two commands that work on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export CRUCIBLE_HOME ?= $(CURDIR)/.crucible
STAMP := $(VENV)/.crucible-installed
# 3 xdist workers on 2 cores: the slowest tests wait on daemons, Ray and subprocess launches more than they compute
PYTEST_WORKERS ?= 3

.PHONY: setup demo test test-ui dev clean bench

$(STAMP): pyproject.toml constraints.txt scripts/setup.sh
	bash scripts/setup.sh

setup: $(STAMP)

# Size set of `make demo` (pipelines/presets.py): demo (minutes on 2 cores), small (the assets' own CPU defaults), full (GPU).
PRESET ?= demo

## Set up, then run the main job (sources, curation, CTR + GBA, RollPacker + RollArc, mixture, post-training) on the embedded default, at the $(PRESET) preset's sizes.
demo: setup
	$(VENV)/bin/crucible demo --preset $(PRESET)

## Set up, then run the test suite (what .ci/run calls).
test: setup
	$(VENV)/bin/python -m pytest -q -n $(PYTEST_WORKERS) --durations=25 tests

## The UI as a person uses it: dagster dev + headless Chromium (needs Debian's chromium on the PATH; .ci/run installs it).
test-ui: setup
	$(VENV)/bin/pip install -q -e ".[dev,ui]" -c constraints.txt
	$(VENV)/bin/python -m pytest -q -m ui tests/ui

## Serve the Dagster UI on http://127.0.0.1:3000 over the same instance and lake.
dev: setup
	$(VENV)/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

## Near-dedup benchmark (writes benchmarks/results/dedup.json).
bench: setup
	$(VENV)/bin/python benchmarks/dedup_bench.py

clean:
	rm -rf .crucible .dagster_home
