#!/usr/bin/env bash
# Install, then serve the dashboard on the embedded store at once: the default store every draftboard
# command uses from this folder (./draftboard.db, artifacts in ./mlartifacts; DESIGN.md), so an eval run
# later from a fresh shell lands in the dashboard; the queue, logs, caches and the demo's files in
# DRAFTBOARD_HOME (default ./.draftboard). On the first start the demo store builds in the background,
# its progress on the page; it stops with the dashboard and a later start resumes it or reuses what was
# built. llama.cpp's server and converter (scripts/llamacpp.sh, beside the venv's install) measure the demo's
# serving pair, so the served views show real engine evals; unless DRAFTBOARD_LLAMACPP_PYTHON names your own.
# Extra arguments go to `draftboard ui`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DRAFTBOARD_LLAMACPP_PYTHON:-}" ]; then
  LLAMACPP_LOG=$PWD/.cache/llamacpp-install.log
  mkdir -p "$PWD/.cache"
  bash scripts/llamacpp.sh > "$LLAMACPP_LOG" 2>&1 &
  llamacpp_install=$!
fi
bash scripts/setup.sh
if [ -n "${llamacpp_install:-}" ]; then
  if wait "$llamacpp_install"; then
    eval "$(bash scripts/llamacpp.sh --exports)"
  else  # the dashboard serves without it: the demo's served evals are left out, and the page says so
    echo "warning: installing llama.cpp (scripts/llamacpp.sh) failed, so the demo has no served evals; log: $LLAMACPP_LOG" >&2
  fi
fi
. "${DRAFTBOARD_VENV:-.venv}/bin/activate"
exec draftboard ui --demo "$@"
