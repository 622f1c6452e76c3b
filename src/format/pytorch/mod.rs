//! PyTorch `.bin` / `.pt` checkpoints (the torch.save zip format), read as
//! data only: a restricted pickle machine that never imports or calls
//! anything, and storages read in place.

use super::{Finding, SourceFile, Tensor};

/// Why a PyTorch file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PytorchError {
    #[error("PyTorch checkpoints are not supported yet")]
    Unsupported,
}

/// Reads the tensors of one torch.save file. `file_index` is stored in each
/// tensor's `file` field.
pub fn read_file(
    _file: &SourceFile,
    _file_index: usize,
) -> Result<(Vec<Tensor>, Vec<Finding>), PytorchError> {
    Err(PytorchError::Unsupported)
}
