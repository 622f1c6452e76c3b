#!/usr/bin/env bash
# `reshard batch --part I/N` on a real single-node Slurm cluster.
#
# Starts munged, slurmctld and slurmd (as root, every file in a temp dir, on
# ports of their own), then submits the job script users are told to write,
# docs/examples/slurm-batch.sh (docs/batch.md shows it verbatim; a test in
# tests/cli/docs.rs holds them equal), as `sbatch --array=0-3` over a folder of
# a dozen tiny models, and checks:
#   1. every model converted exactly once across the 4 tasks, each part's
#      report written (counted from the per-part reports);
#   2. a rerun of the array reports every model up to date;
#   3. a task cancelled with scancel in the middle of a model (held there by
#      the RESHARD_PAUSE_AT test hook) is finished by its rerun, and every
#      output then validates against its source.
# The daemons it started are stopped by their pids on every exit path.
#
# Needs root (the daemons run as root); without it, it says so and exits 0.
# Installs slurm-wlm and munge with apt-get when they are missing.
# Env: RESHARD_BIN (default: cargo's target folder's debug/reshard, built here),
#      RESHARD_SLURM_PORT (slurmctld's port, default 16817; slurmd's is +1),
#      RESHARD_KEEP=1 keeps the temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
started=$SECONDS

say() { printf 'slurm-test: %s\n' "$*"; }
fail() {
  say "FAILED: $*" >&2
  exit 1
}

if [ "$(id -u)" != 0 ]; then
  say "skipped: needs root to start munged, slurmctld and slurmd (running as uid $(id -u))"
  exit 0
fi

export PATH=$PATH:/usr/sbin:/sbin
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
  ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
  say "installing slurm-wlm and munge with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm munge >/dev/null
fi

if [ -n "${RESHARD_BIN:-}" ]; then
  bin=$RESHARD_BIN
else
  cargo build --locked --quiet --bin reshard
  source "$repo/scripts/lib/target.sh"
  bin=$(cd "$repo" && cargo_target_dir)/debug/reshard
fi
[ -x "$bin" ] || fail "no reshard binary at $bin"
bindir=$(mktemp -d /tmp/reshard-slurm-bin.XXXXXX)
ln -s "$bin" "$bindir/reshard"

tmp=$(mktemp -d /tmp/reshard-slurm.XXXXXX)
chmod 700 "$tmp"
pids=()
jobs_submitted=()

cleanup() {
  local rc=$?
  set +e
  for j in "${jobs_submitted[@]}"; do scancel "$j" 2>/dev/null; done
  # Newest first: slurmd, slurmctld, munged.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    local pid=${pids[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null && say "daemon $pid did not stop on TERM: killed"
    wait "$pid" 2>/dev/null
  done
  [ ${#pids[@]} -gt 0 ] && say "stopped daemons ${pids[*]}"
  if [ "$rc" != 0 ]; then
    for f in "$tmp"/log/*.log "$tmp"/jobs/*.out; do
      [ -f "$f" ] || continue
      echo "---- $f (last 30 lines)" >&2
      tail -n 30 "$f" >&2
    done
  fi
  if [ "${RESHARD_KEEP:-0}" = 1 ]; then say "kept $tmp"; else rm -rf "$tmp"; fi
  rm -rf "$bindir"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the cluster -----------------------------------------------------------
mkdir -p "$tmp"/{munge,state,spool,log,jobs,etc}
chmod 700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$tmp/munge/munge.key"
sock=$tmp/munge/munge.socket
munged -F --force --socket="$sock" --key-file="$tmp/munge/munge.key" \
  --log-file="$tmp/log/munged.log" --pid-file="$tmp/munge/munged.pid" \
  --seed-file="$tmp/munge/munged.seed" >"$tmp/log/munged.stdout" 2>&1 &
pids+=($!)
for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || fail "munged did not create its socket"

host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 9 / 10))
port=${RESHARD_SLURM_PORT:-16817}
export SLURM_CONF=$tmp/etc/slurm.conf
cat >"$SLURM_CONF" <<EOF
ClusterName=reshard-test
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerParameters=sched_interval=1
KillWait=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -D -i -f "$SLURM_CONF" >"$tmp/log/slurmctld.stdout" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$tmp/log/slurmd.stdout" 2>&1 &
pids+=($!)
say "cluster: munged, slurmctld, slurmd = pids ${pids[*]}; node $host, $cpus CPUs, ${mem_mb} MB"
state=
for _ in $(seq 300); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || fail "node $host is '${state:-unknown}', not idle, after 60 s"
say "node $host idle after $((SECONDS - started)) s"

# ---- a dozen tiny models ---------------------------------------------------
models=$tmp/models
i=0
for f in tiny-gpt2 tiny-gpt2-bin tiny-llama tiny-llama-bin tiny-llama-f32-sharded \
  tiny-moe-sharded tiny-moe-bin-sharded tiny-t5; do
  mkdir -p "$models/org-a" "$models/org-b"
  cp -r "tests/fixtures/$f" "$models/org-a/$f"
  i=$((i + 1))
done
for f in tiny-gpt2 tiny-llama tiny-t5; do cp -r "tests/fixtures/$f" "$models/org-b/$f"; done
cp -r examples/tiny-llama "$models/example-llama"
count=$(find "$models" -name config.json | wc -l)
[ "$count" = 12 ] || fail "built $count models, not 12"

# ---- helpers ---------------------------------------------------------------
script=$repo/docs/examples/slurm-batch.sh
parts=4
submit() { # OUT ARRAY [extra env] -> job id
  local out=$1 array=$2 extra=${3:-}
  # The script asks for 8 CPUs and 8G per task; this node is smaller.
  PATH=$bindir:$PATH sbatch --parsable --array="$array" --cpus-per-task=1 --mem=512M \
    --output="$tmp/jobs/%A_%a.out" \
    --export="ALL,PARTS=$parts,MODELS=$models,CONVERTED=$out$extra" "$script"
}
wait_job() { # JOBID: until squeue no longer lists it
  for _ in $(seq 600); do
    [ -z "$(squeue -h -j "$1" -o %i 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  fail "job $1 still queued after 120 s: $(squeue -j "$1")"
}
check() { # what merged-report-json python-expression
  python3 - "$2" "$3" "$1" <<'EOF'
import json, sys
merged = json.load(open(sys.argv[1]))
ok = eval(sys.argv[2], {"m": merged, "models": merged["models"]})
if not ok:
    print(f"slurm-test: FAILED: {sys.argv[3]}: {sys.argv[2]}", file=sys.stderr)
    print(json.dumps({k: merged[k] for k in ("totals", "parts", "missing_parts")}, indent=1), file=sys.stderr)
    sys.exit(1)
EOF
}
merge() { # OUT -> merged report path
  local m=$tmp/merged-$(basename "$1")-$RANDOM.json
  reports=("$1"/.reports/part-*.json)
  "$bin" batch-report merge "${reports[@]}" -o "$m" >"$m.txt" || true
  echo "$m"
}

# ---- 1. the array converts every model exactly once ------------------------
out=$tmp/converted
job=$(submit "$out" 0-$((parts - 1)))
jobs_submitted+=("$job")
wait_job "$job"
for p in $(seq 0 $((parts - 1))); do
  [ -f "$out/.reports/part-$p.json" ] || fail "task $p wrote no report ($tmp/jobs/${job}_$p.out)"
done
m=$(merge "$out")
check "every model converted exactly once" "$m" \
  "len(models) == 12 and len({x['name'] for x in models}) == 12 and m['totals']['converted'] == 12 and not m['missing_parts']"
per_part=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
print(", ".join("part %s: %d" % (p["part"], p["totals"]["converted"]) for p in m["parts"]))
' "$m")
say "1. array $job: 12 models converted exactly once over 4 tasks ($per_part); 4 reports"

# ---- 2. a rerun finds everything up to date --------------------------------
job=$(submit "$out" 0-$((parts - 1)))
jobs_submitted+=("$job")
wait_job "$job"
m=$(merge "$out")
check "rerun is up to date" "$m" \
  "m['totals']['up_to_date'] == 12 and m['totals']['converted'] == 0 and len(models) == 12"
say "2. rerun $job: 12 up to date, 0 converted"

# ---- 3. a task cancelled mid-model is finished by its rerun ----------------
out2=$tmp/converted-cancel
job=$(submit "$out2" 0-$((parts - 1)) ",RESHARD_PAUSE_AT=3,RESHARD_PAUSE_UNTIL=$tmp/release")
jobs_submitted+=("$job")
victim=
for _ in $(seq 600); do
  victim=$(grep -l "paused at write step" "$tmp/jobs/${job}"_*.out 2>/dev/null | head -n 1 || true)
  [ -n "$victim" ] && break
  sleep 0.2
done
[ -n "$victim" ] || fail "no task of $job reached its pause"
task=${victim##*_}
task=${task%.out}
scancel "${job}_$task"
for _ in $(seq 100); do
  st=$(squeue -h -j "${job}_$task" -o %T 2>/dev/null || true)
  [ -z "$st" ] && break
  sleep 0.2
done
# The cancelled part's models that hold a partial conversion (others of the
# array may be paused too: only this part's count).
interrupted=$("$bin" batch "$models" --out "$out2" --part "$task/$parts" --dry-run --json |
  python3 -c '
import json, os, sys
for m in json.load(sys.stdin)["models"]:
    if os.path.exists(os.path.join(m["output"], ".reshard-partial.json")):
        print(m["name"])
')
[ -n "$interrupted" ] || fail "the cancelled task $task left no partial conversion"
touch "$tmp/release"
wait_job "$job"
[ ! -f "$out2/.reports/part-$task.json" ] || fail "the cancelled task $task wrote a report"
job2=$(submit "$out2" "$task")
jobs_submitted+=("$job2")
wait_job "$job2"
m=$(merge "$out2")
check "rerun of the cancelled task finished the job" "$m" \
  "len(models) == 12 and not m['missing_parts'] and m['totals']['failed'] == 0 and all(x['status'] in ('converted', 'up_to_date') for x in models) and all(x['status'] == 'converted' for x in models if x['part'] != $task) and all(x['status'] == 'converted' for x in models if x['name'] in '$(echo $interrupted)'.split())"
[ -z "$(find "$out2" -name .reshard-partial.json)" ] || fail "a partial conversion is left after the rerun"
n=0
while IFS= read -r name; do
  "$bin" validate "$out2/$name" --against "$models/$name" >/dev/null ||
    fail "$out2/$name does not validate against its source"
  n=$((n + 1))
done < <(python3 -c 'import json,sys; [print(x["name"]) for x in json.load(open(sys.argv[1]))["models"]]' "$m")
[ "$n" = 12 ] || fail "validated $n outputs, not 12"
say "3. task ${job}_$task cancelled in the middle of $(echo $interrupted); its rerun $job2 converted it; all 12 outputs validate"
say "passed in $((SECONDS - started)) s"
