//! A byte-level BPE tokenizer.json to `tokenizer.ggml.*`, as
//! convert_hf_to_gguf's `_set_vocab_gpt2` writes it: `get_vocab_base`'s
//! tokens and token types, the merges `SpecialVocab` reads, and
//! `tokenizer.ggml.pre` from [`PRE_TOKENIZERS`].
//!
//! The converter names the pre-tokenizer by hashing how the tokenizer
//! splits a fixed text and looking the hash up; a tokenizer it does not
//! know is refused. reshard cannot run the tokenizer, so it looks at what
//! decides the split instead (the normalizer, each pre-tokenizer step with
//! its regex, and `ignore_merges`) and names the entries whose llama.cpp
//! implementation (`llama-vocab.cpp`) splits the same way. Anything else
//! is refused, naming what it found.
//!
//! tokenizer.json is parsed into typed structs (the vocabulary as pairs,
//! the merges as strings), not into a JSON tree: a 9 MB vocabulary costs
//! a few times its size, not a tree of values.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value as Json;

use crate::format::gguf::value::Strings;

use super::error::ToGgufError;

const FILE: &str = "tokenizer.json";

/// gguf-py's `TokenType`.
pub(super) const NORMAL: i32 = 1;
pub(super) const CONTROL: i32 = 3;
pub(super) const USER_DEFINED: i32 = 4;
pub(super) const UNUSED: i32 = 5;

/// The most ids a vocabulary may have (config.json's `vocab_size`): the
/// largest real ones hold 262,144.
pub const MAX_VOCAB: u32 = 1 << 20;

/// tokenizer.json as reshard reads it. The normalizer, pre-tokenizer and
/// post-processor are JSON trees, each parsed with config.json's bound on
/// the number of values (`crate::format::config::parse_config`).
pub(super) struct TokenizerJson {
    pub(super) added_tokens: Vec<AddedToken>,
    normalizer: Json,
    pre_tokenizer: Json,
    pub(super) post_processor: Json,
    model: Model,
}

#[derive(Deserialize)]
struct RawTokenizerJson<'a> {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    #[serde(borrow, default)]
    normalizer: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pre_tokenizer: Option<&'a RawValue>,
    #[serde(borrow, default)]
    post_processor: Option<&'a RawValue>,
    model: Model,
}

/// One of the small trees, bounded; `null` or absent is `Json::Null`.
fn tree(raw: Option<&RawValue>, field: &str) -> Result<Json, ToGgufError> {
    match raw.map(|r| r.get().trim()) {
        None | Some("null") => Ok(Json::Null),
        Some(text) => crate::format::config::parse_config(text).map_err(|e| ToGgufError::Json {
            file: FILE,
            why: format!("{field}: {e}"),
        }),
    }
}

#[derive(Deserialize)]
pub(super) struct AddedToken {
    pub(super) id: u64,
    pub(super) content: String,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct Model {
    #[serde(rename = "type", default)]
    ty: Option<String>,
    #[serde(default)]
    vocab: HashMap<String, u64>,
    #[serde(default)]
    merges: Vec<Merge>,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(default)]
    byte_fallback: bool,
}

/// A merge as tokenizers writes it: `"a b"` (before 0.20) or `["a", "b"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Merge {
    Joined(String),
    Pair([String; 2]),
}

pub(super) fn parse(text: &str) -> Result<TokenizerJson, ToGgufError> {
    let raw: RawTokenizerJson = serde_json::from_str(text).map_err(|e| ToGgufError::Json {
        file: FILE,
        why: e.to_string(),
    })?;
    Ok(TokenizerJson {
        normalizer: tree(raw.normalizer, "normalizer")?,
        pre_tokenizer: tree(raw.pre_tokenizer, "pre_tokenizer")?,
        post_processor: tree(raw.post_processor, "post_processor")?,
        added_tokens: raw.added_tokens,
        model: raw.model,
    })
}

fn unsupported(what: &str, why: impl Into<String>) -> ToGgufError {
    ToGgufError::UnsupportedTokenizer {
        what: what.into(),
        why: why.into(),
    }
}

/// The vocabulary as GGUF holds it.
pub(super) struct Vocab {
    pub(super) pre: &'static str,
    pub(super) tokens: Strings,
    pub(super) types: Vec<i32>,
    pub(super) merges: Strings,
}

/// `get_vocab_base` and the merges, for a vocabulary of `vocab_size` ids
/// (config.json's, which may exceed the tokenizer's: the ids without a
/// token become `[PADn]`, UNUSED).
pub(super) fn vocab(tok: &TokenizerJson, vocab_size: u32) -> Result<Vocab, ToGgufError> {
    if tok.model.ty.as_deref() != Some("BPE") || tok.model.byte_fallback {
        return Err(unsupported(
            "model",
            format!(
                "type {:?}{}; reshard writes byte-level BPE (GGUF tokenizer model \"gpt2\") only",
                tok.model.ty,
                if tok.model.byte_fallback {
                    " with byte_fallback"
                } else {
                    ""
                }
            ),
        ));
    }
    if vocab_size > MAX_VOCAB {
        return Err(unsupported(
            "vocab_size",
            format!("{vocab_size} ids, more than the {MAX_VOCAB} of any real vocabulary"),
        ));
    }
    let pre = pre_name(tok)?;
    let n = vocab_size as usize;
    // tokenizer.vocab holds the model's tokens and the added ones.
    let mut by_id: Vec<Option<(&str, Option<&AddedToken>)>> = vec![None; n];
    let added: HashMap<&str, &AddedToken> = tok
        .added_tokens
        .iter()
        .map(|a| (a.content.as_str(), a))
        .collect();
    let entries = tok.model.vocab.iter().map(|(t, &id)| (t.as_str(), id));
    let extra = tok.added_tokens.iter().map(|a| (a.content.as_str(), a.id));
    for (text, id) in entries.chain(extra) {
        let slot = usize::try_from(id).ok().and_then(|i| by_id.get_mut(i)).ok_or_else(|| {
            unsupported(
                "vocab",
                format!("token {text:?} has id {id}, not below config.json's vocab_size {vocab_size}"),
            )
        })?;
        if let Some((other, _)) = slot {
            if *other != text {
                return Err(unsupported(
                    "vocab",
                    format!("tokens {other:?} and {text:?} share id {id}"),
                ));
            }
        }
        *slot = Some((text, added.get(text).copied()));
    }
    let mut tokens = Strings::default();
    let mut types = Vec::with_capacity(n);
    for (i, slot) in by_id.iter().enumerate() {
        match slot {
            None => {
                tokens.push(format!("[PAD{i}]").as_bytes());
                types.push(UNUSED);
            }
            Some((text, None)) => {
                tokens.push(text.as_bytes());
                types.push(NORMAL);
            }
            Some((text, Some(a))) => {
                if a.special || looks_special(text) {
                    tokens.push(text.as_bytes());
                    types.push(CONTROL);
                } else {
                    // Pre-normalized user-defined spaces, as for Gemma.
                    tokens.push(text.replace('\u{2581}', " ").as_bytes());
                    types.push(USER_DEFINED);
                }
            }
        }
    }
    Ok(Vocab {
        pre,
        tokens,
        types,
        merges: merges(&tok.model.merges)?,
    })
}

/// `does_token_look_special`.
pub(super) fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// `SpecialVocab`'s merges: strings as they are; pairs joined by a space,
/// a space inside a part written as U+0120 (`chr(ord(' ') + 256)`).
fn merges(merges: &[Merge]) -> Result<Strings, ToGgufError> {
    let mut out = Strings::default();
    let pairs = matches!(merges.first(), Some(Merge::Pair(_)));
    for (i, m) in merges.iter().enumerate() {
        match (m, pairs) {
            (Merge::Joined(s), false) => out.push(s.as_bytes()),
            (Merge::Pair([a, b]), true) => {
                let esc = |s: &str| s.replace(' ', "\u{120}");
                out.push(format!("{} {}", esc(a), esc(b)).as_bytes());
            }
            _ => {
                return Err(unsupported(
                    "model.merges",
                    format!("entry {i} mixes the string and the pair forms"),
                ))
            }
        }
    }
    Ok(out)
}

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// One step of a pre-tokenizer, reduced to what decides the split.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// `Split` with a regex, `Isolated`, not inverted.
    SplitIsolated(String),
    /// `ByteLevel { add_prefix_space, use_regex }` (trim_offsets only
    /// moves offsets).
    ByteLevel { prefix: bool, regex: bool },
}

/// A tokenizer llama.cpp knows: its `tokenizer.ggml.pre`, the normalizer
/// (`None` or a type), the steps, and `ignore_merges`.
struct Entry {
    pre: &'static str,
    normalizer: Option<&'static str>,
    steps: &'static [(&'static str, bool, bool)],
    ignore_merges: bool,
}

/// The table. Steps are (regex, prefix, use_regex): a non-empty regex is a
/// Split step, an empty one a ByteLevel step. Each row is the tokenizer
/// convert_hf_to_gguf's hash names so (Llama 3's `llama-bpe`, Qwen2's
/// `qwen2`, GPT-2's `gpt-2`), with the llama.cpp pre-type that splits as
/// it does: LLAMA3 (its regex, ignore_merges), QWEN2 (its regex with
/// single digits; the NFC the tokenizer applies), GPT2 (ByteLevel's
/// own regex). Names that llama.cpp treats alike (`deepseek-r1-qwen` and
/// `qwen2`, `llama3` and `llama-bpe`) are written as the first.
const PRE_TOKENIZERS: &[Entry] = &[
    Entry {
        pre: "llama-bpe",
        normalizer: None,
        steps: &[(LLAMA3_REGEX, false, false), ("", false, false)],
        ignore_merges: true,
    },
    Entry {
        pre: "qwen2",
        normalizer: Some("NFC"),
        steps: &[(QWEN2_REGEX, false, false), ("", false, false)],
        ignore_merges: false,
    },
    Entry {
        pre: "gpt-2",
        normalizer: None,
        steps: &[("", false, true)],
        ignore_merges: false,
    },
];

fn steps_of(pre: &Json, out: &mut Vec<Step>) -> Option<()> {
    match pre.get("type")?.as_str()? {
        "Sequence" => {
            for p in pre.get("pretokenizers")?.as_array()? {
                steps_of(p, out)?;
            }
        }
        "Split" => {
            let regex = pre.get("pattern")?.get("Regex")?.as_str()?;
            let isolated = pre.get("behavior")?.as_str()? == "Isolated";
            let inverted = pre.get("invert").and_then(Json::as_bool).unwrap_or(false);
            if !isolated || inverted {
                return None;
            }
            out.push(Step::SplitIsolated(regex.to_string()));
        }
        "ByteLevel" => out.push(Step::ByteLevel {
            prefix: pre
                .get("add_prefix_space")
                .and_then(Json::as_bool)
                .unwrap_or(true),
            regex: pre.get("use_regex").and_then(Json::as_bool).unwrap_or(true),
        }),
        _ => return None,
    }
    Some(())
}

fn pre_name(tok: &TokenizerJson) -> Result<&'static str, ToGgufError> {
    let normalizer = match &tok.normalizer {
        Json::Null => Some(None),
        n => n.get("type").and_then(Json::as_str).map(Some),
    };
    let mut steps = Vec::new();
    let parsed = steps_of(&tok.pre_tokenizer, &mut steps);
    let found = PRE_TOKENIZERS.iter().find(|e| {
        let want: Vec<Step> = e
            .steps
            .iter()
            .map(|&(regex, prefix, use_regex)| match regex {
                "" => Step::ByteLevel {
                    prefix,
                    regex: use_regex,
                },
                r => Step::SplitIsolated(r.to_string()),
            })
            .collect();
        parsed.is_some()
            && normalizer == Some(e.normalizer)
            && steps == want
            && tok.model.ignore_merges == e.ignore_merges
    });
    match found {
        Some(e) => Ok(e.pre),
        None => Err(ToGgufError::UnknownPreTokenizer {
            normalizer: short(&tok.normalizer.to_string()),
            pre_tokenizer: match parsed {
                Some(()) => format!("{steps:?}"),
                None => short(&tok.pre_tokenizer.to_string()),
            },
            ignore_merges: tok.model.ignore_merges,
            known: "llama-bpe (Llama 3's Split regex + ByteLevel, ignore_merges), qwen2 (NFC, Qwen2's Split regex + ByteLevel), gpt-2 (ByteLevel with its regex)".into(),
        }),
    }
}

/// JSON text for a message: at most 200 characters of it.
fn short(raw: &str) -> String {
    match raw.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &raw[..at]),
        None => raw.to_string(),
    }
}

/// `len(tokenizer.vocab)`: the vocabulary size when config.json has none.
pub(super) fn implied_size(tok: &TokenizerJson) -> Result<u32, ToGgufError> {
    let mut texts: std::collections::HashSet<&str> =
        tok.model.vocab.keys().map(String::as_str).collect();
    texts.extend(tok.added_tokens.iter().map(|a| a.content.as_str()));
    u32::try_from(texts.len()).map_err(|_| unsupported("vocab", "too many tokens"))
}
