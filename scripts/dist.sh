#!/usr/bin/env bash
# Builds what users install, into dist/ (gitignored):
#   reshard-<v>-py3-none-manylinux_<glibc>_x86_64.whl  `pip install` it: the
#       binary lands on the venv's PATH (maturin, bindings = "bin"); checked
#       for manylinux compliance by maturin and `auditwheel show`
#   reshard-<v>-x86_64-linux.tar.gz   the same binary, README, licenses
#   reshard-<v>.crate                 what `cargo publish` would upload
#   windows/reshard-<v>-py3-none-win_amd64.whl and
#       windows/reshard-<v>-x86_64-windows.zip, only when a Windows build of
#       the binary exists (see below); in their own folder so that
#       `pip install dist/reshard-*.whl` on Linux finds one wheel
#   SHA256SUMS
#
# The Windows build is not made here (it needs the Windows cross-build,
# scripts/windows-test.sh). dist.sh packages it when it finds it: at
# $RESHARD_WINDOWS_EXE, else <cargo's target folder>/x86_64-pc-windows-gnu/<profile>/reshard.exe.
# maturin cannot wrap a prebuilt exe (it always runs cargo for the target
# itself), so that wheel is written by scripts/wheel-from-exe.py, with the
# METADATA and licenses of the Linux wheel.
#
# maturin and auditwheel (scripts/dist-requirements.txt) are installed with
# pip into a venv cached outside the checkout, named by the hash of that file:
# ${RESHARD_CACHE:-/var/cache/reshard}/venv-dist-<hash> (falling back to
# ~/.cache/reshard when that is not writable), so reruns reuse it.
#
# Env: RESHARD_DIST_PROFILE=release (default) or dev (CI: reuses the test
#      build; the wheel then holds an unoptimised binary, for tests only).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
started=$SECONDS
say() { printf 'dist: %s\n' "$*"; }

profile=${RESHARD_DIST_PROFILE:-release}
case $profile in
release) profile_dir=release ;;
dev) profile_dir=debug ;;
*)
  say "RESHARD_DIST_PROFILE must be release or dev, not '$profile'" >&2
  exit 2
  ;;
esac

# ---- the tools, in a cached venv ---------------------------------------------
reqs=scripts/dist-requirements.txt
hash=$(sha256sum "$reqs" | cut -c1-16)
cache=${RESHARD_CACHE:-/var/cache/reshard}
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/reshard
  mkdir -p "$cache"
fi
venv=$cache/venv-dist-$hash
# .complete marks a finished install: a run killed while installing is redone.
if [ ! -f "$venv/.complete" ] || ! "$venv/bin/python" -c 'import maturin, auditwheel' 2>/dev/null; then
  say "installing $(tr '\n' ' ' <"$reqs")into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
  touch "$venv/.complete"
fi
maturin() { "$venv/bin/python" -m maturin "$@"; }
auditwheel() { "$venv/bin/python" -m auditwheel "$@"; }

version=$(cargo metadata --no-deps --format-version 1 --offline 2>/dev/null |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["packages"][0]["version"])')
out=$repo/dist
rm -rf "$out"
mkdir -p "$out"

# ---- the Linux wheel -----------------------------------------------------------
say "building the wheel ($profile profile) with $(maturin --version)"
profile_flag=(--release)
[ "$profile" = dev ] && profile_flag=(--profile dev)
# --auditwheel check: fail, rather than repair, if the binary needs a library
# outside the manylinux set. The tag is the lowest manylinux the binary's
# glibc symbols allow.
maturin build "${profile_flag[@]}" --locked --quiet --auditwheel check --out "$out" 2>&1 |
  grep -v '^\(📦\|🔗\|📡\|🍹\)' || true
wheel=$(ls "$out"/reshard-"$version"-py3-none-*linux*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || {
  say "maturin wrote no Linux wheel" >&2
  exit 1
}
tag=$(basename "$wheel" .whl)
tag=${tag#reshard-"$version"-py3-none-}
auditwheel show "$wheel" >"$out/auditwheel.txt" 2>&1 || true
say "wheel $(basename "$wheel"): $(du -h "$wheel" | cut -f1), platform tag $tag"
say "auditwheel show: $(tr '\n' ' ' <"$out/auditwheel.txt" | grep -o 'consistent with the following platform tag: "[^"]*"' || echo 'see dist/auditwheel.txt')"

# ---- the Linux tarball: the binary from the wheel (stripped) ----------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
name=reshard-$version-x86_64-linux
mkdir -p "$stage/$name"
python3 - "$wheel" "$stage/$name/reshard" "$version" <<'EOF'
import os, sys, zipfile
wheel, dst, version = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    data = z.read(f"reshard-{version}.data/scripts/reshard")
with open(dst, "wb") as f:
    f.write(data)
os.chmod(dst, 0o755)
EOF
cp README.md LICENSE-MIT LICENSE-APACHE "$stage/$name/"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$out/$name.tar.gz" "$name"
"$stage/$name/reshard" --version >/dev/null
say "tarball $name.tar.gz: $(du -h "$out/$name.tar.gz" | cut -f1)"

# ---- the crate ----------------------------------------------------------------
# Verified: the packaged sources are built on their own (dev profile, reusing
# target/'s dependencies), so a file left out of `include` fails here.
source scripts/lib/target.sh
target=$(cargo_target_dir)
rm -f "$target/package/reshard-$version.crate"
cargo package --locked --allow-dirty --quiet 2>&1 | grep -v 'no documentation, homepage or repository\|^ *|$\|^ *= note: see' || true
[ -f "$target/package/reshard-$version.crate" ] || {
  say "cargo package failed" >&2
  exit 1
}
cp "$target/package/reshard-$version.crate" "$out/"
say "crate reshard-$version.crate: $(du -h "$out/reshard-$version.crate" | cut -f1), $(cargo package --list --locked --allow-dirty 2>/dev/null | wc -l) files"

# ---- Windows, when a Windows build exists ------------------------------------
exe=${RESHARD_WINDOWS_EXE:-$target/x86_64-pc-windows-gnu/$profile_dir/reshard.exe}
if [ -f "$exe" ]; then
  if [ "$(head -c 2 "$exe")" != MZ ]; then
    say "$exe is not a Windows executable (no MZ header)" >&2
    exit 1
  fi
  mkdir -p "$out/windows"
  # Shipped stripped, as the Linux binary is: the release profile keeps line
  # tables for backtraces, which take three quarters of the file.
  built=$exe
  cp "$built" "$stage/reshard.exe"
  x86_64-w64-mingw32-strip "$stage/reshard.exe"
  exe=$stage/reshard.exe
  python3 scripts/wheel-from-exe.py --exe "$exe" --as reshard.exe --tag py3-none-win_amd64 --like "$wheel" --out "$out/windows" >/dev/null
  wname=reshard-$version-x86_64-windows
  python3 - "$exe" "$out/windows/$wname.zip" "$wname" README.md LICENSE-MIT LICENSE-APACHE <<'EOF'
import sys, zipfile
exe, dst, top, *docs = sys.argv[1:]
with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as z:
    z.write(exe, f"{top}/reshard.exe")
    for d in docs:
        z.write(d, f"{top}/{d}")
EOF
  say "windows: windows/reshard-$version-py3-none-win_amd64.whl ($(du -h "$out/windows/reshard-$version-py3-none-win_amd64.whl" | cut -f1)) and windows/$wname.zip from $built, stripped"
else
  say "windows: skipped: no Windows build at $exe (set RESHARD_WINDOWS_EXE, or build it with the Windows cross-build, scripts/windows-test.sh)"
fi

(cd "$out" && sha256sum -- *.whl *.tar.gz *.crate $(ls windows/* 2>/dev/null) >SHA256SUMS)
say "done in $((SECONDS - started)) s:"
(cd "$out" && find . -type f | sort | while IFS= read -r f; do printf '  %10d  %s\n' "$(stat -c %s "$f")" "${f#./}"; done)
