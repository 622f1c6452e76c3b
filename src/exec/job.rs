//! What a run of the executor is asked to do ([`ExecOptions`]) and why it
//! stops ([`ExecError`]).

use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::reporter::Reporter;
use super::window::WindowPool;
use super::window::WindowTooSmall;
use crate::cast::dequant::DequantError;
use crate::cast::quantize::ScaleMemo;
use crate::cast::CastError;
use crate::format::read::SourceReader;
use crate::format::{Checkpoint, FormatError};
use crate::plan::{Plan, ShardPlan};
use crate::write::digest::DigestAlgo;
use crate::write::manifest::ShardRecord;
use crate::write::WriteError;

/// Largest chunk a worker reads at once: past a few MiB, bigger reads do not
/// go faster, they only hold more memory.
pub const MAX_CHUNK: u64 = 16 << 20;

/// Why execution stopped. Every variant names the file and, where known, the
/// tensor.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Read(#[from] FormatError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error(transparent)]
    Cast(#[from] CastError),
    #[error(transparent)]
    Window(#[from] WindowTooSmall),
    #[error(transparent)]
    Dequant(#[from] DequantError),
    #[error("tensor {tensor:?}: planned as computed but read as a source tensor (a reshard bug)")]
    NotComputed { tensor: String },
    #[error("tensor {tensor:?}: in a mapped shard, but its stream cannot read from a mapping (a reshard bug)")]
    NotMappable { tensor: String },
    #[error("interrupted; finished shards are kept and a rerun resumes")]
    Interrupted,
}

/// How to run a plan.
pub struct ExecOptions<'a> {
    pub threads: usize,
    /// Set from another thread (Ctrl-C) to stop between chunks.
    pub cancel: &'a AtomicBool,
    /// Shards to leave alone (finished by an earlier run).
    pub skip: &'a (dyn Fn(&ShardPlan) -> bool + Sync),
    /// Called from the worker as each shard is committed.
    pub on_shard: &'a (dyn Fn(&ShardRecord) -> Result<(), WriteError> + Sync),
    /// The shard digest to record.
    pub digest: DigestAlgo,
    /// How bytes that need no cast are moved.
    pub copy: CopyPath,
}

/// How shard bytes that need no cast are moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyPath {
    /// Write from mappings of the source where the file system allows it,
    /// else read and write.
    #[default]
    Auto,
    /// Always read into a buffer and write from it.
    ReadWrite,
}

/// One run of the executor: what every shard's worker reads from and
/// writes to, passed as one value instead of seven arguments.
#[derive(Clone, Copy)]
pub(crate) struct Job<'a> {
    pub reader: &'a SourceReader,
    pub ck: &'a Checkpoint,
    pub plan: &'a Plan,
    pub dst: &'a Path,
    pub pool: &'a WindowPool,
    pub options: &'a ExecOptions<'a>,
    pub reporter: &'a dyn Reporter,
    /// Scales a quantized weight's codes or scales stream derived, for its
    /// other stream.
    pub memo: &'a ScaleMemo,
}
