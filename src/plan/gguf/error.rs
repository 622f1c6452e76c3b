//! Why a GGUF cannot be given Hugging Face names, a config or a tokenizer.

/// Why a GGUF cannot be turned into a transformers folder. Every message
/// names the metadata key or the tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum GgufHfError {
    #[error("GGUF architecture {arch:?} is not one reshard turns into a transformers model (it knows llama, mistral, qwen2, qwen3)")]
    UnknownArchitecture { arch: String },
    #[error("GGUF metadata has no {key:?}")]
    MissingKey { key: String },
    #[error("GGUF metadata {key:?} is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("GGUF metadata {key:?}: {why}")]
    BadValue { key: String, why: String },
    #[error("GGUF has no tensor {tensor:?}, which the config needs")]
    MissingTensor { tensor: String },
    #[error("tensor {tensor:?}: {rows} rows cannot be split into {heads} heads of an even size, so llama.cpp's rotary permutation cannot be undone")]
    HeadsDoNotDivide {
        tensor: String,
        rows: u64,
        heads: u64,
    },
    #[error("tensor {tensor:?} holds Llama 3 rope scaling factors; pass its values so the config can state them")]
    RopeFactorsNeeded { tensor: String },
    #[error("tensor {tensor:?}: {why}")]
    RopeFactors { tensor: String, why: String },
    #[error("GGUF tokenizer model {model:?} (tokenizer.ggml.model) has no Hugging Face tokenizer reshard can build; it builds \"gpt2\" (byte-level BPE)")]
    UnsupportedTokenizer { model: String },
    #[error("GGUF pre-tokenizer {pre:?} (tokenizer.ggml.pre) has no Hugging Face pre-tokenizer reshard knows")]
    UnknownPreTokenizer { pre: String },
    #[error("GGUF metadata {key:?}: entry {index} {why}")]
    BadEntry {
        key: String,
        index: usize,
        why: String,
    },
    #[error(
        "GGUF token {token:?} appears twice in tokenizer.ggml.tokens (ids {first} and {second})"
    )]
    DuplicateToken {
        token: String,
        first: usize,
        second: usize,
    },
    #[error("GGUF metadata {key:?}: token id {id} is not below the {len} tokens of tokenizer.ggml.tokens")]
    TokenOutOfRange { key: String, id: u64, len: usize },
    #[error("cannot write JSON: {0}")]
    Json(#[from] serde_json::Error),
}
