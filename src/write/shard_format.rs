//! The output-format trait: what a format's writer adds to the planner's
//! [`ShardLayout`]. Implementations: `super::format::Safetensors`,
//! `super::gguf::Gguf`; `super::format::of` picks one.

use std::path::Path;

use super::WriteError;
use crate::plan::{Plan, ShardLayout, ShardPlan};

/// An output format: the planner's layout rules and the writer's bytes.
pub trait ShardFormat: ShardLayout {
    /// The planner's view of this format (for [`Plan::build`]).
    fn layout(&self) -> &dyn ShardLayout;
    /// The bytes before a shard's data section, for `shard` of `plan` as
    /// planned, written to `path` (named in errors). The whole plan, since
    /// a header may hold plan-wide data (GGUF's metadata, split counts).
    fn header_bytes(
        &self,
        path: &Path,
        plan: &Plan,
        shard: &ShardPlan,
    ) -> Result<Vec<u8>, WriteError>;
    /// The index file's bytes, for a plan that has one.
    fn index_bytes(&self, plan: &Plan) -> Vec<u8>;
}
