# safetensors: the transformers 4 / accelerate pattern. With a model class
# named in config.json (transformers installed): build the model empty, give
# it its storage (`to_empty`), then per shard `safetensors.torch.load_file`
# and `load_state_dict`, dropping each shard's dict before the next. Without
# one: per-shard `load_file` into one state dict that keeps every tensor.
torch = need("torch", "torch")
st = need("safetensors", "safetensors")
import safetensors.torch  # noqa: E402


def shard_files():
    index = os.path.join(PATH, "model.safetensors.index.json")
    if os.path.isfile(PATH):
        return [PATH]
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(PATH, n) for n in files]
    return sorted(
        os.path.join(PATH, n) for n in os.listdir(PATH) if n.endswith(".safetensors")
    )


def prepare():
    files = shard_files()
    model = None
    folder = PATH if os.path.isdir(PATH) else os.path.dirname(PATH)
    if config_json(folder).get("architectures"):
        transformers = need("transformers", "transformers")
        config = transformers.AutoConfig.from_pretrained(folder)
        cls = transformers_class(transformers, folder)
        with torch.device("meta"):
            model = cls._from_config(config) if hasattr(cls, "_from_config") else cls(config)
    return files, model


class _Dict:
    def __init__(self, d):
        self.d = d

    def parameters(self):
        return list(self.d.values())

    def buffers(self):
        return []


def load(state):
    files, model = state
    device = DEVICE if DEVICE.startswith("cuda") else "cpu"
    if model is None:
        merged = {}
        for f in files:
            merged.update(safetensors.torch.load_file(f, device=device))
        return _Dict(merged)
    model.to_empty(device=device)
    for f in files:
        sd = safetensors.torch.load_file(f, device=device)
        model.load_state_dict(sd, strict=False)
        del sd
    return model


main(prepare, load)
