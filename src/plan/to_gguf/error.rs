//! Why a Hugging Face LLM folder cannot be described as a GGUF.

use crate::format::FormatError;

/// Why [`super::llm_gguf`] refuses a model. Every message names the file
/// (config.json, tokenizer.json, ...) and the key or tensor at fault.
#[derive(Debug, thiserror::Error)]
pub enum ToGgufError {
    #[error("cannot read the tokenizer files")]
    Read(#[from] FormatError),
    #[error("{file}: {why}")]
    Json { file: &'static str, why: String },
    #[error("config.json architectures {arch:?} is not an LLM reshard writes as GGUF (it writes {known})")]
    UnknownArchitecture { arch: String, known: &'static str },
    #[error("{file} has no {key:?}, which the GGUF needs")]
    MissingKey { file: &'static str, key: String },
    #[error("{file} {key:?}: {why}")]
    BadValue {
        file: &'static str,
        key: String,
        why: String,
    },
    #[error("tensor {tensor:?} has no GGUF name for architecture {arch} (llama.cpp's TensorNameMap has no entry reshard writes)")]
    UnknownTensor { tensor: String, arch: &'static str },
    #[error("tensor {tensor:?}: {why}")]
    BadTensor { tensor: String, why: String },
    #[error("tensor {tensor:?} appears twice")]
    DuplicateTensor { tensor: String },
    #[error("tensor {tensor:?}: {rows} rows do not split into {heads} heads of an even size, so the rotary rows cannot be permuted as llama.cpp expects")]
    HeadsDoNotDivide {
        tensor: String,
        rows: u64,
        heads: u64,
    },
    #[error("block {block}: expert tensors {missing} are missing (a GGUF stacks all {experts} experts of a block into one tensor)")]
    MissingExperts {
        block: u64,
        experts: u64,
        missing: String,
    },
    #[error("{what} (tokenizer.json): {why}")]
    UnsupportedTokenizer { what: String, why: String },
    #[error("tokenizer.json's pre-tokenizer is not in reshard's table of the tokenizers llama.cpp knows (normalizer {normalizer}, pre_tokenizer {pre_tokenizer}, ignore_merges {ignore_merges}); llama.cpp would split text differently than the model was trained to, so no GGUF is written. Known: {known}")]
    UnknownPreTokenizer {
        normalizer: String,
        pre_tokenizer: String,
        ignore_merges: bool,
        known: String,
    },
}
