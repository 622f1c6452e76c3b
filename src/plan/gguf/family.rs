//! The LLM families whose GGUF files reshard turns into transformers
//! folders, told apart by `general.architecture`.

use crate::format::gguf::Metadata;

use super::error::GgufHfError;

/// LLM families whose GGUF reshard turns into a transformers folder.
///
/// llama.cpp writes `MistralForCausalLM` checkpoints as `llama` (same
/// tensors, same permutation); [`Family::Mistral`] is for the few files
/// that say `mistral`, and is written as a `MistralForCausalLM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

impl Family {
    /// The family `general.architecture` names, `None` for any other (or
    /// a missing key).
    pub fn of(metadata: &Metadata) -> Option<Family> {
        Some(match metadata.get_str("general.architecture")? {
            "llama" => Family::Llama,
            "mistral" => Family::Mistral,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            _ => return None,
        })
    }

    /// [`Family::of`], or the error that names the architecture.
    pub fn require(metadata: &Metadata) -> Result<Family, GgufHfError> {
        Family::of(metadata).ok_or_else(|| match metadata.get_str("general.architecture") {
            Some(arch) => GgufHfError::UnknownArchitecture { arch: arch.into() },
            None => GgufHfError::MissingKey {
                key: "general.architecture".into(),
            },
        })
    }

    /// The transformers class (`architectures[0]` in config.json).
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// transformers' `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    /// The prefix of the family's GGUF keys (`llama.block_count`): the
    /// `general.architecture` value.
    pub fn key_prefix(self) -> &'static str {
        self.model_type()
    }

    /// Whether llama.cpp's converter permuted the rows of q and k for the
    /// rotary embedding (`LlamaModel.permute`); Qwen2 and Qwen3 are
    /// converted without it.
    pub fn permutes_qk(self) -> bool {
        matches!(self, Family::Llama | Family::Mistral)
    }
}
