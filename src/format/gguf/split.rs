//! gguf-split sets: `NAME-00001-of-0000N.gguf` ... `NAME-0000N-of-0000N.gguf`,
//! each with `split.no` (0-based), `split.count` and (at least in the first)
//! `split.tensors.count`; the model's metadata is the first member's.
//!
//! A set opens from any member: the member's own `split.*` keys and its
//! name give the others. Every member's keys must agree with the set, each
//! tensor is in exactly one member, and the tensor total must match
//! `split.tensors.count`. A file without `split.count` (or with 1) is a
//! model on its own.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::GgufError;
use super::header::read_header;
use super::model::{refuse_duplicate_tensors, GgufFile, GgufTensor, Metadata};
use crate::format::{FormatError, SourceFile};

/// Most members a split set may have: llama.cpp and gguf-py write
/// `split.count` as a `uint16`.
pub const MAX_SPLITS: u64 = u16::MAX as u64;

/// A GGUF model: one file or a whole split set.
#[derive(Debug, Clone, Default)]
pub struct GgufModel {
    /// The files in split order (one for a single file). For a set opened
    /// with [`open_set`], missing members are left out here and listed in
    /// [`SplitSet::missing`].
    pub files: Vec<SourceFile>,
    /// What each file's header said about its layout, by file index.
    pub parts: Vec<Part>,
    /// The first member's key/value pairs (empty if it is missing).
    pub metadata: Metadata,
    /// Every tensor, in split order then info order; `file` indexes `files`.
    pub tensors: Vec<GgufTensor>,
    pub split: Option<SplitSet>,
}

/// The layout facts of one file.
#[derive(Debug, Clone, Serialize)]
pub struct Part {
    pub version: u32,
    pub alignment: u64,
    pub data_start: u64,
    /// `split.no` (0 for a single file).
    pub split_no: u64,
    pub tensors: usize,
}

/// How a split set is named and counted.
#[derive(Debug, Clone, Serialize)]
pub struct SplitSet {
    /// `NAME` of `NAME-00001-of-0000N.gguf`.
    pub prefix: String,
    pub count: u64,
    /// `split.tensors.count` of the first member (or of the member opened).
    pub tensors_count: u64,
    /// Members whose files are not there.
    pub missing: Vec<PathBuf>,
}

/// Opens a GGUF file, or the whole split set it belongs to; a missing
/// member is an error naming it.
pub fn open(path: &Path) -> Result<GgufModel, FormatError> {
    let model = open_set(path)?;
    if let Some(set) = &model.split {
        if let Some(missing) = set.missing.first() {
            let no = split_no_of_name(missing).unwrap_or(0);
            return Err(gguf_err(
                path,
                GgufError::SplitMissing {
                    path: missing.clone(),
                    no,
                    count: set.count,
                },
            ));
        }
    }
    Ok(model)
}

/// [`open`], but a missing member is listed in [`SplitSet::missing`]
/// instead of failing (for `inspect`, which reports it).
pub fn open_set(path: &Path) -> Result<GgufModel, FormatError> {
    let file = SourceFile::stat(path)?;
    let header = read_header(path)?;
    let Some(count) = int_key(path, &header.metadata, "split.count")? else {
        return Ok(single(file, header));
    };
    if count <= 1 {
        return Ok(single(file, header));
    }
    if count > MAX_SPLITS {
        return Err(mismatch(
            path,
            format!("split.count {count} is more than {MAX_SPLITS}, the most a uint16 split.count holds"),
        ));
    }
    let no = int_key(path, &header.metadata, "split.no")?.ok_or_else(|| {
        mismatch(
            path,
            "the file has \"split.count\" but no \"split.no\"".into(),
        )
    })?;
    let prefix = prefix_of(path, no, count)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut model = GgufModel::default();
    let mut missing = Vec::new();
    let mut tensors_count = None;
    let mut opened = Some((file, header));
    for i in 0..count {
        let member = dir.join(member_name(&prefix, i, count));
        let (file, header) = if i == no {
            opened
                .take()
                .ok_or_else(|| mismatch(path, "split.no repeats".into()))?
        } else if member.exists() {
            (SourceFile::stat(&member)?, read_header(&member)?)
        } else {
            missing.push(member);
            continue;
        };
        check_member(&member, &header.metadata, i, count)?;
        if let Some(n) = int_key(&member, &header.metadata, "split.tensors.count")? {
            match tensors_count {
                None => tensors_count = Some(n),
                Some(t) if t != n => {
                    return Err(mismatch(
                        &member,
                        format!("\"split.tensors.count\" is {n} here but {t} in an earlier member"),
                    ))
                }
                Some(_) => {}
            }
        }
        add_member(&mut model, file, header, i);
    }
    let tensors_count = tensors_count
        .ok_or_else(|| mismatch(path, "no member has \"split.tensors.count\"".into()))?;
    if missing.is_empty() && model.tensors.len() as u64 != tensors_count {
        return Err(mismatch(
            path,
            format!(
                "the members hold {} tensors but \"split.tensors.count\" is {tensors_count}",
                model.tensors.len()
            ),
        ));
    }
    refuse_duplicate_tensors(&model.tensors).map_err(|e| match e {
        GgufError::DuplicateTensor { tensor } => {
            let files: Vec<usize> = model
                .tensors
                .iter()
                .filter(|t| t.name == tensor)
                .map(|t| t.file)
                .collect();
            gguf_err(
                path,
                GgufError::SplitDuplicate {
                    tensor,
                    first: files
                        .first()
                        .map_or(0, |&f| model.parts[f].split_no as usize + 1),
                    second: files
                        .get(1)
                        .map_or(0, |&f| model.parts[f].split_no as usize + 1),
                },
            )
        }
        other => gguf_err(path, other),
    })?;
    model.split = Some(SplitSet {
        prefix,
        count,
        tensors_count,
        missing,
    });
    Ok(model)
}

fn single(file: SourceFile, header: GgufFile) -> GgufModel {
    let mut model = GgufModel::default();
    add_member(&mut model, file, header, 0);
    model
}

fn add_member(model: &mut GgufModel, file: SourceFile, header: GgufFile, split_no: u64) {
    let index = model.files.len();
    model.parts.push(Part {
        version: header.version,
        alignment: header.alignment,
        data_start: header.data_start,
        split_no,
        tensors: header.tensors.len(),
    });
    if split_no == 0 {
        model.metadata = header.metadata;
    }
    model
        .tensors
        .extend(header.tensors.into_iter().map(|mut t| {
            t.file = index;
            t
        }));
    model.files.push(file);
}

fn gguf_err(path: &Path, source: GgufError) -> FormatError {
    FormatError::Gguf {
        path: path.to_path_buf(),
        source,
    }
}

fn mismatch(path: &Path, reason: String) -> FormatError {
    gguf_err(path, GgufError::SplitMismatch { reason })
}

/// An integer key as u64; another type, or a negative value, is refused.
fn int_key(path: &Path, md: &Metadata, key: &str) -> Result<Option<u64>, FormatError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    match v.as_int().map(u64::try_from) {
        Some(Ok(n)) => Ok(Some(n)),
        _ => Err(gguf_err(
            path,
            GgufError::WrongKeyType {
                key: key.into(),
                expected: "a non-negative integer",
                found: format!("{} {v}", v.type_name()),
            },
        )),
    }
}

fn check_member(path: &Path, md: &Metadata, no: u64, count: u64) -> Result<(), FormatError> {
    let got_count = int_key(path, md, "split.count")?;
    let got_no = int_key(path, md, "split.no")?;
    if got_count != Some(count) || got_no != Some(no) {
        return Err(mismatch(
            path,
            format!(
                "its name makes it split {no} of {count} (0-based) but its keys say split.no {} of split.count {}",
                got_no.map_or("absent".into(), |v| v.to_string()),
                got_count.map_or("absent".into(), |v| v.to_string()),
            ),
        ));
    }
    Ok(())
}

/// `NAME-%05d-of-%05d.gguf`, as llama.cpp's `llama_split_path`.
pub fn member_name(prefix: &str, no: u64, count: u64) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", no + 1)
}

/// The `NAME` of a member's file name, checked against its keys.
fn prefix_of(path: &Path, no: u64, count: u64) -> Result<String, FormatError> {
    if no >= count {
        return Err(mismatch(
            path,
            format!("split.no {no} is not below split.count {count}"),
        ));
    }
    let suffix = format!("-{:05}-of-{count:05}.gguf", no + 1);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match name.strip_suffix(&suffix) {
        Some(prefix) if !prefix.is_empty() => Ok(prefix.to_string()),
        _ => Err(mismatch(
            path,
            format!(
                "split {} of {count} must be named NAME{suffix} to find the other members",
                no + 1
            ),
        )),
    }
}

/// The 1-based split number in a member's name.
fn split_no_of_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (head, _) = stem.rsplit_once("-of-")?;
    let (_, no) = head.rsplit_once('-')?;
    no.parse::<u64>().ok()
}
