# sentence-transformers: `SentenceTransformer(path, device=...)`, which loads
# its Transformer module with transformers' `from_pretrained`.
torch = need("torch", "torch")
transformers = need("transformers", "transformers")
st = need("sentence_transformers", "sentence-transformers")


def prepare():
    transformers_class(transformers, PATH)
    return st.SentenceTransformer


def load(cls):
    device = DEVICE if DEVICE.startswith("cuda") else "cpu"
    return cls(PATH, device=device, local_files_only=True)


main(prepare, load)
