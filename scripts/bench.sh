#!/usr/bin/env bash
# reshard against the copy floor: every job is paired with a `cp -r` + `sync`
# of the same source, run just before it, BENCH_RUNS times (default 5); each
# row gives medians of wall seconds and CPU seconds (user + sys, from
# /usr/bin/time) of the job and of its paired copies, and the ratios; and
# the machine's busy CPU seconds while each ran (see busy() below).
# Synthetic Llama-shaped checkpoints (examples/synth.rs), two source files.
#
#   scripts/bench.sh                       # 1, 2 and 4 GB, warm and cold cache
#   BENCH_SIZES="1GB" BENCH_CACHE=warm scripts/bench.sh
#   BENCH_BASE=/tmp/reshard-old scripts/bench.sh   # adds rows for an older binary
#   BENCH_JOBS="convert cast" scripts/bench.sh      # a subset of the jobs
#
# Rows per size: bf16 and f32 sources converted into 512 MB shards,
# validate --device cpu of that output, f32 -> bf16, and (1 GB only) bf16
# into 100 MB shards; a Python row (safetensors + numpy: per-tensor read and
# save_file) on the f32 source with BENCH_PYTHON (default: the test venv).
# Warm cache: the source is read once before the pairs. Cold: page caches are
# dropped before every measured command, which needs root; without it the
# cold rows are skipped and the output says so.
# Virtual machines that hand freed memory back to their host (free page
# reporting, as on this project's CI machines: see docs/performance.md) charge
# ~3.5 s of system time per GB to touch that memory again, to whichever
# command comes first. So before each row's first pair the script touches
# size + 1 GiB of memory in /dev/shm and frees it (BENCH_PRETOUCH=0 skips
# this); later commands reuse what the previous one freed a moment before.
# Needs about 3x the largest size free under BENCH_DIR (default /tmp);
# everything is deleted at the end. Results go to stdout and BENCH_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${BENCH_SIZES:-"1GB 2GB 4GB"}
CACHES=${BENCH_CACHE:-"warm cold"}
RUNS=${BENCH_RUNS:-5}
WORK=${BENCH_DIR:-/tmp}/reshard-bench
OUT=${BENCH_OUT:-$WORK.md}
BASE=${BENCH_BASE:-}
PY=${BENCH_PYTHON:-/var/cache/reshard/venv-loaders/bin/python}
JOBS=" ${BENCH_JOBS:-convert validate cast shards100 python} "
want() { [[ "$JOBS" == *" $1 "* ]]; }
WINDOW=256MiB
cargo build --release --quiet --bin reshard --example synth
rm -rf "$WORK" && mkdir -p "$WORK"
# Copies, so a rebuild during the run does not change what is measured.
source scripts/lib/target.sh
target=$(cargo_target_dir)
cp "$target/release/reshard" "$target/release/examples/synth" "$WORK/"
BIN=$WORK/reshard
SYNTH=$WORK/synth
trap 'rm -rf "$WORK" /dev/shm/reshard-bench-pretouch' EXIT

can_drop=0
if sync && echo 3 2>/dev/null > /proc/sys/vm/drop_caches; then can_drop=1; fi
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# The guest's page-reporting counter (KiB handed back to the host), where the
# kernel has one.
REPORTED=/sys/module/page_reporting/parameters/reported_kib
reported() { cat "$REPORTED" 2>/dev/null || echo 0; }
reported_at_start=$(reported)
# pretouch SIZE: touch SIZE + 1 GiB of memory and free it (see the top).
pretouch() {
  [ "${BENCH_PRETOUCH:-1}" = 0 ] && return
  local gib=$(( ${1%GB} + 1 ))
  head -c "${gib}G" /dev/zero > /dev/shm/reshard-bench-pretouch 2>/dev/null || true
  rm -f /dev/shm/reshard-bench-pretouch
}

cat > "$WORK/py_reshard.py" <<'PY'
# The per-tensor Python reshard a user would write: one safe_open per file,
# one tensor at a time, save_file per 512 MB shard.
import json, os, sys
from safetensors import safe_open
from safetensors.numpy import save_file
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
idx = json.load(open(os.path.join(src, "model.safetensors.index.json")))["weight_map"]
shard, size, n, limit = {}, 0, 0, 512 * 10**6
def flush():
    global shard, size, n
    if shard:
        n += 1
        save_file(shard, os.path.join(dst, f"model-{n:05d}.safetensors"), metadata={"format": "pt"})
    shard, size = {}, 0
for f in sorted(set(idx.values())):
    with safe_open(os.path.join(src, f), framework="np") as st:
        for k in st.keys():
            t = st.get_tensor(k)
            if size + t.nbytes > limit:
                flush()
            shard[k] = t
            size += t.nbytes
flush()
PY

# Busy CPU seconds of the whole machine so far (user, nice, system, irq,
# softirq of /proc/stat), to count work the kernel does on a command's
# behalf in its own threads: `sync` hands the writeback of cp's pages to
# the flusher threads, which /usr/bin/time does not see, while a program
# that calls fsync or sync_file_range (reshard) pays that writeback itself.
HZ=$(getconf CLK_TCK)
busy() { awk -v hz="$HZ" '/^cpu / { printf "%.2f\n", ($2 + $3 + $4 + $7 + $8) / hz }' /proc/stat; }
# timed CACHE CMD...: prints "wall cpu rss_kb machine_cpu" of CMD (run by sh -c).
timed() {
  local cache=$1; shift
  [ "$cache" = cold ] && drop_caches
  local b0 b1
  b0=$(busy)
  /usr/bin/time -f "%e %U %S %M" -o "$WORK/time" sh -c "$1" > "$WORK/stdout" 2> "$WORK/stderr" \
    || { cat "$WORK/stderr" >&2; exit 1; }
  b1=$(busy)
  awk -v m="$(awk -v a="$b0" -v b="$b1" 'BEGIN { printf "%.2f", b - a }')" \
    '{ printf "%s %.2f %s %s\n", $1, $2 + $3, $4, m }' "$WORK/time"
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

rows=()
# job CACHE LABEL SRC CMD CLEANUP: RUNS pairs of (cp -r + sync, CMD), CLEANUP after each.
job() {
  local cache=$1 label=$2 src=$3 cmd=$4 cleanup=$5
  : > "$WORK/job" && : > "$WORK/cp"
  pretouch "$size"
  [ "$cache" = warm ] && cat "$src"/* > /dev/null
  for _ in $(seq "$RUNS"); do
    timed "$cache" "cp -r '$src' '$WORK/copy' && sync" >> "$WORK/cp"
    rm -rf "$WORK/copy"
    timed "$cache" "$cmd" >> "$WORK/job"
    sh -c "$cleanup"
  done
  local jw jc jr cw cc ratios
  jw=$(cut -d' ' -f1 "$WORK/job" | median); jc=$(cut -d' ' -f2 "$WORK/job" | median)
  jr=$(cut -d' ' -f3 "$WORK/job" | sort -g | tail -1)
  cw=$(cut -d' ' -f1 "$WORK/cp" | median); cc=$(cut -d' ' -f2 "$WORK/cp" | median)
  # The wall ratio is the median of the paired ratios.
  ratios=$(paste -d' ' "$WORK/job" "$WORK/cp" | awk '{ printf "%.3f\n", $1 / $5 }' | median)
  local cpu_ratio jm cm machine_ratio
  cpu_ratio=$(awk -v a="$jc" -v b="$cc" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "-" }')
  jm=$(cut -d' ' -f4 "$WORK/job" | median); cm=$(cut -d' ' -f4 "$WORK/cp" | median)
  machine_ratio=$(awk -v a="$jm" -v b="$cm" 'BEGIN { if (b > 0) printf "%.1f", a / b; else print "-" }')
  local row="| $label | $cache | $jw | $jc | $cw | $cc | $(printf %.2f "$ratios") | $cpu_ratio | $jm | $cm | $machine_ratio | $(awk -v k="$jr" 'BEGIN { printf "%.0f", k / 1024 }') |"
  rows+=("$row")
  echo "$row"
}

convert_cmd() { # BIN SRC DST EXTRA
  echo "'$1' convert '$2' '$3' --no-progress --window $WINDOW --max-shard-size 512MB $4 && sync"
}

echo "| job | cache | wall s | CPU s | cp wall s | cp CPU s | wall / cp | CPU / cp | machine CPU s | cp machine CPU s | machine CPU / cp | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for size in $SIZES; do
  for dtype in bf16 f32; do
    src="$WORK/src-$size-$dtype"
    $SYNTH "$src" --size "$size" --dtype "$dtype" --shards 2 > /dev/null
    for cache in $CACHES; do
      if [ "$cache" = cold ] && [ $can_drop = 0 ]; then continue; fi
      [ "$cache" = warm ] && cat "$src"/* > /dev/null
      bins=("new:$BIN")
      [ -n "$BASE" ] && bins+=("before:$BASE")
      for b in "${bins[@]}"; do
        name=${b%%:*} exe=${b#*:}
        tag=""; [ -n "$BASE" ] && tag=" ($name)"
        if want convert; then
          job "$cache" "$size $dtype convert$tag" "$src" "$(convert_cmd "$exe" "$src" "$WORK/out" "")" "rm -rf '$WORK/out'"
        fi
        if want validate; then
          convert_cmd "$exe" "$src" "$WORK/out" "" | sh > /dev/null
          job "$cache" "$size $dtype validate --device cpu$tag" "$src" "'$exe' validate '$WORK/out' --device cpu" "true"
          rm -rf "$WORK/out"
        fi
        if [ "$dtype" = f32 ] && want cast; then
          job "$cache" "$size f32 -> bf16$tag" "$src" "$(convert_cmd "$exe" "$src" "$WORK/out" "--dtype bf16")" "rm -rf '$WORK/out'"
        fi
        if [ "$size" = 1GB ] && [ "$dtype" = bf16 ] && want shards100; then
          job "$cache" "$size bf16 into 100 MB shards$tag" "$src" \
            "'$exe' convert '$src' '$WORK/out' --no-progress --window $WINDOW --max-shard-size 100MB && sync" "rm -rf '$WORK/out'"
        fi
      done
      if [ "$dtype" = f32 ] && [ -x "$PY" ] && want python; then
        job "$cache" "$size f32 Python safetensors+numpy" "$src" "'$PY' '$WORK/py_reshard.py' '$src' '$WORK/py' && sync" "rm -rf '$WORK/py'"
      fi
    done
    rm -rf "$src"
  done
done

{
  echo "Measured by \`scripts/bench.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'): $(nproc) cores"
  echo "($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); SHA extensions: $(grep -q sha_ni /proc/cpuinfo && echo yes || echo no)),"
  echo "$(free -g | awk '/Mem:/ {print $2}') GiB RAM; load after the run: $(uptime | sed 's/.*load average: //'). Medians of $RUNS paired runs."
  echo "Memory handed back to the host during the run (free page reporting): $(( ($(reported) - reported_at_start) / 1024 )) MiB."
  [ $can_drop = 0 ] && echo "Cold-cache rows skipped: dropping page caches needs root."
  echo
  echo "| job | cache | wall s | CPU s | cp wall s | cp CPU s | wall / cp | CPU / cp | machine CPU s | cp machine CPU s | machine CPU / cp | peak RSS MiB |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo
cat "$OUT"
