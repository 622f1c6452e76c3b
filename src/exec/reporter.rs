//! Progress reporting as a trait: the executor calls it, the CLI implements it
//! with indicatif, tests and libraries pass [`NoReport`].

/// Receives progress from the executor's workers.
pub trait Reporter: Sync {
    /// The run will move `bytes` source bytes in total.
    fn start(&self, _bytes: u64) {}
    /// A worker moved `bytes` more source bytes.
    fn advance(&self, _bytes: u64) {}
    fn shard_started(&self, _file: &str) {}
    fn shard_done(&self, _file: &str) {}
    fn finish(&self) {}
}

/// A reporter that ignores everything.
pub struct NoReport;

impl Reporter for NoReport {}
