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
//! Supported: `LlamaForCausalLM`, `MistralForCausalLM` and
//! `MixtralForCausalLM` (`llama`), `Qwen2ForCausalLM` (`qwen2`),
//! `Qwen2MoeForCausalLM` (`qwen2moe`), MoE experts as per-expert tensors, with a byte-level BPE tokenizer.json (`vocab`) or
//! a SentencePiece tokenizer.model (`spm`). Refused, naming what is
//! missing: pre-tokenizers outside the table in `vocab`, tensors without a
//! name, config keys whose meaning reshard does not write.

mod error;
mod files;
mod general;
mod hparams;
mod kv;
mod rope;
mod special;
mod spm;
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
    /// Mostly Q4_K (llama-quantize upgrades a few early `attn_v` and
    /// `ffn_down` tensors to Q5_K, `output` to Q6_K): the closest name for
    /// reshard's uniform Q4_K, closer than Q4_K_M (15), whose upgrades
    /// reach half of those tensors.
    pub const MOSTLY_Q4_K_S: u32 = 14;
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

/// `set_vocab` of the three converter classes: `_set_vocab_sentencepiece`
/// where Llama or Qwen2 has a tokenizer.model, else `_set_vocab_gpt2`;
/// Llama's `add_space_prefix` and small-Granite rule.
fn tokenizer(hp: &Hparams, files: &TokenizerFiles, kv: &mut Kvs) -> Result<(), ToGgufError> {
    let object = |file: &'static str, text: &Option<String>| match text {
        None => Ok(None),
        Some(t) => match crate::format::config::parse_config(t) {
            Ok(Json::Object(m)) => Ok(Some(m)),
            Ok(_) => Ok(None),
            Err(e) => Err(ToGgufError::Json {
                file,
                why: e.to_string(),
            }),
        },
    };
    let tokenizer_config = object("tokenizer_config.json", &files.tokenizer_config_json)?;
    if hp.arch == Arch::Llama {
        if let Some(Json::Bool(b)) = tokenizer_config
            .as_ref()
            .and_then(|c| c.get("add_prefix_space"))
        {
            kv.bool("tokenizer.ggml.add_space_prefix", *b);
        }
    }
    let tok = files
        .tokenizer_json
        .as_deref()
        .map(vocab::parse)
        .transpose()?;
    let parts = tok
        .as_ref()
        .map(|t| (t.added_tokens.as_slice(), &t.post_processor));
    let config = |k: &str| hp.get(k).cloned();
    match (&files.sentencepiece_model, hp.arch) {
        (Some(model), Arch::Llama | Arch::Qwen2) => {
            let pieces = spm::pieces(model)?;
            let size = hp.find_u32(&["vocab_size_per_layer_input", "vocab_size"])?;
            let added = object("added_tokens.json", &files.added_tokens_json)?;
            let v = spm::vocab(&pieces, size, added.as_ref(), tokenizer_config.as_ref())?;
            let n = v.types.len() as u32;
            kv.string("tokenizer.ggml.model", "llama");
            kv.string("tokenizer.ggml.pre", "default");
            kv.strings("tokenizer.ggml.tokens", v.tokens);
            kv.f32s("tokenizer.ggml.scores", v.scores);
            kv.i32s("tokenizer.ggml.token_type", v.types);
            let sp = special::load(parts, tokenizer_config, files, &config, Some(n))?;
            special::write(&sp, kv);
        }
        _ => {
            let tok = tok
                .as_ref()
                .ok_or_else(|| ToGgufError::UnsupportedTokenizer {
                    what: "tokenizer.json".into(),
                    why:
                        "is missing (and no tokenizer.model); reshard reads the vocabulary from it"
                            .into(),
                })?;
            let vocab_size = match hp.find_u32(&["vocab_size"])? {
                Some(n) => n,
                None => vocab::implied_size(tok)?,
            };
            let v = vocab::vocab(tok, vocab_size)?;
            kv.string("tokenizer.ggml.model", "gpt2");
            kv.string("tokenizer.ggml.pre", v.pre);
            kv.strings("tokenizer.ggml.tokens", v.tokens);
            kv.i32s("tokenizer.ggml.token_type", v.types);
            let sp = special::load(parts, tokenizer_config, files, &config, None)?;
            kv.strings("tokenizer.ggml.merges", v.merges);
            special::write(&sp, kv);
        }
    }
    if hp.arch == Arch::Llama && hp.find_u32(&["vocab_size"])? == Some(49152) {
        kv.bool("tokenizer.ggml.add_bos_token", false);
    }
    Ok(())
}
