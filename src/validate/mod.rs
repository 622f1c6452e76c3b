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
//! 2. Load ([`load`]): shard by shard in layer order, every tensor goes
//!    through one bounded staging buffer into a device allocation
//!    ([`cpu`] or [`cuda`]), is read back and compared. Or, with
//!    [`ValidateOptions::emulate`], another loader's mapping pattern is
//!    reproduced instead ([`emulate`]).
//! 3. Commit ([`ledger`]): the process's commit charge is sampled at every
//!    allocation and mapping; [`budget`] enforces a budget for real by
//!    running the load in a child process under `RLIMIT_DATA`.
//! 4. Against ([`against`]): every tensor equals the source's, bit for bit
//!    or as the documented cast of it.
//!
//! A check that ran and failed is a [`Failure`] in the report (exit 1 at the
//! CLI); a check that could not run is a [`ValidateError`] (exit 2). Nothing
//! here prints.

pub mod against;
pub mod budget;
pub mod cpu;
pub mod cuda;
pub mod emulate;
pub mod integrity;
pub mod ledger;
pub mod load;
pub mod report;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::format::{self, FormatError};
use crate::write::manifest::{Manifest, ManifestError, MANIFEST};

pub use self::budget::validate_with_budget;
pub use self::emulate::Loader;
pub use self::ledger::{CommitFigures, CommitLedger};
pub use self::report::{Failure, ShardTiming, ValidateReport};

/// Default size of the one staging buffer every byte goes through.
pub const DEFAULT_STAGING: u64 = 64 << 20;

/// Which device the load step puts tensors on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "ordinal")]
pub enum DeviceSpec {
    /// Host memory (`Vec<u8>`) standing in for device memory.
    #[default]
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceSpec::Cuda(n)),
                _ => Err(format!("invalid device {s:?}: use cpu, cuda or cuda:N")),
            },
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// What to check and how. Serde so the budget child receives it as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidateOptions {
    pub device: DeviceSpec,
    /// Size of the staging buffer (capped at the largest tensor).
    pub staging: u64,
    /// Device bytes the load may hold in total, counted cumulatively as a
    /// GPU would hold them.
    pub vram_budget: Option<u64>,
    /// Commit the load may add above its baseline. [`validate`] only
    /// measures and reports against it; [`validate_with_budget`] enforces it.
    pub commit_budget: Option<u64>,
    /// A source checkpoint every tensor is compared with.
    pub against: Option<PathBuf>,
    /// Reproduce another loader's mapping pattern instead of loading.
    pub emulate: Option<Loader>,
}

impl Default for ValidateOptions {
    fn default() -> Self {
        ValidateOptions {
            device: DeviceSpec::Cpu,
            staging: DEFAULT_STAGING,
            vram_budget: None,
            commit_budget: None,
            against: None,
            emulate: None,
        }
    }
}

/// Why validation could not run (as opposed to a check that failed).
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("no CUDA driver found (libcuda could not be loaded); use --device cpu")]
    NoCudaDriver,
    #[error("CUDA device {ordinal} does not exist ({count} found)")]
    NoSuchCudaDevice { ordinal: usize, count: usize },
    #[error("CUDA: {reason}")]
    Cuda { reason: String },
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
    let order = load::shard_order(&ck);

    match options.emulate {
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
            let mut device = load::open_device(options.device, options.staging, &ck)?;
            report.device = device.info();
            if options.against.is_some() {
                // cast_parallel may use rayon: start its threads before the
                // baseline so their stacks are not counted as load.
                ledger.add_thread_stacks(against::warm_threads());
            }
            before_load(ledger)?;
            load::run(
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
            load::staging_len(options.staging, &ck) as u64,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("CUDA:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            assert!(bad.parse::<DeviceSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn options_round_trip_as_json() {
        let o = ValidateOptions {
            device: DeviceSpec::Cuda(1),
            commit_budget: Some(5),
            emulate: Some(Loader::PerShardMmap),
            against: Some(PathBuf::from("/src")),
            ..ValidateOptions::default()
        };
        let back: ValidateOptions =
            serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }
}
