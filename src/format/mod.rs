//! Checkpoint readers: turn what a user has on disk into a [`Checkpoint`], a
//! plain list of tensors with exact byte locations.
//!
//! This stage owns file discovery ([`discover`]), the safetensors header
//! ([`safetensors`]), index files ([`index`]), the PyTorch zip format
//! ([`pytorch`]), bounded reads of tensor bytes ([`read`]) and the layout of
//! a model folder made of several weight sets ([`layout`]). It reads headers
//! only: no tensor data is touched until a later stage asks [`read`] for it.
//! It never writes anything.

pub(crate) mod checkpoint;
pub(crate) mod config;
pub(crate) mod discover;
pub(crate) mod dtype;
pub(crate) mod error;
pub(crate) mod finding;
pub mod gguf;
pub(crate) mod index;
mod json;
pub mod json_edit;
pub mod layout;
pub mod mapped;
pub mod pytorch;
pub mod read;
pub(crate) mod safetensors;
pub(crate) mod strided;
pub(crate) mod tensor_names;

pub use self::checkpoint::{Checkpoint, DataRef, Format, Layout, SourceFile, Tensor};
pub use self::discover::open;
pub use self::dtype::Dtype;
pub use self::error::FormatError;
pub use self::finding::{Finding, LARGE_SHARD, MAX_TENSORS};
