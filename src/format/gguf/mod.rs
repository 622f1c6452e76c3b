//! The GGUF reader: single files and gguf-split sets, versions 2 and 3,
//! little-endian, with the safetensors reader's hostile-input discipline.
//!
//! This module owns the header (`header`: key/value pairs kept typed in
//! [`value`], tensor infos, offsets), the bounded reads it goes through
//! (`cursor`), the GGML type table ([`ggml`]) and split sets ([`split`]).
//! It reads headers only: tensor bytes are read later, by offset and
//! length, and turned into floats by the cast stage (`crate::cast::gguf`).
//! It never writes anything and does not decide what a tensor is called in
//! Hugging Face terms.
//!
//! What a header may cost is bounded: [`MAX_HEADER`] bytes of reads and
//! memory together, at most [`MAX_TENSORS`](crate::format::MAX_TENSORS)
//! tensors and [`MAX_KEYS`] keys, strings of at most [`MAX_STRING`] bytes
//! (names [`MAX_NAME`]), arrays nested at most [`MAX_ARRAY_DEPTH`] deep. All
//! size arithmetic is checked. Tensor shapes are given in safetensors
//! (row-major) order: ggml's dims reversed.

pub mod checkpoint;
mod cursor;
pub mod error;
pub mod ggml;
mod header;
mod model;
pub mod split;
#[cfg(test)]
mod tests;
pub mod value;

use std::path::Path;

pub use self::checkpoint::{plain_dtype, to_checkpoint};
pub use self::header::{parse_bytes, read_header};
pub use self::model::{
    GgufFile, GgufTensor, Metadata, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_HEADER,
    MAX_KEYS, MAX_NAME, MAX_STRING,
};
pub use self::split::{open, open_set, GgufModel};

/// True if `path`'s name ends in `.gguf` (any case).
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}
