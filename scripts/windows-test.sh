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

source scripts/windows/env.sh

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

# Build and run. Tests that need Unix-only machinery skip with a reason;
# see docs/windows.md for what Wine cannot show. win_cargo passes the runner
# through --config, not CARGO_TARGET_..._RUNNER: assert_cmd reads that
# variable and would start `wine reshard.exe` from inside Wine.
# The Python interop tests use a Linux venv; a Windows exe cannot run it.
unset RESHARD_TEST_PYTHON
win_cargo test --no-fail-fast --lib --test cli "$@"
# A user's session on a bigger checkpoint, and the same convert on Linux.
if [ $# -eq 0 ]; then
  bash scripts/windows-smoke.sh 64MB
fi
