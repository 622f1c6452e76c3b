//! One conversion, start to finish: plan, lock and clean DST, execute,
//! copy the other files, commit the index and manifest.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Instant;

use crate::exec::{self, ExecOptions, PeakMeter, Reporter, WindowPool};
use crate::format::{Checkpoint, Format};
use crate::plan::Plan;
use crate::plan::PlanOptions;
use crate::write::digest::{file_matches, DigestAlgo, ShardDigest, ShardHasher};
use crate::write::lock::DstLock;
use crate::write::made::MadeDirs;
use crate::write::manifest::{
    plan_id, Manifest, QuantizedOutput, ShardRecord, SourceIdentity, MANIFEST, PARTIAL,
};
use crate::write::owned::DstInventory;
use crate::write::scope::{OutputScope, ScopeRules};
use crate::write::{
    remove_stale_temps, sync_dir, write_atomic, write_atomic_as, Publish, WriteError,
};

use super::error::{ConvertError, GateError};
use super::options::{BeforeCommit, ConvertOptions, ConvertSummary};
use super::{dst, other};

/// The plan [`convert`] executes for `ck` under `options` (what
/// `--dry-run` prints): the output format's plan, refused if it expands a
/// view past what `--allow-expanded` allows.
pub fn plan_for(ck: &Checkpoint, options: &ConvertOptions) -> Result<Plan, ConvertError> {
    let plan = crate::write::format::plan(ck, &plan_options(ck, options)?)?;
    check_portable(ck, &plan)?;
    crate::write::format::check_headers(&plan)?;
    crate::plan::check_expanded(ck, &plan, options.allow_expanded)?;
    // A GGUF LLM's config is made from its header: one that cannot be
    // fails the dry run too, not only the run.
    super::gguf::generated_files(ck, &plan)?;
    Ok(plan)
}

/// Refuses a source weight file, or a name the output would get (shards,
/// index), that Windows reserves (`CON.safetensors`, `aux.safetensors`,
/// [`crate::names::windows_reserved`]), on every platform, before anything
/// is written: the same rule mirrored files and layout folders pass.
fn check_portable(ck: &Checkpoint, plan: &Plan) -> Result<(), ConvertError> {
    let sources = ck.files.iter().map(|f| (f.name(), f.path.clone()));
    let outputs = plan
        .shards
        .iter()
        .map(|s| s.file.clone())
        .chain(plan.index_file.clone())
        .map(|n| (n.clone(), Path::new(&n).to_path_buf()));
    for (name, path) in sources.chain(outputs) {
        if let Some((part, reason)) = crate::names::reserved_part(&name) {
            return Err(ConvertError::ReservedName {
                path,
                name: part.to_string(),
                reason,
            });
        }
    }
    Ok(())
}

/// The plan options a conversion of `ck` runs under: `options.plan`, except
/// that a GGUF written under its own names (a diffusion model: the UIs that
/// load those read one file) has no shard limit unless one was given.
pub fn plan_options(
    ck: &Checkpoint,
    options: &ConvertOptions,
) -> Result<PlanOptions, ConvertError> {
    let mut plan = options.plan.clone();
    if ck.format == Format::Gguf && !options.shard_size_given {
        let model = crate::format::gguf::open(&ck.files[0].path)?;
        let llm = crate::plan::gguf::Family::of(&model.metadata).is_some();
        if !llm || plan.keep_gguf_names {
            plan.max_shard_size = u64::MAX;
        }
    }
    Ok(plan)
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
    let started = Instant::now();
    // This conversion's own peak: a pipeline's weight sets and
    // `--split-components`' components share one pool, one after another.
    let meter = pool.meter();
    let job = prepare(ck, dst, options)?;
    // A folder of someone else's files is refused before reshard writes a
    // byte into it, its lock included; under the lock the same rules are
    // applied again to what DST holds then.
    if let Some(unclaimed) = DstInventory::unclaimed(dst) {
        dst::decide(dst, &unclaimed, &job.id, options.overwrite)?;
    }
    // Declared before the lock, so dropped after it: a run that ends
    // without output (refused, failed) takes back the folders it made once
    // its lock file is gone.
    let made = MadeDirs::create(dst).map_err(|e| WriteError::io(dst, e))?;
    let mut scope = job.scope;
    scope.confirm(ck, job.rules)?;
    let lock = DstLock::acquire(dst)?;
    remove_stale_temps(dst, &lock)?;
    let inventory = DstInventory::read(dst, &lock)?;
    let Prepared {
        plan,
        source,
        id,
        mut others,
        config,
        generated,
        ..
    } = job;

    // What DST holds decides what is left to do.
    let state = dst::decide(dst, &inventory, &id, options.overwrite)?;
    let cleanup = matches!(state, dst::DstState::Fresh).then(|| inventory.cleanup(dst, &lock));
    // The names beside the shards that DST holds now and keeps through the
    // cleanup: checked below, and the only ones the commit writes over (a
    // file that appears at any other name during the run is kept).
    let mut checked = std::collections::BTreeSet::new();
    if !matches!(state, dst::DstState::UpToDate(_)) {
        let beside = Beside {
            plan: &plan,
            others: &others,
            config: config.as_deref(),
            generated: &generated,
            digest: options.digest,
        };
        let names = beside.names();
        dst::check_replacements(dst, &inventory, &names, cleanup.as_ref(), &|n| {
            beside.new_bytes(n)
        })?;
        checked = names
            .into_iter()
            .filter(|n| !cleanup.as_ref().is_some_and(|c| c.remove.contains(n)))
            .filter(|n| std::fs::symlink_metadata(dst.join(n)).is_ok())
            .collect();
        // The committed manifest of the run being resumed is replaced; a
        // cleanup takes any other away first.
        if inventory.manifest.is_some() && cleanup.is_none() {
            checked.insert(MANIFEST.to_string());
        }
    }
    let done = match state {
        dst::DstState::UpToDate(mut manifest) => {
            let refreshed =
                other::refresh(&mut others, dst, config.as_deref(), &mut manifest, cancel)?;
            let mut s = summary(dst, true, 0, &plan, 0, started, &meter, options, manifest);
            s.refreshed_files = refreshed;
            s.skipped_files = others.skipped;
            s.copied_as_is = others.copied_as_is;
            made.keep();
            return Ok(s);
        }
        dst::DstState::Resume(partial) => {
            verified_shards(dst, &plan, partial.shards, options.digest)
        }
        dst::DstState::Fresh => Vec::new(),
    };
    dst::check_space(
        dst,
        ck,
        &plan,
        &done,
        &others,
        cleanup.as_ref().map(|c| &c.remove),
    )?;
    if let Some(cleanup) = &cleanup {
        if !cleanup.remove.is_empty() || !cleanup.aside.is_empty() || inventory.manifest.is_some() {
            // An earlier run's output stays until the check has passed.
            before_commit().map_err(|e| not_committed(dst, e))?;
        }
        dst::clear(dst, &inventory, cleanup, &lock)?;
    }
    let mut set_aside = cleanup.map(|c| c.aside).unwrap_or_default();
    // A resumed run rewrites the shards it could not verify: whatever holds
    // such a name (a shard renamed just before a crash, recorded only after
    // its rename; a damaged one; a file someone put there) is moved aside,
    // never written over, so every shard is published onto a free name.
    let unverified = plan
        .shards
        .iter()
        .filter(|s| !done.iter().any(|d| d.file == s.file))
        .map(|s| s.file.clone());
    let held = crate::write::owned::aside_names(dst, unverified);
    crate::write::owned::move_aside(dst, &held, &lock)?;
    let resumed = done.len();

    let mut manifest = Manifest {
        reshard_version: env!("CARGO_PKG_VERSION").to_string(),
        plan_id: id,
        source,
        options: plan.options.clone(),
        index_file: plan.index_file.clone(),
        shards: done,
        copied_files: Vec::new(),
        copied_sources: Vec::new(),
        files: Vec::new(),
        oversized: plan.oversized.clone(),
        dropped: plan.dropped.clone(),
        planned: Vec::new(),
        quantization: plan.quantization.clone(),
        gguf: plan.gguf.clone(),
        quantized: None,
    };
    let run = Shards {
        ck,
        dst,
        plan: &plan,
        options,
        pool,
        reporter,
        cancel,
    };
    let (new, todo_bytes) = run.write(&manifest, &lock, before_commit)?;
    // What was moved aside and holds exactly the shard now written under
    // its name (a shard finished just before a crash) loses nothing when
    // it goes; anything else stays aside, and the summary says so.
    for (name, aside) in held {
        let same = new
            .iter()
            .find(|r| r.file == name)
            .is_some_and(|r| crate::write::owned::as_recorded(dst, &aside, r.size, &r.digest));
        if same {
            std::fs::remove_file(dst.join(&aside))
                .map_err(|e| WriteError::io(&dst.join(&aside), e))?;
        } else {
            set_aside.push((name, aside));
        }
    }
    manifest.shards.extend(new);
    // Shards in plan order, whatever order the workers finished in.
    let position = |f: &str| plan.shards.iter().position(|s| s.file == f);
    manifest.shards.sort_by_key(|s| position(&s.file));
    manifest.quantized = plan.quantized.as_ref().map(|q| QuantizedOutput {
        scheme: q.scheme,
        tensors: q.tensors,
        bytes_before: q.bytes_before,
        bytes_after: q.bytes_after,
        quality: manifest.quality(),
    });

    let beside = Beside {
        plan: &plan,
        others: &others,
        config: config.as_deref(),
        generated: &generated,
        digest: options.digest,
    };
    commit(dst, &beside, &checked, &mut manifest, cancel)?;
    drop(lock);
    made.keep();
    let mut s = summary(
        dst, false, resumed, &plan, todo_bytes, started, &meter, options, manifest,
    );
    s.set_aside = set_aside;
    s.skipped_files = others.skipped;
    s.copied_as_is = others.copied_as_is;
    Ok(s)
}

fn not_committed(dst: &Path, source: GateError) -> ConvertError {
    ConvertError::NotCommitted {
        dst: dst.to_path_buf(),
        source,
    }
}

/// What a conversion decides before it touches DST: where it may write,
/// the plan and its id, and the other files with a rewritten config.
struct Prepared<'a> {
    rules: ScopeRules<'a>,
    scope: OutputScope,
    plan: Plan,
    source: SourceIdentity,
    id: String,
    others: other::OtherFiles,
    config: Option<String>,
    /// Files made rather than copied (a GGUF LLM's config and tokenizer).
    generated: Vec<(String, String)>,
}

/// The first phase: resolve where the run may write, plan, and choose the
/// other files; a config.json that cannot be rewritten fails here, before
/// anything is written.
fn prepare<'a>(
    ck: &Checkpoint,
    dst: &Path,
    options: &'a ConvertOptions,
) -> Result<Prepared<'a>, ConvertError> {
    let rules = ScopeRules {
        single_file: options.single_file,
        within: options.within.as_deref(),
    };
    let scope = OutputScope::resolve(ck, dst, rules)?;
    let plan = plan_for(ck, options)?;
    let mut source = SourceIdentity::of(ck);
    source.root = Some(scope.root().display().to_string());
    let id = match &options.id_salt {
        None => plan_id(&source, &plan.options),
        Some(salt) => {
            use sha2::{Digest, Sha256};
            let key = format!("{}\n{salt}", plan_id(&source, &plan.options));
            crate::write::shard::hex(&Sha256::digest(key.as_bytes()))
        }
    };
    // A GGUF's folder holds other models, not this one's files: what the
    // output needs beside its shards is made from the header instead.
    let mut others = if options.copy_other_files && ck.format != Format::Gguf {
        other::select(ck, &scope, &options.walk)?
    } else {
        other::OtherFiles::default()
    };
    if plan.quantization.as_ref().is_some_and(|q| q.dequantized) {
        // ModelOpt's quantization config: the output is dense.
        others.files.retain(|f| f.name != "hf_quant_config.json");
    }
    let dtype = options.plan.dtype.filter(|_| options.config_dtype);
    let quantization = plan.quantized.as_ref().and_then(|q| q.config());
    let config = other::rewritten_config(ck, &others, dtype, quantization.as_ref())?;
    let generated = super::gguf::generated_files(ck, &plan)?;
    others.skipped.extend(generated.skipped);
    Ok(Prepared {
        rules,
        scope,
        plan,
        source,
        id,
        others,
        config,
        generated: generated.files,
    })
}

/// The shard phase: the shards a run still has to write, recorded one by
/// one in the partial manifest as they are committed.
struct Shards<'a> {
    ck: &'a Checkpoint,
    dst: &'a Path,
    plan: &'a Plan,
    options: &'a ConvertOptions,
    pool: &'a WindowPool,
    reporter: &'a dyn Reporter,
    cancel: &'a AtomicBool,
}

impl Shards<'_> {
    /// Writes every shard `manifest` does not hold yet; returns their
    /// records and the source bytes read. When `before_commit` refuses
    /// afterwards, the new shards are removed again.
    fn write(
        &self,
        manifest: &Manifest,
        lock: &DstLock,
        before_commit: BeforeCommit,
    ) -> Result<(Vec<ShardRecord>, u64), ConvertError> {
        let Shards {
            ck,
            dst,
            plan,
            options,
            pool,
            reporter,
            cancel,
        } = *self;
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
        let new = exec::execute(ck, plan, dst, pool, &exec_options, reporter);
        reporter.finish();
        let new = new?;
        ck.check_unchanged()?;
        if let Err(source) = before_commit() {
            let partial = progress
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            dst::forget(dst, &partial, &new, lock)?;
            return Err(not_committed(dst, source));
        }
        Ok((new, todo_bytes))
    }
}

/// What a run writes beside the shards: the other files (config.json as
/// rewritten), the generated files and the index.
struct Beside<'a> {
    plan: &'a Plan,
    others: &'a other::OtherFiles,
    config: Option<&'a str>,
    generated: &'a [(String, String)],
    digest: DigestAlgo,
}

impl Beside<'_> {
    /// Every name written beside the shards.
    fn names(&self) -> Vec<String> {
        self.others
            .files
            .iter()
            .map(|f| f.name.clone())
            .chain(self.generated.iter().map(|(n, _)| n.clone()))
            .chain(self.plan.index_file.clone())
            .collect()
    }

    /// The size and digest of the bytes about to be written as `name`
    /// (read from the source for a copied file); `None` if unreadable.
    fn new_bytes(&self, name: &str) -> Option<(u64, ShardDigest)> {
        let of = |bytes: &[u8]| {
            let mut h = ShardHasher::new(self.digest);
            h.update(bytes);
            Some((bytes.len() as u64, h.finish()))
        };
        if let Some((_, text)) = self.generated.iter().find(|(n, _)| n == name) {
            return of(text.as_bytes());
        }
        if self.plan.index_file.as_deref() == Some(name) {
            return of(&crate::write::format::of_plan(self.plan).index_bytes(self.plan));
        }
        if let (Some(text), "config.json") = (self.config, name) {
            return of(text.as_bytes());
        }
        let f = self.others.files.iter().find(|f| f.name == name)?;
        let digest = crate::write::digest::digest_file(&f.path, self.digest).ok()?;
        Some((f.size, digest))
    }
}

/// The commit phase: the other files, then the index and the manifest,
/// which make the output whole. Every file written beside the shards is
/// recorded with its size and digest as written; only the `checked` names
/// are written over.
fn commit(
    dst: &Path,
    beside: &Beside<'_>,
    checked: &std::collections::BTreeSet<String>,
    manifest: &mut Manifest,
    cancel: &AtomicBool,
) -> Result<(), ConvertError> {
    let Beside {
        plan,
        others,
        config,
        generated,
        digest,
    } = *beside;
    let how = |name: &str| Publish::after_check(checked.contains(name));
    manifest.copied_files =
        other::copy(&others.files, dst, config, cancel, &|n| checked.contains(n))?;
    for (name, text) in generated {
        write_atomic_as(dst, name, text.as_bytes(), how(name))?;
        manifest.copied_files.push(name.clone());
    }
    manifest.copied_sources = other::records(&others.files);
    sync_dir(dst)?;
    if let Some(index) = &plan.index_file {
        write_atomic_as(
            dst,
            index,
            &crate::write::format::of_plan(plan).index_bytes(plan),
            how(index),
        )?;
    }
    let written = manifest.copied_files.iter().chain(&plan.index_file);
    manifest.files = other::file_records(dst, written, digest)?;
    write_atomic_as(dst, MANIFEST, &manifest.to_json(), how(MANIFEST))?;
    let _ = std::fs::remove_file(dst.join(PARTIAL));
    sync_dir(dst)?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn summary(
    dst: &Path,
    up_to_date: bool,
    resumed: usize,
    plan: &Plan,
    bytes_read: u64,
    started: Instant,
    meter: &PeakMeter<'_>,
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
        peak_buffer_bytes: meter.peak(),
        window: options.window,
        skipped_files: Vec::new(),
        copied_as_is: Vec::new(),
        set_aside: Vec::new(),
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
