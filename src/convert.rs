//! The convert job: plan, execute, commit. This module owns the DST folder's
//! life cycle: refusing a DST that holds something else, resuming a killed
//! run, copying the model's other files, and writing the index and manifest
//! last, which is the commit point.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::cast;
use crate::exec::{self, ExecError, ExecOptions, Reporter, WindowPool};
use crate::format::{Checkpoint, FormatError};
use crate::plan::{Plan, PlanError, PlanOptions};
use crate::write::manifest::{
    plan_id, Manifest, ManifestError, ShardRecord, SourceIdentity, MANIFEST, PARTIAL,
};
use crate::write::shard::sha256_file;
use crate::write::{copy_atomic, remove_stale_temps, sync_dir, write_atomic, WriteError};

/// How to run a conversion, beyond the plan.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub plan: PlanOptions,
    /// Bytes of buffers in flight, in total.
    pub window: u64,
    pub threads: usize,
    /// Replace a DST that holds a different conversion or other files.
    pub overwrite: bool,
    /// Copy config.json, tokenizer files, ... from the source folder.
    pub copy_other_files: bool,
    /// Write expanded (stride-0) views however much they amplify
    /// (see [`crate::plan::check_expanded`]).
    pub allow_expanded: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            plan: PlanOptions::default(),
            window: 256 << 20,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            overwrite: false,
            copy_other_files: true,
            allow_expanded: false,
        }
    }
}

/// Why a conversion did not happen. Nothing under a final name is left
/// incomplete in any of these cases.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Read(#[from] FormatError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("{}: output must not be the source folder or inside it", .dst.display())]
    DstInsideSource { dst: PathBuf },
    #[error("{}: holds a different conversion (other source or options); pass --overwrite to replace it", .dst.display())]
    DstHoldsOther { dst: PathBuf },
    #[error("{}: folder is not empty and was not written by reshard; pass --overwrite to write into it", .dst.display())]
    DstNotEmpty { dst: PathBuf },
    #[error("{}: {reason}", .path.display())]
    Config { path: PathBuf, reason: String },
}

/// What a conversion did.
#[derive(Debug, Clone, Serialize)]
pub struct ConvertSummary {
    pub dst: String,
    /// True when DST already held this exact conversion: nothing was written.
    pub up_to_date: bool,
    pub shards: usize,
    /// Shards a previous, interrupted run had finished and this run kept.
    pub resumed_shards: usize,
    pub tensors: usize,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub seconds: f64,
    /// Most bytes of window buffers held at once.
    pub peak_buffer_bytes: u64,
    pub window: u64,
    pub manifest: Manifest,
}

/// Converts `ck` into `dst`. `cancel` stops the run between chunks (Ctrl-C).
pub fn convert(
    ck: &Checkpoint,
    dst: &Path,
    options: &ConvertOptions,
    reporter: &dyn Reporter,
    cancel: &AtomicBool,
) -> Result<ConvertSummary, ConvertError> {
    convert_with_pool(
        ck,
        dst,
        options,
        &WindowPool::new(options.window),
        reporter,
        cancel,
    )
}

/// As [`convert`], with buffers from a pool shared with other jobs (`batch`).
pub fn convert_with_pool(
    ck: &Checkpoint,
    dst: &Path,
    options: &ConvertOptions,
    pool: &WindowPool,
    reporter: &dyn Reporter,
    cancel: &AtomicBool,
) -> Result<ConvertSummary, ConvertError> {
    let started = Instant::now();
    refuse_dst_in_source(ck, dst)?;
    let plan = Plan::build(ck, &options.plan)?;
    crate::plan::check_expanded(ck, &plan, options.allow_expanded)?;
    if options.copy_other_files {
        // A config.json that cannot be rewritten fails now, before any shard.
        rewritten_config(ck, options.plan.dtype)?;
    }
    let source = SourceIdentity::of(ck);
    let id = plan_id(&source, &options.plan);
    std::fs::create_dir_all(dst).map_err(|e| WriteError::io(dst, e))?;

    let done = match dst_state(dst, &id, options.overwrite)? {
        DstState::UpToDate(manifest) => {
            return Ok(summary(
                dst, true, 0, &plan, 0, started, pool, options, manifest,
            ));
        }
        DstState::Resume(partial) => verified_shards(dst, &plan, partial.shards),
        DstState::Fresh => Vec::new(),
    };
    remove_stale_temps(dst)?;
    let resumed = done.len();

    let mut manifest = Manifest {
        reshard_version: env!("CARGO_PKG_VERSION").to_string(),
        plan_id: id,
        source,
        options: options.plan.clone(),
        index_file: plan.index_file.clone(),
        shards: done,
        copied_files: Vec::new(),
        oversized: plan.oversized.clone(),
        dropped: plan.dropped.clone(),
    };
    let progress = Mutex::new(manifest.clone());
    let record_shard = |record: &ShardRecord| -> Result<(), WriteError> {
        let mut partial = progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        partial.shards.push(record.clone());
        write_atomic(dst, PARTIAL, &partial.to_json())
    };
    write_atomic(dst, PARTIAL, &manifest.to_json())?;
    let finished: Vec<String> = manifest.shards.iter().map(|s| s.file.clone()).collect();
    let todo_bytes: u64 = plan
        .shards
        .iter()
        .filter(|s| !finished.contains(&s.file))
        .flat_map(|s| s.tensors.iter().map(|t| ck.tensors[t.source].len))
        .sum();
    reporter.start(todo_bytes);
    let exec_options = ExecOptions {
        threads: options.threads,
        cancel,
        skip: &|s| finished.contains(&s.file),
        on_shard: &record_shard,
    };
    let new = exec::execute(ck, &plan, dst, pool, &exec_options, reporter);
    reporter.finish();
    manifest.shards.extend(new?);
    // Shards in plan order, whatever order the workers finished in.
    let position = |f: &str| plan.shards.iter().position(|s| s.file == f);
    manifest.shards.sort_by_key(|s| position(&s.file));

    ck.check_unchanged()?;
    if options.copy_other_files {
        manifest.copied_files = copy_other_files(ck, dst, options.plan.dtype)?;
    }
    sync_dir(dst)?;
    if let Some(index) = &plan.index_file {
        write_atomic(dst, index, &crate::write::index::index_json(&plan))?;
    }
    write_atomic(dst, MANIFEST, &manifest.to_json())?;
    let _ = std::fs::remove_file(dst.join(PARTIAL));
    sync_dir(dst)?;
    Ok(summary(
        dst, false, resumed, &plan, todo_bytes, started, pool, options, manifest,
    ))
}

#[allow(clippy::too_many_arguments)]
fn summary(
    dst: &Path,
    up_to_date: bool,
    resumed: usize,
    plan: &Plan,
    bytes_read: u64,
    started: Instant,
    pool: &WindowPool,
    options: &ConvertOptions,
    manifest: Manifest,
) -> ConvertSummary {
    ConvertSummary {
        dst: dst.display().to_string(),
        up_to_date,
        shards: plan.shards.len(),
        resumed_shards: resumed,
        tensors: plan.layer_order.len(),
        bytes_read,
        bytes_written: if up_to_date {
            0
        } else {
            manifest.shards.iter().map(|s| s.size).sum()
        },
        seconds: started.elapsed().as_secs_f64(),
        peak_buffer_bytes: pool.peak(),
        window: options.window,
        manifest,
    }
}

fn refuse_dst_in_source(ck: &Checkpoint, dst: &Path) -> Result<(), ConvertError> {
    let src = ck
        .dir
        .canonicalize()
        .map_err(|e| FormatError::io(&ck.dir, e))?;
    // DST may not exist yet: canonicalize its nearest existing ancestor.
    let mut existing = dst.to_path_buf();
    let mut tail = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_os_string());
                existing = if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                };
            }
            _ => break,
        }
    }
    let mut full = existing
        .canonicalize()
        .map_err(|e| WriteError::io(&existing, e))?;
    full.extend(tail.iter().rev());
    if full.starts_with(&src) {
        return Err(ConvertError::DstInsideSource {
            dst: dst.to_path_buf(),
        });
    }
    Ok(())
}

enum DstState {
    Fresh,
    UpToDate(Manifest),
    Resume(Manifest),
}

/// Decides what DST holds: nothing of ours, this exact conversion (done or
/// half done), or something else.
fn dst_state(dst: &Path, id: &str, overwrite: bool) -> Result<DstState, ConvertError> {
    let manifest = Manifest::read(&dst.join(MANIFEST))?;
    let partial = Manifest::read(&dst.join(PARTIAL)).ok().flatten();
    match (manifest, partial) {
        (Some(m), _) if m.plan_id == id => return Ok(DstState::UpToDate(m)),
        (None, Some(p)) if p.plan_id == id => return Ok(DstState::Resume(p)),
        (None, Some(_)) => {
            // Our own unfinished run of another plan (the source or options
            // changed since): nothing was committed, so start over.
            clear_outputs(dst)?;
            return Ok(DstState::Fresh);
        }
        _ => {}
    }
    let occupied = std::fs::read_dir(dst)
        .map_err(|e| WriteError::io(dst, e))?
        .filter_map(Result::ok)
        .any(|e| {
            !e.file_name()
                .to_string_lossy()
                .ends_with(crate::write::TEMP_SUFFIX)
        });
    if !occupied {
        return Ok(DstState::Fresh);
    }
    if !overwrite {
        let ours = dst.join(MANIFEST).exists() || dst.join(PARTIAL).exists();
        return Err(if ours {
            ConvertError::DstHoldsOther {
                dst: dst.to_path_buf(),
            }
        } else {
            ConvertError::DstNotEmpty {
                dst: dst.to_path_buf(),
            }
        });
    }
    clear_outputs(dst)?;
    Ok(DstState::Fresh)
}

/// Under --overwrite: removes the commit point first, then weight files and
/// indexes, so no moment shows a final index over missing shards.
fn clear_outputs(dst: &Path) -> Result<(), WriteError> {
    for name in [MANIFEST, PARTIAL] {
        match std::fs::remove_file(dst.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(WriteError::io(&dst.join(name), e))
            }
            _ => {}
        }
    }
    for entry in std::fs::read_dir(dst)
        .map_err(|e| WriteError::io(dst, e))?
        .filter_map(Result::ok)
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".index.json") || name.ends_with(".safetensors") {
            std::fs::remove_file(entry.path()).map_err(|e| WriteError::io(&entry.path(), e))?;
        }
    }
    Ok(())
}

/// The shards of a partial run that are still on disk and intact.
fn verified_shards(dst: &Path, plan: &Plan, recorded: Vec<ShardRecord>) -> Vec<ShardRecord> {
    recorded
        .into_iter()
        .filter(|r| plan.shards.iter().any(|s| s.file == r.file))
        .filter(|r| {
            let path = dst.join(&r.file);
            std::fs::metadata(&path).is_ok_and(|m| m.len() == r.size)
                && sha256_file(&path).is_ok_and(|h| h == r.sha256)
        })
        .collect()
}

/// The source's `config.json` rewritten for a cast to `dtype`; `None` when
/// not casting or when there is no config. Read as a regular file of at
/// most [`cast::MAX_CONFIG`] bytes.
fn rewritten_config(
    ck: &Checkpoint,
    dtype: Option<crate::format::Dtype>,
) -> Result<Option<String>, ConvertError> {
    let Some(to) = dtype else {
        return Ok(None);
    };
    let path = ck.dir.join("config.json");
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    let text = crate::format::read::read_regular_string(&path, cast::MAX_CONFIG)?;
    cast::rewrite_config_dtype(&text, to)
        .map(Some)
        .map_err(|e| ConvertError::Config {
            path,
            reason: e.to_string(),
        })
}

/// Copies the source folder's other files (config, tokenizer, README, ...),
/// rewriting config.json's dtype when casting. Weight files, indexes and
/// pickles are not copied.
fn copy_other_files(
    ck: &Checkpoint,
    dst: &Path,
    dtype: Option<crate::format::Dtype>,
) -> Result<Vec<String>, ConvertError> {
    let weight_files: Vec<&Path> = ck.files.iter().map(|f| f.path.as_path()).collect();
    let config = rewritten_config(ck, dtype)?;
    let mut copied = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&ck.dir)
        .map_err(|e| FormatError::io(&ck.dir, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let skip = name.starts_with('.')
            || !path.is_file()
            || weight_files.contains(&path.as_path())
            || name.ends_with(".index.json")
            || name.ends_with(".safetensors")
            || [".bin", ".pt", ".pth", ".pkl", ".ckpt"]
                .iter()
                .any(|e| name.ends_with(e))
            || name == MANIFEST;
        if skip {
            continue;
        }
        match &config {
            Some(rewritten) if name == "config.json" => {
                write_atomic(dst, &name, rewritten.as_bytes())?;
            }
            _ => copy_atomic(&path, dst, &name)?,
        }
        copied.push(name);
    }
    Ok(copied)
}
