//! A SentencePiece `tokenizer.model` (Llama 2's vocabulary) to
//! `tokenizer.ggml.*` (model `llama`), as convert_hf_to_gguf's
//! `_set_vocab_sentencepiece` writes it: each piece with its score and
//! type, then the ids of added_tokens.json and tokenizer_config.json's
//! `added_tokens_decoder`, padded with `[PADn]` to config.json's
//! `vocab_size`.
//!
//! The model is a protobuf `ModelProto`; only its repeated `pieces`
//! (field 1: `piece` 1, `score` 2, `type` 3) are read, by a hand-written
//! reader that bounds every length by the bytes left and skips every
//! other field.

use serde_json::{Map, Value as Json};

use crate::format::gguf::value::Strings;

use super::error::ToGgufError;
use super::vocab::{looks_special, CONTROL, NORMAL, UNUSED, USER_DEFINED};

/// gguf-py's `TokenType.UNKNOWN` and `BYTE` (= SentencePiece's types).
const UNKNOWN: i32 = 2;
const BYTE: i32 = 6;

fn bad(why: String) -> ToGgufError {
    ToGgufError::UnsupportedTokenizer {
        what: "tokenizer.model".into(),
        why,
    }
}

/// One SentencePiece piece: text, score, SentencePiece type (1 normal,
/// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Piece {
    pub(super) text: String,
    pub(super) score: f32,
    pub(super) ty: u64,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn varint(&mut self) -> Result<u64, ToGgufError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .bytes
                .get(self.at)
                .ok_or_else(|| bad(format!("truncated varint at byte {}", self.at)))?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad(format!("varint longer than 10 bytes at {}", self.at)))
    }

    fn take(&mut self, n: u64) -> Result<&[u8], ToGgufError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.at.checked_add(n))
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| bad(format!("a field at byte {} runs past the end", self.at)))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// The next field: (number, wire type, its bytes for types 1, 2, 5 or
    /// the varint for type 0).
    fn field(&mut self) -> Result<(u64, u64, &[u8], u64), ToGgufError> {
        let key = self.varint()?;
        let (num, wire) = (key >> 3, key & 7);
        match wire {
            0 => Ok((num, wire, &[], self.varint()?)),
            1 => Ok((num, wire, self.take(8)?, 0)),
            2 => {
                let n = self.varint()?;
                Ok((num, wire, self.take(n)?, 0))
            }
            5 => Ok((num, wire, self.take(4)?, 0)),
            _ => Err(bad(format!(
                "wire type {wire} at byte {} is not read",
                self.at
            ))),
        }
    }

    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }
}

/// The pieces of a `ModelProto`.
pub(super) fn pieces(model: &[u8]) -> Result<Vec<Piece>, ToGgufError> {
    let mut r = Reader {
        bytes: model,
        at: 0,
    };
    let mut out = Vec::new();
    while !r.done() {
        let (num, wire, body, _) = r.field()?;
        if num != 1 || wire != 2 {
            continue;
        }
        let mut p = Reader { bytes: body, at: 0 };
        let mut piece = Piece {
            text: String::new(),
            score: 0.0,
            ty: 1,
        };
        while !p.done() {
            match p.field()? {
                (1, 2, s, _) => {
                    piece.text = String::from_utf8(s.to_vec())
                        .map_err(|_| bad(format!("piece {} is not UTF-8", out.len())))?;
                }
                (2, 5, f, _) => piece.score = f32::from_le_bytes([f[0], f[1], f[2], f[3]]),
                (3, 0, _, v) => piece.ty = v,
                _ => {}
            }
        }
        out.push(piece);
    }
    if out.is_empty() {
        return Err(bad("holds no pieces".into()));
    }
    Ok(out)
}

/// The vocabulary as GGUF holds it.
pub(super) struct SpmVocab {
    pub(super) tokens: Strings,
    pub(super) scores: Vec<f32>,
    pub(super) types: Vec<i32>,
}

/// `_create_vocab_sentencepiece`. `vocab_size` is config.json's (0 or
/// absent: the pieces'), `added_tokens` added_tokens.json's object.
pub(super) fn vocab(
    pieces: &[Piece],
    vocab_size: Option<u32>,
    added_tokens: Option<&Map<String, Json>>,
    tokenizer_config: Option<&Map<String, Json>>,
) -> Result<SpmVocab, ToGgufError> {
    let n = match vocab_size {
        Some(n) if n > 0 => n as usize,
        _ => pieces.len(),
    };
    if n > super::vocab::MAX_VOCAB as usize {
        return Err(bad(format!(
            "{n} ids, more than the {} of any real vocabulary",
            super::vocab::MAX_VOCAB
        )));
    }
    let mut tokens: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; n];
    let mut types = vec![UNUSED; n];
    for (i, p) in pieces.iter().enumerate().take(n) {
        tokens[i] = p.text.clone();
        scores[i] = p.score;
        // IsUnknown, IsControl, IsUnused, IsByte, else NORMAL (a
        // user-defined piece too).
        types[i] = match p.ty {
            2 => UNKNOWN,
            3 => CONTROL,
            5 => UNUSED,
            6 => BYTE,
            _ => NORMAL,
        };
    }
    let id_of = |v: &Json, file: &'static str, key: &str| -> Result<Option<usize>, ToGgufError> {
        let id = v.as_u64().ok_or_else(|| ToGgufError::BadValue {
            file,
            key: key.into(),
            why: format!("id {v} is not a non-negative integer"),
        })?;
        Ok(usize::try_from(id).ok().filter(|&i| i < n))
    };
    for (text, id) in added_tokens.into_iter().flatten() {
        if let Some(i) = id_of(id, "added_tokens.json", text)? {
            tokens[i] = text.clone();
            scores[i] = -1000.0;
            types[i] = USER_DEFINED;
        }
    }
    let decoder = tokenizer_config.and_then(|c| c.get("added_tokens_decoder"));
    if let Some(Json::Object(decoder)) = decoder {
        for (id, data) in decoder {
            let file = "tokenizer_config.json";
            let key = format!("added_tokens_decoder.{id}");
            let parsed: Json =
                id.trim()
                    .parse::<u64>()
                    .map(Json::from)
                    .map_err(|_| ToGgufError::BadValue {
                        file,
                        key: key.clone(),
                        why: "the id is not an integer".into(),
                    })?;
            let Some(i) = id_of(&parsed, file, &key)? else {
                continue;
            };
            let content = data.get("content").and_then(Json::as_str).ok_or_else(|| {
                ToGgufError::BadValue {
                    file,
                    key: key.clone(),
                    why: "has no content string".into(),
                }
            })?;
            let special = data
                .get("special")
                .is_some_and(|s| s.as_bool() == Some(true));
            if special || looks_special(content) {
                tokens[i] = content.to_string();
                types[i] = CONTROL;
            } else {
                tokens[i] = content.replace('\u{2581}', " ");
                types[i] = USER_DEFINED;
            }
            scores[i] = -1000.0;
        }
    }
    let mut strings = Strings::default();
    tokens.iter().for_each(|t| strings.push(t.as_bytes()));
    Ok(SpmVocab {
        tokens: strings,
        scores,
        types,
    })
}
