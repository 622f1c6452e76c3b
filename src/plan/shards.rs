//! What every output format's plan shares once tensors are packed: the
//! output prefix, the packed ranges cut into shards, and one shard laid out
//! by the format's layout.

use super::order::block_of;
use super::output::ShardLayout;
use super::types::{Oversized, PlannedTensor, ShardPlan};
use crate::format::{Checkpoint, Format};

/// The output prefix: the source's, except PyTorch's `pytorch_model`, which
/// Hugging Face names `model` once it is safetensors.
pub(super) fn output_prefix(ck: &Checkpoint) -> String {
    match (ck.format, ck.prefix.as_str()) {
        (Format::Pytorch, "pytorch_model") => "model".into(),
        (_, "") => "model".into(),
        (_, p) => p.to_string(),
    }
}

/// One shard of `tensors` (in layer order) as `layout` lays it out.
pub(super) fn lay_out_shard(
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

/// `planned` (in layer order) cut into the shards `ranges` tile it with,
/// named and laid out by `layout`; a tensor alone in its shard and larger
/// than `max_shard_size` is listed as oversized.
pub(super) fn cut_into_shards(
    layout: &dyn ShardLayout,
    prefix: &str,
    planned: Vec<PlannedTensor>,
    ranges: Vec<std::ops::Range<usize>>,
    max_shard_size: u64,
) -> (Vec<ShardPlan>, Vec<Oversized>) {
    let count = ranges.len();
    let mut shards = Vec::with_capacity(count);
    let mut oversized = Vec::new();
    // The ranges tile `planned` in order: move each shard's tensors out
    // rather than copy them (a checkpoint may hold 262,144 tensors).
    let mut rest = planned.into_iter();
    for (n, range) in ranges.into_iter().enumerate() {
        let file = layout.shard_name(prefix, n, count);
        let tensors: Vec<PlannedTensor> = rest.by_ref().take(range.len()).collect();
        if tensors.len() == 1 && tensors[0].len > max_shard_size {
            oversized.push(Oversized {
                tensor: tensors[0].name.clone(),
                bytes: tensors[0].len,
                file: file.clone(),
            });
        }
        shards.push(lay_out_shard(layout, file, tensors));
    }
    (shards, oversized)
}
