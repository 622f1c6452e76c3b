#!/usr/bin/env bash
# Builds (once) the venv of the ggml oracle test and prints its python:
#
#   export RESHARD_GGML_PYTHON=$(bash scripts/lib/ggml-venv.sh)
#
# The venv is cached under $RESHARD_CACHE/ggml-venv-<hash of
# tests/requirements-ggml.txt>; READY is written last, so an install cut
# short is rebuilt. llama-cpp-python compiles llama.cpp from source (about
# 22 minutes on 2 shared cores); the flags pin a portable AVX2 build without
# AMX (ggml's AMX kernels crash on the CI machines' CPUs).
# Progress goes to stderr, the path alone to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib/cache.sh
requirements=tests/requirements-ggml.txt
venv="$RESHARD_CACHE/ggml-venv-$(hash_of "$requirements")"
if [ ! -f "$venv/READY" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-binary llama-cpp-python -r "$requirements" >&2
  touch "$venv/READY"
fi
echo "$venv/bin/python"
