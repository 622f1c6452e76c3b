//! Finding the checkpoint behind a path: a weight file, a folder (single,
//! indexed or loose shards), or a Hugging Face cache repo or snapshot.
//!
//! [`open`] is the one entry point every subcommand uses. It resolves the
//! path, reads every header, cross-checks the index and gathers findings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::index::{cross_check, read_index};
use super::read::{open_regular, read_regular_string};
use super::{
    pytorch, safetensors, tensor_names, Checkpoint, Finding, Format, FormatError, Layout,
    SourceFile, Tensor, LARGE_SHARD, MAX_TENSORS,
};
use crate::names::{PYTORCH_SUFFIXES, SAFETENSORS_SUFFIX};

/// Files next to PyTorch weights that torch.save writes but that hold no
/// weights (and, for training_args.bin, arbitrary pickled objects).
const NOT_WEIGHTS: &[&str] = &[
    "training_args.bin",
    "optimizer.pt",
    "optimizer.bin",
    "scheduler.pt",
    "scaler.pt",
];

/// Reads the checkpoint at `path`: a file, a folder or an HF cache folder.
pub fn open(path: &Path) -> Result<Checkpoint, FormatError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    if meta.is_file() {
        return open_file(path);
    }
    if !meta.is_dir() {
        return Err(FormatError::NotRegularFile {
            path: path.to_path_buf(),
            kind: "a FIFO, socket or device",
        });
    }
    let dir = resolve_hf_cache(path)?;
    let weights = WeightFiles::scan(&dir)?;
    if let Some(index) = weights.safetensors_index {
        return open_indexed(&dir, &index, Format::Safetensors);
    }
    if !weights.safetensors.is_empty() {
        return open_files(&dir, &weights.safetensors, Format::Safetensors);
    }
    if let Some(index) = weights.pytorch_index {
        return open_indexed(&dir, &index, Format::Pytorch);
    }
    if !weights.pytorch.is_empty() {
        return open_files(&dir, &weights.pytorch, Format::Pytorch);
    }
    Err(FormatError::NoCheckpoint {
        path: path.to_path_buf(),
    })
}

/// True if `path` holds a checkpoint `open` would read (a quick look at names,
/// no headers read). Used by `batch` discovery.
pub fn looks_like_checkpoint(dir: &Path) -> bool {
    WeightFiles::scan(dir).is_ok_and(|w| {
        w.safetensors_index.is_some()
            || !w.safetensors.is_empty()
            || w.pytorch_index.is_some()
            || !w.pytorch.is_empty()
    })
}

/// An ELOOP from the OS becomes a clear symlink-loop error.
fn io_error(path: &Path, e: std::io::Error) -> FormatError {
    if crate::platform::is_symlink_loop(&e) {
        FormatError::SymlinkLoop {
            path: path.to_path_buf(),
        }
    } else {
        FormatError::io(path, e)
    }
}

fn open_file(path: &Path) -> Result<Checkpoint, FormatError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    if super::gguf::is_gguf_path(path) {
        return super::gguf::to_checkpoint(path, super::gguf::open(path)?);
    }
    if name.ends_with(".index.json") {
        let format = if name.contains(".safetensors.") {
            Format::Safetensors
        } else {
            Format::Pytorch
        };
        return open_indexed(&dir, path, format);
    }
    let format = if name.ends_with(SAFETENSORS_SUFFIX) {
        Format::Safetensors
    } else {
        Format::Pytorch
    };
    open_files(&dir, &[path.to_path_buf()], format)
}

/// Largest `refs/main` read: it holds one revision (a 40-character commit
/// hash, or a branch or tag name), never more than a line.
pub const MAX_REF: u64 = 1024;

/// An HF cache repo folder (`models--ORG--NAME`, holding `refs/` and
/// `snapshots/`) resolves to the snapshot `refs/main` names; any other folder
/// is returned as it is. A `refs/main` that exists but cannot be read (not a
/// regular file, too large, not UTF-8, unreadable) is an error, never a
/// reason to guess a snapshot.
pub fn resolve_hf_cache(dir: &Path) -> Result<PathBuf, FormatError> {
    let snapshots = dir.join("snapshots");
    if !snapshots.is_dir() {
        return Ok(dir.to_path_buf());
    }
    let refs_main = dir.join("refs").join("main");
    let revision = match read_regular_string(&refs_main, MAX_REF) {
        Ok(r) => r.trim().to_string(),
        // No refs/main at all (not even a dangling link): accept a cache
        // holding exactly one snapshot.
        Err(FormatError::NotFound { .. }) if std::fs::symlink_metadata(&refs_main).is_err() => {
            let mut revs = list_dir(&snapshots)?
                .into_iter()
                .filter(|p| p.is_dir())
                .collect::<Vec<_>>();
            if revs.len() != 1 {
                return Err(FormatError::NoCheckpoint {
                    path: dir.to_path_buf(),
                });
            }
            return Ok(revs.remove(0));
        }
        Err(e) => return Err(e),
    };
    if revision.is_empty() || revision.contains('/') || revision.contains("..") {
        return Err(FormatError::MissingSnapshot {
            path: refs_main,
            revision,
        });
    }
    let snapshot = snapshots.join(&revision);
    if !snapshot.is_dir() {
        return Err(FormatError::MissingSnapshot {
            path: dir.to_path_buf(),
            revision,
        });
    }
    Ok(snapshot)
}

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, FormatError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        out.push(entry.path());
    }
    out.sort();
    Ok(out)
}

/// The weight files of a folder, by kind, sorted by name.
#[derive(Default)]
struct WeightFiles {
    safetensors_index: Option<PathBuf>,
    safetensors: Vec<PathBuf>,
    pytorch_index: Option<PathBuf>,
    pytorch: Vec<PathBuf>,
}

impl WeightFiles {
    fn scan(dir: &Path) -> Result<WeightFiles, FormatError> {
        let mut w = WeightFiles::default();
        let mut st_indexes = Vec::new();
        let mut pt_indexes = Vec::new();
        for path in list_dir(dir)? {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with('.') {
                continue;
            }
            let kind = if name.ends_with(".safetensors.index.json") {
                &mut st_indexes
            } else if name.ends_with(SAFETENSORS_SUFFIX) {
                &mut w.safetensors
            } else if name.ends_with(".bin.index.json") || name.ends_with(".pt.index.json") {
                &mut pt_indexes
            } else if PYTORCH_SUFFIXES.iter().any(|e| name.ends_with(e))
                && !NOT_WEIGHTS.contains(&name.as_str())
                && !name.starts_with("rng_state")
            {
                &mut w.pytorch
            } else {
                continue;
            };
            // Follow symlinks (HF snapshots are links into blobs/); a loop is
            // an error. A folder with a weight file's name is not one; a FIFO,
            // socket or device with such a name is refused, never skipped.
            let meta = std::fs::metadata(&path).map_err(|e| io_error(&path, e))?;
            if meta.is_dir() {
                continue;
            }
            if !meta.is_file() {
                return Err(FormatError::NotRegularFile {
                    path,
                    kind: "a FIFO, socket or device",
                });
            }
            kind.push(path);
        }
        drop_variants(&mut w.safetensors);
        drop_variants(&mut w.pytorch);
        w.safetensors_index = pick_index(st_indexes, "model.safetensors.index.json");
        w.pytorch_index = pick_index(pt_indexes, "pytorch_model.bin.index.json");
        Ok(w)
    }
}

/// Leaves out variant files (`diffusion_pytorch_model.fp16.safetensors`,
/// `model.non_ema.bin`: a `.` in the prefix) when files without a variant
/// sit beside them: those are the checkpoint, the variants another copy of
/// it (diffusers loads them only with `variant=`). Merging both would give
/// every tensor twice. A folder holding only variants keeps them.
fn drop_variants(files: &mut Vec<PathBuf>) {
    let is_variant = |p: &PathBuf| {
        p.file_name()
            .is_some_and(|n| prefix_of(&n.to_string_lossy()).contains('.'))
    };
    if files.iter().any(|p| !is_variant(p)) {
        files.retain(|p| !is_variant(p));
    }
}

/// With several indexes in one folder, prefer the transformers default name.
fn pick_index(mut indexes: Vec<PathBuf>, preferred: &str) -> Option<PathBuf> {
    if let Some(i) = indexes
        .iter()
        .position(|p| p.file_name().is_some_and(|n| n == preferred))
    {
        return Some(indexes.swap_remove(i));
    }
    indexes.into_iter().next()
}

/// The shard prefix of a file name: `model-00001-of-00003.safetensors` and
/// `model.safetensors` give `model`; `x.safetensors.index.json` gives `x`.
pub fn prefix_of(file_name: &str) -> String {
    let stem = file_name
        .trim_end_matches(".index.json")
        .trim_end_matches(".safetensors")
        .trim_end_matches(".bin")
        .trim_end_matches(".pth")
        .trim_end_matches(".pt");
    // Strip a "-NNNNN-of-NNNNN" shard suffix.
    if let Some((head, tail)) = stem.rsplit_once("-of-") {
        if let Some((base, num)) = head.rsplit_once('-') {
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            if digits(num) && digits(tail) {
                return base.to_string();
            }
        }
    }
    stem.to_string()
}

fn open_indexed(dir: &Path, index_path: &Path, format: Format) -> Result<Checkpoint, FormatError> {
    let index = read_index(index_path)?;
    let mut paths = Vec::new();
    let mut files = index.files();
    files.sort();
    for file in files {
        let path = dir.join(&file);
        let missing = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => false,
            Ok(meta) => {
                return Err(FormatError::NotRegularFile {
                    path,
                    kind: if meta.is_dir() {
                        "a folder"
                    } else {
                        "a FIFO, socket or device"
                    },
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(io_error(&path, e)),
        };
        if missing {
            let tensor = index
                .weight_map
                .iter()
                .find(|(_, f)| *f == file)
                .map(|(t, _)| t.clone())
                .unwrap_or_default();
            return Err(FormatError::IndexMissingFile {
                path: index_path.to_path_buf(),
                tensor,
                file,
            });
        }
        paths.push(path);
    }
    let mut checkpoint = open_files(dir, &paths, format)?;
    let weights = WeightFiles::scan(dir)?;
    let siblings = if format == Format::Safetensors {
        weights.safetensors
    } else {
        weights.pytorch
    };
    for path in siblings.iter().filter(|p| !paths.contains(p)) {
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        checkpoint.findings.push(Finding::FileNotInIndex { file });
    }
    let names: Vec<String> = checkpoint.files.iter().map(SourceFile::name).collect();
    let findings = cross_check(index_path, &index, &checkpoint.tensors, &names)?;
    checkpoint.findings.extend(findings);
    checkpoint.layout = Layout::Indexed {
        index: index_path.to_path_buf(),
    };
    let index_name = index_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    checkpoint.prefix = prefix_of(&index_name);
    Ok(checkpoint)
}

/// Reads every file's header and merges them into one checkpoint.
fn open_files(dir: &Path, paths: &[PathBuf], format: Format) -> Result<Checkpoint, FormatError> {
    let mut files = Vec::with_capacity(paths.len());
    let mut tensors: Vec<Tensor> = Vec::new();
    let mut findings = Vec::new();
    let mut metadata = BTreeMap::new();
    // Bytes of `__metadata__` held for the whole run (merged, and the
    // values a conflict drops, kept for its finding): within one header's
    // limit, as one file's are, whatever the number of shards.
    let mut held = 0u64;
    for (i, path) in paths.iter().enumerate() {
        let file = SourceFile::stat(path).map_err(|e| match e {
            FormatError::Io { path, source } => io_error(&path, source),
            other => other,
        })?;
        let (file_tensors, file_meta, file_findings) = match format {
            Format::Safetensors => {
                let (t, metadata, f) = safetensors::read_file(&file, i)?;
                (t, metadata.unwrap_or_default(), f)
            }
            Format::Pytorch => {
                let handle = open_regular(path, u64::MAX)?;
                let (t, f) =
                    pytorch::read_file(&handle, i).map_err(|source| FormatError::Pytorch {
                        path: path.clone(),
                        source,
                    })?;
                (t, BTreeMap::new(), f)
            }
            // A GGUF file is a model of its own (its split set found from
            // its name); folder scans never list one.
            Format::Gguf => return super::gguf::to_checkpoint(path, super::gguf::open(path)?),
        };
        for (key, value) in file_meta {
            let adds = match metadata.get(&key) {
                None => key.len() + value.len(),
                Some(kept) if *kept != value => value.len(),
                Some(_) => 0,
            };
            held = held.saturating_add(adds as u64);
            if held > safetensors::MAX_HEADER {
                return Err(FormatError::BadMetadata {
                    path: path.clone(),
                    key,
                    reason: format!(
                        "with the earlier shards' __metadata__ it makes {held} bytes, over the {} bytes of a header, which every output shard's must fit",
                        safetensors::MAX_HEADER
                    ),
                });
            }
            match metadata.get(&key) {
                None => {
                    metadata.insert(key, value);
                }
                Some(kept) if *kept != value => findings.push(Finding::MetadataConflict {
                    key,
                    kept: kept.clone(),
                    dropped: value,
                    file: file.name(),
                }),
                Some(_) => {}
            }
        }
        if tensors.len().saturating_add(file_tensors.len()) > MAX_TENSORS {
            return Err(FormatError::TooManyTensors {
                path: path.clone(),
                max: MAX_TENSORS,
            });
        }
        findings.extend(
            file_tensors
                .iter()
                .filter(|t| t.len > t.stored_bytes())
                .map(|t| Finding::ExpandedView {
                    tensor: t.name.clone(),
                    file: file.name(),
                    bytes: t.len,
                    stored: t.stored_bytes(),
                }),
        );
        if file.size > LARGE_SHARD {
            findings.push(Finding::LargeShard {
                file: file.name(),
                size: file.size,
            });
        }
        findings.extend(file_findings);
        if tensors.is_empty() {
            tensors = file_tensors;
        } else {
            tensors.extend(file_tensors);
        }
        files.push(file);
    }
    tensor_names::check(paths, &tensors)?;
    let layout = if files.len() == 1 {
        Layout::Single
    } else {
        Layout::Loose
    };
    let prefix = files
        .first()
        .map_or_else(|| "model".into(), |f| prefix_of(&f.name()));
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        format,
        layout,
        prefix,
        files,
        tensors,
        metadata,
        findings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(prefix_of("model-00001-of-00003.safetensors"), "model");
        assert_eq!(prefix_of("model.safetensors"), "model");
        assert_eq!(
            prefix_of("diffusion_pytorch_model.safetensors.index.json"),
            "diffusion_pytorch_model"
        );
        assert_eq!(
            prefix_of("pytorch_model-00002-of-00003.bin"),
            "pytorch_model"
        );
        assert_eq!(prefix_of("pytorch_model.bin.index.json"), "pytorch_model");
        assert_eq!(prefix_of("my-model-v2.safetensors"), "my-model-v2");
    }

    #[test]
    fn variants_beside_the_checkpoint_are_left_out() {
        let p = |n: &str| PathBuf::from(n);
        let mut files = vec![
            p("diffusion_pytorch_model.fp16.safetensors"),
            p("diffusion_pytorch_model.safetensors"),
            p("diffusion_pytorch_model.non_ema-00001-of-00002.safetensors"),
        ];
        drop_variants(&mut files);
        assert_eq!(files, [p("diffusion_pytorch_model.safetensors")]);
        let mut only = vec![p("model.fp16.safetensors")];
        drop_variants(&mut only);
        assert_eq!(only, [p("model.fp16.safetensors")]);
    }
}
