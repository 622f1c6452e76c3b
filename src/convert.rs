//! The convert job: plan, execute, commit. This module owns the DST folder's
//! life cycle: refusing a DST that holds something else, resuming a killed
//! run, copying the model's other files, and writing the index and manifest
//! last, which is the commit point.
//!
//! What it may touch is decided before anything is written: the paths by
//! [`OutputScope`], the names inside DST by [`DstInventory`] (only what
//! reshard's own manifests record is ever removed), one run at a time by
//! [`DstLock`], and the free space by [`dst::check_space`].
//!
//! [`convert_gated`] lets a caller hold the commit: `batch --verify-source`
//! hashes the source on its own threads while the shards are written, and
//! the output is committed only once that check has passed.

mod dst;
mod layout;
mod other;
pub mod split;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::exec::{self, CopyPath, ExecError, ExecOptions, Reporter, WindowPool};
use crate::format::{Checkpoint, FormatError};
use crate::plan::{Plan, PlanError, PlanOptions};
use crate::write::digest::{file_matches, DigestAlgo};
use crate::write::lock::{DstLock, LockError};
use crate::write::manifest::{
    plan_id, Manifest, ManifestError, ShardRecord, SourceIdentity, MANIFEST, PARTIAL,
};
use crate::write::owned::DstInventory;
use crate::write::scope::{OutputScope, ScopeError, ScopeRules};
use crate::write::{remove_stale_temps, sync_dir, write_atomic, WriteError};

pub use self::layout::{convert_layout, convert_split, ComponentSummary};
pub use self::other::{SkippedFile, Walk};

/// How to run a conversion, beyond the plan.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub plan: PlanOptions,
    /// Bytes of buffers in flight, in total.
    pub window: u64,
    pub threads: usize,
    /// Replace a DST that holds a different conversion, or write into one
    /// that holds other (non-weight) files. Never removes a file reshard did
    /// not write.
    pub overwrite: bool,
    /// Copy config.json, tokenizer files, ... from the source folder.
    pub copy_other_files: bool,
    /// Which other files: the folder's own ([`Walk::Flat`]) or the whole
    /// tree but other weight sets' folders ([`Walk::Tree`]).
    pub walk: Walk,
    /// Rewrite config.json's dtype when casting (transformers configs; a
    /// diffusers config has no dtype key and is copied as it is).
    pub config_dtype: bool,
    /// SRC was one file, not a folder: DST may sit beside it.
    pub single_file: bool,
    /// `batch`: DST must resolve inside this folder (OUT).
    pub within: Option<PathBuf>,
    /// Write expanded (stride-0) views however much they amplify
    /// (see [`crate::plan::check_expanded`]).
    pub allow_expanded: bool,
    /// Mixed into the plan id when the checkpoint handed in is derived from
    /// the source (a component of a split): the same files with other
    /// prefixes are another conversion.
    pub id_salt: Option<String>,
    /// Weight sets (layout folders, split components) written in their own
    /// dtype whatever `plan.dtype` says (`--keep-dtype-preset vae`).
    pub keep_components: Vec<String>,
    /// The shard digest recorded in the manifest (BLAKE3 unless `--sha256`).
    pub digest: DigestAlgo,
    /// How source bytes are read: through mappings where possible, or buffers.
    pub copy: CopyPath,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            plan: PlanOptions::default(),
            window: 256 << 20,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            overwrite: false,
            copy_other_files: true,
            walk: Walk::Flat,
            config_dtype: true,
            single_file: false,
            within: None,
            allow_expanded: false,
            id_salt: None,
            keep_components: Vec::new(),
            digest: DigestAlgo::default(),
            copy: CopyPath::default(),
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
    #[error(transparent)]
    Scope(#[from] ScopeError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("{}: holds a different conversion (other source or options); pass --overwrite to replace it", .dst.display())]
    DstHoldsOther { dst: PathBuf },
    #[error("{}: folder is not empty and was not written by reshard; pass --overwrite to write into it", .dst.display())]
    DstNotEmpty { dst: PathBuf },
    #[error("{}: holds weight files reshard did not write ({names}); remove them or choose another output folder (--overwrite never deletes them)", .dst.display())]
    ForeignWeights { dst: PathBuf, names: String },
    #[error("{}: not enough free space: the conversion needs {} ({needed} bytes) and the file system has {} ({available} bytes) available", .dst.display(), crate::units::human(*.needed), crate::units::human(*.available))]
    NoSpace {
        dst: PathBuf,
        needed: u64,
        available: u64,
    },
    #[error("{}: {reason}", .path.display())]
    Config { path: PathBuf, reason: String },
    #[error(transparent)]
    Split(#[from] split::SplitError),
    #[error("{}: {reason}", .path.display())]
    DstSubfolder { path: PathBuf, reason: &'static str },
    /// The [`BeforeCommit`] check refused: the shards this run wrote were
    /// removed again and nothing was committed.
    #[error("{}: not committed", .dst.display())]
    NotCommitted {
        dst: PathBuf,
        #[source]
        source: GateError,
    },
    #[error("{}: {name:?} cannot be a name in the output: {reason}; the output must be portable to Windows, so rename it in the source", .path.display())]
    ReservedName {
        path: PathBuf,
        name: String,
        reason: &'static str,
    },
}

/// Why a [`BeforeCommit`] check refused.
pub type GateError = Box<dyn std::error::Error + Send + Sync>;

/// What [`convert_gated`] waits on before it removes anything an earlier
/// run left in DST and before it commits. It may block (until a check on
/// another thread is done); an error keeps the output uncommitted.
pub type BeforeCommit<'a> = &'a (dyn Fn() -> Result<(), GateError> + Sync);

/// What a conversion did.
#[derive(Debug, Clone, Serialize)]
pub struct ConvertSummary {
    pub dst: String,
    /// True when DST already held this exact conversion: no shard was
    /// written (mirrored files may have been refreshed).
    pub up_to_date: bool,
    /// Mirrored files recopied into an up-to-date output because their
    /// source changed (or the manifest did not record it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refreshed_files: Vec<String>,
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
    /// Other files of the source folder that were not copied, and why (a
    /// symlink out of the model's folder, a name that is not UTF-8, ...).
    pub skipped_files: Vec<SkippedFile>,
    /// Weight files outside any converted folder (`onnx/model.onnx`),
    /// copied as they are.
    pub copied_as_is: Vec<String>,
    /// The other weight sets of the model (sentence-transformers modules,
    /// diffusers components), each converted in its own folder.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentSummary>,
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
    convert_gated(ck, dst, options, pool, reporter, cancel, &|| Ok(()))
}

/// As [`convert_with_pool`], asking `before_commit` first where the run
/// would remove what an earlier run left in DST, and again after the shards
/// are written, before the other files, the index and the manifest. When it
/// refuses, the shards this run wrote are removed (the partial manifest
/// stops recording them first), so DST holds no output a rerun could call
/// up to date and nothing this run did not write is gone.
pub fn convert_gated(
    ck: &Checkpoint,
    dst: &Path,
    options: &ConvertOptions,
    pool: &WindowPool,
    reporter: &dyn Reporter,
    cancel: &AtomicBool,
    before_commit: BeforeCommit,
) -> Result<ConvertSummary, ConvertError> {
    let not_committed = |source| ConvertError::NotCommitted {
        dst: dst.to_path_buf(),
        source,
    };
    let started = Instant::now();
    let rules = ScopeRules {
        single_file: options.single_file,
        within: options.within.as_deref(),
    };
    let mut scope = OutputScope::resolve(ck, dst, rules)?;
    let plan = crate::write::format::plan(ck, &options.plan)?;
    crate::plan::check_expanded(ck, &plan, options.allow_expanded)?;
    let mut source = SourceIdentity::of(ck);
    source.root = Some(scope.root().display().to_string());
    let id = match &options.id_salt {
        None => plan_id(&source, &options.plan),
        Some(salt) => {
            use sha2::{Digest, Sha256};
            let key = format!("{}\n{salt}", plan_id(&source, &options.plan));
            crate::write::shard::hex(&Sha256::digest(key.as_bytes()))
        }
    };
    let mut others = if options.copy_other_files {
        other::select(ck, &scope, &options.walk)?
    } else {
        other::OtherFiles::default()
    };
    if plan.quantization.as_ref().is_some_and(|q| q.dequantized) {
        // ModelOpt's quantization config: the output is dense.
        others.files.retain(|f| f.name != "hf_quant_config.json");
    }
    // A config.json that cannot be rewritten fails now, before any shard.
    let dtype = options.plan.dtype.filter(|_| options.config_dtype);
    let config = other::rewritten_config(ck, &others, dtype)?;
    std::fs::create_dir_all(dst).map_err(|e| WriteError::io(dst, e))?;
    scope.confirm(ck, rules)?;
    let lock = DstLock::acquire(dst)?;
    remove_stale_temps(dst, &lock)?;
    let inventory = DstInventory::read(dst, &lock)?;

    let (done, doomed) = match dst::decide(dst, &inventory, &id, options.overwrite)? {
        dst::DstState::UpToDate(mut manifest) => {
            let refreshed = other::refresh(&mut others, dst, config.as_deref(), &mut manifest)?;
            let mut s = summary(dst, true, 0, &plan, 0, started, pool, options, manifest);
            s.refreshed_files = refreshed;
            s.skipped_files = others.skipped;
            s.copied_as_is = others.copied_as_is;
            return Ok(s);
        }
        dst::DstState::Resume(partial) => (
            verified_shards(dst, &plan, partial.shards, options.digest),
            None,
        ),
        dst::DstState::Fresh { remove } => (Vec::new(), Some(remove)),
    };
    dst::check_space(dst, ck, &plan, &done, &others, doomed.as_ref())?;
    if let Some(doomed) = &doomed {
        if !doomed.is_empty() || inventory.manifest.is_some() {
            // An earlier run's output stays until the check has passed.
            before_commit().map_err(not_committed)?;
        }
        dst::clear(dst, &inventory, doomed, &lock)?;
    }
    let resumed = done.len();

    let mut manifest = Manifest {
        reshard_version: env!("CARGO_PKG_VERSION").to_string(),
        plan_id: id,
        source,
        options: options.plan.clone(),
        index_file: plan.index_file.clone(),
        shards: done,
        copied_files: Vec::new(),
        copied_sources: Vec::new(),
        oversized: plan.oversized.clone(),
        dropped: plan.dropped.clone(),
        planned: Vec::new(),
        quantization: plan.quantization.clone(),
    };
    let mut partial = manifest.clone();
    partial.planned = plan
        .shards
        .iter()
        .map(|s| s.file.clone())
        .chain(plan.index_file.clone())
        .collect();
    write_atomic(dst, PARTIAL, &partial.to_json())?;
    let progress = Mutex::new(partial);
    let record_shard = |record: &ShardRecord| -> Result<(), WriteError> {
        let mut partial = progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        partial.shards.push(record.clone());
        write_atomic(dst, PARTIAL, &partial.to_json())
    };
    let finished: Vec<String> = manifest.shards.iter().map(|s| s.file.clone()).collect();
    let todo_bytes: u64 = plan
        .shards
        .iter()
        .filter(|s| !finished.contains(&s.file))
        .flat_map(|s| s.tensors.iter().map(|t| ck.tensors[t.input.primary()].len))
        .sum();
    reporter.start(todo_bytes);
    let exec_options = ExecOptions {
        threads: options.threads,
        cancel,
        skip: &|s| finished.contains(&s.file),
        on_shard: &record_shard,
        digest: options.digest,
        copy: options.copy,
    };
    let new = exec::execute(ck, &plan, dst, pool, &exec_options, reporter);
    reporter.finish();
    let new = new?;
    ck.check_unchanged()?;
    if let Err(source) = before_commit() {
        let partial = progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        dst::forget(dst, &partial, &new, &lock)?;
        return Err(not_committed(source));
    }
    manifest.shards.extend(new);
    // Shards in plan order, whatever order the workers finished in.
    let position = |f: &str| plan.shards.iter().position(|s| s.file == f);
    manifest.shards.sort_by_key(|s| position(&s.file));

    manifest.copied_files = other::copy(&others.files, dst, config.as_deref())?;
    manifest.copied_sources = other::records(&others.files);
    sync_dir(dst)?;
    if let Some(index) = &plan.index_file {
        write_atomic(
            dst,
            index,
            &crate::write::format::of_plan(&plan).index_bytes(&plan),
        )?;
    }
    write_atomic(dst, MANIFEST, &manifest.to_json())?;
    let _ = std::fs::remove_file(dst.join(PARTIAL));
    sync_dir(dst)?;
    drop(lock);
    let mut s = summary(
        dst, false, resumed, &plan, todo_bytes, started, pool, options, manifest,
    );
    s.skipped_files = others.skipped;
    s.copied_as_is = others.copied_as_is;
    Ok(s)
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
        refreshed_files: Vec::new(),
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
        skipped_files: Vec::new(),
        copied_as_is: Vec::new(),
        components: Vec::new(),
        manifest,
    }
}

/// The shards of a partial run that are still on disk and intact, and
/// recorded with the digest this run records (a shard with the other one is
/// rewritten, so a manifest holds one kind).
fn verified_shards(
    dst: &Path,
    plan: &Plan,
    recorded: Vec<ShardRecord>,
    digest: DigestAlgo,
) -> Vec<ShardRecord> {
    recorded
        .into_iter()
        .filter(|r| plan.shards.iter().any(|s| s.file == r.file))
        .filter(|r| r.digest.algo() == digest)
        .filter(|r| {
            // A regular file under its own name: a symlink there is not a
            // shard reshard wrote, and is never read through.
            let path = dst.join(&r.file);
            std::fs::symlink_metadata(&path)
                .is_ok_and(|m| m.file_type().is_file() && m.len() == r.size)
                && file_matches(&path, &r.digest)
        })
        .collect()
}
