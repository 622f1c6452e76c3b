#!/usr/bin/env bash
# Builds the release reshard.exe (x86_64-pc-windows-gnu) from Debian's
# packages alone, and prints its path. scripts/dist.sh packages it (a zip
# with README and licences, and a py3-none-win_amd64 wheel):
#
#   RESHARD_WINDOWS_EXE=$(bash scripts/windows-build.sh) bash scripts/dist.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/windows/env.sh
win_cargo build --quiet --release --bin reshard >&2
echo "$CARGO_TARGET_DIR/$WINDOWS_TARGET/release/reshard.exe"
