"""The script users run today to make a scaled-FP8 checkpoint, the baseline
of scripts/bench-quantize.sh: safetensors' load_file (the whole model in
RAM), a per-tensor absmax scale and an FP8 cast in torch for every Linear
weight of a block, save_file of the whole output.

    python quantize-baseline.py SRC_FOLDER OUT_FILE
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file

src, out = sys.argv[1], sys.argv[2]
state = {}
for name in sorted(os.listdir(src)):
    if name.endswith(".safetensors"):
        state.update(load_file(os.path.join(src, name)))
result = {}
for key, w in state.items():
    if w.ndim == 2 and key.endswith(".weight") and ".layers." in key:
        scale = (w.abs().amax() / 448.0).float()
        result[key] = (w * (1.0 / scale).to(w.dtype)).clamp(-448, 448).to(torch.float8_e4m3fn)
        result[key[: -len("weight")] + "weight_scale"] = scale
    else:
        result[key] = w
save_file(result, out)
