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

use crate::cast::quantize::{Part, Recipe};
use crate::format::Dtype;
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
    /// Source tensor `tensor` (a 2-D weight) quantized to scaled FP8 by
    /// `recipe` in working dtype `work`: its codes or its scales
    /// (`crate::cast::quantize`).
    Quantized {
        tensor: usize,
        recipe: Recipe,
        work: Dtype,
        part: Part,
    },
    /// Source tensor `tensor` written as GGML type `ggml` in a GGUF file
    /// (`crate::cast::gguf::EncodeStream`): its elements to f32, then
    /// encoded; with `permute_heads`, the rows of that many heads put in
    /// llama.cpp's rotary order. With `stacked`, those source tensors
    /// (MoE experts of `tensor`'s shape) follow it, as one tensor of a new
    /// leading axis (`crate::cast::gguf::StackStream`).
    ToGgml {
        tensor: usize,
        ggml: crate::format::gguf::ggml::GgmlType,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permute_heads: Option<u64>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        stacked: Vec<usize>,
    },
    /// Fixed bytes a quantized layout needs beside a weight (ComfyUI's
    /// `comfy_quant` JSON, the `scaled_fp8` marker), kept with source
    /// tensor `of`.
    Constant { of: usize, bytes: Vec<u8> },
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
            TensorInput::Quantized { tensor, .. } => tensor,
            TensorInput::ToGgml { tensor, .. } => tensor,
            TensorInput::Constant { of, .. } => of,
        }
    }

    /// True for a tensor that only accompanies another (a computed scale,
    /// a constant): it is packed into its weight's shard.
    pub fn accompanies(&self) -> bool {
        matches!(
            self,
            TensorInput::Constant { .. }
                | TensorInput::Quantized {
                    part: Part::Scales,
                    ..
                }
        )
    }

    /// The GGML type a GGUF output tensor is written in.
    pub fn ggml(&self) -> Option<crate::format::gguf::ggml::GgmlType> {
        match self {
            TensorInput::ToGgml { ggml, .. } => Some(*ggml),
            _ => None,
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
            TensorInput::Source { .. }
            | TensorInput::Gguf { .. }
            | TensorInput::Quantized { .. }
            | TensorInput::ToGgml { .. }
            | TensorInput::Constant { .. } => None,
        }
    }

    /// Every source tensor this one reads.
    pub fn reads(&self) -> Vec<usize> {
        match *self {
            TensorInput::Source { tensor }
            | TensorInput::Gguf { tensor, .. }
            | TensorInput::Quantized { tensor, .. } => vec![tensor],
            TensorInput::ToGgml {
                tensor,
                ref stacked,
                ..
            } => std::iter::once(tensor)
                .chain(stacked.iter().copied())
                .collect(),
            TensorInput::Dequantized { weight, scale, .. } => vec![weight, scale],
            TensorInput::Constant { .. } => Vec::new(),
        }
    }
}
