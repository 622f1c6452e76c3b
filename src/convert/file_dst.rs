//! What DST names ([`DstKind`]) and writing a DST that names one file.
//!
//! One rule for every format: a DST ending in `.safetensors` names that
//! file (one file, the whole model: what ComfyUI, A1111 and Forge load); a
//! DST ending in `.gguf` names a GGUF file and sets the output format
//! (with `--max-shard-size`, the first file of a gguf-split set
//! `NAME-00001-of-0000N.gguf`, the others beside it); any other DST is a
//! folder.
//!
//! A file DST is written through a hidden staging folder beside it,
//! `.NAME.reshard/`: an ordinary conversion there (plan, lock, manifest,
//! resume, the same checks), then the one shard is renamed onto the file
//! (atomic on one file system) and the staging folder is removed. A run
//! killed before the rename leaves the file as it was and a staging folder
//! the next run resumes from. Nothing but the weights is written: no
//! config, no index, no manifest beside the file. A gguf-split set is
//! staged the same way, in `.NAME.gguf.reshard/`, and its files are
//! renamed beside DST one by one, the first (the one llama.cpp opens) last:
//! a run killed between two renames leaves a set whose first file is the
//! old one or missing (so no loader opens a mixed set as new), and the
//! staging folder, which a rerun resumes (writing again the files already
//! moved out). Only those names are written; nothing else beside DST is
//! touched, and an existing member is replaced only with `--overwrite`.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use super::error::ConvertError;
use super::options::{ConvertOptions, ConvertSummary};
use super::run::convert_gated;
use super::source::ConvertSource;
use crate::exec::{Reporter, WindowPool};
use crate::format::gguf::is_gguf_path;
use crate::names::SAFETENSORS_SUFFIX;
use crate::write::lock::DstLock;
use crate::write::manifest::{MANIFEST, PARTIAL};
use crate::write::{sync_dir, WriteError};

/// What a DST path names, by its ending (ASCII case ignored; a trailing
/// separator always names a folder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DstKind {
    /// A folder of shards, an index, the model's other files, the manifest.
    Folder,
    /// `NAME.safetensors`: that one file.
    SafetensorsFile,
    /// `NAME.gguf`: a GGUF file (or the first of a gguf-split set).
    GgufFile,
}

impl DstKind {
    pub fn of(dst: &Path) -> DstKind {
        // `merged.safetensors/` says folder.
        let text = dst.as_os_str().to_string_lossy();
        if text.chars().last().is_some_and(std::path::is_separator) {
            return DstKind::Folder;
        }
        let name = dst
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if is_gguf_path(dst) {
            DstKind::GgufFile
        } else if name.len() > SAFETENSORS_SUFFIX.len() && name.ends_with(SAFETENSORS_SUFFIX) {
            DstKind::SafetensorsFile
        } else {
            DstKind::Folder
        }
    }
}

/// The options a file DST is converted under: one shard, no other file.
pub fn file_options(options: &ConvertOptions) -> ConvertOptions {
    let mut o = options.clone();
    o.plan.max_shard_size = u64::MAX;
    o.copy_other_files = false;
    o
}

/// The options a GGUF DST is converted under: the GGUF format, no other
/// file, and one file unless `split` (`--max-shard-size` was given).
pub fn gguf_options(options: &ConvertOptions, split: bool) -> ConvertOptions {
    let mut o = file_options(options);
    if split {
        o.plan.max_shard_size = options.plan.max_shard_size;
    }
    o.plan.format = crate::plan::OutputFormat::Gguf;
    o
}

/// The files of a gguf-split set named by `file` (`NAME.gguf`):
/// `NAME-00001-of-0000N.gguf` beside it, for staged shard `n` of `count`.
pub fn split_name(file: &Path, n: usize, count: usize) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = match name.len().checked_sub(".gguf".len()) {
        Some(at) if name.is_char_boundary(at) => &name[..at],
        _ => name.as_str(),
    };
    file.with_file_name(format!("{stem}-{:05}-of-{count:05}.gguf", n + 1))
}

/// The files beside `file` (`NAME.gguf`) that may be members of its split
/// set (`NAME-*.gguf`), by path.
fn members_present(file: &Path) -> std::collections::BTreeSet<PathBuf> {
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let probe = split_name(file, 0, 1);
    let stem = probe
        .file_name()
        .map(|n| n.to_string_lossy().replace("-00001-of-00001.gguf", "-"))
        .unwrap_or_default();
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return Default::default();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&stem) && n.ends_with(".gguf"))
        .map(|n| file.with_file_name(n))
        .collect()
}

/// The staging folder of the file DST `file`.
pub fn staging_dir(file: &Path) -> Result<PathBuf, ConvertError> {
    let name = file
        .file_name()
        .ok_or_else(|| file_dst(file, "names no file".into()))?;
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(parent.join(format!(".{}.reshard", name.to_string_lossy())))
}

/// Converts `source` into the one file `file` (see the module doc).
pub fn convert_to_file(
    source: &ConvertSource,
    file: &Path,
    options: &ConvertOptions,
    pool: &WindowPool,
    reporter: &dyn Reporter,
    cancel: &AtomicBool,
) -> Result<ConvertSummary, ConvertError> {
    if let Some(scheme) = options.plan.quantize.filter(|s| s.needs_config()) {
        return Err(file_dst(
            file,
            format!(
                "a DST ending in .safetensors holds the weights only, and --quantize {} needs \
                 config.json beside them: its quantization_config is where transformers and \
                 vLLM read the scheme; name a folder as DST, or use --quantize fp8-scaled for \
                 one file",
                scheme.name()
            ),
        ));
    }
    let ck = one_weight_set(source, file)?;
    let split = options.plan.format == crate::plan::OutputFormat::Gguf
        && options.plan.max_shard_size != u64::MAX;
    // Whether each target was there when checked: a target that was not
    // is published without replacing (a file that appears at its name
    // during the run is the user's, never overwritten).
    let mut existed = Vec::new();
    if !split {
        existed.push(check_target(file, ck, options.overwrite)?);
    }
    // The members of a split set already beside DST: only these may be
    // replaced at the end (one that appears during the run is kept).
    let before = if split {
        members_present(file)
    } else {
        Default::default()
    };
    let staging = staging_dir(file)?;
    if std::fs::symlink_metadata(&staging).is_ok_and(|m| !m.file_type().is_dir()) {
        return Err(file_dst(
            &staging,
            "reshard's staging folder is taken by something that is not a folder (a symlink, a file); remove it".into(),
        ));
    }
    let o = match options.plan.format {
        crate::plan::OutputFormat::Gguf => gguf_options(options, split),
        crate::plan::OutputFormat::Safetensors => file_options(options),
    };
    let mut summary = convert_gated(ck, &staging, &o, pool, reporter, cancel, &|| Ok(()))?;
    let shards = &summary.manifest.shards;
    let targets: Vec<PathBuf> = match shards.len() {
        0 => return Err(file_dst(file, "the model has no tensors to write".into())),
        1 if !split => vec![file.to_path_buf()],
        count => (0..count).map(|n| split_name(file, n, count)).collect(),
    };
    if split {
        for (shard, t) in shards.iter().zip(&targets) {
            // A member that already holds the bytes about to be written is
            // one a run stopped between its renames moved out: the rerun
            // replaces it without --overwrite, as it loses nothing.
            let dir = t.parent().filter(|p| !p.as_os_str().is_empty());
            let name = t
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            let ours = crate::write::owned::as_recorded(
                dir.unwrap_or(Path::new(".")),
                &name,
                shard.size,
                &shard.digest,
            );
            let there = check_target(t, ck, options.overwrite || ours)?;
            existed.push(there && before.contains(t.as_path()));
        }
    }
    // Again under the staging folder's lock: no other run finishes it too.
    let lock = DstLock::acquire(&staging)?;
    // The first file last: until it is in place, no loader opens the set.
    for ((shard, target), existed) in shards.iter().zip(&targets).zip(&existed).rev() {
        let written = staging.join(&shard.file);
        publish(&written, target, *existed, &staging)?;
    }
    if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(parent)?;
    }
    let ours = summary.manifest.copied_files.iter().map(String::as_str);
    for name in ours.chain([MANIFEST, PARTIAL]) {
        match std::fs::remove_file(staging.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(WriteError::io(&staging.join(name), e).into())
            }
            _ => {}
        }
    }
    // Removes the lock file too.
    drop(lock);
    // Best effort: a staging folder someone put other files into stays.
    let _ = std::fs::remove_dir(&staging);
    summary.dst = file.display().to_string();
    Ok(summary)
}

/// The one weight set a file can hold: a file SRC, or a plain model folder
/// (a pipeline or a sentence-transformers model has several).
fn one_weight_set<'a>(
    source: &'a ConvertSource,
    file: &Path,
) -> Result<&'a crate::format::Checkpoint, ConvertError> {
    match (&source.layout, &source.root) {
        (Some(l), _) if l.is_composite() => Err(file_dst(
            file,
            format!(
                "{} has {} weight sets and one file holds one: name a folder, or convert one component folder",
                l.kind.describe(),
                l.sets.len()
            ),
        )),
        (_, Some(ck)) => Ok(ck),
        (_, None) => Err(crate::format::FormatError::NoCheckpoint {
            path: source.path.clone(),
        }
        .into()),
    }
}

/// Moves the staged file `written` onto `target`. A target that was there
/// when checked (and may be replaced) is replaced in one rename; one that
/// was not is published only if its name is still free, so a file someone
/// put there during the run survives and the run fails, its output left in
/// the staging folder for a rerun.
fn publish(
    written: &Path,
    target: &Path,
    existed: bool,
    staging: &Path,
) -> Result<(), ConvertError> {
    let moved = if existed {
        std::fs::rename(written, target)
    } else {
        crate::platform::rename_no_replace(written, target)
    };
    match moved {
        Ok(()) => Ok(()),
        Err(e) if !existed && e.kind() == std::io::ErrorKind::AlreadyExists => Err(file_dst(
            target,
            format!(
                "appeared while reshard was writing it and was left as it is; the output waits \
                 in {}: rerun with --overwrite to replace the file, or name another DST",
                staging.display()
            ),
        )),
        Err(e) => Err(WriteError::io(target, e).into()),
    }
}

/// The file DST may be replaced: absent (`Ok(false)`), or a regular file
/// that is none of the source's files, replaced only with `overwrite`
/// (`Ok(true)`).
fn check_target(
    file: &Path,
    ck: &crate::format::Checkpoint,
    overwrite: bool,
) -> Result<bool, ConvertError> {
    let Ok(meta) = std::fs::symlink_metadata(file) else {
        return Ok(false);
    };
    if let Ok(real) = crate::platform::canonicalize(file) {
        for f in &ck.files {
            if crate::platform::canonicalize(&f.path).is_ok_and(|p| p == real) {
                return Err(crate::write::scope::ScopeError::DstOnSourceFile {
                    dst: file.to_path_buf(),
                    file: f.path.clone(),
                }
                .into());
            }
        }
    }
    if !meta.file_type().is_file() {
        return Err(file_dst(
            file,
            "exists and is not a regular file (a folder, a symlink); a DST ending in .safetensors or .gguf names one file: remove it or name another".into(),
        ));
    }
    if !overwrite {
        return Err(file_dst(
            file,
            "exists; pass --overwrite to replace it".into(),
        ));
    }
    Ok(true)
}

fn file_dst(path: &Path, reason: String) -> ConvertError {
    ConvertError::FileDst {
        path: path.to_path_buf(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dst_kind_by_ending() {
        for (dst, kind) in [
            ("out", DstKind::Folder),
            ("out/", DstKind::Folder),
            ("merged.safetensors", DstKind::SafetensorsFile),
            ("a/B.SafeTensors", DstKind::SafetensorsFile),
            (".safetensors", DstKind::Folder),
            ("model.gguf", DstKind::GgufFile),
            ("x.GGUF", DstKind::GgufFile),
            ("model.safetensors.d", DstKind::Folder),
            ("merged.safetensors/", DstKind::Folder),
        ] {
            assert_eq!(DstKind::of(Path::new(dst)), kind, "{dst}");
        }
    }

    #[test]
    fn a_split_set_is_named_after_the_dst() {
        assert_eq!(
            split_name(Path::new("out/m.gguf"), 0, 3),
            Path::new("out/m-00001-of-00003.gguf")
        );
        assert_eq!(
            split_name(Path::new("M.GGUF"), 2, 3),
            Path::new("M-00003-of-00003.gguf")
        );
    }

    #[test]
    fn the_staging_folder_is_hidden_beside_the_file() {
        assert_eq!(
            staging_dir(Path::new("a/m.safetensors")).unwrap(),
            Path::new("a/.m.safetensors.reshard")
        );
        assert_eq!(
            staging_dir(Path::new("m.safetensors")).unwrap(),
            Path::new("./.m.safetensors.reshard")
        );
    }
}
