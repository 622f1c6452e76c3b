#!/usr/bin/env bash
# The GPU check of `reshard validate --device cuda`, in two steps, so the
# machine with the GPU needs no Rust toolchain and no network:
#
#   bash scripts/gpu-check.sh --prepare [DIR]      on the build machine:
#       builds release reshard, synth, cuda_copy and the CLI test binary and
#       copies them, stripped, into DIR (default target/gpu-check; under
#       64 MiB, so a device run can carry it with the working tree)
#   bash scripts/gpu-check.sh [--bin DIR] [--results FILE] [--work DIR]
#       on the GPU machine, from the repository root (under 5 minutes on an
#       H200): the CUDA tests against the real driver, then
#       `validate --device cuda` on a 2 GB and an 8 GB synthetic checkpoint
#       against a pinned cuMemcpyHtoD + cuMemcpyDtoH loop of the same bytes
#       (validate uploads and reads back: that loop is its limit), and the
#       VRAM budget against fit. Writes one results file (default
#       DIR/gpu-check-results.tsv), its format in docs/validate.md.
#   bash scripts/gpu-check.sh --cpu-only [--bin DIR] ...
#       the same steps against the CUDA driver test double (tests/fake-cuda,
#       $RESHARD_TEST_FAKE_CUDA) on small checkpoints: what CI can run of
#       this script (scripts/test.sh does). Its figures say nothing about a GPU.
#
# Exits 1 when a check fails (the results file says which), 2 on a usage or
# setup error.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/gpu-check
results=
work=
cpu_only=0
prepare=0
profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) prepare=1; [ $# -gt 1 ] && [ "${2#-}" = "$2" ] && { bin=$2; shift; } ;;
    --profile) profile=${2:?--profile needs dev or release}; shift ;;
    --bin) bin=${2:?--bin needs a folder}; shift ;;
    --results) results=${2:?--results needs a file}; shift ;;
    --work) work=${2:?--work needs a folder}; shift ;;
    --cpu-only) cpu_only=1 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$prepare" = 1 ]; then
  flag=--release; dir=release
  [ "$profile" = dev ] && { flag=; dir=debug; }
  cargo build $flag --quiet --bin reshard --example synth --example cuda_copy
  # The test binary's path, from cargo's own report of what it built.
  test_exe=$(cargo test $flag --quiet --no-run --test cli --message-format=json \
    | grep '"kind":\["test"\]' | grep '"name":"cli"' \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
  [ -n "$test_exe" ] || { echo "gpu-check: no test binary reported" >&2; exit 2; }
  source scripts/lib/target.sh
  target=$(cargo_target_dir)
  mkdir -p "$bin"
  # dev (CI's --cpu-only run on this machine): links, not copies.
  put="cp"
  [ "$profile" = dev ] && put="ln -sf"
  for b in reshard examples/synth examples/cuda_copy; do
    $put "$target/$dir/$b" "$bin/"
  done
  $put "$test_exe" "$bin/cli-tests"
  if [ "$profile" = release ]; then
    strip "$bin/reshard" "$bin/synth" "$bin/cuda_copy" "$bin/cli-tests"
    size=$(du -sb "$bin" | cut -f1)
    if [ "$size" -gt $((64 << 20)) ]; then
      echo "gpu-check: $bin is $size bytes, more than a device run carries (64 MiB)" >&2
      exit 2
    fi
  fi
  du -shL "$bin"/*
  echo "$bin"
  exit 0
fi

for b in reshard synth cuda_copy cli-tests; do
  [ -x "$bin/$b" ] || { echo "gpu-check: no $bin/$b; run scripts/gpu-check.sh --prepare first" >&2; exit 2; }
done
bin=$(cd "$bin" && pwd)
results=${results:-$bin/gpu-check-results.tsv}
work=${work:-$(mktemp -d "${TMPDIR:-/tmp}/reshard-gpu-check.XXXXXX")}
mkdir -p "$work"
: >"$results"
failed=0

# One result a line: CHECK <tab> VERDICT (ok, FAILED or info) <tab> DETAIL.
result() {
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" | tee -a "$results"
  [ "$2" != FAILED ] || failed=1
}
# A number from reshard's JSON report: json_num KEY < report
json_num() { grep -o "\"$1\": *[0-9.eE+-]*" | head -1 | sed 's/.*: *//'; }

if [ "$cpu_only" = 1 ]; then
  : "${RESHARD_TEST_FAKE_CUDA:?--cpu-only needs RESHARD_TEST_FAKE_CUDA (tests/fake-cuda/build.sh)}"
  export LD_LIBRARY_PATH="$RESHARD_TEST_FAKE_CUDA${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The double's device holds host memory: keep the checkpoints small.
  export FAKE_CUDA_TOTAL_MEM=$((1 << 30))
  sizes=(24MB 48MB)
  synth_args=(--hidden 256)
  result mode info "cpu-only: the CUDA driver test double, not a GPU; figures say nothing about a GPU"
else
  sizes=(2GB 8GB)
  synth_args=()
  if command -v nvidia-smi >/dev/null; then
    result gpu info "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
  fi
fi

# 1. The CUDA tests (tests/cli/cuda.rs) against this driver: the ones that
#    inject no fault run on a real GPU; the rest need the double and skip.
log="$work/cuda-tests.log"
if RESHARD_TEST_REAL_CUDA=1 RESHARD_TEST_ROOT="$PWD" CARGO_BIN_EXE_reshard="$bin/reshard" \
  "$bin/cli-tests" cuda:: --test-threads 1 >"$log" 2>&1; then
  result cuda_tests ok "$(grep '^test result' "$log" | tail -1)"
else
  result cuda_tests FAILED "$(grep -E '^test .*FAILED|^test result' "$log" | tr '\n' ' ')(log: $log)"
fi

# 2. validate against the copy loop, per size; 3. the VRAM budget.
for size in "${sizes[@]}"; do
  src="$work/src-$size" out="$work/out-$size"
  rm -rf "$src" "$out"
  "$bin/synth" "$src" --size "$size" --dtype bf16 --shards 2 "${synth_args[@]}" >/dev/null
  "$bin/reshard" convert "$src" "$out" --max-shard-size 512MiB --no-progress >/dev/null
  # The first run reads the files into the page cache; the second is measured.
  "$bin/reshard" validate "$out" --device cuda --json >/dev/null || true
  rc=0
  report=$("$bin/reshard" validate "$out" --device cuda --json) || rc=$?
  if [ "$rc" != 0 ]; then
    result "validate_$size" FAILED "exit $rc"
    continue
  fi
  bytes=$(json_num bytes_loaded <<<"$report")
  validate_gb_s=$(json_num throughput_gb_s <<<"$report")
  staging=$(json_num staging <<<"$report")
  result "validate_$size" ok "$validate_gb_s GB/s ($bytes bytes, staging $staging)"
  copy=$("$bin/cuda_copy" "$bytes" "$staging") || { result "copy_$size" FAILED "cuda_copy failed"; continue; }
  copy_gb_s=$(json_num gb_s <<<"$copy")
  result "copy_$size" ok "$copy_gb_s GB/s (pinned upload + readback of the same bytes)"
  ratio=$(awk -v v="$validate_gb_s" -v c="$copy_gb_s" 'BEGIN { printf "%.2f", (c > 0 ? v / c : 0) }')
  if [ "$cpu_only" = 1 ]; then
    result "ratio_$size" info "$ratio (target >= 0.80 on a GPU; not judged against the double)"
  elif awk -v r="$ratio" 'BEGIN { exit !(r >= 0.80) }'; then
    result "ratio_$size" ok "$ratio (target >= 0.80)"
  else
    result "ratio_$size" FAILED "$ratio (target >= 0.80)"
  fi
done

# 3. --vram-budget at 3/4 of the model: exit 1, and the leading blocks fit
#    counts as fit counts them.
out="$work/out-${sizes[0]}"
budget=$(("$(du -sb "$out" | cut -f1)" * 3 / 4))
rc=0
report=$("$bin/reshard" validate "$out" --device cuda --vram-budget "$budget" --json) || rc=$?
blocks=$(json_num blocks_fit <<<"$report")
fit_blocks=$("$bin/reshard" fit "$out" --vram "$budget" --loader reshard --json | json_num leading_blocks_fit || true)
if [ "$rc" = 1 ] && [ -n "$blocks" ] && [ "$blocks" = "$fit_blocks" ]; then
  result vram_budget ok "--vram-budget $budget: exit 1, $blocks leading blocks fit, as fit says"
else
  result vram_budget FAILED "--vram-budget $budget: exit $rc, validate says ${blocks:-?} blocks, fit says ${fit_blocks:-?}"
fi

echo "gpu-check: results in $results"
exit "$failed"
