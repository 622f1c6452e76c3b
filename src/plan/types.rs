//! The plan as data: what `convert --dry-run` prints and `convert`
//! executes. [`Plan::build`](super::Plan) (in the parent) makes one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::dequant::QuantRecord;
use super::from_gguf::GgufRecord;
use super::input::TensorInput;
use super::order::Order;
use super::quantize::{QuantizeRecord, QuantizeScheme};
use crate::cast::OverflowPolicy;
use crate::format::Dtype;

/// The options that decide what `convert` writes. Two runs with equal
/// options on an unchanged source write identical bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// Largest data section of a shard, in bytes (a single larger tensor
    /// still gets a shard of its own).
    pub max_shard_size: u64,
    pub order: Order,
    /// Cast floating-point tensors to this dtype.
    pub dtype: Option<Dtype>,
    /// Globs on tensor names that keep their dtype.
    pub keep_dtype: Vec<String>,
    pub on_overflow: OverflowPolicy,
    /// Drop later names of tensors that are exact views of the same bytes.
    pub dedupe_tied: bool,
    /// Write quantized weights that have no scale as plain codes instead of
    /// refusing them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_unscaled: bool,
    /// Store Linear weights quantized (`--quantize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize: Option<QuantizeScheme>,
    /// Globs of tensors `--quantize` keeps (`--keep`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quantize_keep: Vec<String>,
    /// Globs `--quantize` is limited to (`--quantize-only`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quantize_only: Vec<String>,
    /// `--block ROWSxCOLS` of `--quantize fp8-block` (128x128 when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantize_block: Option<[u64; 2]>,
    /// Write a GGUF LLM's tensors under their GGUF names, with no config or
    /// tokenizer, instead of transformers' names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_gguf_names: bool,
    /// The format written (left out of the JSON when safetensors).
    #[serde(default, skip_serializing_if = "OutputFormat::is_default")]
    pub format: OutputFormat,
}

impl PlanOptions {
    /// The dtype a source tensor is written in when it is not quantized:
    /// `--dtype`'s cast of it unless `--keep-dtype` matches it, else its
    /// own. (A glob that does not parse matches nothing here: the planner
    /// refuses it before anything is written.)
    pub fn written_dtype(&self) -> impl Fn(&crate::format::Tensor) -> Dtype + '_ {
        let keep = super::globs::glob_set(&self.keep_dtype).ok();
        move |t| match self.dtype {
            Some(to) if !keep.as_ref().is_some_and(|k| k.is_match(&t.name)) => {
                crate::cast::target_for(t.dtype, to)
                    .ok()
                    .flatten()
                    .unwrap_or(t.dtype)
            }
            _ => t.dtype,
        }
    }
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            max_shard_size: 1 << 30,
            order: Order::Forward,
            dtype: None,
            keep_dtype: Vec::new(),
            on_overflow: OverflowPolicy::Error,
            dedupe_tied: false,
            allow_unscaled: false,
            quantize: None,
            quantize_keep: Vec::new(),
            quantize_only: Vec::new(),
            quantize_block: None,
            keep_gguf_names: false,
            format: OutputFormat::Safetensors,
        }
    }
}

/// One tensor as it will be written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedTensor {
    pub name: String,
    /// What it is made from (source tensor indices).
    pub input: TensorInput,
    /// The dtype of its primary input (the codes of a dequantized tensor).
    pub source_dtype: Dtype,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Output byte length.
    pub len: u64,
    /// Offset in the shard's data section.
    pub offset: u64,
    /// The tensor of the same shard this one is laid out right after where
    /// alignment allows (a derived scale after its weight, so one read of
    /// the weight can also produce the scale); see the output format's
    /// `lay_out`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// One output shard: its file name and its tensors in file (offset) order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPlan {
    pub file: String,
    pub tensors: Vec<PlannedTensor>,
    pub data_len: u64,
    pub first_block: Option<String>,
    pub last_block: Option<String>,
}

/// A tensor larger than the shard limit. It sets the floor of every
/// loader's peak, so the user hears about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Oversized {
    pub tensor: String,
    pub bytes: u64,
    pub file: String,
}

/// Bytes before and after for one cast pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CastPair {
    pub from: Dtype,
    pub to: Dtype,
    pub tensors: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// A tied name left out under `dedupe_tied`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dropped {
    pub tensor: String,
    pub same_as: String,
}

/// Everything `convert` will write, decided before a byte is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub options: PlanOptions,
    pub prefix: String,
    pub shards: Vec<ShardPlan>,
    /// `None` when everything fits in one shard (`<prefix>.safetensors`).
    pub index_file: Option<String>,
    /// Tensor names in layer order, as the index's weight_map lists them.
    pub layer_order: Vec<String>,
    pub total_size: u64,
    pub oversized: Vec<Oversized>,
    pub casts: Vec<CastPair>,
    pub dropped: Vec<Dropped>,
    /// Metadata of every output shard (for safetensors, `__metadata__`,
    /// always with `format: pt`).
    pub metadata: BTreeMap<String, String>,
    /// A quantized source: its scheme and what was dequantized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<QuantRecord>,
    /// `--quantize`: what was quantized and what kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized: Option<QuantizeRecord>,
    /// A GGUF source: each tensor's GGUF name and type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gguf: Option<GgufRecord>,
    /// A GGUF output: its architecture, key/value metadata and the types
    /// chosen (`super::gguf_out`). Plans are only ever read back for
    /// their options, so this is written, never read.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub gguf_out: Option<super::gguf_out_record::GgufOut>,
}

/// Which format `convert` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    /// safetensors shards with a Hugging Face index.
    #[default]
    Safetensors,
    /// One GGUF file, or a gguf-split set (`crate::write::gguf`).
    Gguf,
}

impl OutputFormat {
    /// True for the default, which plans and manifests leave out (so
    /// plans made before the tag existed serialize as they did).
    pub fn is_default(&self) -> bool {
        *self == OutputFormat::default()
    }
}
