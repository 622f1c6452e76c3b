//! Why a checkpoint's quantization cannot be told.

use std::path::PathBuf;

use crate::format::FormatError;

/// Why a checkpoint's quantization cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error(transparent)]
    Read(#[from] FormatError),
    #[error("{}: {reason}", .path.display())]
    BadConfig { path: PathBuf, reason: String },
    #[error("{}: ambiguous quantization: {reason}; reshard does not guess", .path.display())]
    Ambiguous { path: PathBuf, reason: String },
}
