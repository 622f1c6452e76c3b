//! Why a validation could not run (a failed check is a report, not an
//! error).

use std::path::PathBuf;

use super::options::Loader;
use crate::format::{self, FormatError};
use crate::write::manifest::ManifestError;

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
    Quant(#[from] crate::quant::QuantError),
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(transparent)]
    Dequant(#[from] crate::cast::dequant::DequantError),
    #[error("the budget child process failed: {reason}")]
    Child { reason: String },
    #[error("{}: the file is {len} bytes but its header describes {expected}: it was truncated or changed during the validation", .path.display())]
    Truncated {
        path: PathBuf,
        len: u64,
        expected: u64,
    },
    #[error("validation of {} interrupted", .path.display())]
    Interrupted { path: PathBuf },
    #[error("cannot {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}
