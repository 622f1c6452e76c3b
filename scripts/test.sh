#!/usr/bin/env bash
# Runs the whole test suite. Sets up what the interop tests need first: a
# Python venv (.venv) with the `safetensors` and `numpy` packages.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import safetensors, numpy" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check safetensors numpy
fi
export RESHARD_TEST_PYTHON="$PWD/.venv/bin/python"
cargo test "$@"
