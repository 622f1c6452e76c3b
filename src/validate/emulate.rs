//! Reproducing other loaders' mapping patterns, to measure what they commit.
//!
//! This is the one place reshard maps a file copy-on-write, on purpose:
//! a private writable mapping (memmap2 `map_copy`) is what PyTorch's
//! `from_file` and the safetensors loader make, Windows charges its whole
//! size against the commit limit when it is mapped, and Linux charges it to
//! `VmData` and `RLIMIT_DATA` the same way. A read-only view
//! (`map_copy_read_only`, `Mmap::map`) is charged by neither and would
//! measure nothing. The mappings are only read, never written, so no page is
//! ever copied and the files are never modified.
//!
//! * `transformers-v5-mmap` (transformers 5.0 to 5.16): every shard mapped
//!   and kept mapped; peak sum(S).
//! * `per-shard-mmap` (transformers v4, accelerate, diffusers, vLLM's
//!   default iterator): one shard mapped at a time; peak max(S).
//! * `full-read` (`disable_mmap`, `load_file` into RAM): every file read
//!   whole into memory and kept; peak sum(S).
//!
//! The safetensors loader also makes a short-lived second view of each file
//! to read its header; it is not reproduced (it adds up to max(S) for a
//! moment on Windows, see docs/validate.md).

#![allow(unsafe_code)]

use std::fs::File;
use std::time::Instant;

use memmap2::{MmapMut, MmapOptions};
use xxhash_rust::xxh3::xxh3_64;

use super::integrity::{Expected, ShardCheck};
use super::ledger::CommitLedger;
use super::options::Loader;
use super::report::{EmulationReport, Failure, ShardTiming, ValidateReport};
use super::ValidateError;
use crate::format::{Checkpoint, DataRef};

/// One shard held the way the loader holds it.
enum Held {
    Map(MmapMut),
    Read(Vec<u8>),
}

impl Held {
    fn bytes(&self) -> &[u8] {
        match self {
            Held::Map(m) => m,
            Held::Read(v) => v,
        }
    }
}

/// Maps (or reads) the shards of `ck` in `order` as `loader` does, checking
/// every tensor's bytes on the way, and records the pattern in `report`.
pub fn run(
    ck: &Checkpoint,
    order: &[usize],
    loader: Loader,
    expect: &Expected<'_>,
    ledger: &mut CommitLedger,
    report: &mut ValidateReport,
) -> Result<(), ValidateError> {
    let sizes: Vec<u64> = order.iter().map(|&f| ck.files[f].size).collect();
    let sum: u64 = sizes.iter().sum();
    let max = sizes.iter().copied().max().unwrap_or(0);
    report.emulation = Some(EmulationReport {
        loader,
        shards: order.len(),
        sum_shards: sum,
        max_shard: max,
        predicted_peak: if loader.keeps_all() { sum } else { max },
    });
    let mut kept: Vec<Held> = Vec::new();
    kept.try_reserve_exact(order.len())
        .map_err(|_| ValidateError::Child {
            reason: "out of memory".into(),
        })?;
    for &file in order {
        let started = Instant::now();
        let source = &ck.files[file];
        let name = source.name();
        let io = |e: std::io::Error| ValidateError::Io {
            what: format!("read {}", source.path.display()),
            source: e,
        };
        let f = File::open(&source.path).map_err(io)?;
        let held = match hold(&f, source.size, loader) {
            Ok(h) => h,
            Err(e) if crate::platform::is_out_of_memory(&e) => {
                let committed = ledger.sample();
                report.fail(Failure::OverBudget {
                    shard: name,
                    tensor: None,
                    needed: source.size,
                    committed,
                    budget: report.commit_budget,
                });
                return Ok(());
            }
            Err(e) => return Err(io(e)),
        };
        ledger.sample();
        let bytes = held.bytes();
        let mut check = ShardCheck::new(expect.shard(file));
        check.update(bytes);
        check.finish(&mut report.failures);
        let mut tensor_bytes = 0;
        let mut count = 0;
        for (i, t) in ck
            .tensors
            .iter()
            .enumerate()
            .filter(|(_, t)| t.file == file)
        {
            let DataRef::Contiguous { offset } = t.data else {
                continue;
            };
            let range = usize::try_from(offset)
                .ok()
                .zip(usize::try_from(offset + t.len).ok());
            let Some(data) = range.and_then(|(a, b)| bytes.get(a..b)) else {
                continue; // format::open checked the offsets against the size
            };
            expect.check_tensor(ck, i, xxh3_64(data), &mut report.failures);
            tensor_bytes += t.len;
            count += 1;
        }
        ledger.sample();
        if loader.keeps_all() {
            kept.push(held);
        }
        report.bytes_loaded += tensor_bytes;
        report.shards.push(ShardTiming {
            file: name,
            bytes: tensor_bytes,
            tensors: count,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    Ok(())
}

/// Maps `file` copy-on-write, or reads it whole, as `loader` would.
fn hold(file: &File, size: u64, loader: Loader) -> std::io::Result<Held> {
    match loader {
        Loader::TransformersV5Mmap | Loader::PerShardMmap => {
            // SAFETY: a private (copy-on-write) mapping: writes through it
            // would never reach the file, and we never write. The file is
            // opened read-only and was checked unchanged when the checkpoint
            // was opened; if another process truncates it while mapped,
            // reading the lost pages raises SIGBUS, the documented hazard of
            // every mmap loader this emulates.
            let map = unsafe { MmapOptions::new().map_copy(file) }?;
            Ok(Held::Map(map))
        }
        Loader::FullRead => {
            let len = usize::try_from(size).map_err(|_| crate::platform::out_of_memory())?;
            let mut v = Vec::new();
            v.try_reserve_exact(len)
                .map_err(|_| crate::platform::out_of_memory())?;
            v.resize(len, 0);
            crate::platform::read_exact_at(file, &mut v, 0)?;
            Ok(Held::Read(v))
        }
    }
}
