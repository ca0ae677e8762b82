#!/usr/bin/env bash
# Install, build the demo store on first run, then serve the dashboard on the embedded store (SQLite + local artifacts) in
# DRAFTBOARD_HOME (default: ./.draftboard). Extra arguments go to `draftboard ui`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${DRAFTBOARD_VENV:-.venv}/bin/activate"
export DRAFTBOARD_HOME=${DRAFTBOARD_HOME:-$PWD/.draftboard}
mkdir -p "$DRAFTBOARD_HOME"
draftboard demo  # built once; returns at once when the store is there
exec draftboard ui "$@"
