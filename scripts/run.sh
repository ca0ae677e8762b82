#!/usr/bin/env bash
# Install, then serve the dashboard on the embedded default store (SQLite + local artifacts:
# ./draftboard.db, the store every draftboard command in this folder uses unless told otherwise) at
# once; the queue, caches, logs and demo files live in DRAFTBOARD_HOME (default ./.draftboard). On the
# first start the demo store builds in the background, its progress on the page; it stops with the
# dashboard and a later start resumes it or reuses what was built. Extra arguments go to `draftboard ui`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${DRAFTBOARD_VENV:-.venv}/bin/activate"
mkdir -p "${DRAFTBOARD_HOME:-.draftboard}"
exec draftboard ui --demo "$@"
