#!/usr/bin/env bash
# Install everything the tests need, then run them. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${DRAFTBOARD_VENV:-.venv}/bin/activate"

# A triton install kept apart from .venv: one test puts it on PYTHONPATH to reproduce the
# CPU box where transformers picks fla's triton kernels and the forward would crash.
TRITON_SITE=${DRAFTBOARD_TRITON_SITE:-$PWD/.cache/triton-site}
if [ ! -d "$TRITON_SITE/triton" ]; then
  python -m pip install -q --no-deps --target "$TRITON_SITE" "triton==3.9.0"
fi
export DRAFTBOARD_TRITON_SITE="$TRITON_SITE"

set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests; the suite is broken" >&2
  exit 1
fi
exit "$rc"
