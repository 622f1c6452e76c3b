#!/usr/bin/env bash
# Builds the CUDA driver test double (fake_cuda.c; test-only, never shipped)
# into OUTDIR and prints OUTDIR:
#
#   bash tests/fake-cuda/build.sh OUTDIR [linux|windows|all]   (default all)
#
# linux:   OUTDIR/libcuda.so and OUTDIR/libcuda.so.1 (gcc); cudarc 0.19 tries
#          libcuda.so first, by name, so LD_LIBRARY_PATH=OUTDIR finds it.
# windows: OUTDIR/cuda.dll and OUTDIR/nvcuda.dll (x86_64-w64-mingw32-gcc);
#          cudarc tries cuda.dll before nvcuda.dll; a folder on PATH finds it.
# OUTDIR/lacking/ holds a build without one entry point (the test of a driver
# that loads but lacks one). Rebuilds only when the source is newer.
set -euo pipefail
out=${1:?usage: build.sh OUTDIR [linux|windows|all]}
which=${2:-all}
src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/fake_cuda.c"
mkdir -p "$out"
fresh() { [ -f "$1" ] && [ "$1" -nt "$src" ]; }
if [ "$which" != windows ] && ! fresh "$out/libcuda.so"; then
  gcc -std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden \
    -o "$out/libcuda.so" "$src"
  cp "$out/libcuda.so" "$out/libcuda.so.1"
fi
if [ "$which" != linux ] && ! fresh "$out/cuda.dll"; then
  x86_64-w64-mingw32-gcc -std=c11 -O2 -Wall -Wextra -Werror -shared \
    -static-libgcc -o "$out/cuda.dll" "$src"
  cp "$out/cuda.dll" "$out/nvcuda.dll"
fi
# OUTDIR/lacking: the same without cuDeviceGetName (see fake_cuda.c).
mkdir -p "$out/lacking"
if [ "$which" != windows ] && ! fresh "$out/lacking/libcuda.so"; then
  gcc -std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden \
    -DFAKE_CUDA_LACK_NAME -o "$out/lacking/libcuda.so" "$src"
fi
if [ "$which" != linux ] && ! fresh "$out/lacking/cuda.dll"; then
  x86_64-w64-mingw32-gcc -std=c11 -O2 -Wall -Wextra -Werror -shared \
    -static-libgcc -DFAKE_CUDA_LACK_NAME -o "$out/lacking/cuda.dll" "$src"
fi
echo "$out"
