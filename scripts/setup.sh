#!/usr/bin/env bash
# Create .venv and install draftboard with the exact versions CI uses (constraints.txt).
# Idempotent and quick when nothing changed: a stamp records what was installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DRAFTBOARD_VENV:-.venv}
PY=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"

stamp="$VENV/.draftboard-installed"
want=$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python -m pip install -q --upgrade pip
  # torch first and pinned: a CPU wheel here; anything depending on torch then finds it
  # satisfied instead of pulling a multi-GB CUDA build.
  python -m pip install -q "torch==2.13.0"
  # setuptools' editable install of this flat layout tells, on every install, that folders named like the
  # packages may shadow them (an information-only notice, nothing to act on): not shown at each start.
  PYTHONWARNINGS="ignore:Editable installation" python -m pip install -q -c constraints.txt -e ".[test,ray,postgres]"
  echo "$want" > "$stamp"
fi
