# transformers: `from_pretrained` as a user calls it. `--device cuda` means
# device_map="cuda". NAME transformers-pread makes from_pretrained open every
# shard with safetensors' pread backend, exactly as transformers 5.24 does on
# win32 (`safe_open(file, framework="pt", device="cpu", backend="pread")` in
# modeling_utils); elsewhere 5.24 uses the mmap backend. NAME
# transformers-disable-mmap passes disable_mmap=True: each shard is read whole
# and parsed with `safetensors.torch.load(bytes)` (what 5.24 also does on an
# HF mount).
torch = need("torch", "torch")
transformers = need("transformers", "transformers")
need("safetensors", "safetensors")


def prepare():
    cls = transformers_class(transformers, PATH)
    if NAME == "transformers-pread":
        import transformers.modeling_utils as mu

        if not hasattr(mu, "safe_open"):
            raise RuntimeError("transformers %s has no pread backend (needs >= 5.17)" % transformers.__version__)
        original = mu.safe_open

        def pread_open(file, framework, device="cpu", backend="mmap", **kw):
            return original(file, framework=framework, device=device, backend="pread", **kw)

        mu.safe_open = pread_open
    return cls


def load(cls):
    kw = {"device_map": DEVICE} if DEVICE.startswith("cuda") else {}
    if NAME == "transformers-disable-mmap":
        kw["disable_mmap"] = True
    return cls.from_pretrained(PATH, **kw)


main(prepare, load)
