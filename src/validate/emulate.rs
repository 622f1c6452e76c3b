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

use std::fmt;
use std::fs::File;
use std::str::FromStr;
use std::time::Instant;

use memmap2::{MmapMut, MmapOptions};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use super::integrity::{Expected, ShardCheck};
use super::ledger::CommitLedger;
use super::report::{EmulationReport, Failure, ShardTiming, ValidateReport};
use super::ValidateError;
use crate::format::{Checkpoint, DataRef};

/// A loader whose mapping pattern `--emulate` reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Loader {
    TransformersV5Mmap,
    PerShardMmap,
    FullRead,
}

impl Loader {
    pub const ALL: [Loader; 3] = [
        Loader::TransformersV5Mmap,
        Loader::PerShardMmap,
        Loader::FullRead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Loader::TransformersV5Mmap => "transformers-v5-mmap",
            Loader::PerShardMmap => "per-shard-mmap",
            Loader::FullRead => "full-read",
        }
    }

    /// Whether every shard stays in memory until the end.
    pub fn keeps_all(self) -> bool {
        !matches!(self, Loader::PerShardMmap)
    }
}

impl fmt::Display for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Loader {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Loader::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Loader::ALL.iter().map(|l| l.name()).collect();
                format!("unknown loader {s:?}: use one of {}", names.join(", "))
            })
    }
}

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

fn is_enomem(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOMEM) || e.kind() == std::io::ErrorKind::OutOfMemory
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
            Err(e) if is_enomem(&e) => {
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
            let len = usize::try_from(size)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
            let mut v = Vec::new();
            v.try_reserve_exact(len)
                .map_err(|_| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
            v.resize(len, 0);
            crate::format::pread::read_exact_at(file, &mut v, 0)?;
            Ok(Held::Read(v))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_loader_names() {
        for l in Loader::ALL {
            assert_eq!(l.name().parse::<Loader>().unwrap(), l);
            assert_eq!(
                serde_json::to_string(&l).unwrap(),
                format!("\"{}\"", l.name())
            );
        }
        assert!("transformers".parse::<Loader>().is_err());
    }
}
