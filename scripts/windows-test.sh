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

# The CUDA driver test double as cuda.dll and nvcuda.dll (test-only, never
# shipped): tests/cli/cuda.rs puts this folder first on the PATH of the
# reshard.exe it starts, and Windows' LoadLibrary searches PATH last.
fake_cuda=$(bash tests/fake-cuda/build.sh "$CARGO_TARGET_DIR/fake-cuda" windows)
RESHARD_TEST_FAKE_CUDA=$(winepath -w "$fake_cuda")
export RESHARD_TEST_FAKE_CUDA

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
unset RESHARD_TEST_PYTHON RESHARD_GGML_PYTHON
# Wine sometimes fails to start a process at all ("Internal error. (os error
# 1359)" from CreateProcess, seen once in about twenty runs under load; an
# unwrapped io::Error prints it as `Os { code: 1359, .. }`). A
# test that failed only that way is run once more, by name; any other
# failure fails the run as it is.
log=$(mktemp "${TMPDIR:-/tmp}/reshard-wine-test.XXXXXX")
if ! win_cargo test --no-fail-fast --lib --test cli "$@" 2>&1 | tee "$log"; then
  mapfile -t failed < <(awk '/^failures:$/ { f = 1; next } f && /^    [^ ]/ { print $1 } f && /^test result/ { f = 0 }' "$log" | sort -u)
  mapfile -t spawn_only < <(awk '
    /^---- .* stdout ----$/ { if (name != "") print name, hit; name = $2; hit = 0; next }
    /os error 1359|Os \{ code: 1359,/ { hit = 1 }
    END { if (name != "") print name, hit }' "$log" | awk '$2 == 1 { print $1 }' | sort -u)
  if [ ${#failed[@]} -eq 0 ] || [ "${failed[*]}" != "${spawn_only[*]}" ]; then
    rm -f "$log"
    exit 1
  fi
  echo "windows-test: ${failed[*]}: Wine could not start a process (os error 1359); running once more"
  win_cargo test --lib --test cli -- --exact "${failed[@]}"
fi
rm -f "$log"
# A user's session on a bigger checkpoint, and the same convert on Linux.
if [ $# -eq 0 ]; then
  bash scripts/windows-smoke.sh 64MB
fi
