#!/usr/bin/env bash
# Runs the whole test suite: the Rust tests on this machine (with a Python
# venv for the interop tests and one with llama-cpp-python for the ggml
# oracle), then every suite a script of its own holds
# (the Windows build under Wine, the Slurm cluster, the Python wheel), each
# of which installs what it needs itself.
#
#   bash scripts/test.sh            everything
#   bash scripts/test.sh -- ARGS    cargo test ARGS only (a quick loop while coding)
#
# The venv and the other suites' caches live outside the checkout, under
# $RESHARD_CACHE (default /var/cache/reshard, or ~/.cache/reshard when that
# is not writable), keyed by a hash of what they install, so reruns and fresh
# clones reuse them.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/cache.sh

requirements=tests/requirements.txt
venv="$RESHARD_CACHE/venv-$(hash_of "$requirements")"
# READY is written last, so a venv whose install was cut short is rebuilt.
if [ ! -f "$venv/READY" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  touch "$venv/READY"
fi
export RESHARD_TEST_PYTHON="$venv/bin/python"
# The ggml oracle: llama-cpp-python built from source (about 22 minutes on
# 2 cores the first time, then cached the same way). The K-quant
# bit-exactness test and the llama.cpp load tests run on it.
RESHARD_GGML_PYTHON=$(bash scripts/lib/ggml-venv.sh)
export RESHARD_GGML_PYTHON
# Nothing may download a model at test time.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
# The CUDA driver test double (test-only, never shipped) that tests/cli/cuda.rs
# puts on reshard's library search path; under CI those tests fail without it.
source scripts/lib/target.sh
RESHARD_TEST_FAKE_CUDA=$(bash tests/fake-cuda/build.sh "$(cargo_target_dir)/fake-cuda" linux)
export RESHARD_TEST_FAKE_CUDA

if [ "${1:-}" = "--" ]; then
  shift
  exec cargo test "$@"
fi

cargo test
# The CPU-side part of scripts/gpu-check.sh, against the CUDA driver double
# (a GPU machine runs the whole script on release binaries).
bash scripts/gpu-check.sh --prepare target/gpu-check-ci --profile dev >/dev/null
bash scripts/gpu-check.sh --bin target/gpu-check-ci --cpu-only \
  --results target/gpu-check-ci/results.tsv
# The wheel test reuses the test build's profile rather than building every
# dependency again in release.
export RESHARD_DIST_PROFILE="${RESHARD_DIST_PROFILE:-dev}"
for suite in scripts/windows-test.sh scripts/slurm-test.sh scripts/dist-test.sh; do
  if [ -f "$suite" ]; then
    echo "== $suite"
    bash "$suite"
  fi
done
