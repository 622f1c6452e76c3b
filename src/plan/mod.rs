//! Planning: the order tensors are written in ([`order`]) and how they are
//! packed into shards ([`pack`]). What a load of the result will cost is
//! the next stage's, [`crate::fit`]. A [`Plan`] is plain serde data: `convert --dry-run` prints it
//! and `convert` executes it. Building a plan reads nothing but headers
//! and, for quantized sources ([`dequant`]), the small quantization config
//! files.

pub mod dequant;
pub mod input;
pub mod order;
pub mod output;
pub mod pack;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cast::{self, CastError, OverflowPolicy};
use crate::format::{Checkpoint, Dtype, Format};
use crate::quant::QuantError;

use self::dequant::{QuantPlan, QuantRecord, Role};
pub use self::input::TensorInput;
pub use self::output::{OutputFormat, ShardLayout};

use self::order::{block_of, sort_indices, Order};
use self::pack::{pack, Item};

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
    /// The format written (left out of the JSON when safetensors).
    #[serde(default, skip_serializing_if = "OutputFormat::is_default")]
    pub format: OutputFormat,
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
            format: OutputFormat::Safetensors,
        }
    }
}

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("--max-shard-size must be at least 1 byte")]
    ZeroShardSize,
    #[error("invalid --keep-dtype glob {glob:?}")]
    BadGlob {
        glob: String,
        #[source]
        source: globset::Error,
    },
    #[error(transparent)]
    Cast(#[from] CastError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("{file}: quantized weight {tensor:?} has no scale; its values would be wrong by the missing factor (pass --allow-unscaled to write its codes unscaled)")]
    MissingScale { file: String, tensor: String },
    #[error("{file}: scale {tensor:?} of weight {weight:?} has a shape that does not fit the weight and the block size (see reshard inspect)")]
    BadScale {
        file: String,
        tensor: String,
        weight: String,
    },
    #[error("--keep-dtype matches quantized weight {tensor:?}; a dequantized output cannot keep some weights quantized")]
    KeepQuantized { tensor: String },
    #[error(
        "quantized weight {tensor:?} would be written as {name:?}, which another tensor already is"
    )]
    DenseNameTaken { tensor: String, name: String },
    #[error("tensor {tensor:?}: its {bytes}-byte header entry makes the shard header larger than safetensors allows")]
    HeaderTooLarge { tensor: String, bytes: u64 },
    #[error("{file}: tensor {tensor:?} is an expanded view: {bytes} bytes of output from {stored} bytes stored, more than {MAX_EXPANSION} times; pass --allow-expanded to write it anyway")]
    ExpandedView {
        file: String,
        tensor: String,
        bytes: u64,
        stored: u64,
    },
}

/// Most output bytes a tensor may have per byte of storage it reads
/// (`convert` without `--allow-expanded`). A transpose or slice reads each
/// element once (1x); only a view whose elements repeat (`expand`, stride
/// 0) goes past it, and torch writes such views only when a user saves
/// one.
pub const MAX_EXPANSION: u64 = 16;
/// Expanded views of at most 16 MiB of output pass whatever their ratio:
/// they cost nothing worth refusing.
pub const EXPANSION_FLOOR: u64 = 16 << 20;

/// Refuses, unless `allow`, every planned tensor whose output is more than
/// [`MAX_EXPANSION`] times the bytes it reads and more than
/// [`EXPANSION_FLOOR`]: a 1.6 KB `.bin` of `torch.zeros(1).expand(2**50)`
/// would otherwise write 4 PiB.
pub fn check_expanded(ck: &Checkpoint, plan: &Plan, allow: bool) -> Result<(), PlanError> {
    if allow {
        return Ok(());
    }
    for t in plan.tensors() {
        let source = &ck.tensors[t.input.primary()];
        let stored = source.stored_bytes();
        if t.len > EXPANSION_FLOOR && t.len / MAX_EXPANSION > stored {
            return Err(PlanError::ExpandedView {
                file: ck.file_of(source).name(),
                tensor: t.name.clone(),
                bytes: t.len,
                stored,
            });
        }
    }
    Ok(())
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
}

impl Plan {
    /// Plans the conversion of `ck` under `options`, naming and laying out
    /// its files as `layout` (the output format of `options.format`, from
    /// `crate::write::format::of`) says.
    pub fn build(
        ck: &Checkpoint,
        options: &PlanOptions,
        layout: &dyn ShardLayout,
    ) -> Result<Plan, PlanError> {
        if options.max_shard_size == 0 {
            return Err(PlanError::ZeroShardSize);
        }
        let keep = keep_globs(&options.keep_dtype)?;
        let (kept, dropped) = dedupe(ck, options.dedupe_tied);
        let names: Vec<&str> = kept.iter().map(|&i| ck.tensors[i].name.as_str()).collect();
        let ordered: Vec<usize> = sort_indices(&names, options.order)
            .into_iter()
            .map(|i| kept[i])
            .collect();
        let quant = QuantPlan::new(ck, options.dtype.is_some(), options.allow_unscaled, &|n| {
            keep.is_match(n)
        })?;
        let ordered = quant.regroup(ordered);

        let mut planned = Vec::with_capacity(ordered.len());
        let mut casts: BTreeMap<(Dtype, Dtype), CastPair> = BTreeMap::new();
        for &i in &ordered {
            let t = &ck.tensors[i];
            let (name, shape, input) = match &quant.roles[i] {
                Role::Dequant {
                    name,
                    shape,
                    scale,
                    scheme,
                } => (
                    name,
                    shape,
                    TensorInput::Dequantized {
                        weight: i,
                        scale: *scale,
                        scheme: scheme.clone(),
                    },
                ),
                _ => (&t.name, &t.shape, TensorInput::Source { tensor: i }),
            };
            let dequant = !input.is_source();
            let target = match options.dtype {
                Some(to) if dequant => cast::target_for(Dtype::F32, to)?.or(Some(to)),
                Some(to) if !keep.is_match(&t.name) => cast::target_for(t.dtype, to)?,
                _ => None,
            };
            let dtype = target.unwrap_or(t.dtype);
            let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            // Element counts were checked when the header was read, a cast
            // never goes past 64-bit elements, and a dense MXFP4 shape holds
            // twice the codes' bytes.
            let len = numel.and_then(|n| dtype.byte_len(n)).unwrap_or(u64::MAX);
            if target.is_some() {
                let pair = casts.entry((t.dtype, dtype)).or_insert(CastPair {
                    from: t.dtype,
                    to: dtype,
                    tensors: 0,
                    bytes_before: 0,
                    bytes_after: 0,
                });
                pair.tensors += 1;
                pair.bytes_before += t.len;
                pair.bytes_after += len;
            }
            planned.push(PlannedTensor {
                name: name.clone(),
                input,
                source_dtype: t.dtype,
                dtype,
                shape: shape.clone(),
                len,
                offset: 0,
            });
        }

        let items: Vec<Item<order::Block>> = planned
            .iter()
            .map(|t| Item {
                bytes: t.len,
                block: block_of(&t.name),
                glued: matches!(quant.roles[t.input.primary()], Role::GluedTo(_)),
            })
            .collect();
        let ranges = pack(&items, options.max_shard_size);
        drop(items);
        let prefix = output_prefix(ck);
        let count = ranges.len();
        let layer_order: Vec<String> = planned.iter().map(|t| t.name.clone()).collect();
        let total_size = planned.iter().map(|t| t.len).sum();
        let mut shards = Vec::with_capacity(count);
        let mut oversized = Vec::new();
        // The ranges tile `planned` in order: move each shard's tensors out
        // rather than copy them (a checkpoint may hold 262,144 tensors).
        let mut rest = planned.into_iter();
        for (n, range) in ranges.into_iter().enumerate() {
            let file = layout.shard_name(&prefix, n, count);
            let tensors: Vec<PlannedTensor> = rest.by_ref().take(range.len()).collect();
            if tensors.len() == 1 && tensors[0].len > options.max_shard_size {
                oversized.push(Oversized {
                    tensor: tensors[0].name.clone(),
                    bytes: tensors[0].len,
                    file: file.clone(),
                });
            }
            shards.push(lay_out_shard(layout, file, tensors));
        }
        let metadata = layout.shard_metadata(&ck.metadata);
        Ok(Plan {
            options: options.clone(),
            index_file: layout.index_name(&prefix, count),
            prefix,
            layer_order,
            total_size,
            shards,
            oversized,
            casts: casts.into_values().collect(),
            dropped,
            metadata,
            quantization: quant.record,
        })
    }

    /// Every planned tensor, shard by shard.
    pub fn tensors(&self) -> impl Iterator<Item = &PlannedTensor> {
        self.shards.iter().flat_map(|s| s.tensors.iter())
    }
}

fn keep_globs(globs: &[String]) -> Result<globset::GlobSet, PlanError> {
    let mut set = globset::GlobSetBuilder::new();
    for g in globs {
        let glob = globset::GlobBuilder::new(g)
            .literal_separator(false)
            .build()
            .map_err(|source| PlanError::BadGlob {
                glob: g.clone(),
                source,
            })?;
        set.add(glob);
    }
    set.build().map_err(|source| PlanError::BadGlob {
        glob: globs.join(" "),
        source,
    })
}

/// Source tensor indices to write, and the tied names left out. Only exact
/// duplicates (same bytes, dtype and shape) are dropped, and only when asked.
fn dedupe(ck: &Checkpoint, dedupe_tied: bool) -> (Vec<usize>, Vec<Dropped>) {
    if !dedupe_tied {
        return ((0..ck.tensors.len()).collect(), Vec::new());
    }
    let mut first: BTreeMap<(usize, String, Dtype, Vec<u64>), usize> = BTreeMap::new();
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for (i, t) in ck.tensors.iter().enumerate() {
        let location = serde_json::to_string(&t.data).unwrap_or_default();
        let key = (t.file, location, t.dtype, t.shape.clone());
        match first.get(&key) {
            Some(&k) => {
                dropped.push(Dropped {
                    tensor: t.name.clone(),
                    same_as: ck.tensors[k].name.clone(),
                });
            }
            _ => {
                first.insert(key, i);
                kept.push(i);
            }
        }
    }
    (kept, dropped)
}

/// The output prefix: the source's, except PyTorch's `pytorch_model`, which
/// Hugging Face names `model` once it is safetensors.
fn output_prefix(ck: &Checkpoint) -> String {
    match (ck.format, ck.prefix.as_str()) {
        (Format::Pytorch, "pytorch_model") => "model".into(),
        (_, "") => "model".into(),
        (_, p) => p.to_string(),
    }
}

/// One shard of `tensors` (in layer order) as `layout` lays it out.
fn lay_out_shard(
    layout: &dyn ShardLayout,
    file: String,
    mut tensors: Vec<PlannedTensor>,
) -> ShardPlan {
    let first_block = tensors
        .iter()
        .find_map(|t| block_of(&t.name))
        .map(|b| b.name());
    let last_block = tensors
        .iter()
        .rev()
        .find_map(|t| block_of(&t.name))
        .map(|b| b.name());
    let data_len = layout.lay_out(&mut tensors);
    ShardPlan {
        file,
        tensors,
        data_len,
        first_block,
        last_block,
    }
}
