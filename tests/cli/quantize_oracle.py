"""The reference quantizers of `convert --quantize`, run on the same source,
compared byte for byte with what reshard wrote (tests/cli/quantize_fp8.rs).

    python quantize_oracle.py SCHEME SRC OUT [--dtype f16|bf16|f32] [--block R C]

SRC and OUT are a safetensors file or a folder of them (small test models:
loaded whole). For every weight OUT stores as F8_E4M3 with a scale, the
scheme's reference computes codes and scale from SRC's tensor (cast to
--dtype first, as reshard casts before it quantizes):

    fp8-scaled, fp8-scaled-legacy  comfy-kitchen's TensorCoreFP8Layout.quantize
                                   (eager backend), ComfyUI's own quantizer
    fp8-channel                    compressed-tensors' calculate_qparams and
                                   quantize, as llm-compressor's FP8_DYNAMIC
    fp8-block                      transformers' Fp8Quantize._quantize_one

Every other tensor of SRC must be in OUT unchanged (or cast to --dtype).
Prints a JSON summary; exits non-zero, naming the tensor, on any difference.

    python quantize_oracle.py load OUT DENSE SRC

loads OUT (an fp8-channel or fp8-block model folder) in transformers as a
user would (compressed-tensors decompresses the first, FineGrainedFP8Config
with dequantize=True the second), and requires no missing, unexpected or
mismatched keys and every weight equal to DENSE's, reshard's own
dequantization of OUT (`convert OUT DENSE --dtype bf16`); prints the logits'
distance from DENSE's and from SRC's.

    python quantize_oracle.py comfy OUT DENSE

dequantizes every scaled weight of OUT (fp8-scaled or -legacy) with
comfy-kitchen's dequantize_per_tensor_fp8 into bf16, as ComfyUI does, and
requires it equal to DENSE's (reshard's dequantization).
"""
import json
import os
import sys
import types

import torch
from safetensors import safe_open
from safetensors.torch import load_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
SCALE_SUFFIX = {
    "fp8-scaled": "weight_scale",
    "fp8-scaled-legacy": "scale_weight",
    "fp8-channel": "weight_scale",
    "fp8-block": "weight_scale_inv",
}


def files(path):
    if os.path.isdir(path):
        return sorted(
            os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")
        )
    return [path]


def load(path):
    tensors, metadata = {}, {}
    for f in files(path):
        tensors.update(load_file(f))
        with safe_open(f, "pt") as h:
            metadata.update(h.metadata() or {})
    return tensors, metadata


def comfy_kitchen(w):
    import comfy_kitchen as ck
    from comfy_kitchen.tensor.fp8 import TensorCoreFP8Layout

    with ck.use_backend("eager"):
        codes, params = TensorCoreFP8Layout.quantize(w)
    return codes, params.scale


def compressed_tensors(w):
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(
        num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False
    )
    min_vals = torch.amin(w, dim=1, keepdim=True)
    max_vals = torch.amax(w, dim=1, keepdim=True)
    scale, zero_point = calculate_qparams(min_vals, max_vals, args)
    codes = quantize(w, scale, zero_point, args, dtype=torch.float8_e4m3fn)
    return codes, scale


def transformers_block(w, block):
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    config = types.SimpleNamespace(weight_block_size=list(block), scale_fmt=None)
    op = Fp8Quantize(types.SimpleNamespace(quantization_config=config))
    out = op._quantize_one("x.weight", w)
    if "x.weight_scale_inv" not in out:
        raise SystemExit(f"transformers does not quantize a {list(w.shape)} weight in {block} blocks")
    return out["x.weight"], out["x.weight_scale_inv"]


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).contiguous().view(torch.uint8), b.reshape(-1).contiguous().view(torch.uint8)
    )


def load_in_transformers(out, dense, src):
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    with open(os.path.join(out, "config.json")) as f:
        method = json.load(f)["quantization_config"]["quant_method"]
    kwargs = {}
    if method == "fp8":
        kwargs["quantization_config"] = FineGrainedFP8Config(dequantize=True)
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True, **kwargs)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(key):
            raise SystemExit(f"{key}: {sorted(info[key])[:5]}")
    reference = AutoModelForCausalLM.from_pretrained(dense)
    source = AutoModelForCausalLM.from_pretrained(src)
    ids = torch.arange(0, 16).reshape(1, 16)
    with torch.no_grad():
        logits = model(ids).logits.float()  # compressed-tensors decompresses here
        want = reference(ids).logits.float()
        src_logits = source(ids).logits.float()
    got, ref = model.state_dict(), reference.state_dict()
    for name, t in ref.items():
        if name not in got:
            raise SystemExit(f"{name}: not in the loaded model")
        if not torch.equal(got[name].to(t.dtype), t):
            raise SystemExit(f"{name}: the loader's weight differs from reshard's dequantization")
    scale = src_logits.abs().max().item()
    print(json.dumps({
        "method": method,
        "weights": len(ref),
        "logits_vs_dequantized": (logits - want).abs().max().item() / scale,
        "logits_vs_source": (logits - src_logits).abs().max().item() / scale,
    }))


def comfy_dequantize(out, dense):
    import comfy_kitchen as ck

    output, _ = load(out)
    reference, _ = load(dense)
    n = 0
    for name, codes in output.items():
        if codes.dtype != torch.float8_e4m3fn:
            continue
        stem = name[: -len(".weight")]
        scale = output.get(f"{stem}.weight_scale", output.get(f"{stem}.scale_weight"))
        if scale is None:
            continue
        with ck.use_backend("eager"):
            got = ck.dequantize_per_tensor_fp8(codes, scale, torch.bfloat16)
        if not same_bytes(got, reference[name]):
            raise SystemExit(f"{name}: comfy-kitchen's dequantization differs from reshard's")
        n += 1
    print(json.dumps({"dequantized": n}))


def main():
    argv = sys.argv[1:]
    if argv[0] == "load":
        return load_in_transformers(*argv[1:4])
    if argv[0] == "comfy":
        return comfy_dequantize(*argv[1:3])
    scheme, src, out = argv[:3]
    dtype = None
    block = (128, 128)
    rest = argv[3:]
    while rest:
        if rest[0] == "--dtype":
            dtype, rest = DTYPES[rest[1]], rest[2:]
        elif rest[0] == "--block":
            block, rest = (int(rest[1]), int(rest[2])), rest[3:]
        else:
            raise SystemExit(f"unknown argument {rest[0]}")
    source, _ = load(src)
    output, metadata = load(out)
    suffix = SCALE_SUFFIX[scheme]
    quantized, kept, zeros = [], 0, []
    derived = set()
    for name, got in output.items():
        stem = name[: -len(".weight")] if name.endswith(".weight") else None
        scale_name = f"{stem}.{suffix}" if stem else None
        if got.dtype != torch.float8_e4m3fn or scale_name not in output:
            continue
        w = source[name]
        if dtype is not None and w.is_floating_point():
            w = w.to(dtype)
        if not torch.any(w != 0):
            # An all-zero weight: comfy-kitchen's scale is 0 and its codes
            # NaN (0 * inf); reshard writes scale 1 and zero codes. The Rust
            # test checks those.
            zeros.append(name)
            derived.update([name, scale_name, f"{stem}.comfy_quant"])
            continue
        if scheme.startswith("fp8-scaled"):
            codes, scale = comfy_kitchen(w)
        elif scheme == "fp8-channel":
            codes, scale = compressed_tensors(w)
        else:
            codes, scale = transformers_block(w, block)
        if not same_bytes(codes, got):
            diff = (codes.view(torch.uint8) != got.view(torch.uint8)).nonzero()[:3].tolist()
            raise SystemExit(f"{name}: codes differ from the reference at {diff}")
        if not same_bytes(scale, output[scale_name]):
            raise SystemExit(
                f"{scale_name}: {output[scale_name].dtype} {list(output[scale_name].shape)} "
                f"{output[scale_name].flatten()[:4].tolist()}, the reference's "
                f"{scale.dtype} {list(scale.shape)} {scale.flatten()[:4].tolist()}"
            )
        quantized.append(name)
        derived.update([name, scale_name, f"{stem}.comfy_quant"])
    if scheme == "fp8-scaled":
        expected = b'{"format": "float8_e4m3fn"}'
        layers = json.loads(metadata["_quantization_metadata"])["layers"]
        for name in quantized + zeros:
            stem = name[: -len(".weight")]
            got = bytes(output[f"{stem}.comfy_quant"].tolist())
            if got != expected:
                raise SystemExit(f"{stem}.comfy_quant holds {got!r}")
            if layers.get(stem) != {"format": "float8_e4m3fn"}:
                raise SystemExit(f"_quantization_metadata lacks {stem}")
        if len(layers) != len(quantized) + len(zeros):
            raise SystemExit(f"_quantization_metadata lists {len(layers)} layers")
    markers = [n for n in output if n == "scaled_fp8" or n.endswith(".scaled_fp8")]
    if (scheme == "fp8-scaled-legacy") != (len(markers) == 1):
        raise SystemExit(f"scaled_fp8 markers: {markers}")
    derived.update(markers)
    for name, t in source.items():
        if name in derived:
            continue
        if name not in output:
            raise SystemExit(f"{name} is missing from the output")
        want = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        if not same_bytes(want, output[name]):
            raise SystemExit(f"{name}: kept tensor differs from the source")
        kept += 1
    extra = set(output) - set(source) - derived
    if extra:
        raise SystemExit(f"output tensors not accounted for: {sorted(extra)[:5]}")
    print(json.dumps({"quantized": len(quantized), "zeros": len(zeros), "kept": kept}))


if __name__ == "__main__":
    main()
