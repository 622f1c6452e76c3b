//! What a planned tensor is made from: the plan's one enum of inputs.
//!
//! Most output tensors are a source tensor, copied or cast. A derived one
//! reads one or more source tensors and computes its bytes: today, a
//! quantized weight written dense from its codes and its scale. A new kind
//! (a scale computed from a weight, a quantized tensor, rows permuted,
//! experts stacked, a reshape) is one more variant here, one more arm in
//! the executor that streams it, and one more check in validate. The
//! variants hold source tensor indices, never the tensors: a plan stays
//! plain serde data.

use serde::{Deserialize, Serialize};

use crate::quant::Scheme;

/// The source of one planned tensor's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum TensorInput {
    /// Source tensor `tensor` (an index into the checkpoint's tensors),
    /// copied, or cast to the planned dtype.
    Source { tensor: usize },
    /// The quantized codes of source tensor `weight` times the f32 value of
    /// their block's scale in source tensor `scale`, rounded to the planned
    /// dtype.
    Dequantized {
        weight: usize,
        scale: usize,
        scheme: Scheme,
    },
    /// GGUF tensor `tensor`: its GGML blocks (or plain elements)
    /// dequantized to f32 exactly as gguf-py does, then rounded to the
    /// planned dtype; with `unpermute_heads`, the rows of that many heads
    /// put back in Hugging Face order (`crate::cast::gguf::RowOrder`).
    Gguf {
        tensor: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unpermute_heads: Option<u64>,
    },
}

impl TensorInput {
    /// The source tensor whose bytes stream into this one (for a
    /// dequantized tensor, the codes): the one that sets its file, its
    /// read order and its progress.
    pub fn primary(&self) -> usize {
        match *self {
            TensorInput::Source { tensor } => tensor,
            TensorInput::Dequantized { weight, .. } => weight,
            TensorInput::Gguf { tensor, .. } => tensor,
        }
    }

    /// True for a source tensor copied or cast as it is.
    pub fn is_source(&self) -> bool {
        matches!(self, TensorInput::Source { .. })
    }

    /// The scale tensor and scheme of a dequantized tensor.
    pub fn dequantized(&self) -> Option<(usize, &Scheme)> {
        match self {
            TensorInput::Dequantized { scale, scheme, .. } => Some((*scale, scheme)),
            TensorInput::Source { .. } | TensorInput::Gguf { .. } => None,
        }
    }

    /// Every source tensor this one reads.
    pub fn reads(&self) -> Vec<usize> {
        match *self {
            TensorInput::Source { tensor } | TensorInput::Gguf { tensor, .. } => vec![tensor],
            TensorInput::Dequantized { weight, scale, .. } => vec![weight, scale],
        }
    }
}
