//! A Hugging Face LLM folder described as llama.cpp's converter
//! (`convert_hf_to_gguf.py`) would write it as GGUF: the metadata keys
//! with gguf-py's value types and order, and the GGUF tensors with their
//! sources, row permutations and F32 rules.
//!
//! This module owns, as one pure function ([`llm_gguf`]) of config.json,
//! the tokenizer files ([`TokenizerFiles`], read with a size cap) and the
//! source tensor names and shapes: which GGUF architecture a model is
//! ([`Arch`]), its `{arch}.*` hyperparameters (`hparams`), its tensor names
//! (`tensors`), the Llama 3 rope factors (`rope`), its vocabulary (`vocab`,
//! `special`) and its `general.*` keys (`general`). It reads no weights
//! and writes nothing: the GGUF writer streams the tensors this plan names,
//! permuting rows with `crate::cast::gguf::permuted_row`. The reverse
//! direction, GGUF to transformers, is `super::gguf`.
//!
//! Supported: `LlamaForCausalLM`/`MistralForCausalLM` (`llama`),
//! `Qwen2ForCausalLM` (`qwen2`), `Qwen2MoeForCausalLM` with per-expert
//! tensors (`qwen2moe`), with a byte-level BPE tokenizer.json. Refused,
//! naming what is missing: SentencePiece `tokenizer.model` vocabularies,
//! pre-tokenizers outside the table in `vocab`, tensors without a name.

mod error;
mod files;
mod general;
mod hparams;
mod kv;
mod rope;
mod special;
mod tensors;
#[cfg(test)]
mod tests;
mod vocab;

use serde_json::Value as Json;

use crate::format::gguf::value::Value;

pub use self::error::ToGgufError;
pub use self::files::{TokenizerFiles, MAX_TOKENIZER_JSON};
pub use self::hparams::Arch;
pub use self::tensors::{LlmSource, LlmTensor};
pub use self::vocab::MAX_VOCAB;

use self::hparams::Hparams;
use self::kv::Kvs;

/// `general.file_type` values (gguf-py's `LlamaFileType`) of the output
/// types reshard writes.
pub mod file_type {
    pub const ALL_F32: u32 = 0;
    pub const MOSTLY_F16: u32 = 1;
    pub const MOSTLY_Q4_0: u32 = 2;
    pub const MOSTLY_Q8_0: u32 = 7;
    pub const MOSTLY_Q4_K_M: u32 = 15;
    pub const MOSTLY_Q6_K: u32 = 18;
    pub const MOSTLY_BF16: u32 = 32;
}

/// What [`llm_gguf`] reads: already-read text and the source's tensors.
#[derive(Debug, Clone, Copy)]
pub struct LlmInput<'a> {
    pub config_json: &'a str,
    pub tokenizer: &'a TokenizerFiles,
    /// Every source tensor (name, safetensors shape) in the order
    /// convert_hf_to_gguf reads them: shards sorted by file name, each
    /// shard's names sorted. The GGUF keeps that order.
    pub tensors: &'a [(String, Vec<u64>)],
    /// The model folder's name, for `general.name` when config.json has no
    /// Hub `_name_or_path`.
    pub folder_name: &'a str,
    /// `general.file_type` ([`file_type`]).
    pub file_type: u32,
}

/// A GGUF LLM file's content, less the tensor bytes.
#[derive(Debug, Clone)]
pub struct LlmGguf {
    pub architecture: Arch,
    /// Key/value pairs in the order the converter writes them: general.*,
    /// the `{arch}.*` hyperparameters, `general.quantization_version`,
    /// tokenizer.*.
    pub metadata: Vec<(String, Value)>,
    /// GGUF tensors in file order.
    pub tensors: Vec<LlmTensor>,
}

/// Describes the model `input` names as the converter would write it, or
/// refuses it, naming the file and key or tensor that stops it.
pub fn llm_gguf(input: &LlmInput) -> Result<LlmGguf, ToGgufError> {
    let hp = Hparams::parse(input.config_json)?;
    let tensors = tensors::plan(&hp, input.tensors)?;
    let mut kv = Kvs::default();
    kv.string("general.architecture", hp.arch.name());
    let name_or_path = hp.get("_name_or_path").and_then(Json::as_str);
    general::write(&mut kv, name_or_path, input.folder_name, &tensors);
    hparams::write(&hp, &mut kv, input.file_type)?;
    kv.u32("general.quantization_version", 2);
    tokenizer(&hp, input.tokenizer, &mut kv)?;
    Ok(LlmGguf {
        architecture: hp.arch,
        metadata: kv.0,
        tensors,
    })
}

/// `set_vocab` of the three converter classes: `_set_vocab_gpt2`, after a
/// SentencePiece attempt (Llama, Qwen2) reshard refuses, and Llama's
/// `add_space_prefix` and small-Granite rule.
fn tokenizer(hp: &Hparams, files: &TokenizerFiles, kv: &mut Kvs) -> Result<(), ToGgufError> {
    let refuse = |what: &str, why: &str| ToGgufError::UnsupportedTokenizer {
        what: what.into(),
        why: why.into(),
    };
    if files.sentencepiece_model && hp.arch != Arch::Qwen2Moe {
        return Err(refuse(
            "tokenizer.model",
            "SentencePiece vocabularies (GGUF tokenizer model \"llama\") are not written yet",
        ));
    }
    let text = files.tokenizer_json.as_deref().ok_or_else(|| {
        refuse(
            "tokenizer.json",
            "is missing; reshard reads the vocabulary from it",
        )
    })?;
    let tok = vocab::parse(text)?;
    let tokenizer_config = match &files.tokenizer_config_json {
        None => None,
        Some(t) => match crate::format::config::parse_config(t) {
            Ok(Json::Object(m)) => Some(m),
            Ok(_) => None,
            Err(e) => {
                return Err(ToGgufError::Json {
                    file: "tokenizer_config.json",
                    why: e.to_string(),
                })
            }
        },
    };
    if hp.arch == Arch::Llama {
        if let Some(Json::Bool(b)) = tokenizer_config
            .as_ref()
            .and_then(|c| c.get("add_prefix_space"))
        {
            kv.bool("tokenizer.ggml.add_space_prefix", *b);
        }
    }
    let vocab_size = match hp.find_u32(&["vocab_size"])? {
        Some(n) => n,
        None => vocab::implied_size(&tok)?,
    };
    let v = vocab::vocab(&tok, vocab_size)?;
    kv.string("tokenizer.ggml.model", "gpt2");
    kv.string("tokenizer.ggml.pre", v.pre);
    kv.strings("tokenizer.ggml.tokens", v.tokens);
    kv.i32s("tokenizer.ggml.token_type", v.types);
    let config = |k: &str| hp.get(k).cloned();
    let sp = special::load(
        &tok.added_tokens,
        &tok.post_processor,
        tokenizer_config,
        files,
        &config,
    )?;
    kv.strings("tokenizer.ggml.merges", v.merges);
    special::write(&sp, kv);
    if hp.arch == Arch::Llama && vocab_size == 49152 {
        kv.bool("tokenizer.ggml.add_bos_token", false);
    }
    Ok(())
}
