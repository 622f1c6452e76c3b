# diffusers: a pipeline folder (model_index.json) with
# `DiffusionPipeline.from_pretrained`, component by component, or one model
# folder with the class its config.json names (`_class_name`).
torch = need("torch", "torch")
diffusers = need("diffusers", "diffusers")
need("safetensors", "safetensors")


def prepare():
    if os.path.exists(os.path.join(PATH, "model_index.json")):
        return diffusers.DiffusionPipeline
    name = config_json(PATH).get("_class_name")
    cls = getattr(diffusers, name, None) if name else None
    if cls is None:
        raise RuntimeError("%s has no model_index.json and its config.json names no diffusers class" % PATH)
    return cls


def load(cls):
    obj = cls.from_pretrained(PATH)
    if DEVICE.startswith("cuda"):
        obj = obj.to(DEVICE)
    if hasattr(obj, "components"):
        return [c for c in obj.components.values() if hasattr(c, "parameters")]
    return obj


main(prepare, load)
