#!/usr/bin/env bash
# Builds reshard for x86_64-pc-windows-gnu and runs its unit tests (--lib)
# and CLI tests (--test cli) under Wine, from Debian packages only: no rustup
# target, nothing downloaded outside the package registries (crates.io for
# the crates, as on Linux).
#
#   bash scripts/windows-test.sh [extra cargo test args, e.g. -- crash::]
#
# Caches (outside the checkout, kept between runs): the Windows target folder
# and a private Wine prefix under ${RESHARD_CACHE:-/var/cache/reshard}.
# The std of the Windows target is built from Debian's rust-web-src
# (-Zbuild-std, hence RUSTC_BOOTSTRAP=1 for this cargo only).
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${RESHARD_CACHE:-/var/cache/reshard}"
target=x86_64-pc-windows-gnu
packages=(rustc-web cargo-web rust-web-src gcc-mingw-w64-x86-64 wine64)

# 1. Packages (quick when present).
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

# 2. Debian's toolchain, not rustup's (rustup has no Windows std here).
export CARGO=/usr/bin/cargo RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="$cache/windows-target"

# 3. A private Wine prefix, no display, no Wine chatter on stderr.
export WINEPREFIX="$cache/wine-prefix" WINEARCH=win64 WINEDEBUG=-all
export WINEDLLOVERRIDES="mscoree,mshtml="  # no Mono/Gecko install prompts
unset DISPLAY WAYLAND_DISPLAY
mkdir -p "$cache"
if [ ! -f "$WINEPREFIX/drive_c/windows/system32/kernel32.dll" ]; then
  wineboot -i >/dev/null 2>&1
  wineserver -w
fi

# 4. The bcryptprimitives.dll stand-in (Wine 8 lacks it; Rust's std needs
#    its ProcessPrng). A test-harness part: it lives only in this prefix.
dll="$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll"
src=scripts/windows/bcryptprimitives
if [ ! -f "$dll" ] || [ "$src.c" -nt "$dll" ] || [ "$src.def" -nt "$dll" ]; then
  x86_64-w64-mingw32-gcc -O2 -shared -o "$dll" "$src.c" "$src.def" -ladvapi32
fi

# 5. Small volumes for the full-disk, free-space and read-only tests: drives
#    M: (2 MB) and N: (read-only) mapped to tmpfs mounts. Needs root, as the
#    Linux tests' tmpfs does; without it those tests print why they skip.
mounts=()
cleanup() {
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null && rmdir "$m"; done
  rm -f "$WINEPREFIX/dosdevices/m:" "$WINEPREFIX/dosdevices/n:"
}
trap cleanup EXIT
volume() { # DRIVE OPTIONS VAR
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/reshard-wine-$1.XXXXXX")
  if mount -t tmpfs -o "$2" tmpfs "$dir" 2>/dev/null; then
    mounts+=("$dir")
    ln -sfn "$dir" "$WINEPREFIX/dosdevices/$1:"
    export "$3=${1^^}:\\"
  fi
}
if [ "$(id -u)" -eq 0 ]; then
  volume m size=2m RESHARD_TEST_FULL_DIR
  volume n size=1m,ro RESHARD_TEST_READONLY_DIR
fi

# 6. Build and run. Tests that need Unix-only machinery skip with a reason;
#    see docs/windows.md for what Wine cannot show.
# The runner goes in through --config, not CARGO_TARGET_..._RUNNER: assert_cmd
# reads that variable and would start `wine reshard.exe` from inside Wine.
runner=(--config "target.$target.runner = 'wine'")
# The Python interop tests use a Linux venv; a Windows exe cannot run it.
unset RESHARD_TEST_PYTHON
"$CARGO" test "${runner[@]}" -Zbuild-std=std,panic_abort --target "$target" \
  --no-fail-fast --lib --test cli "$@"
