"""Oracle for reshard's Q4_K and Q6_K quantizers: libggml's own.

    python kquant_oracle.py OUT_DIR

Writes OUT_DIR/rows.f32 (float32 rows of ROW values, little endian), then
OUT_DIR/q4_k.bin and OUT_DIR/q6_k.bin: those rows quantized by
ggml_quantize_chunk from the libggml-base that llama-cpp-python ships,
without an importance matrix, which makes ggml run quantize_row_q4_K_ref and
quantize_row_q6_K_ref (ggml/src/ggml-quants.c, quantize_q4_K/quantize_q6_K).
Prints one JSON line: the row count, the row length, the library path.

Rows: normal at several scales, Student t (heavy tails), normal with a few
outliers, sparse, all zero, constant, negative only, tiny, subnormal,
huge (1e30, where x*x overflows), values on exact code ties, f16 edges.
"""
import ctypes
import json
import pathlib
import sys

import llama_cpp
import numpy as np

ROW = 1024  # four super-blocks a row
TYPES = {"q4_k": (12, "q4_K", 144), "q6_k": (14, "q6_K", 210)}


def libggml():
    path = pathlib.Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"
    lib = ctypes.CDLL(str(path))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
    ]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_blck_size.restype = ctypes.c_int64
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    # The enum values are this file's assumption: check them in the library.
    for ty, name, size in TYPES.values():
        assert lib.ggml_type_name(ty).decode() == name, (ty, lib.ggml_type_name(ty))
        assert lib.ggml_type_size(ty) == size and lib.ggml_blck_size(ty) == 256
        assert not lib.ggml_quantize_requires_imatrix(ty)
    return lib, path


def rows():
    rng = np.random.default_rng(20261202)
    out = []
    for scale in (1.0, 0.02, 1e-3, 300.0, 3e4):
        out += [rng.standard_normal(ROW) * scale for _ in range(160)]
    out += [rng.standard_t(df, ROW) * 0.05 for df in (1, 2, 3) for _ in range(32)]
    for _ in range(48):
        r = rng.standard_normal(ROW) * 0.02
        idx = rng.integers(0, ROW, 4)
        r[idx] = rng.choice([-1, 1], 4) * rng.uniform(1, 100, 4)
        out.append(r)
    for _ in range(24):
        r = rng.standard_normal(ROW) * (rng.random(ROW) < 0.05)
        out.append(r)
    out.append(np.zeros(ROW))
    out.append(np.full(ROW, -0.0))
    for c in (3.0, -2.0, 1e-3, -700.0, 65504.0):
        out.append(np.full(ROW, c))
    out += [-np.abs(rng.standard_normal(ROW)) - off for off in (0.0, 1.0, 50.0)]
    out += [np.abs(rng.standard_normal(ROW)) + off for off in (0.0, 1.0, 50.0)]
    for v in (1e-30, 1e-16, 1e-14, 1e-10):
        out.append(rng.standard_normal(ROW) * v)
    sub = np.frombuffer(rng.integers(1, 0x00800000, ROW, dtype=np.uint32).tobytes(), np.float32)
    out.append(sub.astype(np.float64) * rng.choice([-1, 1], ROW))
    for v in (1e30, 1e20, 3e38):  # finite in f32: no inf among the inputs
        out.append(np.clip(rng.standard_normal(ROW) * v, -3.4e38, 3.4e38))
    # Exact ties for nearest_int: small integers and halves, repeated levels.
    out.append(rng.integers(-32, 32, ROW) / 2.0)
    out.append(rng.integers(0, 16, ROW).astype(np.float64))
    out.append(np.tile(np.arange(-8, 8, dtype=np.float64), ROW // 16))
    # Mixed magnitudes inside a block: sub-blocks from 1e-6 to 1e3.
    r = rng.standard_normal(ROW)
    r *= np.repeat(10.0 ** rng.integers(-6, 4, ROW // 32), 32)
    out.append(r)
    return np.stack(out).astype(np.float32)


def main():
    dst = pathlib.Path(sys.argv[1])
    lib, path = libggml()
    x = np.ascontiguousarray(rows())
    x.tofile(dst / "rows.f32")
    n, row = x.shape
    for key, (ty, _, size) in TYPES.items():
        buf = np.zeros(n * row // 256 * size, np.uint8)
        got = lib.ggml_quantize_chunk(ty, x.ctypes.data, buf.ctypes.data, 0, n, row, None)
        assert got == buf.size, (key, got, buf.size)
        buf.tofile(dst / f"{key}.bin")
    print(json.dumps({"rows": n, "row": row, "lib": str(path)}))


main()
