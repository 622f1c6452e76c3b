# Sourced by the Windows scripts (windows-test.sh, windows-build.sh,
# windows-smoke.sh): Debian's packages for the cross-build and Wine, the
# toolchain variables, a private Wine prefix and the test-only
# bcryptprimitives.dll stand-in. Nothing is downloaded outside the package
# registries: no rustup target; the Windows std is built from Debian's
# rust-web-src with -Zbuild-std (hence RUSTC_BOOTSTRAP=1 for this cargo only).
#
# Provides win_cargo ARGS...: Debian's cargo for x86_64-pc-windows-gnu,
# with the Windows target folder cached outside the checkout.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/cache.sh"

WINDOWS_TARGET=x86_64-pc-windows-gnu

# 1. Packages (quick when present).
_win_missing=()
for _p in rustc-web cargo-web rust-web-src gcc-mingw-w64-x86-64 wine64; do
  dpkg-query -W -f='${Status}' "$_p" 2>/dev/null | grep -q "ok installed" || _win_missing+=("$_p")
done
if ((${#_win_missing[@]})); then
  _sudo=""
  [ "$(id -u)" -eq 0 ] || _sudo=sudo
  $_sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $_sudo apt-get install -y -qq "${_win_missing[@]}"
fi

# 2. Debian's toolchain, not rustup's (rustup has no Windows std here).
export CARGO=/usr/bin/cargo RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="$RESHARD_CACHE/windows-target"

# The cached target folder serves every checkout on this machine. Cargo
# takes a unit as fresh when its sources are older than the unit, wherever
# it was built, so a checkout older than another checkout's build would run
# that build's test binaries, with the other checkout's path compiled in
# (env!("CARGO_MANIFEST_DIR"): its fixtures, "no such file"). reshard's own
# units (not the dependencies or std) are rebuilt when the checkout changes.
_win_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
_win_stamp="$CARGO_TARGET_DIR/.reshard-checkout"
if [ "$(cat "$_win_stamp" 2>/dev/null)" != "$_win_root" ]; then
  "$CARGO" clean -q -p reshard --target "$WINDOWS_TARGET" \
    --manifest-path "$_win_root/Cargo.toml" 2>/dev/null || true
  mkdir -p "$CARGO_TARGET_DIR"
  echo "$_win_root" >"$_win_stamp"
fi

# 3. A private Wine prefix, no display, no Wine chatter on stderr.
export WINEPREFIX="$RESHARD_CACHE/wine-prefix" WINEARCH=win64 WINEDEBUG=-all
export WINEDLLOVERRIDES="mscoree,mshtml=" # no Mono/Gecko install prompts
unset DISPLAY WAYLAND_DISPLAY
if [ ! -f "$WINEPREFIX/drive_c/windows/system32/kernel32.dll" ]; then
  wineboot -i >/dev/null 2>&1
  wineserver -w
fi

# 4. The bcryptprimitives.dll stand-in (Wine 8 lacks it; Rust's std needs
#    its ProcessPrng). A test-harness part: it lives only in this prefix and
#    is never shipped.
_win_dll="$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll"
_win_src="$(dirname "${BASH_SOURCE[0]}")/bcryptprimitives"
if [ ! -f "$_win_dll" ] || [ "$_win_src.c" -nt "$_win_dll" ] || [ "$_win_src.def" -nt "$_win_dll" ]; then
  x86_64-w64-mingw32-gcc -O2 -shared -o "$_win_dll" "$_win_src.c" "$_win_src.def" -ladvapi32
fi

win_cargo() {
  local sub=$1
  shift
  "$CARGO" "$sub" --config "target.$WINDOWS_TARGET.runner = 'wine'" \
    -Zbuild-std=std,panic_abort --target "$WINDOWS_TARGET" "$@"
}
