//! `batch`: run one job (convert; later fit or validate) over every model
//! under a folder.
//!
//! ```text
//! discover (list models)  ->  part (keep this machine's share)
//!     ->  run_batch (N jobs, one shared WindowPool)  ->  report
//! ```
//!
//! This module owns the list, the scheduling and the per-model outcome. It
//! does not own conversion (that is [`crate::convert`], which already makes
//! each output idempotent, resumable and atomic) and it never prints:
//! progress goes through [`BatchReporter`], results come back as
//! [`ModelResult`] values.
//!
//! Failures are per model: an error in one job becomes that model's `failed`
//! line and the other jobs go on (unless `fail_fast`).
//!
//! `--verify-source` runs beside each job, not before it (see [`verify`]):
//! a conversion is committed only once its source has verified, and a
//! source that fails fails the model whatever the job did.

pub(crate) mod discover;
mod mode;
pub mod part;
pub(crate) mod report;
pub mod select;
pub(crate) mod verify;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::convert::fit::{choose, FitChoiceError, FitTarget};
use crate::convert::{ConvertError, ConvertOptions, ConvertSource, GateError};
use crate::exec::{Reporter, WindowPool};
use crate::fit::machine::Machine;
use crate::fit::{FitError, FitOptions};
use crate::format::discover::resolve_hf_cache;
use crate::format::FormatError;
use crate::validate::{
    validate_sets, validate_with_budget, Progress, ValidateError, ValidateOptions,
};
use crate::write::manifest::{Manifest, MANIFEST};

pub use self::discover::{discover, DiscoverError, Discovery, Model, Skipped};
pub use self::mode::Mode;
pub use self::part::{part_of, BadPart, Balance, Part};
pub use self::report::{
    error_chain, merge, BatchReport, MergeError, MergedReport, ModelResult, Status, Totals,
};
pub use self::select::{plan_parts, Listing, Planned, Selection};
pub use self::verify::{verify_snapshot, Gate, Verified, VerifyError};

/// How to run a batch.
#[derive(Debug, Clone)]
pub struct BatchOptions {
    /// Options of each conversion. `threads` is for the whole batch (each
    /// job gets `threads / jobs`, at least 1); `window` is the shared budget;
    /// `overwrite` also lets jobs write into folders reshard did not write
    /// (never deleting anything it did not write); `within` should be OUT,
    /// so every output must resolve inside it.
    pub convert: ConvertOptions,
    pub mode: Mode,
    /// Models run at once.
    pub jobs: usize,
    /// Check HF cache blobs against their sha256 names alongside each job;
    /// a conversion commits only once they passed.
    pub verify_source: bool,
    /// Start no new job after the first failure.
    pub fail_fast: bool,
    /// The machine `--mode fit` judges against.
    pub fit: Option<FitJob>,
    /// `--mode convert --fit`: each model is converted to the best form
    /// this program reads that fits this machine, as `convert --fit` does.
    pub convert_fit: Option<FitTarget>,
    /// How `--mode validate` loads each output (compared with its source).
    pub validate: Option<ValidateOptions>,
}

/// What `--mode fit` judges each model on; the model is judged as `convert`
/// would write it with the batch's options.
#[derive(Debug, Clone)]
pub struct FitJob {
    pub machine: Machine,
    pub options: FitOptions,
}

/// Why one model's job failed. Each variant forwards its cause's message.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Read(#[from] FormatError),
    #[error(transparent)]
    Verify(#[from] VerifyError),
    #[error(transparent)]
    Convert(#[from] ConvertError),
    #[error("mode {mode} needs its options (BatchOptions::fit or ::validate)")]
    ModeNotWired { mode: Mode },
    #[error(transparent)]
    Fit(#[from] FitError),
    #[error("does not fit: {loaders}")]
    DoesNotFit { loaders: String },
    #[error(transparent)]
    FitChoice(#[from] FitChoiceError),
    #[error("not converted: {reason}")]
    NothingFits { reason: String },
    #[error(transparent)]
    Validate(#[from] ValidateError),
    #[error("validation failed: {failures}")]
    Invalid { failures: String },
    #[error("the source verification stopped unexpectedly")]
    VerifyPanicked,
}

/// What a job that succeeded did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub status: Status,
    pub bytes: u64,
    pub resumed_shards: usize,
    /// What the user should hear about (other files not copied, and why).
    pub notes: Vec<String>,
}

/// Receives progress from a running batch (the CLI draws bars with it).
pub trait BatchReporter: Sync {
    /// A job starts on `model`; its conversion or its validation reports
    /// through the result (shared: a validation's load holds it as its
    /// [`Progress`], and a budget child's progress is relayed to it).
    fn model_started(&self, model: &Model) -> Arc<dyn Reporter + Send>;
    /// A model is done (or skipped).
    fn model_done(&self, _result: &ModelResult) {}
}

/// A [`BatchReporter`] that ignores everything.
pub struct NoBatchReport;

impl BatchReporter for NoBatchReport {
    fn model_started(&self, _model: &Model) -> Arc<dyn Reporter + Send> {
        Arc::new(crate::exec::NoReport)
    }
}

/// What every job shares.
pub struct JobContext<'a> {
    /// Conversion options with this job's thread share.
    pub convert: &'a ConvertOptions,
    /// The one pool of window buffers for the whole process.
    pub pool: &'a WindowPool,
    pub verify_source: bool,
    pub cancel: &'a AtomicBool,
    pub fit: Option<&'a FitJob>,
    pub convert_fit: Option<&'a FitTarget>,
    pub validate: Option<&'a ValidateOptions>,
}

/// Why a batch could not run at all (a model that fails is a result in
/// the report, not an error).
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("cannot write the report {}", .path.display())]
    ReportPath {
        path: std::path::PathBuf,
        #[source]
        source: crate::write::scope::ScopeError,
    },
    #[error("cannot write the report {}", .path.display())]
    Report {
        path: std::path::PathBuf,
        #[source]
        source: crate::write::WriteError,
    },
}

/// `reshard batch` without `--dry-run`: runs `options.mode` on this part
/// of `selection` and returns the report, written to `report` too when
/// given. The report path is checked first, against every model found (not
/// only this part's): it may not land on any source.
pub fn run(
    selection: &Selection,
    options: &BatchOptions,
    report: Option<&Path>,
    pool: &WindowPool,
    reporter: &dyn BatchReporter,
    cancel: &AtomicBool,
) -> Result<BatchReport, BatchError> {
    let started = selection.started;
    if let Some(path) = report {
        let mut sources = crate::write::scope::SourceSet::default();
        for m in &selection.found.models {
            sources.add_model(&m.source);
        }
        crate::write::scope::check_report(path, &sources).map_err(|source| {
            BatchError::ReportPath {
                path: path.to_path_buf(),
                source,
            }
        })?;
    }
    let part = selection.part;
    let models: Vec<Model> = selection.mine().iter().map(|(m, _)| (*m).clone()).collect();
    let mut results = run_batch(&models, part.index, options, pool, reporter, cancel);
    let skipped = selection.skipped();
    results.extend(skipped.iter().map(|s| skipped_result(s, part.count)));
    results.sort_by(|a, b| a.name.cmp(&b.name));
    let batch = BatchReport {
        reshard_version: env!("CARGO_PKG_VERSION").to_string(),
        root: selection.root.display().to_string(),
        out: selection.out.display().to_string(),
        mode: options.mode,
        part,
        balance: selection.balance,
        jobs: options.jobs,
        window: pool.budget(),
        peak_buffer_bytes: pool.peak(),
        seconds: started.elapsed().as_secs_f64(),
        totals: BatchReport::count(&results),
        models: results,
    };
    if let Some(path) = report {
        batch.write(path).map_err(|source| BatchError::Report {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(batch)
}

/// Runs `models`, `options.jobs` at a time, all drawing buffers from `pool`.
/// `part` is the part (of `--part I/N`) the models were assigned to; each
/// result records it. Results come back in the order of `models`.
pub fn run_batch(
    models: &[Model],
    part: u64,
    options: &BatchOptions,
    pool: &WindowPool,
    reporter: &dyn BatchReporter,
    cancel: &AtomicBool,
) -> Vec<ModelResult> {
    let jobs = options.jobs.clamp(1, models.len().max(1));
    let mut per_job = options.convert.clone();
    per_job.threads = (options.convert.threads / jobs).max(1);
    let ctx = JobContext {
        convert: &per_job,
        pool,
        verify_source: options.verify_source,
        cancel,
        fit: options.fit.as_ref(),
        convert_fit: options.convert_fit.as_ref(),
        validate: options.validate.as_ref(),
    };
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Mutex<Vec<Option<ModelResult>>> = Mutex::new(vec![None; models.len()]);
    let worker = || loop {
        let i = next.fetch_add(1, Ordering::SeqCst);
        let Some(model) = models.get(i) else { break };
        let result = if cancel.load(Ordering::SeqCst) {
            not_run(model, part, "interrupted before it started")
        } else if stop.load(Ordering::SeqCst) {
            not_run(
                model,
                part,
                "not started: an earlier model failed (--fail-fast)",
            )
        } else {
            let job_reporter = reporter.model_started(model);
            run_model(model, part, options.mode, &ctx, &job_reporter)
        };
        if result.status == Status::Failed && options.fail_fast {
            stop.store(true, Ordering::SeqCst);
        }
        reporter.model_done(&result);
        results
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[i] = Some(result);
    };
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(worker);
        }
    });
    let results = results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    results
        .into_iter()
        .zip(models)
        .map(|(r, m)| r.unwrap_or_else(|| not_run(m, part, "job did not report")))
        .collect()
}

/// One model's job: run `mode`, and if asked verify the source on other
/// threads at the same time. Never fails: an error becomes the result's
/// `failed` status and reason; a failed verification is the reason whatever
/// the job did (a conversion waits for it and is not committed).
///
/// `fit` and `validate` need their options in [`BatchOptions`]; without
/// them the model fails with [`mode_not_wired`].
pub fn run_model(
    model: &Model,
    part: u64,
    mode: Mode,
    ctx: &JobContext,
    reporter: &Arc<dyn Reporter + Send>,
) -> ModelResult {
    let started = Instant::now();
    let gate = Gate::default();
    let (outcome, verified) = std::thread::scope(|s| {
        let verifying = ctx.verify_source.then(|| {
            s.spawn(|| {
                let _fail = gate.fail_on_drop();
                let started = Instant::now();
                let result = verify_model_source(model, ctx.convert.threads, ctx.cancel);
                gate.open(result.is_ok());
                result.map(|v| (v, started.elapsed()))
            })
        });
        let outcome = run_mode(
            model,
            mode,
            ctx,
            reporter,
            verifying.as_ref().map(|_| &gate),
        );
        let verified = verifying.map(|h| {
            gate.wait();
            h.join().unwrap_or(Err(ModelError::VerifyPanicked))
        });
        (outcome, verified)
    });
    let mut verify = None;
    let outcome = match verified {
        Some(Err(e)) => Err(e),
        Some(Ok((v, took))) => {
            verify = Some(VerifyRecord {
                files: v.files,
                seconds: took.as_secs_f64(),
                waited_seconds: gate.waited().as_secs_f64(),
            });
            outcome
        }
        None => outcome,
    };
    let (status, reason, bytes, resumed_shards, notes) = match outcome {
        Ok(o) => (o.status, None, o.bytes, o.resumed_shards, o.notes),
        Err(e) => (Status::Failed, Some(error_chain(&e)), 0, 0, Vec::new()),
    };
    ModelResult {
        name: model.name.clone(),
        source: model.source.display().to_string(),
        output: model.output.display().to_string(),
        part,
        status,
        reason,
        bytes,
        resumed_shards,
        verified_files: verify.map(|v| v.files),
        verify_seconds: verify.map(|v| v.seconds),
        verify_waited_seconds: verify.map(|v| v.waited_seconds),
        notes,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// A verification that passed, as the result records it.
#[derive(Debug, Clone, Copy)]
struct VerifyRecord {
    files: usize,
    seconds: f64,
    waited_seconds: f64,
}

/// `mode`'s own work on one model; a conversion waits on `gate` (the
/// source verification, if one runs) before it commits.
fn run_mode(
    model: &Model,
    mode: Mode,
    ctx: &JobContext,
    reporter: &Arc<dyn Reporter + Send>,
    gate: Option<&Gate>,
) -> Result<Outcome, ModelError> {
    match mode {
        Mode::Convert => match ctx.convert_fit {
            Some(target) => fit_convert_model(model, target, ctx, reporter.as_ref(), gate),
            None => convert_model(model, ctx, reporter.as_ref(), gate),
        },
        Mode::Fit => match ctx.fit {
            Some(job) => fit_model(model, job, ctx),
            None => mode_not_wired(mode),
        },
        Mode::Validate => match ctx.validate {
            Some(options) => validate_model(model, options, Progress::new(reporter.clone())),
            None => mode_not_wired(mode),
        },
    }
}

/// The placeholder for modes other engineers are building (`fit`,
/// `validate`): always an error naming the mode.
pub fn mode_not_wired(mode: Mode) -> Result<Outcome, ModelError> {
    Err(ModelError::ModeNotWired { mode })
}

/// Converts one model into its output folder through the shared pool, as
/// `convert` converts it ([`ConvertSource`]: a sentence-transformers model
/// or a diffusers pipeline weight set by weight set, with the rest of its
/// tree), committing each folder only once `gate` (if any) has opened as
/// passed.
pub fn convert_model(
    model: &Model,
    ctx: &JobContext,
    reporter: &dyn Reporter,
    gate: Option<&Gate>,
) -> Result<Outcome, ModelError> {
    convert_with(model, ctx.convert, ctx, reporter, gate)
}

/// `--mode convert --fit` for one model: the choice `convert --fit` makes
/// ([`crate::convert::fit::choose`]), converted into the model's output
/// folder (a GGUF form as a folder holding the `.gguf`, a program that
/// loads one file as a folder holding one shard); a model nothing fits
/// fails with fit's reason and nothing is written.
pub fn fit_convert_model(
    model: &Model,
    target: &FitTarget,
    ctx: &JobContext,
    reporter: &dyn Reporter,
    gate: Option<&Gate>,
) -> Result<Outcome, ModelError> {
    let choice = choose(&model.source, target)?;
    let Some(options) = choice.apply(ctx.convert) else {
        return Err(ModelError::NothingFits {
            reason: choice.nothing_fits(),
        });
    };
    let mut outcome = convert_with(model, &options, ctx, reporter, gate)?;
    if let Some(reason) = choice.reason {
        outcome.notes.insert(0, format!("fit: {reason}"));
    }
    Ok(outcome)
}

/// Converts one model with `options` (this job's thread share).
fn convert_with(
    model: &Model,
    options: &ConvertOptions,
    ctx: &JobContext,
    reporter: &dyn Reporter,
    gate: Option<&Gate>,
) -> Result<Outcome, ModelError> {
    let source = ConvertSource::open(&model.source)?;
    let mut options = options.clone();
    options.overwrite |= converted_from(&model.output, &model.source);
    // DST lies under OUT, never beside a file source.
    options.single_file = false;
    let before_commit = || -> Result<(), GateError> {
        match gate {
            Some(gate) if !gate.wait() => Err("the source failed --verify-source".into()),
            _ => Ok(()),
        }
    };
    let summary = source.convert(
        &model.output,
        &options,
        ctx.pool,
        reporter,
        ctx.cancel,
        &before_commit,
    )?;
    let all = std::iter::once(("", &summary)).chain(
        summary
            .components
            .iter()
            .map(|c| (c.path.as_str(), &c.summary)),
    );
    let mut notes = Vec::new();
    for (folder, s) in all.clone() {
        let prefix = if folder.is_empty() {
            String::new()
        } else {
            format!("{folder}/")
        };
        notes.extend(s.skipped_files.iter().map(|f| {
            format!(
                "not copied: {:?}: {}",
                format!("{prefix}{}", f.name),
                f.reason
            )
        }));
        notes.extend(s.set_aside.iter().map(|(name, to)| {
            format!("moved aside: {:?} to {:?}: a manifest found in the output claimed it, but its bytes are not what it recorded", format!("{prefix}{name}"), format!("{prefix}{to}"))
        }));
    }
    Ok(Outcome {
        status: if all.clone().all(|(_, s)| s.up_to_date) {
            Status::UpToDate
        } else {
            Status::Converted
        },
        bytes: all.clone().map(|(_, s)| s.bytes_written).sum(),
        resumed_shards: all.map(|(_, s)| s.resumed_shards).sum(),
        notes,
    })
}

/// `--mode fit` for one model: judged as the batch's options would convert
/// it; a loader that does not fit fails the model, naming the shortfall.
pub fn fit_model(model: &Model, job: &FitJob, ctx: &JobContext) -> Result<Outcome, ModelError> {
    // A pipeline or sentence-transformers model as `fit` judges it: all
    // its weight sets together.
    let (ck, _) = crate::format::layout::open_as_loaded(&model.source)?;
    let mut options = job.options.clone();
    options.what_if = Some(ctx.convert.plan.clone());
    options.path = model.source.display().to_string();
    let report = crate::fit::fit(&ck, job.machine.clone(), &options)?;
    if report.fits {
        return Ok(Outcome {
            status: Status::Passed,
            bytes: ck.total_bytes(),
            resumed_shards: 0,
            notes: Vec::new(),
        });
    }
    let judged = report.what_if.as_ref().unwrap_or(&report.today);
    let loaders = judged
        .loaders
        .iter()
        .filter(|l| !l.fits)
        .map(|l| {
            let short = l.host_shortfall.max(l.vram_shortfall);
            format!("{} short by {}", l.loader, crate::units::human(short))
        })
        .collect::<Vec<_>>()
        .join(", ");
    Err(ModelError::DoesNotFit { loaders })
}

/// `--mode validate` for one model: loads its output and compares every
/// tensor with its source (a pipeline or sentence-transformers output
/// weight set by weight set, each against its own source folder, as
/// `validate` does); any failed check fails the model. The bytes read are
/// reported on `progress` (the job's bar), as `validate` draws its own.
pub fn validate_model(
    model: &Model,
    options: &ValidateOptions,
    progress: Progress,
) -> Result<Outcome, ModelError> {
    let mut options = options.clone();
    options.against = Some(model.source.clone());
    options.progress = progress;
    let reports = match validate_sets(&model.output, &options)? {
        Some((_, sets)) => sets
            .into_iter()
            .map(|s| (format!("{}: ", s.component), s.report))
            .collect(),
        None => vec![(
            String::new(),
            validate_with_budget(&model.output, &options)?,
        )],
    };
    let failures: Vec<String> = reports
        .iter()
        .flat_map(|(set, r)| r.failures.iter().map(move |f| format!("{set}{f}")))
        .collect();
    if reports.iter().all(|(_, r)| r.passed) {
        return Ok(Outcome {
            status: Status::Passed,
            bytes: reports.iter().map(|(_, r)| r.bytes_loaded).sum(),
            resumed_shards: 0,
            notes: Vec::new(),
        });
    }
    Err(ModelError::Invalid {
        failures: failures.join("; "),
    })
}

/// True if `dst/reshard.json` records a conversion of this same source (its
/// real model root). Batch replaces such an output by itself when the
/// source's files or the options changed; anything else (another source's
/// conversion, a manifest from before roots were recorded, a folder of
/// anyone else's files) needs `--overwrite`. An unfinished run of reshard's
/// own is resumed or restarted by `convert` without it.
pub fn converted_from(dst: &Path, source: &Path) -> bool {
    let Ok(Some(manifest)) = Manifest::read(&dst.join(MANIFEST)) else {
        return false;
    };
    let Ok(real) = crate::platform::canonicalize(source) else {
        return false;
    };
    let root = crate::format::discover::resolve_hf_cache(source)
        .ok()
        .and_then(|d| crate::platform::canonicalize(&d).ok())
        .map_or(real, |d| crate::write::scope::model_root(&d));
    manifest.source.root.as_deref() == Some(root.display().to_string().as_str())
}

/// `--verify-source` for one model: its HF cache snapshot's blobs, on up
/// to `threads` threads. Folders outside the cache have nothing to check
/// against (0 files).
pub fn verify_model_source(
    model: &Model,
    threads: usize,
    cancel: &AtomicBool,
) -> Result<Verified, ModelError> {
    if !model.hf_cache {
        return Ok(Verified::default());
    }
    let snapshot = resolve_hf_cache(&model.source)?;
    Ok(verify_snapshot(&snapshot, threads, cancel)?)
}

/// The result line of a discovery skip.
pub fn skipped_result(s: &Skipped, part_count: u64) -> ModelResult {
    ModelResult {
        name: s.name.clone(),
        source: s.path.display().to_string(),
        output: String::new(),
        part: part_of(&s.name, part_count),
        status: Status::Skipped,
        reason: Some(s.reason.clone()),
        bytes: 0,
        resumed_shards: 0,
        verified_files: None,
        verify_seconds: None,
        verify_waited_seconds: None,
        notes: Vec::new(),
        seconds: 0.0,
    }
}

fn not_run(model: &Model, part: u64, reason: &str) -> ModelResult {
    ModelResult {
        name: model.name.clone(),
        source: model.source.display().to_string(),
        output: model.output.display().to_string(),
        part,
        status: Status::Skipped,
        reason: Some(reason.to_string()),
        bytes: 0,
        resumed_shards: 0,
        verified_files: None,
        verify_seconds: None,
        verify_waited_seconds: None,
        notes: Vec::new(),
        seconds: 0.0,
    }
}

#[cfg(test)]
mod tests;
