#!/usr/bin/env bash
# Tests what scripts/dist.sh ships, after building it afresh:
#   1. the Linux wheel, installed with pip into a new venv, puts a working
#      `reshard` on the venv's PATH: --version, then the README's convert of
#      examples/tiny-llama, whose output `reshard validate` accepts;
#   2. a wheel written by scripts/wheel-from-exe.py (the Windows wheel's
#      path) is one pip accepts: installed with `pip install --platform
#      win_amd64 --target`, its exe lands in bin/ byte for byte;
#   3. `cargo install --path .` into a temp root gives a working binary;
#   4. the crate (`cargo package --list`) holds no file over 4 MB, nothing of
#      fuzz/, scripts/ or .ci/, and the files the README and the docs need.
# Env: RESHARD_DIST_PROFILE=dev builds the dev profile (CI: reuses the test
#      build instead of a release build of every dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
started=$SECONDS
say() { printf 'dist-test: %s\n' "$*"; }
fail() {
  say "FAILED: $*" >&2
  exit 1
}

bash scripts/dist.sh
version=$(cargo metadata --no-deps --format-version 1 --offline 2>/dev/null |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')
wheel=$(ls dist/reshard-"$version"-py3-none-*linux*.whl | head -n 1)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- 1. pip install the wheel into a new venv ------------------------------
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "$wheel"
export PATH=$tmp/venv/bin:$PATH
[ "$(command -v reshard)" = "$tmp/venv/bin/reshard" ] ||
  fail "reshard on PATH is $(command -v reshard), not the venv's"
got=$(reshard --version)
[ "$got" = "reshard $version" ] || fail "reshard --version printed '$got'"
mkdir -p "$tmp/work"
cp -r examples "$tmp/work/"
(
  cd "$tmp/work"
  # The README's command, through the wheel's entry point.
  reshard convert examples/tiny-llama out/tiny-llama --max-shard-size 100KB >convert.txt 2>&1
  grep -q "^wrote 4 shards" convert.txt || fail "convert printed: $(cat convert.txt)"
  reshard validate out/tiny-llama --against examples/tiny-llama >validate.txt 2>&1 ||
    fail "validate failed: $(cat validate.txt)"
)
say "1. $(basename "$wheel") in a new venv: $got; README convert wrote 4 shards; validate passed"

# ---- 2. a wheel around a prebuilt exe, as the Windows wheel is built -------
# A stand-in with an MZ header: pip does not run it, it only installs it.
printf 'MZ stand-in for reshard.exe\n' >"$tmp/reshard.exe"
python3 scripts/wheel-from-exe.py --exe "$tmp/reshard.exe" --as reshard.exe --tag py3-none-win_amd64 \
  --like "$wheel" --out "$tmp/win" >/dev/null
win=$tmp/win/reshard-$version-py3-none-win_amd64.whl
"$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
  --platform win_amd64 --only-binary=:all: --target "$tmp/win-target" "$win"
cmp -s "$tmp/reshard.exe" "$tmp/win-target/bin/reshard.exe" ||
  fail "pip did not install reshard.exe from the win_amd64 wheel"
[ -f "$tmp/win-target/reshard-$version.dist-info/METADATA" ] || fail "no METADATA installed"
say "2. wheel-from-exe.py: pip installs the py3-none-win_amd64 wheel (--platform win_amd64)"

# ---- 3. cargo install --path . ---------------------------------------------
install_flags=(--locked --quiet --root "$tmp/cargo-root")
[ "${RESHARD_DIST_PROFILE:-release}" = dev ] && install_flags+=(--debug)
cargo install --path . "${install_flags[@]}"
got=$("$tmp/cargo-root/bin/reshard" --version)
[ "$got" = "reshard $version" ] || fail "cargo-installed reshard --version printed '$got'"
say "3. cargo install --path . into a temp root: $got"

# ---- 4. what the crate holds -------------------------------------------------
cargo package --list --locked --allow-dirty 2>/dev/null >"$tmp/files.txt"
n=$(wc -l <"$tmp/files.txt")
# Sizes of the listed files that exist here (Cargo.toml.orig and
# .cargo_vcs_info.json are made by cargo): "<bytes> <path>" per line.
while IFS= read -r f; do
  if [ -f "$f" ]; then stat -c '%s %n' "$f"; fi
done <"$tmp/files.txt" >"$tmp/sizes.txt"
big=$(awk -v max=$((4 << 20)) '$1 > max {print $2}' "$tmp/sizes.txt")
[ -z "$big" ] || fail "files over 4 MB in the crate: $big"
if grep -E '^(fuzz|scripts|\.ci|dist|target|out)/|^pyproject\.toml$' "$tmp/files.txt"; then
  fail "the crate holds files it should not (above)"
fi
for f in README.md LICENSE-MIT LICENSE-APACHE src/main.rs examples/tiny-llama/model.safetensors \
  docs/examples/slurm-batch.sh docs/examples/k8s-indexed-job.yaml; do
  grep -qx "$f" "$tmp/files.txt" || fail "the crate lacks $f"
done
unpacked=$(awk '{s += $1} END {print s}' "$tmp/sizes.txt")
largest=$(sort -n "$tmp/sizes.txt" | tail -n 1)
say "4. crate: $n files, $unpacked bytes unpacked, $(stat -c %s "dist/reshard-$version.crate") bytes packed; largest $largest; no fuzz/"
say "passed in $((SECONDS - started)) s"
