//! Why a conversion stopped.

use std::path::PathBuf;

use crate::exec::ExecError;
use crate::format::FormatError;
use crate::plan::PlanError;
use crate::write::lock::LockError;
use crate::write::manifest::ManifestError;
use crate::write::scope::ScopeError;
use crate::write::WriteError;

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
    #[error("{}: holds files reshard cannot prove it wrote ({names}): edited since reshard wrote them, or never recorded by it; reshard would replace them, so it stops (--overwrite never replaces them); move them away or choose another output folder", .dst.display())]
    WouldReplace { dst: PathBuf, names: String },
    #[error("{}: not enough free space: the conversion needs {} ({needed} bytes) and the file system has {} ({available} bytes) available", .dst.display(), crate::units::human(*.needed), crate::units::human(*.available))]
    NoSpace {
        dst: PathBuf,
        needed: u64,
        available: u64,
    },
    #[error("{}: {reason}", .path.display())]
    Config { path: PathBuf, reason: String },
    #[error(transparent)]
    Split(#[from] super::split::SplitError),
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
    /// A DST that names one file (`NAME.safetensors`) cannot be written.
    #[error("{}: {reason}", .path.display())]
    FileDst { path: PathBuf, reason: String },
    #[error("{}: {name:?} cannot be a name in the output: {reason}; the output must be portable to Windows, so rename it in the source", .path.display())]
    ReservedName {
        path: PathBuf,
        name: String,
        reason: &'static str,
    },
}

/// Why a [`BeforeCommit`] check refused.
pub type GateError = Box<dyn std::error::Error + Send + Sync>;

impl ConvertError {
    /// Whether the conversion stopped at values its target cannot hold
    /// under `--on-overflow error` (a cast's overflow, or values infinite
    /// in an FP8 scheme's working dtype): what `--on-overflow` decides.
    pub fn is_overflow(&self) -> bool {
        use crate::cast::dequant::DequantError;
        use crate::cast::CastError;
        matches!(
            self,
            ConvertError::Exec(
                ExecError::Cast(CastError::Overflow { .. })
                    | ExecError::Dequant(DequantError::NotFinite { .. })
                    | ExecError::Dequant(DequantError::NotFiniteInBlocks { .. })
                    | ExecError::Dequant(DequantError::ScaleOverflow { .. })
            )
        )
    }
}
