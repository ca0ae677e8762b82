#!/usr/bin/env bash
# Install the real llama.cpp draftboard drives (`--engine llamacpp`): xllamacpp's prebuilt CPU wheel (llama.cpp's
# server, embedded) in a venv of its own, with what llama.cpp's own GGUF converter needs (torch, transformers,
# sentencepiece); the converter itself (convert_hf_to_gguf.py, its conversion/ package and gguf-py/) comes from
# the llama-cpp-python sdist, which ships llama.cpp's tree. Idempotent: a stamp records what was installed.
# Used by scripts/test.sh (the engine tests) and scripts/run.sh (the demo's served evals). The venv:
# DRAFTBOARD_LLAMACPP_VENV (default ./.cache/llamacpp-venv). `--exports` installs nothing and prints the shell
# exports that point draftboard at this install (DRAFTBOARD_LLAMACPP_PYTHON, DRAFTBOARD_LLAMACPP_CONVERTER).
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMACPP_VENV=${DRAFTBOARD_LLAMACPP_VENV:-$PWD/.cache/llamacpp-venv}
if [ "${1:-}" = "--exports" ]; then
  printf 'export DRAFTBOARD_LLAMACPP_PYTHON=%q DRAFTBOARD_LLAMACPP_CONVERTER=%q\n' \
    "$LLAMACPP_VENV/bin/python" "$LLAMACPP_VENV/llama.cpp"
  exit 0
fi
LLAMACPP_VERSION="xllamacpp==2026.10.11549 llama-cpp-python==0.3.36"
[ "$(cat "$LLAMACPP_VENV/.draftboard-installed" 2>/dev/null)" = "$LLAMACPP_VERSION" ] && exit 0
if [ -e "$LLAMACPP_VENV" ] && [ ! -e "$LLAMACPP_VENV/.draftboard-created" ]; then
  echo "error: $LLAMACPP_VENV exists and this script did not make it; set DRAFTBOARD_LLAMACPP_VENV elsewhere" >&2
  exit 1
fi
rm -rf "$LLAMACPP_VENV" && python3 -m venv "$LLAMACPP_VENV" && touch "$LLAMACPP_VENV/.draftboard-created"
# Every dependency at the version CI installs (constraints.txt, as setup.sh does).
"$LLAMACPP_VENV/bin/pip" install -q -c constraints.txt "torch==2.13.0"
"$LLAMACPP_VENV/bin/pip" install -q -c constraints.txt "xllamacpp==2026.10.11549" "transformers==5.24.0" \
  "sentencepiece==0.2.3" "protobuf==7.36.2" "numpy==2.4.6" "safetensors==0.8.0" "PyYAML==6.0.4"
sdist=$(mktemp -d)
trap 'rm -rf "$sdist"' EXIT
# The sdist itself, its digest pinned: pip would build its metadata first, with the newest build backends.
"$LLAMACPP_VENV/bin/python" scripts/sdist.py llama-cpp-python 0.3.36 \
  832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e "$sdist" >/dev/null
tar xzf "$sdist"/llama_cpp_python-0.3.36.tar.gz -C "$sdist" llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py \
  llama_cpp_python-0.3.36/vendor/llama.cpp/conversion llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py
mv "$sdist"/llama_cpp_python-0.3.36/vendor/llama.cpp "$LLAMACPP_VENV/llama.cpp"
echo "$LLAMACPP_VERSION" > "$LLAMACPP_VENV/.draftboard-installed"
