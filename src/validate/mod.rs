//! `validate`: prove that a checkpoint is intact and that it loads, on a
//! given device, within a given memory commit budget.
//!
//! The steps, in the order [`validate`] runs them:
//!
//! 1. Integrity ([`integrity`]): headers (via [`crate::format::open`]), the
//!    index maps every tensor exactly once, and, when `reshard.json` is
//!    present, every shard's sha256 and every tensor's xxh3 match it. The
//!    hashes are computed on the bytes as step 2 streams them: each file is
//!    read once.
//! 2. Load ([`own`]): shard by shard in layer order, every tensor goes
//!    through one bounded staging buffer into a device allocation
//!    ([`device`]: the CPU stand-in or CUDA), is read back and compared. Or, with
//!    [`ValidateOptions::emulate`], another loader's mapping pattern is
//!    reproduced instead ([`emulate`]).
//! 3. Commit ([`ledger`]): the process's commit charge is sampled at every
//!    allocation and mapping; [`budget`] enforces a budget for real by
//!    running the load in a child process under a commit limit
//!    ([`crate::platform::CommitLimit`]: `RLIMIT_DATA`, or a Job Object).
//! 4. Against ([`against`]): every tensor equals the source's, bit for bit
//!    or as the documented cast of it.
//!
//! The files form layers, each using only those below it: [`ledger`],
//! [`options`] and [`report`] (plain data) at the bottom; [`device`] and
//! [`integrity`] in the middle; the ways of loading ([`own`], [`emulate`],
//! [`against`], and a real loader in the user's Python, [`python`]) and the
//! budget child ([`budget`]) on top, and this file,
//! which runs them in order. `scripts/check-architecture.py` keeps it so.
//!
//! A check that ran and failed is a [`Failure`] in the report (exit 1 at the
//! CLI); a check that could not run is a [`ValidateError`] (exit 2). Nothing
//! here prints.

// Bottom layer: plain data, depending on nothing above it.
pub mod ledger;
pub mod options;
pub mod report;
// Middle: what a load checks, and where it puts tensors.
pub mod device;
pub mod integrity;
// Top: the ways of loading, each over the same ledger, and the budget child.
pub mod against;
pub mod budget;
pub mod emulate;
pub mod own;
pub mod python;

use std::path::{Path, PathBuf};

use crate::format::{self, FormatError};
use crate::write::manifest::{Manifest, ManifestError, MANIFEST};

pub use self::budget::validate_with_budget;
pub use self::ledger::{CommitFigures, CommitLedger};
pub use self::options::{DeviceSpec, Loader, ValidateOptions, DEFAULT_STAGING};
pub use self::report::{Failure, ShardTiming, ValidateReport};

/// Why validation could not run (as opposed to a check that failed).
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("no CUDA driver found (libcuda could not be loaded); use --device cpu")]
    NoCudaDriver,
    #[error("the CUDA driver supports CUDA {version}; reshard needs {minimum} or newer (update the NVIDIA driver)")]
    CudaDriverTooOld { version: String, minimum: String },
    #[error("CUDA device {ordinal} does not exist ({count} found)")]
    NoSuchCudaDevice { ordinal: usize, count: usize },
    #[error("CUDA: {reason}")]
    Cuda { reason: String },
    #[error("--emulate reshard: reshard's own loader is validate without --emulate")]
    EmulateReshard,
    #[error("--emulate {loader} reads safetensors files only; {} is {format}", .path.display())]
    EmulateNeedsSafetensors {
        loader: Loader,
        path: PathBuf,
        format: format::Format,
    },
    #[error("--against {}: cannot compare", .path.display())]
    Against {
        path: PathBuf,
        #[source]
        source: Box<ValidateError>,
    },
    #[error("cannot cast {tensor:?} from {from} to {to} to compare it")]
    Cast {
        tensor: String,
        from: format::Dtype,
        to: format::Dtype,
    },
    #[error(transparent)]
    Quant(#[from] crate::format::quant::QuantError),
    #[error(transparent)]
    Dequant(#[from] crate::cast::dequant::DequantError),
    #[error("the budget child process failed: {reason}")]
    Child { reason: String },
    #[error("cannot {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Validates the checkpoint at `path` in this process. A commit budget in
/// `options` is reported against, not enforced: use
/// [`validate_with_budget`] for that.
pub fn validate(path: &Path, options: &ValidateOptions) -> Result<ValidateReport, ValidateError> {
    let mut ledger = CommitLedger::start();
    run(path, options, &mut ledger, |ledger| {
        ledger.rebase();
        Ok(())
    })
}

/// The whole validation, shared by [`validate`] and the budget child.
/// `before_load` runs once the checkpoint is open and the device is ready,
/// just before the first byte is loaded: the child takes its baseline and
/// sets its limit there.
pub(crate) fn run(
    path: &Path,
    options: &ValidateOptions,
    ledger: &mut CommitLedger,
    before_load: impl FnOnce(&mut CommitLedger) -> Result<(), ValidateError>,
) -> Result<ValidateReport, ValidateError> {
    let mut report = ValidateReport::new(path, options);
    let ck = match format::open(path) {
        Ok(ck) => ck,
        Err(e) => match integrity::failure_of_open_error(&e) {
            Some(failure) => {
                report.fail(failure);
                return Ok(report);
            }
            None => return Err(e.into()),
        },
    };
    let manifest = Manifest::read(&ck.dir.join(MANIFEST))?;
    report.manifest = manifest.is_some();
    report.tensors = ck.tensors.len();
    report.files = ck.files.len();
    let expect = integrity::Expected::new(&ck, manifest.as_ref(), &mut report.failures);
    let order = own::shard_order(&ck);

    match options.emulate {
        Some(Loader::Reshard) => return Err(ValidateError::EmulateReshard),
        Some(loader) => {
            if ck.format != format::Format::Safetensors {
                return Err(ValidateError::EmulateNeedsSafetensors {
                    loader,
                    path: path.to_path_buf(),
                    format: ck.format,
                });
            }
            before_load(ledger)?;
            emulate::run(&ck, &order, loader, &expect, ledger, &mut report)?;
        }
        None => {
            let mut device =
                device::open(options.device, device::staging_len(options.staging, &ck))?;
            report.device = device.info();
            // The load hashes on rayon threads (and cast_parallel may use
            // them): start them before the baseline so their stacks are not
            // counted as load.
            ledger.add_thread_stacks(against::warm_threads());
            before_load(ledger)?;
            own::run(
                &ck,
                &order,
                device.as_mut(),
                options,
                &expect,
                ledger,
                &mut report,
            )?;
        }
    }
    if let Some(src) = &options.against {
        let policy = manifest.as_ref().map(|m| m.options.on_overflow);
        let dropped: Vec<String> = manifest
            .iter()
            .flat_map(|m| m.dropped.iter().map(|d| d.tensor.clone()))
            .collect();
        let result = against::compare(
            &ck,
            src,
            policy,
            &dropped,
            device::staging_len(options.staging, &ck) as u64,
            ledger,
            &mut report,
        );
        result.map_err(|e| ValidateError::Against {
            path: src.clone(),
            source: Box::new(e),
        })?;
    }
    report.commit = Some(ledger.figures());
    report.finish(options);
    Ok(report)
}
