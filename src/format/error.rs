//! The errors of reading a checkpoint. Each variant names the file and, where
//! one is involved, the tensor, so a message alone tells the user what to fix.

use std::io;
use std::path::{Path, PathBuf};

use super::Dtype;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("cannot read {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: no such file or folder", .path.display())]
    NotFound { path: PathBuf },
    #[error("{}: no checkpoint found (no *.safetensors, *.bin or *.pt weights, no index)", .path.display())]
    NoCheckpoint { path: PathBuf },
    #[error("{}: {reason}", .path.display())]
    BadLayout { path: PathBuf, reason: String },
    #[error("{}: is {kind}, not a regular file; reshard reads only regular files", .path.display())]
    NotRegularFile { path: PathBuf, kind: &'static str },
    #[error("{}: {len} bytes is more than the {max}-byte limit for this file", .path.display())]
    FileTooLarge { path: PathBuf, len: u64, max: u64 },
    #[error("{}: not valid UTF-8", .path.display())]
    NotUtf8 { path: PathBuf },
    #[error("{}: out of memory reserving {bytes} bytes", .path.display())]
    OutOfMemory { path: PathBuf, bytes: u64 },
    #[error("{}: symlink loop or cycle in a Hugging Face cache folder", .path.display())]
    SymlinkLoop { path: PathBuf },
    #[error("{}: refs/main names revision {revision:?} but snapshots/{revision} does not exist", .path.display())]
    MissingSnapshot { path: PathBuf, revision: String },

    #[error("{}: file is {len} bytes, too short for a safetensors header (need at least 8)", .path.display())]
    FileTooSmall { path: PathBuf, len: u64 },
    #[error("{}: header length {len} is larger than the limit of {max} bytes", .path.display())]
    HeaderTooLarge { path: PathBuf, len: u64, max: u64 },
    #[error("{}: header length {len} runs past the end of the {file_len}-byte file", .path.display())]
    HeaderPastEnd {
        path: PathBuf,
        len: u64,
        file_len: u64,
    },
    #[error("{}: header is not valid UTF-8", .path.display())]
    HeaderNotUtf8 { path: PathBuf },
    #[error("{}: header is not valid JSON: {reason}", .path.display())]
    HeaderNotJson { path: PathBuf, reason: String },
    #[error("{}: header is not a JSON object", .path.display())]
    HeaderNotObject { path: PathBuf },
    #[error("{}: tensor {tensor:?}: {reason}", .path.display())]
    BadTensorEntry {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("{}: tensor {tensor:?}: unknown dtype {dtype:?}", .path.display())]
    UnknownDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{}: tensor {tensor:?}: shape {shape} is not a list of non-negative integers", .path.display())]
    BadShape {
        path: PathBuf,
        tensor: String,
        shape: String,
    },
    #[error("{}: tensor {tensor:?}: shape has {dims} dimensions, more than the {max} any real checkpoint uses", .path.display())]
    TooManyDims {
        path: PathBuf,
        tensor: String,
        dims: u64,
        max: usize,
    },
    #[error("{}: more than {max} tensors, more than any real checkpoint holds", .path.display())]
    TooManyTensors { path: PathBuf, max: usize },
    #[error("{}: tensor {tensor:?}: shape {shape:?} of {dtype} needs {expected} bytes but its offsets span {actual}", .path.display())]
    ByteLenMismatch {
        path: PathBuf,
        tensor: String,
        dtype: Dtype,
        shape: Vec<u64>,
        expected: String,
        actual: u64,
    },
    #[error("{}: tensor {tensor:?}: data offsets [{begin}, {end}] end before they begin", .path.display())]
    OffsetsOutOfOrder {
        path: PathBuf,
        tensor: String,
        begin: u64,
        end: u64,
    },
    #[error("{}: tensor {tensor:?} overlaps tensor {other:?}", .path.display())]
    OffsetsOverlap {
        path: PathBuf,
        tensor: String,
        other: String,
    },
    #[error("{}: {len} unused bytes before tensor {tensor:?} at data offset {at}", .path.display())]
    OffsetsHole {
        path: PathBuf,
        tensor: String,
        at: u64,
        len: u64,
    },
    #[error("{}: tensor name {tensor:?} is refused: {reason}", .path.display())]
    BadTensorName {
        path: PathBuf,
        tensor: String,
        reason: &'static str,
    },
    #[error("{}: tensor {tensor:?} appears twice", .path.display())]
    DuplicateTensor { path: PathBuf, tensor: String },
    #[error("{}: __metadata__ key {key:?}: {reason}", .path.display())]
    BadMetadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{}: truncated: header and data need {expected} bytes but the file has {actual}{}", .path.display(), last_tensor_note(.tensor))]
    Truncated {
        path: PathBuf,
        expected: u64,
        actual: u64,
        tensor: Option<String>,
    },
    #[error("{}: {extra} trailing bytes after the last tensor's data", .path.display())]
    TrailingBytes { path: PathBuf, extra: u64 },

    #[error("{}: index is not valid JSON: {reason}", .path.display())]
    IndexNotJson { path: PathBuf, reason: String },
    #[error("{}: index has no \"weight_map\" object", .path.display())]
    IndexMissingWeightMap { path: PathBuf },
    #[error("{}: tensor {tensor:?} is mapped to {file:?}, which does not exist", .path.display())]
    IndexMissingFile {
        path: PathBuf,
        tensor: String,
        file: String,
    },
    #[error("{}: tensor {tensor:?} is mapped to {file:?}, which does not hold it", .path.display())]
    IndexTensorMissing {
        path: PathBuf,
        tensor: String,
        file: String,
    },
    #[error("tensor {tensor:?} is in both {} and {}", .first.display(), .second.display())]
    TensorInTwoFiles {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },

    #[error("cannot read PyTorch checkpoint {}", .path.display())]
    Pytorch {
        path: PathBuf,
        #[source]
        source: super::pytorch::PytorchError,
    },

    #[error("cannot read GGUF file {}", .path.display())]
    Gguf {
        path: PathBuf,
        #[source]
        source: super::gguf::error::GgufError,
    },

    #[error("{}: changed while it was being read (size or modification time differ); rerun when it is stable", .path.display())]
    SourceChanged { path: PathBuf },
    #[error("{}: tensor {tensor:?}: {reason}", .path.display())]
    BadData {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
}

fn last_tensor_note(tensor: &Option<String>) -> String {
    match tensor {
        Some(t) => format!(" (tensor {t:?} is cut off)"),
        None => String::new(),
    }
}

impl FormatError {
    /// An I/O error on `path`; a missing file becomes [`FormatError::NotFound`].
    pub fn io(path: &Path, source: io::Error) -> FormatError {
        if source.kind() == io::ErrorKind::NotFound {
            FormatError::NotFound {
                path: path.to_path_buf(),
            }
        } else {
            FormatError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

/// Why a small JSON config (`config.json`, `hf_quant_config.json`) could not
/// be read as one.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file did not parse.
    #[error("config.json is not valid json")]
    Json(#[source] serde_json::Error),
    /// It parsed, but is not a JSON object.
    #[error("config.json is not a json object")]
    NotObject,
    /// It holds more values than any real config.
    #[error("config.json holds more than {max} json values; no real config has that many")]
    TooLarge { max: usize },
}

impl From<serde_json::Error> for ConfigError {
    fn from(e: serde_json::Error) -> Self {
        ConfigError::Json(e)
    }
}
