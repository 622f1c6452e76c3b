//! Why a row could not be quantized: its length, or the room for its blocks.

use crate::format::gguf::ggml::GgmlType;

/// A row or an output buffer of the wrong size for [`super::quantize_q4_k`]
/// or [`super::quantize_q6_k`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KQuantError {
    #[error("a row of {values} values is not a whole number of 256-value {ty} blocks")]
    PartialBlock { ty: GgmlType, values: usize },
    #[error("{values} values make {bytes} bytes of {ty}, but the output has {room}")]
    OutputLength {
        ty: GgmlType,
        values: usize,
        bytes: usize,
        room: usize,
    },
}
