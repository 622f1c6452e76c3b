# Sourced by the bench scripts that report medians: dropping the page
# cache before each run, and one table row per command.
#
# Needs `runs` (how many runs per row) and `work` (a scratch folder) set by
# the caller, and a function `bench_clean` that removes the outputs of the
# previous run.

bench_drop() {
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi
}

# bench_row LABEL COMMAND...: runs COMMAND `runs` times (bench_clean and
# bench_drop first) and prints "LABEL WALL CPU RSS_KIB": the run of median
# wall time's wall seconds and user + system CPU seconds, and the largest
# peak RSS of all the runs. A failed run stops the bench, its stderr shown.
bench_row() {
  local label=$1; shift
  local results=()
  for _ in $(seq "$runs"); do
    bench_clean
    bench_drop
    /usr/bin/time -o "$work/time" -f "%e %U %S %M" "$@" > /dev/null 2> "$work/stderr" || {
      cat "$work/stderr" >&2; echo "bench: $label failed" >&2; exit 2; }
    results+=("$(tail -1 "$work/time")")
  done
  printf '%s\n' "${results[@]}" | sort -n | awk -v label="$label" -v n="$runs" \
    '{w[NR]=$1; c[NR]=$2+$3; if ($4 > m) m = $4} END {i=int((n+1)/2); printf "%s %s %.2f %d\n", label, w[i], c[i], m}'
}
