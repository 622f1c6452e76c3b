"""Tiny quantized checkpoints for tests/cli/quant.rs, and the checks of what
reshard made of them, against references computed here with torch (and
transformers' own MXFP4 dequantization, and ml_dtypes for the F8 codes).

    python quant.py build DIR    writes DIR/<case>/ for every case
    python quant.py check DIR    checks DIR/<case>-out/ against DIR/<case>/

Everything is seeded and offline. One process does every case so torch is
imported once per step.
"""
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.manual_seed(0)

BLOCK = 32
FP8_MAX = 448.0


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )


def dense_llama():
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    model = LlamaForCausalLM(llama_config()).to(torch.bfloat16)
    return {k: v.contiguous() for k, v in model.state_dict().items()}


def is_linear(name):
    return ".layers." in name and name.endswith("proj.weight")


def quantize_blocks(w, dtype):
    """Block-scaled E4M3 codes and the multiplier per 32x32 block (partial
    edge blocks included), stored as `dtype`."""
    m, n = w.shape
    rb, cb = math.ceil(m / BLOCK), math.ceil(n / BLOCK)
    pad = torch.zeros(rb * BLOCK, cb * BLOCK)
    pad[:m, :n] = w.float()
    amax = pad.reshape(rb, BLOCK, cb, BLOCK).abs().amax(dim=(1, 3)).clamp(min=1e-8)
    if dtype == "e8m0":
        exp = torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-127, 127)
        stored = (exp + 127).to(torch.uint8).view(torch.float8_e8m0fnu)
    else:
        stored = (amax / FP8_MAX).to(dtype)
    scale = expand(stored.float(), m, n)
    codes = (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, stored


def expand(scale, m, n):
    """A [ceil(m/b), ceil(n/b)] (or [m, 1], or [1]) scale as a [m, n] one."""
    if scale.numel() == 1:
        return scale.reshape(1, 1).expand(m, n)
    if scale.shape[-1] == 1:
        return scale.reshape(m, 1).expand(m, n)
    return scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:m, :n]


def save_sharded(folder, shards):
    """shards: list of dicts; writes model-0000i-of-0000n and the index."""
    os.makedirs(folder, exist_ok=True)
    weight_map = {}
    total = 0
    for i, sd in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sd, os.path.join(folder, name), metadata={"format": "pt"})
        for k, v in sd.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


def write_config(folder, config, quantization_config=None):
    d = config.to_dict()
    d["torch_dtype"] = "bfloat16"
    if quantization_config is not None:
        d["quantization_config"] = quantization_config
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(d, f, indent=2)


def build_fp8_block(root):
    """DeepSeek-style: weight_scale_inv per 32x32 block of 48x48, 24x48,
    80x48, 48x80 weights (partial edge blocks), scales in F32, BF16 and
    F8_E8M0, layer 0's scales in the other shard than their weights."""
    sd = dense_llama()
    kinds = [torch.float32, torch.bfloat16, "e8m0"]
    first, second = {}, {}
    linear = 0
    for name, w in sd.items():
        target = second if ".layers.1." in name else first
        if not is_linear(name):
            target[name] = w
            continue
        codes, scale = quantize_blocks(w, kinds[linear % 3])
        linear += 1
        target[name] = codes
        scale_name = name + "_scale_inv"
        (second if ".layers.0." in name else target)[scale_name] = scale.contiguous()
    folder = os.path.join(root, "fp8-block")
    save_sharded(folder, [first, second])
    write_config(
        folder,
        llama_config(),
        {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [BLOCK, BLOCK]},
    )


def build_compressed(root):
    """compressed-tensors float-quantized: per-channel weight_scale [M, 1] for
    attention, per-tensor [1] for the MLP, input_scale (dropped)."""
    sd = dense_llama()
    out = {}
    for name, w in sd.items():
        if not is_linear(name):
            out[name] = w
            continue
        if ".mlp." in name:
            scale = (w.float().abs().amax() / FP8_MAX).reshape(1)
        else:
            scale = (w.float().abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-8)
        codes = (w.float() / expand(scale, *w.shape)).to(torch.float8_e4m3fn)
        module = name[: -len(".weight")]
        out[name] = codes
        out[module + ".weight_scale"] = scale.to(torch.bfloat16 if ".mlp." in name else torch.float32)
        out[module + ".input_scale"] = torch.tensor([0.02])
    folder = os.path.join(root, "compressed")
    save_sharded(folder, [out])
    group = {"weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}, "targets": ["Linear"]}
    write_config(
        folder,
        llama_config(),
        {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": group}, "ignore": ["lm_head"]},
    )


def build_modelopt(root):
    """ModelOpt FP8: hf_quant_config.json, scalar weight_scale and input_scale."""
    sd = dense_llama()
    out = {}
    for name, w in sd.items():
        if not is_linear(name):
            out[name] = w
            continue
        scale = w.float().abs().amax() / FP8_MAX
        module = name[: -len(".weight")]
        out[name] = (w.float() / scale).to(torch.float8_e4m3fn)
        out[module + ".weight_scale"] = scale.reshape(())
        out[module + ".input_scale"] = torch.tensor(0.01)
    folder = os.path.join(root, "modelopt")
    save_sharded(folder, [out])
    write_config(folder, llama_config())
    with open(os.path.join(folder, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}}, f)


def gpt_oss_config():
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"],
    )


def build_mxfp4(root):
    """gpt-oss: *_blocks [E, R, G, 16] U8 and *_scales [E, R, G] U8; the
    dense model's other tensors in bf16. Plus mxfp4-all: every E2M1 code
    under every E8M0 exponent, in one [1, 256, 1, 16] tensor."""
    from transformers import GptOssForCausalLM

    torch.manual_seed(2)
    model = GptOssForCausalLM(gpt_oss_config()).to(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    out = {}
    for name, v in model.state_dict().items():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            e, h, r = v.shape  # dense [E, H, R]: blocks are [E, R, H/32, 16]
            out[name + "_blocks"] = torch.randint(0, 256, (e, r, h // 32, 16), generator=g, dtype=torch.uint8)
            out[name + "_scales"] = torch.randint(118, 130, (e, r, h // 32), generator=g, dtype=torch.uint8)
        else:
            out[name] = v.contiguous()
    folder = os.path.join(root, "mxfp4")
    save_sharded(folder, [out])
    write_config(folder, gpt_oss_config(), {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]})

    nibbles = torch.arange(16, dtype=torch.uint8)
    row = (nibbles[0::2] | (nibbles[1::2] << 4)).repeat(2)  # 16 bytes: codes 0..15 twice
    blocks = row.reshape(1, 1, 1, 16).repeat(1, 256, 1, 1).contiguous()
    scales = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(1, 256, 1)
    folder = os.path.join(root, "mxfp4-all")
    os.makedirs(folder)
    save_file({"all_blocks": blocks, "all_scales": scales}, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"quantization_config": {"quant_method": "mxfp4"}}, f)


def build_scaled(root):
    """ComfyUI scaled fp8, one file, no config: F8_E5M2 and F8_E4M3 weights
    with scale_weight, the scaled_fp8 marker, every code of both F8 dtypes."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
    sd = {
        "codes.e4m3.weight": codes.view(torch.float8_e4m3fn),
        "codes.e4m3.scale_weight": torch.tensor([1.0]),
        "codes.e5m2.weight": codes.clone().view(torch.float8_e5m2),
        "codes.e5m2.scale_weight": torch.tensor([1.0]),
        "scaled_fp8": torch.tensor([], dtype=torch.float8_e4m3fn),
    }
    torch.manual_seed(4)
    for i in range(2):
        w = torch.randn(40, 24)
        scale = w.abs().amax() / 57344.0 * 3.0
        sd[f"blocks.{i}.proj.weight"] = (w / scale).to(torch.float8_e5m2)
        sd[f"blocks.{i}.proj.scale_weight"] = scale.reshape(1)
        sd[f"blocks.{i}.proj.bias"] = torch.randn(40).to(torch.bfloat16)
    os.makedirs(os.path.join(root, "scaled"))
    save_file(sd, os.path.join(root, "scaled", "model.safetensors"), metadata={"format": "pt"})


def build(root):
    build_fp8_block(root)
    build_compressed(root)
    build_modelopt(root)
    build_mxfp4(root)
    build_scaled(root)
    print("built")


def load_folder(folder):
    sd = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(folder, f)))
    return sd


def same_bits(a, b):
    """Bit-identical, except that any NaN equals any NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan = torch.isnan(a.float())
    if not torch.equal(nan, torch.isnan(b.float())):
        return False
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a[~nan].view(width), b[~nan].view(width))


def fp8_reference(src, suffix, target):
    """Every quantized weight of `src` as (codes.float() * scale).to(target)."""
    ref = {}
    for name, v in src.items():
        if v.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or not name.endswith(".weight"):
            continue
        module = name[: -len(".weight")]
        scale = src.get(f"{module}.{suffix}", src.get(f"{name}_scale_inv"))
        m = v.shape[0] if v.dim() > 1 else 1
        n = v.shape[-1]
        full = expand(scale.float(), m, n).reshape(v.shape)
        ref[name] = (v.float() * full).to(target)
    return ref


def check_against(case, got, ref, dropped_suffixes):
    for name, want in ref.items():
        assert name in got, f"{case}: {name} missing from the output"
        assert same_bits(got[name], want), f"{case}: {name} differs from the torch reference"
    for name in got:
        assert not any(name.endswith(s) for s in dropped_suffixes), f"{case}: {name} was written"


def check_loads(case, folder, gpt_oss=False):
    from transformers import AutoModelForCausalLM

    config = json.load(open(os.path.join(folder, "config.json")))
    assert "quantization_config" not in config, f"{case}: quantization_config kept"
    assert config.get("torch_dtype", config.get("dtype")) == "bfloat16", f"{case}: dtype {config}"
    assert not os.path.exists(os.path.join(folder, "hf_quant_config.json")), f"{case}: hf_quant_config.json kept"
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, dtype=torch.bfloat16)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(key), f"{case}: {key}: {info[key]}"
    return model


def check(root):
    sources = {c: load_folder(os.path.join(root, c)) for c in ["fp8-block", "compressed", "modelopt", "mxfp4", "mxfp4-all", "scaled"]}

    got = load_folder(os.path.join(root, "fp8-block-out"))
    check_against("fp8-block", got, fp8_reference(sources["fp8-block"], "weight_scale_inv", torch.bfloat16), ["_scale_inv"])
    model = check_loads("fp8-block", os.path.join(root, "fp8-block-out"))
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.abs().max() < 10, "the loaded weights carry their scales"
    got = load_folder(os.path.join(root, "fp8-block-f16-out"))
    check_against("fp8-block f16", got, fp8_reference(sources["fp8-block"], "weight_scale_inv", torch.float16), ["_scale_inv"])
    print("ok fp8-block")

    for case in ["compressed", "modelopt"]:
        got = load_folder(os.path.join(root, f"{case}-out"))
        check_against(case, got, fp8_reference(sources[case], "weight_scale", torch.bfloat16), [".weight_scale", ".input_scale"])
        check_loads(case, os.path.join(root, f"{case}-out"))
        print(f"ok {case}")

    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    got = load_folder(os.path.join(root, "mxfp4-out"))
    src = sources["mxfp4"]
    for name in src:
        if name.endswith("_blocks"):
            stem = name[: -len("_blocks")]
            want = convert_moe_packed_tensors(src[name], src[stem + "_scales"], dtype=torch.bfloat16)
            assert same_bits(got[stem], want), f"mxfp4: {stem} differs from convert_moe_packed_tensors"
    check_loads("mxfp4", os.path.join(root, "mxfp4-out"), gpt_oss=True)
    src = sources["mxfp4-all"]
    got = load_folder(os.path.join(root, "mxfp4-all-out"))
    want = convert_moe_packed_tensors(src["all_blocks"], src["all_scales"], dtype=torch.bfloat16)
    assert same_bits(got["all"], want), "mxfp4: all codes x all exponents differ"
    print("ok mxfp4")

    src = sources["scaled"]
    got = load_folder(os.path.join(root, "scaled-out"))
    ref = fp8_reference(src, "scale_weight", torch.bfloat16)
    check_against("scaled", got, ref, [".scale_weight", "scaled_fp8"])
    got32 = load_folder(os.path.join(root, "scaled-f32-out"))
    import ml_dtypes

    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    for kind, np_dtype in [("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)]:
        want = torch.from_numpy(codes.view(np_dtype).astype(np.float32))
        assert same_bits(got32[f"codes.{kind}.weight"], want), f"{kind}: codes differ from ml_dtypes"
    print("ok scaled")


if __name__ == "__main__":
    {"build": build, "check": check}[sys.argv[1]](sys.argv[2])
