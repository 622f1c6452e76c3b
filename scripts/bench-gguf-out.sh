#!/usr/bin/env bash
# The GGUF-out rows of docs/performance.md (issue 28's targets), one run:
# a Llama-shaped f32 checkpoint (hidden 2048, intermediate 5632, 32 heads,
# 4 kv heads, as many layers as make GB; the tiny Llama fixture's
# tokenizer) written as GGUF by
#   - reshard convert --quantize q8_0 (window 256 MiB, and 16 MiB),
#   - llama.cpp's convert_hf_to_gguf.py --outtype q8_0 (the one vendored in
#     llama-cpp-python 0.3.36's source package, run as
#     tests/fixtures/gguf/llm/make.py runs it),
#   - reshard convert --quantize q4_k, against llama.cpp's own quantizer
#     (llama-cpp-python's llama_model_quantize, F16 GGUF -> Q4_K_S, all
#     cores: the uniform Q4_K reshard writes is closest to Q4_K_S),
# beside cp -r + sync of the source. Each row is the median of RUNS runs
# (default 3) of wall seconds with user + system CPU seconds and the
# largest peak RSS; page caches are dropped before each run when
# /proc/sys/vm/drop_caches is writable.
#
#   bash scripts/bench-gguf-out.sh [GB] [WORKDIR]
#
# Needs the release build (cargo build --release), RESHARD_TEST_PYTHON (torch,
# transformers, numpy, safetensors) and RESHARD_GGML_PYTHON
# (llama-cpp-python), as scripts/test.sh sets them up; downloads
# llama-cpp-python's source package from PyPI once, into WORKDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/target.sh
source scripts/lib/bench.sh
bin=$(cargo_target_dir)/release/reshard
gb=${1:-4.4}
work=${2:-$(mktemp -d)}
runs=${RUNS:-3}
python=${RESHARD_TEST_PYTHON:?set RESHARD_TEST_PYTHON (scripts/test.sh makes the venv)}
ggml_python=${RESHARD_GGML_PYTHON:?set RESHARD_GGML_PYTHON (scripts/lib/ggml-venv.sh)}
src=$work/llama-f32-$gb
mkdir -p "$src"

[ -f "$src/config.json" ] || "$python" - "$src" "$gb" tests/fixtures/gguf/llm/llama <<'PY'
import json, os, shutil, sys
import torch
from safetensors.torch import save_file
src, gb, tiny = sys.argv[1], float(sys.argv[2]), sys.argv[3]
hidden, inter, heads, kv_heads = 2048, 5632, 32, 4
config = json.load(open(os.path.join(tiny, "config.json")))
vocab = config["vocab_size"]
kv = hidden // heads * kv_heads
per_layer = 4 * (2 * hidden * hidden + 2 * kv * hidden + 3 * hidden * inter)
layers = max(1, int((gb * 1e9 - 8 * vocab * hidden) // per_layer))
config.update(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
              num_key_value_heads=kv_heads, num_hidden_layers=layers, head_dim=hidden // heads)
json.dump(config, open(os.path.join(src, "config.json"), "w"), indent=2)
for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
    shutil.copy(os.path.join(tiny, f), src)
torch.manual_seed(0)
shard, index, n = {}, {}, 0
def flush():
    global n
    n += 1
    name = f"model-{n:05d}.safetensors"
    save_file(shard, os.path.join(src, name), metadata={"format": "pt"})
    index.update({k: name for k in shard})
    shard.clear()
w = lambda *shape: torch.randn(shape) * 0.02
shard["model.embed_tokens.weight"] = w(vocab, hidden)
for i in range(layers):
    p = f"model.layers.{i}."
    for k, shape in (("self_attn.q_proj", (hidden, hidden)), ("self_attn.k_proj", (kv, hidden)),
                     ("self_attn.v_proj", (kv, hidden)), ("self_attn.o_proj", (hidden, hidden)),
                     ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                     ("mlp.down_proj", (hidden, inter))):
        shard[p + k + ".weight"] = w(*shape)
    shard[p + "input_layernorm.weight"] = torch.ones(hidden)
    shard[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    if (i + 1) % 4 == 0:
        flush()
shard["model.norm.weight"] = torch.ones(hidden)
shard["lm_head.weight"] = w(vocab, hidden)
flush()
json.dump({"metadata": {}, "weight_map": index}, open(os.path.join(src, "model.safetensors.index.json"), "w"))
PY

lcpp=$(ls -d "$work"/lcpp/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -1 || true)
if [ -z "$lcpp" ]; then
  "$python" -m pip download --quiet llama-cpp-python==0.3.36 --no-deps --no-binary llama-cpp-python -d "$work/lcpp"
  tar xzf "$work"/lcpp/llama_cpp_python-*.tar.gz -C "$work/lcpp"
  lcpp=$(ls -d "$work"/lcpp/llama_cpp_python-*/vendor/llama.cpp | head -1)
fi
[ -f "$work/f16-$gb.gguf" ] || "$bin" convert "$src" "$work/f16-$gb.gguf" --dtype f16 -q

bench_clean() { rm -rf "$work/out.gguf" "$work/copy"; }
# Run by /usr/bin/time, so commands, not shell functions.
convert_hf=(env HF_HUB_OFFLINE=1 "$python" -c 'import sys; sys.path.insert(0, "tests/fixtures/gguf/llm"); import make
make.convert(sys.argv[1], "llama-bpe", sys.argv[2], "q8_0", sys.argv[3])' "$lcpp" "$src" "$work/out.gguf")
llama_quantize=("$ggml_python" -c 'import os, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S
p.nthread = os.cpu_count()
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))' "$work/f16-$gb.gguf" "$work/out.gguf")

size=$(du -sb --exclude='*.gguf' "$src" | cut -f1)
echo "source: f32, $size bytes in $(ls "$src"/*.safetensors | wc -l) shards, $runs runs each (median); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
copy=$(bench_row "cp -r + sync of the source" sh -c "cp -r '$src' '$work/copy' && sync")
q8=$(bench_row "reshard q8_0" "$bin" convert "$src" "$work/out.gguf" --quantize q8_0 --no-progress)
q8w=$(bench_row "reshard q8_0 --window 16MiB" "$bin" convert "$src" "$work/out.gguf" --quantize q8_0 --no-progress --window 16MiB)
hf=$(bench_row "convert_hf_to_gguf.py --outtype q8_0" "${convert_hf[@]}")
q4=$(bench_row "reshard q4_k" "$bin" convert "$src" "$work/out.gguf" --quantize q4_k --no-progress)
lq=$(bench_row "llama_model_quantize F16 -> Q4_K_S" "${llama_quantize[@]}")
IFS=' ' read -r -a c <<<"${copy##*source }"
ratio() { awk "BEGIN{printf \"%.2f\", $1/$2}"; }
echo "| job | wall s | CPU s | wall / cp | peak RSS MiB |"
echo "|---|---|---|---|---|"
for r in "$copy" "$q8" "$q8w" "$hf" "$q4" "$lq"; do
  read -r -a f <<<"$(echo "$r" | awk '{print $(NF-2), $(NF-1), $NF}')"
  label=$(echo "$r" | awk '{NF-=3; print}')
  echo "| $label | ${f[0]} | ${f[1]} | $(ratio "${f[0]}" "${c[0]}") | $((f[2] / 1024)) |"
done
wall() { echo "$1" | awk '{print $(NF-2)}'; }
rss() { echo "$1" | awk '{print $NF}'; }
echo "convert_hf_to_gguf / reshard q8_0 (wall): $(ratio "$(wall "$hf")" "$(wall "$q8")")"
echo "reshard q8_0 --window 16MiB peak RSS / convert_hf_to_gguf's: $(ratio "$(rss "$q8w")" "$(rss "$hf")")"
echo "reshard q4_k / llama_model_quantize (wall): $(ratio "$(wall "$q4")" "$(wall "$lq")")"
bench_clean
if [ -z "${2:-}" ]; then rm -rf "$work"; fi
