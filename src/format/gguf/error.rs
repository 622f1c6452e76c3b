//! The errors of reading a GGUF file or split set. Each names the key or
//! tensor involved; the file is named by the [`crate::format::FormatError::Gguf`]
//! that carries this error as its source.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("read failed")]
    Io(#[source] io::Error),
    #[error("not a GGUF file: it starts with {found:?}, not \"GGUF\"")]
    BadMagic { found: String },
    #[error("a big-endian GGUF file; reshard reads little-endian GGUF only")]
    BigEndian,
    #[error(
        "GGUF version {version} is not supported (reshard reads versions 2 and 3, little-endian)"
    )]
    UnsupportedVersion { version: u32 },
    #[error("the file declares {count} tensors, more than the {max} any real model holds")]
    TooManyTensors { count: u64, max: usize },
    #[error("the file declares {count} key/value pairs, more than the limit of {max}")]
    TooManyKeys { count: u64, max: u64 },
    #[error("the header (key/value pairs and tensor infos) passes the {max}-byte limit in {at}")]
    HeaderTooLarge { max: u64, at: String },
    #[error("the file ends at byte {file_len} inside {at}")]
    Truncated { file_len: u64, at: String },
    #[error("{at}: a string of {len} bytes, more than the limit of {max}")]
    StringTooLong { at: String, len: u64, max: u64 },
    #[error("{at}: not valid UTF-8")]
    NotUtf8 { at: String },
    #[error("key {key:?}: unknown value type {ty}")]
    UnknownValueType { key: String, ty: u32 },
    #[error("key {key:?}: an array of {len} elements cannot fit in the {left} bytes the header has left")]
    ArrayTooLong { key: String, len: u64, left: u64 },
    #[error("key {key:?}: arrays nested more than {max} deep")]
    ArrayTooDeep { key: String, max: usize },
    #[error("key {key:?} appears twice")]
    DuplicateKey { key: String },
    #[error("key {key:?} is {found}, not {expected}")]
    WrongKeyType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("key \"general.alignment\" is {value}, not a power of two")]
    BadAlignment { value: u64 },
    #[error("tensor {tensor:?}: name refused: {reason}")]
    BadName { tensor: String, reason: String },
    #[error("tensor {tensor:?} appears twice")]
    DuplicateTensor { tensor: String },
    #[error("tensor {tensor:?}: {dims} dimensions, more than the {max} reshard reads")]
    TooManyDims {
        tensor: String,
        dims: u32,
        max: usize,
    },
    #[error("tensor {tensor:?}: shape {shape:?} (ggml order) {reason}")]
    BadShape {
        tensor: String,
        shape: Vec<u64>,
        reason: String,
    },
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {tensor:?}: data offset {offset} is before the end ({end}) of tensor {other:?}; data must follow the tensor infos' order without overlap")]
    Overlap {
        tensor: String,
        offset: u64,
        other: String,
        end: u64,
    },
    #[error(
        "tensor {tensor:?}: its data ends at byte {end}, past the end of the {file_len}-byte file"
    )]
    PastEnd {
        tensor: String,
        end: u64,
        file_len: u64,
    },
    #[error("split set member {} is missing (split {no} of {count})", .path.display())]
    SplitMissing { path: PathBuf, no: u64, count: u64 },
    #[error("split set: {reason}")]
    SplitMismatch { reason: String },
    #[error("tensor {tensor:?} is in split {first} and in split {second}")]
    SplitDuplicate {
        tensor: String,
        first: usize,
        second: usize,
    },
}
