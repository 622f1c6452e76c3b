//! What every output format's plan shares once tensors are packed: the
//! output prefix, and one shard laid out by the format's layout.

use super::order::block_of;
use super::output::ShardLayout;
use super::types::{PlannedTensor, ShardPlan};
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
