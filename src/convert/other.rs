//! The model's other files (config, tokenizer, README, module and
//! component folders, ...): which are copied into DST, and copying them
//! (config.json's dtype rewritten when casting).
//!
//! [`Walk::Flat`] looks at the model folder's own files only; [`Walk::Tree`]
//! mirrors the whole folder, recursively, at the same relative paths,
//! leaving out the folders of other weight sets (converted by their own
//! jobs). In the folder being converted, the checkpoint's own weights and
//! index are not copied, and any other weight file there (a
//! `consolidated.safetensors` beside an indexed set, a `pytorch_model.bin`
//! beside `model.safetensors`, `training_args.bin`) is skipped with a note:
//! a loader pointed at DST must find one weight set there, not two. In a
//! folder that is not a weight set (`onnx/`, `1_Pooling/`), every file is
//! copied as it is, weight files included, each of those named in a note.
//! Hidden files and folders (`.gitattributes`, `.git/`) are skipped with a
//! note; reshard's own bookkeeping in a folder that is itself an output
//! (its lock file, partial manifest, temporary files) is skipped silently.
//!
//! A file is copied only when its real path (every symlink followed) lies
//! inside the model's root ([`OutputScope::inside_root`]): a Hugging Face
//! snapshot's links into `../../blobs` are copied, a `notes.txt` that links
//! to `/proc/self/environ` or into someone else's folder is skipped with a
//! note. Only regular files are copied (a FIFO or a device is skipped with a
//! note), a symlinked folder is never entered (skipped with a note), and a
//! name that is not valid UTF-8 is skipped rather than copied under a lossy
//! name that another file could share. The walk is bounded in depth and in
//! entries. A file whose path holds a name Windows reserves (`aux.json`,
//! `CON/x`, `notes.`: [`windows_reserved`]) is refused before anything is
//! written, on every platform, so the output stays portable.
//!
//! The manifest records each copy's source size and mtime ([`records`]), and
//! the size and digest of the copy as written ([`file_records`]); a rerun
//! into an up-to-date output recopies only the files whose source changed,
//! or whose record or copy is missing ([`refresh`]). No run writes over a
//! file DST holds unless it is reshard's copy as recorded or already holds
//! the bytes about to be written ([`crate::write::owned::may_replace`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use super::ConvertError;
use crate::cast;
use crate::format::{Checkpoint, Dtype, FormatError};
use crate::names::{is_weight_like, reserved_part, windows_reserved};
use crate::write::digest::{digest_file, DigestAlgo, ShardDigest};
use crate::write::manifest::{CopiedFile, FileRecord, Manifest, MANIFEST};
use crate::write::owned::{is_bookkeeping, may_replace};
use crate::write::scope::OutputScope;
use crate::write::{copy_atomic, write_atomic, write_atomic_as, Publish, WriteError};

/// Deepest folder the walk enters below the model folder.
pub const MAX_DEPTH: usize = 8;
/// Most entries the walk looks at; past it the rest is skipped with a note.
pub const MAX_ENTRIES: usize = crate::write::capped::MAX_FILES;

/// An other file left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedFile {
    /// The path under the model folder as it is in the source (lossy UTF-8,
    /// `/` separators).
    pub name: String,
    pub reason: String,
}

/// One file to copy.
#[derive(Debug, Clone)]
pub struct OtherFile {
    /// Its path under the model folder, `/` separators.
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    /// Nanoseconds since the Unix epoch (0 if unknown).
    pub mtime_ns: u64,
}

/// Which of the source's other files to look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Walk {
    /// The model folder's own files (`batch`, a lone weight set).
    #[default]
    Flat,
    /// The whole folder, recursively, except these folders (absolute paths
    /// as the layout names them: other weight sets).
    Tree { except: Vec<PathBuf> },
}

/// What [`select`] decided.
#[derive(Debug, Clone, Default)]
pub struct OtherFiles {
    pub files: Vec<OtherFile>,
    pub skipped: Vec<SkippedFile>,
    /// Weight files outside the converted folder, copied as they are.
    pub copied_as_is: Vec<String>,
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
pub fn select(
    ck: &Checkpoint,
    scope: &OutputScope,
    walk: &Walk,
) -> Result<OtherFiles, ConvertError> {
    let weight_files: Vec<&Path> = ck.files.iter().map(|f| f.path.as_path()).collect();
    let mut out = OtherFiles::default();
    // (folder, its path under the model folder, depth)
    let mut todo = vec![(ck.dir.clone(), String::new(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, rel_dir, depth)) = todo.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| FormatError::io(&dir, e))?
            .filter_map(Result::ok)
            .collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        let converted_here = rel_dir.is_empty();
        for entry in entries {
            let path = entry.path();
            let os_name = entry.file_name();
            let lossy = join(&rel_dir, &os_name.to_string_lossy());
            let mut skip = |reason: &str| {
                out.skipped.push(SkippedFile {
                    name: lossy.clone(),
                    reason: reason.to_string(),
                })
            };
            seen += 1;
            if seen > MAX_ENTRIES {
                skip("the folder holds more entries than reshard copies (100,000); this and the rest were not looked at");
                return Ok(out);
            }
            let Some(name) = os_name.to_str() else {
                skip("its name is not valid UTF-8 (it could not be copied under its own name)");
                continue;
            };
            if converted_here && (weight_files.contains(&path.as_path()) || name == MANIFEST) {
                continue;
            }
            if converted_here && name.ends_with(".index.json") && is_indexed_by(ck, &path) {
                continue;
            }
            if is_bookkeeping(name) {
                // An output converted again: its lock, partial manifest and
                // temporary files are reshard's, never the model's.
                continue;
            }
            if name.starts_with('.') {
                skip("a hidden file or folder");
                continue;
            }
            let link = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    skip(&format!("cannot read it: {e}"));
                    continue;
                }
            };
            if meta.is_dir() {
                match walk {
                    Walk::Flat => {}
                    Walk::Tree { .. } if link => {
                        skip("a symlinked folder; not followed");
                    }
                    Walk::Tree { except } if except.contains(&path) => {}
                    Walk::Tree { .. } if depth >= MAX_DEPTH => {
                        skip("deeper than 8 folders below the model; not copied");
                    }
                    Walk::Tree { .. } => todo.push((path, lossy.clone(), depth + 1)),
                }
                continue;
            }
            if converted_here && is_weight_like(name) {
                skip("a weight file that is not part of the converted checkpoint; not converted and not copied");
                continue;
            }
            if !meta.is_file() {
                skip("not a regular file (a FIFO, socket or device)");
                continue;
            }
            if !scope.inside_root(&path) {
                let real = crate::platform::canonicalize(&path)
                    .map_or_else(|_| "?".to_string(), |p| p.display().to_string());
                skip(&format!(
                    "a symlink to {real:?}, outside the model's folder {:?}",
                    scope.root().display().to_string()
                ));
                continue;
            }
            if let Some((part, reason)) = reserved_part(&lossy) {
                return Err(ConvertError::ReservedName {
                    path,
                    name: part.to_string(),
                    reason,
                });
            }
            if is_weight_like(name) {
                out.copied_as_is.push(lossy.clone());
            }
            out.files.push(OtherFile {
                name: lossy,
                path,
                size: meta.len(),
                mtime_ns: mtime_ns(&meta),
            });
        }
    }
    out.files.sort_by(|a, b| a.name.cmp(&b.name));
    out.skipped.sort_by(|a, b| a.name.cmp(&b.name));
    out.copied_as_is.sort();
    Ok(out)
}

fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Refuses, before anything is written, a name Windows reserves anywhere
/// in the tree under `root` that a job of a composite layout will mirror
/// (hidden entries and symlinked folders are not entered, as [`select`]
/// leaves them out; weight-like files are left to [`select`], which knows
/// whether they are converted or copied). Bounded as [`select`] is.
pub fn check_portable_names(root: &Path) -> Result<(), ConvertError> {
    let mut todo = vec![(root.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((dir, depth)) = todo.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| FormatError::io(&dir, e))?;
        for entry in entries.filter_map(Result::ok) {
            seen += 1;
            if seen > MAX_ENTRIES {
                return Ok(());
            }
            let os_name = entry.file_name();
            let Some(name) = os_name.to_str() else {
                continue;
            };
            if name.starts_with('.') || name == MANIFEST {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            // A linked file (an HF snapshot's) counts as its target; a
            // linked folder is not entered.
            let is_file = if kind.is_symlink() {
                std::fs::metadata(&path).is_ok_and(|m| m.is_file())
            } else {
                kind.is_file()
            };
            let descend = kind.is_dir() && depth < MAX_DEPTH;
            let mirrored = is_file && !is_weight_like(name);
            if !descend && !mirrored {
                continue;
            }
            if let Some(reason) = windows_reserved(name) {
                return Err(ConvertError::ReservedName {
                    path,
                    name: name.to_string(),
                    reason,
                });
            }
            if descend {
                todo.push((path, depth + 1));
            }
        }
    }
    Ok(())
}

/// What the manifest records of `files` once copied.
pub fn records(files: &[OtherFile]) -> Vec<CopiedFile> {
    files
        .iter()
        .map(|f| CopiedFile {
            name: f.name.clone(),
            size: f.size,
            mtime_ns: f.mtime_ns,
        })
        .collect()
}

/// Brings the mirrored files of an up-to-date output in line with the
/// source: recopies each file of `others` whose source size or mtime differ
/// from the manifest's record, that has no record (a manifest from before
/// records), or whose copy is gone from DST; then rewrites the manifest.
/// A new source file whose name DST already holds but no manifest records
/// is not replaced (a note in `others.skipped`). Returns the names
/// recopied, none when nothing changed (then nothing is written).
pub fn refresh(
    others: &mut OtherFiles,
    dst: &Path,
    config: Option<&str>,
    manifest: &mut Manifest,
    cancel: &AtomicBool,
) -> Result<Vec<String>, ConvertError> {
    // Up to 100,000 files: looked up by name, not searched.
    let own: std::collections::HashSet<&str> =
        manifest.copied_files.iter().map(String::as_str).collect();
    let recorded_as: std::collections::HashMap<&str, (u64, u64)> = manifest
        .copied_sources
        .iter()
        .map(|r| (r.name.as_str(), (r.size, r.mtime_ns)))
        .collect();
    let written = crate::write::owned::records_by_name(manifest);
    let mut stale = Vec::new();
    // The stale names DST held when checked: only these are written over.
    let mut checked = std::collections::HashSet::new();
    let mut current = Vec::with_capacity(others.files.len());
    for f in &others.files {
        let own = own.contains(f.name.as_str());
        let copy_there = std::fs::symlink_metadata(dst.join(&f.name)).ok();
        let recorded = recorded_as.get(f.name.as_str()) == Some(&(f.size, f.mtime_ns));
        if own && recorded && copy_there.as_ref().is_some_and(std::fs::Metadata::is_file) {
            current.push(f.clone());
            continue;
        }
        // The one rule for writing over a name (as in any other run):
        // reshard's own copy as recorded, or already these bytes.
        let replaceable = copy_there.is_none() || {
            let algo = manifest
                .shards
                .first()
                .map_or(DigestAlgo::Blake3, |s| s.digest.algo());
            let new = new_bytes(f, config, algo);
            let record = written.get(f.name.as_str()).copied();
            may_replace(dst, &f.name, record, new.as_ref().map(|(n, d)| (*n, d)))
        };
        if replaceable {
            if copy_there.is_some() {
                checked.insert(f.name.clone());
            }
            stale.push(f.clone());
            current.push(f.clone());
        } else {
            others.skipped.push(SkippedFile {
                name: f.name.clone(),
                reason: "the output holds a file of that name that reshard cannot prove it wrote (never recorded, or changed since); not replaced".into(),
            });
        }
    }
    if stale.is_empty() {
        return Ok(Vec::new());
    }
    let refreshed = copy(&stale, dst, config, cancel, &|n| checked.contains(n))?;
    let new: Vec<String> = refreshed
        .iter()
        .filter(|n| !own.contains(n.as_str()))
        .cloned()
        .collect();
    manifest.copied_files.extend(new);
    let algo = manifest
        .shards
        .first()
        .map_or(DigestAlgo::Blake3, |s| s.digest.algo());
    let fresh = file_records(dst, refreshed.iter(), algo)?;
    manifest.files.retain(|r| !refreshed.contains(&r.name));
    manifest.files.extend(fresh);
    // Records of files still mirrored; a file gone from the source keeps
    // its name in copied_files (DST still holds reshard's copy) but no
    // record.
    manifest.copied_sources = records(&current);
    crate::write::sync_dir(dst)?;
    write_atomic(dst, MANIFEST, &manifest.to_json())?;
    crate::write::sync_dir(dst)?;
    Ok(refreshed)
}

/// The size and digest of what copying `f` writes (config.json as
/// `config` when given); `None` if the source cannot be read.
fn new_bytes(f: &OtherFile, config: Option<&str>, algo: DigestAlgo) -> Option<(u64, ShardDigest)> {
    if let (Some(text), "config.json") = (config, f.name.as_str()) {
        let mut h = crate::write::digest::ShardHasher::new(algo);
        h.update(text.as_bytes());
        return Some((text.len() as u64, h.finish()));
    }
    let digest = digest_file(&f.path, algo).ok()?;
    Some((f.size, digest))
}

/// The record of each of `names` as written in `dst` (size and digest).
pub fn file_records<'a>(
    dst: &Path,
    names: impl IntoIterator<Item = &'a String>,
    algo: DigestAlgo,
) -> Result<Vec<FileRecord>, ConvertError> {
    let mut out = Vec::new();
    for name in names {
        let path = dst.join(name);
        let io = |e| ConvertError::from(WriteError::io(&path, e));
        let size = std::fs::symlink_metadata(&path).map_err(io)?.len();
        let digest = digest_file(&path, algo).map_err(io)?;
        out.push(FileRecord {
            name: name.clone(),
            size,
            digest,
        });
    }
    Ok(out)
}

fn join(rel_dir: &str, name: &str) -> String {
    if rel_dir.is_empty() {
        name.to_string()
    } else {
        format!("{rel_dir}/{name}")
    }
}

/// True if `path` is the index of `ck` (other indexes are weight files of
/// another set, and skipped with a note).
fn is_indexed_by(ck: &Checkpoint, path: &Path) -> bool {
    matches!(&ck.layout, crate::format::Layout::Indexed { index } if index == path)
}

/// The selected `config.json` rewritten for a cast to `dtype`; `None` when
/// not casting or when there is no config. Read as a regular file of at
/// most [`crate::format::config::MAX_CONFIG`] bytes, so a bad one fails before any shard.
/// When casting, a config.json that [`select`] skipped (a FIFO, a link out
/// of the model) is an error, not a note: the output would otherwise claim
/// the source's dtype.
///
/// `quantization` (the `quantization_config` of a `--quantize` layout
/// that needs one) is added to it; a source config that already has one
/// is refused, since the output would claim two.
pub fn rewritten_config(
    ck: &Checkpoint,
    others: &OtherFiles,
    dtype: Option<Dtype>,
    quantization: Option<&serde_json::Value>,
) -> Result<Option<String>, ConvertError> {
    if dtype.is_none() && quantization.is_none() {
        return Ok(None);
    }
    if let Some(skipped) = others.skipped.iter().find(|f| f.name == "config.json") {
        return Err(ConvertError::Config {
            path: ck.dir.join("config.json"),
            reason: format!("cannot rewrite its dtype: {}", skipped.reason),
        });
    }
    let Some(f) = others.files.iter().find(|f| f.name == "config.json") else {
        if quantization.is_some() {
            // Without it the output is codes and scales no loader can
            // tell apart (reshard itself refuses to guess a block size).
            return Err(ConvertError::Config {
                path: ck.dir.join("config.json"),
                reason: "not part of the source (a one-file checkpoint, or a folder without \
                         it): --quantize fp8-channel and fp8-block write their \
                         quantization_config into it, where transformers and vLLM read the \
                         scheme; convert the model's folder, or use --quantize fp8-scaled for a \
                         one-file checkpoint"
                    .into(),
            });
        }
        return Ok(None);
    };
    let mut text =
        crate::format::read::read_regular_string(&f.path, crate::format::config::MAX_CONFIG)?;
    let bad = |reason: String| ConvertError::Config {
        path: f.path.clone(),
        reason,
    };
    if let Some(to) = dtype {
        text = cast::rewrite_config_dtype(&text, to).map_err(|e| bad(e.to_string()))?;
    }
    if let Some(q) = quantization {
        text = with_quantization_config(&text, q).map_err(bad)?;
    }
    Ok(Some(text))
}

/// `config` (a JSON object) with a `quantization_config` key added at its
/// end, every other byte kept as written (numbers included).
fn with_quantization_config(config: &str, q: &serde_json::Value) -> Result<String, String> {
    let keys: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(config).map_err(|e| format!("not a JSON object: {e}"))?;
    // `null` is what transformers writes for "not quantized"
    // (`PretrainedConfig.to_dict` of a model without one): it is replaced.
    let claims = |key: &str| keys.get(key).is_some_and(|v| !v.is_null());
    if claims("quantization_config") || claims("compression_config") {
        return Err("it already has a quantization_config; the output cannot claim two".into());
    }
    let members = crate::format::json_edit::members(config).ok_or("not a JSON object")?;
    let empty = |m: &crate::format::json_edit::Member| {
        matches!(m.key.as_str(), "quantization_config" | "compression_config")
    };
    let config = crate::format::json_edit::without_members(config, &members, empty);
    let members = crate::format::json_edit::members(&config).ok_or("not a JSON object")?;
    let value = serde_json::to_string_pretty(q).map_err(|e| e.to_string())?;
    let mut out =
        crate::format::json_edit::with_member(&config, &members, "quantization_config", &value);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(out)
}

/// Copies `files` into `dst` at their relative paths, config.json as
/// `config` when given (see [`rewritten_config`]); returns the names
/// written. Each folder on the way is created inside DST and must be a real
/// folder there: a symlink planted in DST is refused, never written through.
/// A name is written over only if `checked(name)`: DST held it when the run
/// checked what it may replace; any other name is published only while it
/// is free ([`Publish::New`]).
pub fn copy(
    files: &[OtherFile],
    dst: &Path,
    config: Option<&str>,
    cancel: &AtomicBool,
    checked: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, ConvertError> {
    let mut copied = Vec::with_capacity(files.len());
    for f in files {
        // Thousands of small files take seconds (each is synced): Ctrl-C
        // stops before the commit, and a rerun resumes.
        if cancel.load(Ordering::Relaxed) {
            return Err(crate::exec::ExecError::Interrupted.into());
        }
        let (dir, name) = match f.name.rsplit_once('/') {
            Some((parent, name)) => (subfolder(dst, parent)?, name),
            None => (dst.to_path_buf(), f.name.as_str()),
        };
        let how = Publish::after_check(checked(&f.name));
        match (f.name.as_str(), config) {
            ("config.json", Some(rewritten)) => {
                write_atomic_as(&dir, name, rewritten.as_bytes(), how)?
            }
            _ => {
                if !copy_atomic(&f.path, &dir, name, cancel, how)? {
                    return Err(crate::exec::ExecError::Interrupted.into());
                }
            }
        }
        copied.push(f.name.clone());
    }
    Ok(copied)
}

/// `dst/rel` (a `/`-separated path of plain names), created folder by
/// folder; each must be a real folder, not a symlink.
pub fn subfolder(dst: &Path, rel: &str) -> Result<PathBuf, ConvertError> {
    let mut dir = dst.to_path_buf();
    for part in rel.split('/') {
        if !crate::names::is_plain_name(part) {
            return Err(ConvertError::DstSubfolder {
                path: dir.join(part),
                reason: "not a plain folder name",
            });
        }
        if let Some(reason) = windows_reserved(part) {
            return Err(ConvertError::DstSubfolder {
                path: dir.join(part),
                reason,
            });
        }
        dir.push(part);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(WriteError::io(&dir, e).into()),
        }
        let real_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_dir());
        if !real_dir {
            return Err(ConvertError::DstSubfolder {
                path: dir,
                reason: "exists in the output and is not a folder (a symlink or a file); refusing to write through it",
            });
        }
    }
    Ok(dir)
}
