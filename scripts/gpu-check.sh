#!/usr/bin/env bash
# CUDA validation on a generated checkpoint of a few GB: builds release,
# writes a 3-shard bf16 checkpoint, reshards it, and validates both on the
# GPU (throughput, device bytes, pinned staging) and under a commit budget
# (peaks). Run it on a machine with an NVIDIA driver:
#
#   scripts/gpu-check.sh [WORKDIR] [SIZE]      # defaults: a temp dir, 3GB
#
# Exits non-zero at the first check that does not behave as expected.
set -euo pipefail

cd "$(dirname "$0")/.."
WORK="${1:-$(mktemp -d)}"
SIZE="${2:-3GB}"
BIN=target/release/reshard

echo "== build (release)"
cargo build --release --bin reshard --example synth

echo "== synth $SIZE bf16, 3 shards -> $WORK/src"
rm -rf "$WORK/src" "$WORK/out"
target/release/examples/synth "$WORK/src" --size "$SIZE" --dtype bf16 --shards 3

echo "== reshard into 512MiB shards -> $WORK/out"
"$BIN" convert "$WORK/src" "$WORK/out" --max-shard-size 512MiB --no-progress

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi

run() {
  echo "== reshard validate $*" >&2
  local rc=0
  "$BIN" validate "$@" || rc=$?
  echo "   exit $rc" >&2
  return $rc
}

# 1. CUDA load of the resharded output: sha256/xxh3 against reshard.json,
#    readback compared on the GPU, throughput and per-shard times.
run "$WORK/out" --device cuda
# 2. The same under a commit budget (child process, RLIMIT_DATA): the peak
#    is the pinned staging buffer plus small overhead.
run "$WORK/out" --device cuda --commit-budget 1GiB --staging 64MiB
# 3. The original, compared bit for bit with the output.
run "$WORK/out" --device cuda --against "$WORK/src" --json \
  | python3 -c 'import json,sys; r=json.load(sys.stdin); print({k: r[k] for k in ("passed","throughput_gb_s","device_bytes","staging")}, r["device"], r["commit"])'
# 4. A VRAM budget of 1GiB must fail (exit 1) and say how many blocks fit.
if run "$WORK/out" --device cuda --vram-budget 1GiB; then
  echo "expected --vram-budget 1GiB to fail" >&2
  exit 1
fi
# 5. Loader emulation peaks (host side, no GPU needed): all-mapped vs one shard.
run "$WORK/src" --emulate transformers-v5-mmap --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print("v5-mmap", r["emulation"], r["commit"])'
run "$WORK/out" --emulate per-shard-mmap --json | python3 -c 'import json,sys; r=json.load(sys.stdin); print("per-shard", r["emulation"], r["commit"])'
echo "== all GPU checks behaved as expected"
