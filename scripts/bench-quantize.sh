#!/usr/bin/env bash
# The --quantize rows of docs/performance.md: a Llama-shaped checkpoint
# (bf16 by default, or f32) quantized by `reshard convert --quantize
# fp8-channel` and `fp8-scaled`, against `cp -r` + `sync` of the source and
# against the script users run today (scripts/quantize-baseline.py: load
# the whole model, scale and cast in torch, save_file), all in one run.
# Each row is the median of RUNS runs (default 5) of wall seconds, with
# user + system CPU seconds and the largest peak RSS beside it; page caches are dropped
# before each run when /proc/sys/vm/drop_caches is writable.
#
#   bash scripts/bench-quantize.sh [bf16|f32] [GB] [WORKDIR]
#
# Needs the release build (cargo build --release) and a Python with torch
# and safetensors (RESHARD_TEST_PYTHON, as scripts/test.sh sets it up).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/target.sh
bin=$(cargo_target_dir)/release/reshard
dtype=${1:-bf16}
gb=${2:-2.2}
work=${3:-$(mktemp -d)}
runs=${RUNS:-5}
python=${RESHARD_TEST_PYTHON:-python3}
src=$work/src-$dtype-$gb
mkdir -p "$src"

[ -f "$src/config.json" ] || "$python" - "$src" "$dtype" "$gb" <<'PY'
import json, os, sys
import torch
from safetensors.torch import save_file
src, dtype, gb = sys.argv[1], getattr(torch, {"bf16": "bfloat16", "f32": "float32"}[sys.argv[2]]), float(sys.argv[3])
hidden, inter = 2048, 5632
per_layer = (4 * hidden * hidden + 3 * hidden * inter) * torch.finfo(dtype).bits // 8
layers = max(1, int(gb * 1e9 // per_layer))
torch.manual_seed(0)
names = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, hidden),
         "self_attn.v_proj": (hidden, hidden), "self_attn.o_proj": (hidden, hidden),
         "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
shard, index = {}, {}
def flush(n):
    name = f"model-{n:05d}.safetensors"
    save_file(shard, os.path.join(src, name), metadata={"format": "pt"})
    index.update({k: name for k in shard})
    shard.clear()
for i in range(layers):
    for k, shape in names.items():
        shard[f"model.layers.{i}.{k}.weight"] = (torch.randn(shape) * 0.02).to(dtype)
    shard[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(hidden, dtype=dtype)
    if (i + 1) % 4 == 0:
        flush(i // 4 + 1)
if shard:
    flush(layers // 4 + 1)
json.dump({"metadata": {}, "weight_map": index}, open(os.path.join(src, "model.safetensors.index.json"), "w"))
json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": str(dtype).split(".")[1]},
          open(os.path.join(src, "config.json"), "w"))
PY

source scripts/lib/bench.sh
bench_clean() { rm -rf "$work/out" "$work/copy" "$work/baseline.safetensors"; }
size=$(du -sb "$src" | cut -f1)
echo "source: $dtype, $size bytes, $runs runs each (median)"
copy=$(bench_row copy sh -c "cp -r '$src' '$work/copy' && sync")
channel=$(bench_row fp8-channel "$bin" convert "$src" "$work/out" --quantize fp8-channel --no-progress --window 128MiB)
scaled=$(bench_row fp8-scaled "$bin" convert "$src" "$work/out" --quantize fp8-scaled --no-progress --window 128MiB)
baseline=$(bench_row baseline sh -c "'$python' scripts/quantize-baseline.py '$src' '$work/baseline.safetensors' && sync")
read -r _ tp cp rp <<<"$copy"
read -r _ tb cb rb <<<"$baseline"
echo "| job | wall s | CPU s | vs cp + sync | vs baseline script | peak RSS MiB |"
echo "|---|---|---|---|---|---|"
for r in "$copy" "$channel" "$scaled" "$baseline"; do
  read -r label t c m <<<"$r"
  echo "| $label | $t | $c | $(awk "BEGIN{printf \"%.2f\", $t/$tp}") | $(awk "BEGIN{printf \"%.2f\", $t/$tb}") | $((m / 1024)) |"
done
if [ -z "${3:-}" ]; then rm -rf "$work"; fi
