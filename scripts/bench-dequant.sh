#!/usr/bin/env bash
# The FP8 -> bf16 row of docs/performance.md: a ~1 GB DeepSeek-style FP8
# checkpoint (F8_E4M3 weights with 128x128 F32 block scales, two shards)
# dequantized by `reshard convert --dtype bf16`, against `cp -r` + `sync` of
# the output (2 GB) in the same run. Page caches are dropped before each row
# when /proc/sys/vm/drop_caches is writable.
#
#   bash scripts/bench-dequant.sh [WORKDIR]     (needs the release build: cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/target.sh
bin=$(cargo_target_dir)/release/reshard
work=${1:-$(mktemp -d)}
src=$work/fp8-src
mkdir -p "$src"

[ -f "$src/config.json" ] || python3 - "$src" <<'PY'
import json, os, struct, sys
src = sys.argv[1]
rows, cols, block = 8192, 16384, 128
nan_free = bytes(b & 0xF7 for b in range(256))  # no S.1111.111 (NaN) codes
for shard in range(2):
    header, offset, names = {"__metadata__": {"format": "pt"}}, 0, []
    for i in range(shard * 4, shard * 4 + 4):
        name = f"model.layers.{i}.mlp.up_proj.weight"
        header[name] = {"dtype": "F8_E4M3", "shape": [rows, cols], "data_offsets": [offset, offset + rows * cols]}
        offset += rows * cols
        n = (rows // block) * (cols // block)
        header[name + "_scale_inv"] = {"dtype": "F32", "shape": [rows // block, cols // block], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
        names.append((name, n))
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(src, f"model-{shard + 1:05d}-of-00002.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, n in names:
            for _ in range(rows * cols // (16 << 20)):
                f.write(os.urandom(16 << 20).translate(nan_free))
            f.write(struct.pack("<f", 0.0123) * n)
index = {"metadata": {"total_size": 0}, "weight_map": {}}
for shard in range(2):
    for i in range(shard * 4, shard * 4 + 4):
        for suffix in ("", "_scale_inv"):
            index["weight_map"][f"model.layers.{i}.mlp.up_proj.weight{suffix}"] = f"model-{shard + 1:05d}-of-00002.safetensors"
json.dump(index, open(os.path.join(src, "model.safetensors.index.json"), "w"))
json.dump({"model_type": "llama", "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8", "weight_block_size": [block, block]}}, open(os.path.join(src, "config.json"), "w"))
PY

drop() { sync; if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi; }
row() { # label, command...
  local label=$1; shift
  drop
  /usr/bin/time -o "$work/time" -f "%e %M" "$@" > /dev/null 2>&1
  echo "$label $(tail -1 "$work/time")"
}
size=$(du -sb "$src" | cut -f1)
echo "source bytes: $size"
rm -rf "$work/out" "$work/copy"
conv=$(row convert "$bin" convert "$src" "$work/out" --dtype bf16 --no-progress --window 256MiB)
out_size=$(du -sb "$work/out" | cut -f1)
echo "output bytes: $out_size"
copy=$(row copy sh -c "cp -r '$work/out' '$work/copy' && sync")
read -r _ tc rc <<<"$conv"
read -r _ tp rp <<<"$copy"
echo "| ~1GB fp8 (E4M3, 128x128 F32 scales) | cp -r + sync of the 2 GB output (copy floor) | $tp | $(awk "BEGIN{printf \"%.2f\", $size/$tp/1e9}") | 1.00 | $((rp / 1024)) |"
echo "| ~1GB fp8 (E4M3, 128x128 F32 scales) | reshard convert --dtype bf16 | $tc | $(awk "BEGIN{printf \"%.2f\", $size/$tc/1e9}") | $(awk "BEGIN{printf \"%.2f\", $tc/$tp}") | $((rc / 1024)) |"
if [ -z "${1:-}" ]; then rm -rf "$work"; fi
