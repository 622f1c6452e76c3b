#!/usr/bin/env bash
# What a Windows user does, under Wine, on a checkpoint of a chosen size,
# with the Linux build beside it for comparison:
#
#   inspect, fit --json, convert, a rerun (up to date), validate --against
#   (its commit figure must be measured, not zero), batch over a Hugging
#   Face cache laid out as Windows lays it out without symlinks (snapshot
#   files are real copies), and the same convert on Linux: shards, index and
#   config must be byte-identical.
#
#   bash scripts/windows-smoke.sh [SIZE] [EXE]
#
# SIZE defaults to 64MB (what the test suite runs); docs/windows.md quotes a
# run at 2GB with the release build. EXE defaults to the debug reshard.exe
# that scripts/windows-test.sh builds; pass a release build for big sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
# The Linux build goes where cargo puts it for this checkout (a shared
# CARGO_TARGET_DIR included), asked before env.sh points CARGO_TARGET_DIR
# at the Windows cross-build.
source scripts/lib/target.sh
linux_target=$(cargo_target_dir)
source scripts/windows/env.sh

size="${1:-64MB}"
exe="${2:-$CARGO_TARGET_DIR/x86_64-pc-windows-gnu/debug/reshard.exe}"
[ -f "$exe" ] || win_cargo build --quiet --bin reshard
# The Linux build with the Linux toolchain and target folder: env.sh points
# CARGO_TARGET_DIR, RUSTC and friends at the Windows cross-build.
env -u CARGO -u RUSTC -u RUSTDOC -u RUSTC_BOOTSTRAP CARGO_TARGET_DIR="$linux_target" \
  cargo build --quiet --release --bin reshard --example synth
linux=$linux_target/release/reshard

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Wine's server exits a few seconds after its last client; a wine started
# at that moment can meet a server that is closing and die before reshard
# runs ("wine client error:0: recvmsg: Connection reset by peer", seen once
# in CI). Such a start is retried once; any other failure is reshard's and
# fails the smoke. Every step is safe to repeat (convert resumes).
win() {
  local err="$work/wine-stderr" rc=0
  wine "$exe" "$@" 2>"$err" || rc=$?
  if [ "$rc" -ne 0 ] && grep -q "wine client error" "$err"; then
    cat "$err" >&2
    echo "windows-smoke: Wine's server went away as the step started; once more" >&2
    sleep 5
    rc=0
    wine "$exe" "$@" 2>"$err" || rc=$?
  fi
  cat "$err" >&2
  return "$rc"
}
step() { printf '\n== %s\n' "$*"; }

"$linux_target/release/examples/synth" "$work/src" --size "$size" --shards 2 >/dev/null
printf '{"model_type": "llama", "torch_dtype": "float32"}\n' >"$work/src/config.json"

step "inspect"
win inspect "$work/src" | head -5
step "fit --json (machine as Wine reports it)"
win fit "$work/src" --json >"$work/fit.json"
python3 - "$work/fit.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["machine"]
print("os", m["os"], "| ram", m["ram"], "| commit limit", m["commit_limit"])
assert m["os"] == "windows", m
assert m["ram"] and m["ram"]["bytes"] > 0, m
EOF

step "convert (Windows)"
win convert "$work/src" "$work/win" --max-shard-size 16MB
step "rerun into the same folder"
win convert "$work/src" "$work/win" --max-shard-size 16MB 2>&1 | tee "$work/rerun.txt"
grep -qi "up to date" "$work/rerun.txt"

step "validate --against (Windows)"
win validate "$work/win" --against "$work/src" --json >"$work/validate.json"
python3 - "$work/validate.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["commit"]
print("passed", r["passed"], "| commit source", c["source"], "| peak above baseline", c["peak_above_baseline"], "| samples", c["samples"])
assert r["passed"], r.get("failures")
assert c["source"] != "unavailable" and c["peak_above_baseline"] > 0, c
EOF

step "batch over a Hugging Face cache without symlinks"
repo="$work/hub/models--org--smoke"
# huggingface_hub without symlinks downloads into blobs/ and moves each
# finished file into the snapshot: blobs/ is there, empty of these files.
mkdir -p "$repo/refs" "$repo/blobs" "$repo/snapshots/0123abcd"
printf 0123abcd >"$repo/refs/main"
cp "$work/src"/* "$repo/snapshots/0123abcd/"
win batch "$work/hub" --out "$work/batch" --max-shard-size 16MB
[ -f "$work/batch/org--smoke/reshard.json" ]

step "the same convert on Linux: byte-identical output"
"$linux" convert "$work/src" "$work/linux" --max-shard-size 16MB >/dev/null
for f in "$work/linux"/*; do
  name=$(basename "$f")
  [ "$name" = reshard.json ] && continue  # records paths and times
  cmp "$f" "$work/win/$name"
done
echo "identical: $(ls "$work/linux" | grep -vc reshard.json) files"
echo "windows smoke: passed"
