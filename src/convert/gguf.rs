//! The files beside the shards of a GGUF LLM's output: the `config.json`,
//! `generation_config.json` and tokenizer files transformers needs to load
//! the folder, made from the GGUF header by [`crate::plan::gguf`]. A
//! tokenizer the header cannot give (a SentencePiece vocabulary, an
//! unknown pre-tokenizer) is left out with a note, not an error: the
//! weights are still what the user asked for.

use std::collections::BTreeMap;

use super::other::SkippedFile;
use super::ConvertError;
use crate::format::read::SourceReader;
use crate::format::{gguf, Checkpoint, Dtype, Format, FormatError};
use crate::plan::gguf::{config_json, generation_config_json, tokenizer_files, Family, ROPE_FREQS};
use crate::plan::{Plan, PlanError};

/// Largest `rope_freqs.weight` read: one f32 per rotary pair of a head
/// (64 for a head of 128), so 64 KiB is far more than any model has.
const MAX_ROPE_FREQS: u64 = 64 << 10;

/// Files to write (name, text), and the ones left out with why.
#[derive(Debug, Default)]
pub struct Generated {
    pub files: Vec<(String, String)>,
    pub skipped: Vec<SkippedFile>,
}

/// What a GGUF LLM's output needs beside its shards; nothing for any other
/// source or for a GGUF whose names were kept.
pub fn generated_files(ck: &Checkpoint, plan: &Plan) -> Result<Generated, ConvertError> {
    let mut out = Generated::default();
    if ck.format != Format::Gguf || !plan.gguf.as_ref().is_some_and(|g| g.hf_names) {
        return Ok(out);
    }
    let model = gguf::open(&ck.files[0].path)?;
    let family = Family::require(&model.metadata).map_err(PlanError::from)?;
    let rope = rope_factors(ck)?;
    let dtype = plan.options.dtype.unwrap_or_else(|| dominant_dtype(plan));
    let config = config_json(
        family,
        &model.metadata,
        &model.tensors,
        dtype,
        rope.as_deref(),
    )
    .map_err(PlanError::from)?;
    out.files.push(("config.json".into(), config));
    if let Some(g) = generation_config_json(&model.metadata).map_err(PlanError::from)? {
        out.files.push(("generation_config.json".into(), g));
    }
    match tokenizer_files(&model.metadata) {
        Ok(files) => out.files.extend(files),
        Err(e) => out.skipped.push(SkippedFile {
            name: "tokenizer.json".into(),
            reason: format!("not written: {e}"),
        }),
    }
    Ok(out)
}

/// The values of `rope_freqs.weight`, if the file has it (F32 or F16).
fn rope_factors(ck: &Checkpoint) -> Result<Option<Vec<f32>>, ConvertError> {
    let Some(t) = ck.tensors.iter().find(|t| t.name == ROPE_FREQS) else {
        return Ok(None);
    };
    let path = || ck.file_of(t).path.clone();
    if t.len > MAX_ROPE_FREQS || !matches!(t.dtype, Dtype::F32 | Dtype::F16) {
        return Err(FormatError::BadData {
            path: path(),
            tensor: t.name.clone(),
            reason: format!(
                "{} bytes of {}; rope factors are at most {MAX_ROPE_FREQS} bytes of F32 or F16",
                t.len, t.dtype
            ),
        }
        .into());
    }
    let reader = SourceReader::open(ck)?;
    let mut bytes = vec![0u8; t.len as usize];
    reader.read_tensor_at(t, 0, &mut bytes)?;
    let values = match t.dtype {
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| crate::cast::gguf::f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    };
    Ok(Some(values))
}

/// The dtype most of the output's bytes are, for config.json when no
/// `--dtype` was given.
fn dominant_dtype(plan: &Plan) -> Dtype {
    let mut bytes: BTreeMap<Dtype, u64> = BTreeMap::new();
    for t in plan.tensors() {
        *bytes.entry(t.dtype).or_default() += t.len;
    }
    bytes
        .into_iter()
        .max_by_key(|&(_, b)| b)
        .map_or(Dtype::F32, |(d, _)| d)
}
