#!/usr/bin/env bash
# The GGUF -> bf16 row of docs/performance.md (issue 27's target): a
# synthetic 1.1B-parameter Q8_0 GGUF with TinyLlama-1.1B's shapes (22 layers,
# hidden 2048, intermediate 5632, 32 heads, 4 kv heads, vocab 32000;
# token_embd and output Q8_0 too, norms F32) dequantized by
# `reshard convert --dtype bf16 --keep-gguf-names`, against `cp -r` + `sync`
# of the output (2.2 GB) in the same run, interleaved. Page caches are
# dropped before each command when /proc/sys/vm/drop_caches is writable.
# The source is written once, with the standard library only, and kept in
# WORKDIR; the outputs are removed at the end.
#
#   bash scripts/bench-gguf.sh [WORKDIR]     (needs the release build: cargo build --release)
#
# BENCH_RUNS (default 5) sets the runs of each command; BENCH_BIN another
# reshard binary.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/target.sh
bin=${BENCH_BIN:-$(cargo_target_dir)/release/reshard}
runs=${BENCH_RUNS:-5}
work=${1:-$(mktemp -d)}
src=$work/tinyllama-q8_0.gguf
mkdir -p "$work"

[ -f "$src" ] || python3 - "$src" <<'PY'
import os, struct, sys
path = sys.argv[1]
hidden, inter, layers, heads, kv_heads, vocab = 2048, 5632, 22, 32, 4, 32000
kv = hidden // heads * kv_heads
Q8_0, F32 = 8, 0
# (name, shape in safetensors order, type)
tensors = [("token_embd.weight", (vocab, hidden), Q8_0)]
for i in range(layers):
    b = f"blk.{i}."
    tensors += [
        (b + "attn_norm.weight", (hidden,), F32),
        (b + "attn_q.weight", (hidden, hidden), Q8_0),
        (b + "attn_k.weight", (kv, hidden), Q8_0),
        (b + "attn_v.weight", (kv, hidden), Q8_0),
        (b + "attn_output.weight", (hidden, hidden), Q8_0),
        (b + "ffn_norm.weight", (hidden,), F32),
        (b + "ffn_gate.weight", (inter, hidden), Q8_0),
        (b + "ffn_up.weight", (inter, hidden), Q8_0),
        (b + "ffn_down.weight", (hidden, inter), Q8_0),
    ]
tensors += [("output_norm.weight", (hidden,), F32), ("output.weight", (vocab, hidden), Q8_0)]
ALIGN = 32

def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b

def nbytes(shape, ty):
    n = 1
    for d in shape:
        n *= d
    return n // 32 * 34 if ty == Q8_0 else n * 4

kvs = [("general.architecture", "llama"), ("general.name", "synthetic TinyLlama-1.1B Q8_0")]
head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
for k, v in kvs:
    head += string(k) + struct.pack("<I", 8) + string(v)  # 8: string
offset, offsets = 0, []
for name, shape, ty in tensors:
    offsets.append(offset)
    head += string(name) + struct.pack("<I", len(shape))
    head += b"".join(struct.pack("<Q", d) for d in reversed(shape))  # ggml order
    head += struct.pack("<IQ", ty, offset)
    offset += nbytes(shape, ty)
    offset += -offset % ALIGN
head += b"\0" * (-len(head) % ALIGN)

scale = struct.pack("<H", 0x2E66)  # f16 0.0998...
step = 1 << 20  # blocks written at a time (34 MiB)
tmp = path + ".part"
with open(tmp, "wb") as f:
    f.write(head)
    for (name, shape, ty), at in zip(tensors, offsets):
        assert f.tell() == len(head) + at, name
        size = nbytes(shape, ty)
        if ty == F32:
            f.write(struct.pack("<f", 1.0) * (size // 4))
        else:
            left = size // 34
            while left:
                n = min(step, left)
                codes = os.urandom(32 * n)
                out = bytearray(34 * n)
                out[0::34] = scale[:1] * n
                out[1::34] = scale[1:] * n
                for k in range(32):
                    out[k + 2::34] = codes[k::32]
                f.write(out)
                left -= n
        f.write(b"\0" * (-size % ALIGN))
os.rename(tmp, path)
PY

drop() { sync; if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi; }
run() { # label, command...: one timed run, "label wall user sys maxrss_kib"
  local label=$1; shift
  drop
  /usr/bin/time -o "$work/time" -f "%e %U %S %M" "$@" > /dev/null 2> "$work/stderr" || {
    cat "$work/stderr" >&2; exit 2; }
  echo "$label $(tail -1 "$work/time")" | tee -a "$work/runs"
}
convert() { # window
  rm -rf "$work/out"
  run "convert-$1" "$bin" convert "$src" "$work/out" --dtype bf16 --keep-gguf-names \
    --no-progress --window "$1"
}

size=$(stat -c %s "$src")
echo "source bytes: $size"
: > "$work/runs"
for i in $(seq "$runs"); do
  convert 256MiB
  rm -rf "$work/copy"
  run copy sh -c "cp -r '$work/out' '$work/copy' && sync"
  convert 128MiB
done
out_size=$(du -sb "$work/out" | cut -f1)
echo "output bytes: $out_size"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"

python3 - "$work/runs" "$size" <<'PY'
import statistics as st, sys
rows = {}
for line in open(sys.argv[1]):
    label, wall, user, sys_, rss = line.split()
    rows.setdefault(label, []).append((float(wall), float(user) + float(sys_), int(rss)))
size = int(sys.argv[2])
med = {k: (st.median(w for w, _, _ in v), st.median(c for _, c, _ in v), max(r for _, _, r in v) / 1024) for k, v in rows.items()}
cp_wall, cp_cpu, _ = med["copy"]
print("| job | wall s | CPU s (user + sys) | wall / cp | CPU / cp | GB/s (source) | peak RSS MiB | RSS limit MiB |")
print("|---|---|---|---|---|---|---|---|")
for label, title, limit in (
    ("copy", "cp -r + sync of the output (copy floor)", None),
    ("convert-256MiB", "reshard convert --dtype bf16 --window 256MiB", 256 + 64),
    ("convert-128MiB", "reshard convert --dtype bf16 --window 128MiB", 128 + 64),
):
    wall, cpu, rss = med[label]
    print(f"| {title} | {wall:.2f} | {cpu:.2f} | {wall / cp_wall:.2f} | {cpu / cp_cpu:.1f} | "
          f"{size / wall / 1e9:.2f} | {rss:.0f} | {limit or '-'} |")
print(f"medians of {len(rows['copy'])} runs each; peak RSS is the largest of the runs")
PY
rm -rf "$work/out" "$work/copy"
if [ -z "${1:-}" ]; then rm -rf "$work"; fi
