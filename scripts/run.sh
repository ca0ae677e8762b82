#!/usr/bin/env bash
# Install, then serve the dashboard on the embedded store (SQLite + local artifacts) in DRAFTBOARD_HOME
# (default: ./.draftboard) at once. On the first start the demo store builds in the background, its
# progress on the page; it stops with the dashboard and a later start resumes it or reuses what was built.
# Extra arguments go to `draftboard ui`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${DRAFTBOARD_VENV:-.venv}/bin/activate"
export DRAFTBOARD_HOME=${DRAFTBOARD_HOME:-$PWD/.draftboard}
mkdir -p "$DRAFTBOARD_HOME"
exec draftboard ui --demo "$@"
