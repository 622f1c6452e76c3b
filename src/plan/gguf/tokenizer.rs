//! The tokenizer files a GGUF's `tokenizer.*` keys allow: tokenizer.json
//! for the `tokenizers` library and tokenizer_config.json for
//! transformers.
//!
//! A file that embeds `tokenizer.huggingface.json` gets it back as is.
//! Otherwise reshard builds byte-level BPE (`tokenizer.ggml.model =
//! "gpt2"`): the vocabulary is `tokenizer.ggml.tokens` by id, less the
//! control and user-defined tokens (types 3 and 4), which become added
//! tokens (special and not), and less the `[PADn]` fillers llama.cpp
//! writes for ids the original tokenizer did not have; the merges are
//! `tokenizer.ggml.merges`. The pre-tokenizer comes from
//! `tokenizer.ggml.pre` through [`PRE_TOKENIZERS`], with the regexes of
//! the original tokenizer.json files (llama.cpp keeps adapted copies),
//! and whether a BOS or EOS is added from `tokenizer.ggml.add_bos_token`
//! and `add_eos_token`, defaulting as llama.cpp does. SentencePiece
//! vocabularies (`"llama"`) are refused for now.

use serde_json::{json, Map, Value};

use crate::format::gguf::Metadata;

use super::error::GgufHfError;
use super::meta;

/// GGUF token types (`llama_token_type` / gguf-py's `TokenType`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNUSED: i64 = 5;

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a byte-level BPE vocabulary splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pre {
    /// Llama 3: its regex, `ignore_merges`, BOS added by default.
    Llama3,
    /// Qwen2: NFC, its regex (single digits).
    Qwen2,
    /// GPT-2: ByteLevel's own regex.
    Gpt2,
}

/// `tokenizer.ggml.pre` values reshard knows, with what they mean. The
/// names are llama.cpp's (`llama-vocab.cpp`). `default` (and a missing
/// key) is GPT-2's byte-level split, which is what transformers' own GGUF
/// loader gives every BPE vocabulary it does not special-case.
const PRE_TOKENIZERS: &[(&str, Pre)] = &[
    ("llama3", Pre::Llama3),
    ("llama-v3", Pre::Llama3),
    ("llama-bpe", Pre::Llama3),
    ("qwen2", Pre::Qwen2),
    ("deepseek-r1-qwen", Pre::Qwen2),
    ("gpt-2", Pre::Gpt2),
    ("default", Pre::Gpt2),
];

/// The most tokens a vocabulary may have: the largest real ones (Gemma 3's,
/// Llama 4's) hold 262,144 and 202,048.
pub const MAX_TOKENS: usize = 1 << 20;

/// The tokenizer files (name, text) the GGUF metadata allows: always
/// tokenizer.json and tokenizer_config.json, or an error naming the key
/// or value that has no Hugging Face equivalent.
pub fn tokenizer_files(metadata: &Metadata) -> Result<Vec<(String, String)>, GgufHfError> {
    let tokens_key = "tokenizer.ggml.tokens";
    let tokens = meta::strings(metadata, tokens_key)?.ok_or_else(|| meta::missing(tokens_key))?;
    if tokens.len() > MAX_TOKENS {
        // tokenizer.json costs a few KiB of memory a token while it is built.
        return Err(GgufHfError::BadValue {
            key: tokens_key.into(),
            why: format!(
                "{} tokens, more than the {MAX_TOKENS} of any real vocabulary",
                tokens.len()
            ),
        });
    }
    let mut texts = Vec::with_capacity(tokens.len());
    for i in 0..tokens.len() {
        texts.push(tokens.get_str(i).ok_or_else(|| GgufHfError::BadEntry {
            key: tokens_key.into(),
            index: i,
            why: "is not UTF-8".into(),
        })?);
    }
    let types = meta::ints(metadata, "tokenizer.ggml.token_type")?;
    if let Some(types) = &types {
        if types.len() != texts.len() {
            return Err(GgufHfError::BadValue {
                key: "tokenizer.ggml.token_type".into(),
                why: format!("{} types for {} tokens", types.len(), texts.len()),
            });
        }
    }
    let type_of = |i: usize| types.as_ref().map_or(1, |t| t[i]);
    let token_id = |key: &str| -> Result<Option<usize>, GgufHfError> {
        match meta::uint(metadata, key)? {
            None => Ok(None),
            Some(id) if (id as u128) < texts.len() as u128 => Ok(Some(id as usize)),
            Some(id) => Err(GgufHfError::TokenOutOfRange {
                key: key.into(),
                id,
                len: texts.len(),
            }),
        }
    };
    let bos = token_id("tokenizer.ggml.bos_token_id")?;
    let eos = token_id("tokenizer.ggml.eos_token_id")?;
    let pad = token_id("tokenizer.ggml.padding_token_id")?;
    let unk = token_id("tokenizer.ggml.unknown_token_id")?;

    let embedded = meta::string(metadata, "tokenizer.huggingface.json")?;
    let model = meta::string(metadata, "tokenizer.ggml.model")?;
    let (tokenizer_json, add_bos, add_eos) = match (embedded, model) {
        (Some(json), _) => (json.to_string(), None, None),
        (None, Some("gpt2")) => {
            let pre_name = meta::string(metadata, "tokenizer.ggml.pre")?.unwrap_or("default");
            let pre = PRE_TOKENIZERS
                .iter()
                .find(|(n, _)| *n == pre_name)
                .map(|(_, p)| *p)
                .ok_or_else(|| GgufHfError::UnknownPreTokenizer {
                    pre: pre_name.into(),
                })?;
            let add_bos = meta::boolean(metadata, "tokenizer.ggml.add_bos_token")?
                .unwrap_or(pre == Pre::Llama3);
            let add_eos = meta::boolean(metadata, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
            let bos_eos = (
                add_bos.then_some(bos).flatten(),
                add_eos.then_some(eos).flatten(),
            );
            let text = bpe_json(metadata, &texts, &type_of, pre, bos_eos)?;
            (text, Some(add_bos), Some(add_eos))
        }
        (None, Some(other)) => {
            return Err(GgufHfError::UnsupportedTokenizer {
                model: other.into(),
            })
        }
        (None, None) => return Err(meta::missing("tokenizer.ggml.model")),
    };

    let mut cfg = Map::new();
    if let Some(b) = add_bos {
        cfg.insert("add_bos_token".into(), json!(b));
    }
    if let Some(e) = add_eos {
        cfg.insert("add_eos_token".into(), json!(e));
    }
    cfg.insert("backend".into(), json!("tokenizers"));
    for (name, id) in [
        ("bos_token", bos),
        ("eos_token", eos),
        ("pad_token", pad),
        ("unk_token", unk),
    ] {
        cfg.insert(name.into(), json!(id.map(|i| texts[i])));
    }
    if let Some(t) = meta::string(metadata, "tokenizer.chat_template")? {
        cfg.insert("chat_template".into(), json!(t));
    }
    cfg.insert("clean_up_tokenization_spaces".into(), json!(false));
    if let Some(arch) = metadata.get_str("general.architecture") {
        if let Some(n) = meta::uint(metadata, &format!("{arch}.context_length"))? {
            cfg.insert("model_max_length".into(), json!(n));
        }
    }
    cfg.insert("tokenizer_class".into(), json!("TokenizersBackend"));
    let mut config_text = serde_json::to_string_pretty(&Value::Object(cfg))?;
    config_text.push('\n');
    Ok(vec![
        ("tokenizer.json".into(), tokenizer_json),
        ("tokenizer_config.json".into(), config_text),
    ])
}

/// tokenizer.json for a byte-level BPE vocabulary. `add` holds the BOS and
/// EOS ids the post-processor adds.
fn bpe_json(
    metadata: &Metadata,
    texts: &[&str],
    type_of: &dyn Fn(usize) -> i64,
    pre: Pre,
    add: (Option<usize>, Option<usize>),
) -> Result<String, GgufHfError> {
    let mut vocab = Map::with_capacity(texts.len());
    let mut added = Vec::new();
    for (i, &t) in texts.iter().enumerate() {
        match type_of(i) {
            CONTROL | USER_DEFINED => added.push(json!({
                "id": i,
                "content": t,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": type_of(i) == CONTROL,
            })),
            UNUSED if t == format!("[PAD{i}]") => {}
            _ => {
                if let Some(first) = vocab.insert(t.to_string(), json!(i)) {
                    return Err(GgufHfError::DuplicateToken {
                        token: t.into(),
                        first: first.as_u64().unwrap_or(0) as usize,
                        second: i,
                    });
                }
            }
        }
    }
    let merges_key = "tokenizer.ggml.merges";
    let merges = meta::strings(metadata, merges_key)?.ok_or_else(|| meta::missing(merges_key))?;
    let mut pairs = Vec::with_capacity(merges.len());
    for i in 0..merges.len() {
        let pair = merges
            .get_str(i)
            .and_then(|m| m.split_once(' '))
            .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '))
            .ok_or_else(|| GgufHfError::BadEntry {
                key: merges_key.into(),
                index: i,
                why: "is not two tokens joined by one space".into(),
            })?;
        pairs.push(json!([pair.0, pair.1]));
    }

    let byte_level = |prefix: bool, trim: bool, regex: bool| json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": trim, "use_regex": regex});
    let split = |regex: &str| json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false});
    let (normalizer, pre_tokenizer, decoder, ignore_merges) = match pre {
        Pre::Llama3 => (
            Value::Null,
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false, true, false)]}),
            byte_level(true, true, true),
            true,
        ),
        Pre::Qwen2 => (
            json!({"type": "NFC"}),
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false, false, false)]}),
            byte_level(false, false, false),
            false,
        ),
        Pre::Gpt2 => (
            Value::Null,
            byte_level(false, true, true),
            byte_level(true, true, true),
            false,
        ),
    };
    let post_processor = template(texts, add).unwrap_or_else(|| byte_level(false, false, false));

    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": ignore_merges,
            "vocab": vocab,
            "merges": pairs,
        },
    });
    let mut out = serde_json::to_string_pretty(&doc)?;
    out.push('\n');
    Ok(out)
}

/// A TemplateProcessing that adds `bos` before and `eos` after each
/// sequence, `None` when it adds neither.
fn template(texts: &[&str], (bos, eos): (Option<usize>, Option<usize>)) -> Option<Value> {
    if bos.is_none() && eos.is_none() {
        return None;
    }
    let special =
        |id: usize, type_id: u32| json!({"SpecialToken": {"id": texts[id], "type_id": type_id}});
    let seq = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = Map::new();
    for (target, names) in [
        (&mut single, &[("A", 0u32)][..]),
        (&mut pair, &[("A", 0u32), ("B", 1)][..]),
    ] {
        for &(name, type_id) in names {
            if let Some(b) = bos {
                target.push(special(b, type_id));
            }
            target.push(seq(name, type_id));
            if let Some(e) = eos {
                target.push(special(e, type_id));
            }
        }
    }
    for id in [bos, eos].into_iter().flatten() {
        specials.insert(
            texts[id].to_string(),
            json!({"id": texts[id], "ids": [id], "tokens": [texts[id]]}),
        );
    }
    Some(
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}),
    )
}
