#!/usr/bin/env bash
# Install, then serve the dashboard on the embedded store at once: the default store every draftboard
# command uses from this folder (./draftboard.db, artifacts in ./mlartifacts; DESIGN.md), so an eval run
# later from a fresh shell lands in the dashboard; the queue, logs, caches and the demo's files in
# DRAFTBOARD_HOME (default ./.draftboard). On the first start the demo store builds in the background,
# its progress on the page; it stops with the dashboard and a later start resumes it or reuses what was
# built. Extra arguments go to `draftboard ui`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${DRAFTBOARD_VENV:-.venv}/bin/activate"
exec draftboard ui --demo "$@"
