//! The output-format seam, as the planner sees it.
//!
//! A [`Plan`](super::Plan) names its output format with a plain tag
//! ([`OutputFormat`], serde data that `--dry-run` prints). What a format
//! decides at plan time (file names, the index, where each tensor of a
//! shard goes, the metadata every shard carries) is the [`ShardLayout`]
//! interface. The planner owns the interface and the write stage owns
//! every implementation (`crate::write::format`), which also encodes the
//! bytes: the planner never imports the writer. A new output format is one
//! new tag here and one implementation there.

use std::collections::BTreeMap;

use super::types::PlannedTensor;

/// What an output format decides while a plan is built.
pub trait ShardLayout: Sync {
    /// The file name of shard `n` (counted from 0) of `count`.
    fn shard_name(&self, prefix: &str, n: usize, count: usize) -> String;
    /// The index file for `count` shards, if the format has one.
    fn index_name(&self, prefix: &str, count: usize) -> Option<String>;
    /// Orders one shard's tensors (given in layer order) as they sit in the
    /// file, sets each one's offset in the data section, and returns the
    /// section's length. Offsets leave no holes the format does not define.
    fn lay_out(&self, tensors: &mut [PlannedTensor]) -> u64;
    /// The metadata every shard carries, from the source's.
    fn shard_metadata(&self, source: &BTreeMap<String, String>) -> BTreeMap<String, String>;
}
