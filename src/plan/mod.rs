//! Planning: the order tensors are written in ([`order`]) and how they are
//! packed into shards ([`pack`]). What a load of the result will cost is
//! the next stage's, [`crate::fit`]. A [`Plan`] is plain serde data: `convert --dry-run` prints it
//! and `convert` executes it. Building a plan reads nothing but headers
//! and, for quantized sources ([`dequant`]), the small quantization config
//! files.

pub(crate) mod dequant;
mod error;
pub(crate) mod from_gguf;
pub mod gguf;
mod gguf_families;
pub mod gguf_out;
mod gguf_out_record;
mod globs;
pub(crate) mod input;
mod names;
pub mod order;
pub(crate) mod output;
pub(crate) mod pack;
pub mod quantize;
pub mod quantizer;
mod shards;
pub mod to_gguf;
mod types;

use std::collections::BTreeMap;

use crate::cast::{self};
use crate::format::{Checkpoint, Dtype, Format};

use self::dequant::{QuantPlan, Role};
pub use self::error::{PlanError, EXPANSION_FLOOR, MAX_EXPANSION};
use self::from_gguf::{GgufPlan, GgufRole};
pub use self::from_gguf::{GgufRecord, GgufTensorRecord, DEQUANTIZED_FROM_KEY};
use self::globs::glob_set;
pub use self::input::TensorInput;
pub use self::output::ShardLayout;
use self::quantizer::{Quantized, Quantizer};
pub use self::types::{
    CastPair, Dropped, OutputFormat, Oversized, Plan, PlanOptions, PlannedTensor, ShardPlan,
};

use self::order::{block_of, sort_indices};
use self::pack::{pack, Item};
use self::shards::{cut_into_shards, output_prefix};

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
        // A stacked GGUF tensor reads every expert it stacks.
        let stored = match &t.input {
            TensorInput::ToGgml { stacked, .. } if !stacked.is_empty() => t
                .input
                .reads()
                .iter()
                .map(|&i| ck.tensors[i].stored_bytes())
                .fold(0, u64::saturating_add),
            _ => source.stored_bytes(),
        };
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
        if options.format == OutputFormat::Gguf {
            return gguf_out::plan(ck, options, layout);
        }
        gguf_out::check_scheme(options).map_err(|e| PlanError::GgufOut(Box::new(e)))?;
        let keep = keep_globs(&options.keep_dtype)?;
        let gguf = match ck.format {
            Format::Gguf => {
                let model = crate::format::gguf::open(&ck.files[0].path)?;
                Some(GgufPlan::new(
                    ck,
                    &model,
                    options.dtype,
                    options.keep_gguf_names,
                    &|n| keep.is_match(n),
                )?)
            }
            _ => None,
        };
        let (mut kept, dropped) = dedupe(ck, options.dedupe_tied);
        if let Some(g) = &gguf {
            kept.retain(|&i| g.roles[i].is_some());
        }
        let name_of = |i: usize| match gguf.as_ref().and_then(|g| g.roles[i].as_ref()) {
            Some(role) => role.name.as_str(),
            None => ck.tensors[i].name.as_str(),
        };
        let names: Vec<&str> = kept.iter().map(|&i| name_of(i)).collect();
        let ordered: Vec<usize> = sort_indices(&names, options.order)
            .into_iter()
            .map(|i| kept[i])
            .collect();
        let quant = QuantPlan::new(ck, options.dtype.is_some(), options.allow_unscaled, &|n| {
            keep.is_match(n)
        })?;
        let ordered = quant.regroup(ordered);
        let mut quantizer = Quantizer::new(
            options.quantize,
            &options.quantize_keep,
            &options.quantize_only,
            options.quantize_block,
        )?;
        if let Some(q) = &quantizer {
            // Detection alone is not quantization: a scale beside a dense
            // weight pairs with nothing (the quantizer refuses it as a
            // stray companion).
            let paired = quant
                .roles
                .iter()
                .any(|r| matches!(r, Role::GluedTo(_) | Role::Dequant { .. }));
            let what = match (&quant.record, &gguf) {
                (Some(r), _) if paired => Some(format!("{:?}", r.format)),
                (_, Some(_)) => Some("GGUF".to_string()),
                _ => None,
            };
            q.check_source(ck, what)?;
        }

        let mut planned = Vec::with_capacity(ordered.len());
        let mut derived_names: Option<std::collections::HashSet<&str>> = None;
        let mut casts: BTreeMap<(Dtype, Dtype), CastPair> = BTreeMap::new();
        for &i in &ordered {
            let t = &ck.tensors[i];
            if let Some(role) = gguf.as_ref().and_then(|g| g.roles[i].as_ref()) {
                planned.push(gguf_tensor(t, role, &mut casts));
                continue;
            }
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
            let mut dtype = target.unwrap_or(t.dtype);
            if let (Some(q), true) = (quantizer.as_mut(), input.is_source()) {
                match q.quantize(i, t, dtype) {
                    Quantized::As(d) => dtype = d,
                    Quantized::Scaled(tensors) => {
                        check_derived(ck, t, &tensors, q, &mut derived_names)?;
                        planned.extend(tensors);
                        continue;
                    }
                }
            }
            let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            // Element counts were checked when the header was read, a cast
            // never goes past 64-bit elements, and a dense MXFP4 shape holds
            // twice the codes' bytes.
            let len = numel.and_then(|n| dtype.byte_len(n)).unwrap_or(u64::MAX);
            if target.is_some() && target == Some(dtype) {
                count_cast(&mut casts, t.dtype, dtype, t.len, len);
            }
            planned.push(PlannedTensor {
                name: name.clone(),
                input,
                source_dtype: t.dtype,
                dtype,
                shape: shape.clone(),
                len,
                offset: 0,
                after: None,
            });
        }

        names::check(ck, &planned)?;
        let items: Vec<Item<order::Block>> = planned
            .iter()
            .map(|t| Item {
                bytes: t.len,
                block: block_of(&t.name),
                glued: matches!(quant.roles[t.input.primary()], Role::GluedTo(_))
                    || t.input.accompanies(),
            })
            .collect();
        let ranges = pack(&items, options.max_shard_size);
        drop(items);
        let prefix = output_prefix(ck);
        let count = ranges.len();
        let layer_order: Vec<String> = planned.iter().map(|t| t.name.clone()).collect();
        let total_size = planned.iter().map(|t| t.len).sum();
        let (shards, oversized) =
            cut_into_shards(layout, &prefix, planned, ranges, options.max_shard_size);
        let mut metadata = layout.shard_metadata(&ck.metadata);
        if quant.record.as_ref().is_some_and(|r| r.dequantized) || quantizer.is_some() {
            // ComfyUI reads this key as "these layers are quantized": a
            // dense output must not carry it, nor a quantized one the
            // source's list (fp8-scaled writes its own below).
            metadata.remove(quantize::COMFY_LAYERS_KEY);
        }
        if let Some(g) = &gguf {
            metadata.extend(g.metadata());
        }
        if let Some((key, value)) = quantizer.as_ref().and_then(|q| q.metadata()) {
            metadata.insert(key, value);
        }
        Ok(Plan {
            options: PlanOptions {
                // `--block 128x128` is the default: the same plan, so the
                // same options (and plan id) as no `--block`.
                quantize_block: options
                    .quantize_block
                    .filter(|b| *b != quantize::DEFAULT_BLOCK),
                ..options.clone()
            },
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
            gguf: gguf.map(|g| g.record),
            gguf_out: None,
            quantized: quantizer.map(|q| q.record),
        })
    }

    /// Every planned tensor, shard by shard.
    pub fn tensors(&self) -> impl Iterator<Item = &PlannedTensor> {
        self.shards.iter().flat_map(|s| s.tensors.iter())
    }
}

/// Refuses scale and marker names the source already uses (`names`, the
/// source's names, is built on first use), and block rows of too many
/// scales.
fn check_derived<'c>(
    ck: &'c Checkpoint,
    weight: &crate::format::Tensor,
    tensors: &[PlannedTensor],
    q: &Quantizer,
    names: &mut Option<std::collections::HashSet<&'c str>>,
) -> Result<(), PlanError> {
    let names = names.get_or_insert_with(|| ck.tensors.iter().map(|t| t.name.as_str()).collect());
    for t in &tensors[1..] {
        if names.contains(t.name.as_str()) {
            return Err(PlanError::QuantizeNameTaken {
                scheme: q.record.scheme.name(),
                tensor: weight.name.clone(),
                name: t.name.clone(),
            });
        }
    }
    if let Some([_, bc]) = q.record.block {
        let cols = weight.shape.get(1).copied().unwrap_or(0);
        let scales = cols.div_ceil(bc);
        let max = crate::cast::quantize::MAX_ROW_SCALES;
        if scales > max {
            return Err(PlanError::BlockRowTooWide {
                tensor: weight.name.clone(),
                cols,
                scales,
                max,
            });
        }
    }
    Ok(())
}

/// Adds one tensor cast from `from` to `to` to the plan's cast totals.
fn count_cast(
    casts: &mut BTreeMap<(Dtype, Dtype), CastPair>,
    from: Dtype,
    to: Dtype,
    bytes_before: u64,
    bytes_after: u64,
) {
    let pair = casts.entry((from, to)).or_insert(CastPair {
        from,
        to,
        tensors: 0,
        bytes_before: 0,
        bytes_after: 0,
    });
    pair.tensors += 1;
    pair.bytes_before += bytes_before;
    pair.bytes_after += bytes_after;
}

/// The planned tensor of GGUF tensor `t` in `role`; a plain tensor's cast
/// is counted in `casts` (a dequantized one is the record's).
fn gguf_tensor(
    t: &crate::format::Tensor,
    role: &GgufRole,
    casts: &mut BTreeMap<(Dtype, Dtype), CastPair>,
) -> PlannedTensor {
    let numel = role.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let len = numel
        .and_then(|n| role.dtype.byte_len(n))
        .unwrap_or(u64::MAX);
    if t.ggml_type().is_none() && t.dtype != role.dtype {
        count_cast(casts, t.dtype, role.dtype, t.len, len);
    }
    PlannedTensor {
        name: role.name.clone(),
        input: role.input.clone(),
        source_dtype: t.dtype,
        dtype: role.dtype,
        shape: role.shape.clone(),
        len,
        offset: 0,
        after: None,
    }
}

fn keep_globs(globs: &[String]) -> Result<globset::GlobSet, PlanError> {
    glob_set(globs).map_err(|(glob, source)| PlanError::BadGlob { glob, source })
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
