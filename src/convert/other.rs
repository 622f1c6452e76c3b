//! The model's other files (config, tokenizer, README, ...): which are
//! copied into DST, and copying them (config.json's dtype rewritten when
//! casting). Weight files, indexes, pickles and hidden files are not copied.
//!
//! A file is copied only when its real path (every symlink followed) lies
//! inside the model's root ([`OutputScope::inside_root`]): a Hugging Face
//! snapshot's links into `../../blobs` are copied, a `notes.txt` that links
//! to `/proc/self/environ` or into someone else's folder is skipped with a
//! note. Only regular files are copied (a FIFO or a device is skipped with a
//! note), and a name that is not valid UTF-8 is skipped rather than copied
//! under a lossy name that another file could share.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ConvertError;
use crate::cast;
use crate::format::{Checkpoint, Dtype, FormatError};
use crate::write::manifest::MANIFEST;
use crate::write::scope::OutputScope;
use crate::write::{copy_atomic, write_atomic};

/// An other file left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedFile {
    /// The name as it is in the source folder (lossy UTF-8).
    pub name: String,
    pub reason: String,
}

/// One file to copy.
#[derive(Debug, Clone)]
pub struct OtherFile {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
}

/// What [`select`] decided.
#[derive(Debug, Clone, Default)]
pub struct OtherFiles {
    pub files: Vec<OtherFile>,
    pub skipped: Vec<SkippedFile>,
}

impl OtherFiles {
    /// Bytes the copies will take.
    pub fn bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| f.size)
            .fold(0, u64::saturating_add)
    }
}

/// Lists the other files of the source folder and decides each one.
pub fn select(ck: &Checkpoint, scope: &OutputScope) -> Result<OtherFiles, ConvertError> {
    let weight_files: Vec<&Path> = ck.files.iter().map(|f| f.path.as_path()).collect();
    let mut entries: Vec<_> = std::fs::read_dir(&ck.dir)
        .map_err(|e| FormatError::io(&ck.dir, e))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    let mut out = OtherFiles::default();
    for entry in entries {
        let path = entry.path();
        let os_name = entry.file_name();
        let lossy = os_name.to_string_lossy().into_owned();
        let skip = |reason: String| SkippedFile {
            name: lossy.clone(),
            reason,
        };
        let Some(name) = os_name.to_str() else {
            out.skipped.push(skip(
                "its name is not valid UTF-8 (it could not be copied under its own name)".into(),
            ));
            continue;
        };
        let not_copied = name.starts_with('.')
            || weight_files.contains(&path.as_path())
            || name.ends_with(".index.json")
            || name.ends_with(".safetensors")
            || [".bin", ".pt", ".pth", ".pkl", ".ckpt"]
                .iter()
                .any(|e| name.ends_with(e))
            || name == MANIFEST;
        if not_copied {
            continue;
        }
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                out.skipped.push(skip(format!("cannot read it: {e}")));
                continue;
            }
        };
        if meta.is_dir() {
            continue;
        }
        if !meta.is_file() {
            out.skipped
                .push(skip("not a regular file (a FIFO, socket or device)".into()));
            continue;
        }
        if !scope.inside_root(&path) {
            let real = crate::platform::canonicalize(&path)
                .map_or_else(|_| "?".to_string(), |p| p.display().to_string());
            out.skipped.push(skip(format!(
                "a symlink to {real:?}, outside the model's folder {:?}",
                scope.root().display().to_string()
            )));
            continue;
        }
        out.files.push(OtherFile {
            name: name.to_string(),
            path,
            size: meta.len(),
        });
    }
    Ok(out)
}

/// The selected `config.json` rewritten for a cast to `dtype`; `None` when
/// not casting or when there is no config. Read as a regular file of at
/// most [`cast::MAX_CONFIG`] bytes, so a bad one fails before any shard.
/// When casting, a config.json that [`select`] skipped (a FIFO, a link out
/// of the model) is an error, not a note: the output would otherwise claim
/// the source's dtype.
pub fn rewritten_config(
    ck: &Checkpoint,
    others: &OtherFiles,
    dtype: Option<Dtype>,
) -> Result<Option<String>, ConvertError> {
    let Some(to) = dtype else {
        return Ok(None);
    };
    if let Some(skipped) = others.skipped.iter().find(|f| f.name == "config.json") {
        return Err(ConvertError::Config {
            path: ck.dir.join("config.json"),
            reason: format!("cannot rewrite its dtype: {}", skipped.reason),
        });
    }
    let Some(f) = others.files.iter().find(|f| f.name == "config.json") else {
        return Ok(None);
    };
    let text = crate::format::read::read_regular_string(&f.path, cast::MAX_CONFIG)?;
    cast::rewrite_config_dtype(&text, to)
        .map(Some)
        .map_err(|e| ConvertError::Config {
            path: f.path.clone(),
            reason: e.to_string(),
        })
}

/// Copies `files` into `dst`, config.json as `config` when given (see
/// [`rewritten_config`]); returns the names written.
pub fn copy(
    files: &[OtherFile],
    dst: &Path,
    config: Option<&str>,
) -> Result<Vec<String>, ConvertError> {
    let mut copied = Vec::with_capacity(files.len());
    for f in files {
        match (f.name.as_str(), config) {
            ("config.json", Some(rewritten)) => write_atomic(dst, &f.name, rewritten.as_bytes())?,
            _ => copy_atomic(&f.path, dst, &f.name)?,
        }
        copied.push(f.name.clone());
    }
    Ok(copied)
}
