//! Reproducing other loaders' memory patterns, to measure what they commit.
//!
//! The pattern of each loader is fit's model ([`crate::fit::loader::pattern`]),
//! term by term, so `validate --emulate` and `fit` agree by construction:
//! the model's own storage (sum(T), one block, filled tensor by tensor as
//! the real loader fills its parameters), the loader's fixed overhead (one
//! block standing in for its reader threads and Python objects), and the
//! shards it holds (every one, one at a time, or none), mapped or read.
//!
//! This is the one place reshard maps a file copy-on-write, on purpose
//! ([`crate::platform::CopyOnWriteView`]):
//! a private writable mapping (memmap2 `map_copy`) is what PyTorch's
//! `from_file` and the safetensors loader make, Windows charges its whole
//! size against the commit limit when it is mapped, and Linux charges it to
//! `VmData` and `RLIMIT_DATA` the same way. A read-only view would measure
//! nothing. The mappings are only read, never written, so no page is ever
//! copied and the files are never modified. On Windows the mapping loaders'
//! second, short-lived header view is reproduced too (a second mapping of
//! the file while the first is made).
//!
//! Every load checks sizes: a shard that is shorter than its header
//! describes when it is mapped or read (truncated since it was opened) is
//! [`ValidateError::Truncated`], never a short slice or a panic; a
//! truncation while it is mapped ends the run through the platform's
//! registered-mapping fault handling (exit status 2, the file named).

use std::fs::File;
use std::path::Path;
use std::time::Instant;

use crate::write::digest::xxh3_64;

use super::integrity::{Expected, ShardCheck};
use super::ledger::CommitLedger;
use super::options::{Loader, ValidateOptions};
use super::report::{EmulationReport, Failure, ShardTiming, ValidateReport};
use super::ValidateError;
use crate::fit::loader::{self as model, LoadParams, Os, Pattern, ShardHold, Sizes};
use crate::format::{Checkpoint, DataRef};
use crate::platform::{CopyOnWriteView, PrivateMemory};

use super::options::Cancel;

/// Bytes copied, read or hashed between two looks at the cancel flag: a
/// multi-GiB tensor or shard stops within one step of Ctrl-C.
const CANCEL_STEP: usize = 16 << 20;

/// The payload of the `io::Error` a cancelled step returns, told apart
/// from a real I/O error by [`cancelled`].
#[derive(Debug)]
struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Cancelled {}

/// Called after each step, so a pause there (`RESHARD_PAUSE_AT=emulate-step`,
/// for the tests) falls inside a tensor that takes more than one step.
fn poll(cancel: &Cancel) -> std::io::Result<()> {
    crate::write::failpoint::named("emulate-step");
    match cancel.is_set() {
        true => Err(std::io::Error::other(Cancelled)),
        false => Ok(()),
    }
}

/// Whether `e` is a cancelled step rather than an I/O error.
fn cancelled(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|r| r.is::<Cancelled>())
}

/// `dst.copy_from_slice(src)`, a step at a time.
fn copy_polling(dst: &mut [u8], src: &[u8], cancel: &Cancel) -> std::io::Result<()> {
    for (d, s) in dst.chunks_mut(CANCEL_STEP).zip(src.chunks(CANCEL_STEP)) {
        d.copy_from_slice(s);
        poll(cancel)?;
    }
    Ok(())
}

/// `read_exact_at(file, dst, offset)`, a step at a time.
fn read_polling(file: &File, dst: &mut [u8], offset: u64, cancel: &Cancel) -> std::io::Result<()> {
    let mut at = offset;
    for d in dst.chunks_mut(CANCEL_STEP) {
        crate::platform::read_exact_at(file, d, at)?;
        at += d.len() as u64;
        poll(cancel)?;
    }
    Ok(())
}

/// Hashes `bytes` into `check`, a step at a time.
fn hash_polling(check: &mut ShardCheck, bytes: &[u8], cancel: &Cancel) -> std::io::Result<()> {
    for piece in bytes.chunks(CANCEL_STEP) {
        check.update(piece);
        poll(cancel)?;
    }
    Ok(())
}

/// One shard held the way the loader holds it.
enum Held {
    Map(CopyOnWriteView),
    Read(PrivateMemory),
}

impl Held {
    fn bytes(&self) -> &[u8] {
        match self {
            Held::Map(m) => m,
            Held::Read(v) => v,
        }
    }
}

/// The pattern and predicted peak of `loader` on `ck`, as fit computes them
/// for this OS without a GPU.
pub fn prediction(ck: &Checkpoint, loader: Loader) -> (Pattern, model::Peak) {
    let shards: Vec<u64> = ck.files.iter().map(|f| f.size).collect();
    let sizes = Sizes::new(&shards, ck.tensors.iter().map(|t| t.len));
    let params = LoadParams::calibrated(Os::current());
    (
        model::pattern(loader, &sizes, &params),
        model::peak(loader, &sizes, &params),
    )
}

/// Holds the shards of `ck` in `order` as `loader` does, checking every
/// tensor's bytes on the way, and records the pattern in `report`.
pub fn run(
    ck: &Checkpoint,
    order: &[usize],
    loader: Loader,
    expect: &Expected<'_>,
    options: &ValidateOptions,
    ledger: &mut CommitLedger,
    report: &mut ValidateReport,
) -> Result<(), ValidateError> {
    let (pattern, peak) = prediction(ck, loader);
    let sizes: Vec<u64> = order.iter().map(|&f| ck.files[f].size).collect();
    report.emulation = Some(EmulationReport {
        loader,
        shards: order.len(),
        sum_shards: sizes.iter().sum(),
        max_shard: sizes.iter().copied().max().unwrap_or(0),
        predicted_peak: peak.open_commit,
    });
    let over = |report: &mut ValidateReport, ledger: &mut CommitLedger, shard: String, needed| {
        let committed = ledger.sample();
        report.fail(Failure::OverBudget {
            shard,
            tensor: None,
            needed,
            committed,
            budget: report.commit_budget,
        });
    };
    // The fixed terms first, as the real loaders allocate them.
    let mut storage = match block(pattern.storage) {
        Ok(b) => b,
        Err(_) => {
            over(report, ledger, "(model storage)".into(), pattern.storage);
            return Ok(());
        }
    };
    let _overhead = match block(pattern.overhead) {
        Ok(b) => b,
        Err(_) => {
            over(report, ledger, "(loader overhead)".into(), pattern.overhead);
            return Ok(());
        }
    };
    ledger.sample();
    let mut kept: Vec<Held> = Vec::new();
    let mut cursor = 0usize;
    for &file in order {
        let started = Instant::now();
        let source = &ck.files[file];
        options.progress.shard_started(&source.name());
        let io = |e: std::io::Error| ValidateError::Io {
            what: format!("read {}", source.path.display()),
            source: e,
        };
        let f = File::open(&source.path).map_err(io)?;
        let mut tensors: Vec<usize> = (0..ck.tensors.len())
            .filter(|&i| ck.tensors[i].file == file)
            .collect();
        tensors.sort_by_key(|&i| match ck.tensors[i].data {
            DataRef::Contiguous { offset } => offset,
            _ => u64::MAX,
        });
        let mut check = ShardCheck::new(expect.shard(file));
        let truncated = || ValidateError::Truncated {
            path: source.path.clone(),
            len: f.metadata().map_or(0, |m| m.len()),
            expected: source.size,
        };
        let interrupted = || ValidateError::Interrupted {
            path: ck.dir.clone(),
        };
        let held = match hold(&f, &source.path, source.size, &pattern, &options.cancel) {
            Ok(h) => h,
            Err(e) if cancelled(&e) => return Err(interrupted()),
            Err(e) if crate::platform::is_out_of_memory(&e) => {
                over(report, ledger, source.name(), source.size);
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(truncated()),
            Err(e) => return Err(io(e)),
        };
        ledger.sample();
        let mut bytes_loaded = 0;
        let mut count = 0;
        let mut pos = 0u64;
        for &i in &tensors {
            crate::write::failpoint::named("emulate");
            if options.cancel.is_set() {
                return Err(interrupted());
            }
            let t = &ck.tensors[i];
            let DataRef::Contiguous { offset } = t.data else {
                continue;
            };
            let (Some(start), Some(end)) = (
                usize::try_from(offset).ok(),
                usize::try_from(offset + t.len).ok(),
            ) else {
                continue; // format::open checked the offsets against the size
            };
            let len = end - start;
            let dst = storage
                .as_deref_mut()
                .and_then(|s| s.get_mut(cursor..cursor + len));
            let shard_io = |e: std::io::Error| {
                if cancelled(&e) {
                    interrupted()
                } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    truncated()
                } else {
                    io(e)
                }
            };
            let data: &[u8] = match (&held, dst) {
                (Some(h), Some(dst)) => {
                    let src = h.bytes().get(start..end).ok_or_else(truncated)?;
                    copy_polling(dst, src, &options.cancel).map_err(shard_io)?;
                    dst
                }
                (Some(h), None) => h.bytes().get(start..end).ok_or_else(truncated)?,
                (None, Some(dst)) => {
                    // Straight from the file into the storage, as pread does;
                    // the bytes between tensors (the header) are hashed too.
                    if check.active() && offset > pos {
                        let gap = read_range(&f, pos, offset).map_err(shard_io)?;
                        check.update(&gap);
                    }
                    read_polling(&f, dst, offset, &options.cancel).map_err(shard_io)?;
                    dst
                }
                (None, None) => continue,
            };
            if held.is_none() {
                check.update(data);
                pos = offset + t.len;
            }
            expect.check_tensor(ck, i, xxh3_64(data), &mut report.failures);
            cursor += if storage.is_some() { len } else { 0 };
            bytes_loaded += t.len;
            options.progress.advance(t.len);
            count += 1;
        }
        match &held {
            Some(h) => {
                hash_polling(&mut check, h.bytes(), &options.cancel).map_err(
                    |e| match cancelled(&e) {
                        true => interrupted(),
                        false => io(e),
                    },
                )?
            }
            None if check.active() && pos < source.size => {
                let tail = read_range(&f, pos, source.size).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        truncated()
                    } else {
                        io(e)
                    }
                })?;
                check.update(&tail);
            }
            None => {}
        }
        check.finish(&mut report.failures);
        ledger.sample();
        if let (Some(h), ShardHold::All) = (held, pattern.shards) {
            kept.push(h);
        }
        report.bytes_loaded += bytes_loaded;
        report.shards.push(ShardTiming {
            file: source.name(),
            bytes: bytes_loaded,
            tensors: count,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    ledger.sample();
    Ok(())
}

/// A committed block of `len` bytes, or none for 0.
fn block(len: u64) -> std::io::Result<Option<PrivateMemory>> {
    if len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| crate::platform::out_of_memory())?;
    PrivateMemory::new(len).map(Some)
}

/// Bytes `start..end` of `file` (the header, between tensors: small).
fn read_range(file: &File, start: u64, end: u64) -> std::io::Result<Vec<u8>> {
    let len =
        usize::try_from(end.saturating_sub(start)).map_err(|_| crate::platform::out_of_memory())?;
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| crate::platform::out_of_memory())?;
    v.resize(len, 0);
    crate::platform::read_exact_at(file, &mut v, start)?;
    Ok(v)
}

/// Maps `file` copy-on-write, or reads it whole, as `pattern` holds a
/// shard; `None` when the loader holds no shard. A file shorter than
/// `size` (its header's claim) is an `UnexpectedEof` error.
fn hold(
    file: &File,
    path: &Path,
    size: u64,
    pattern: &Pattern,
    cancel: &Cancel,
) -> std::io::Result<Option<Held>> {
    let short = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
    let map = || -> std::io::Result<CopyOnWriteView> {
        let view = CopyOnWriteView::map(file, path)?;
        if (view.len() as u64) < size {
            return Err(short());
        }
        Ok(view)
    };
    let _header_view = if pattern.header_view {
        Some(map()?)
    } else {
        None
    };
    match (pattern.shards, pattern.mapped) {
        (ShardHold::None, _) => Ok(None),
        (_, true) => Ok(Some(Held::Map(map()?))),
        (_, false) => {
            let len = usize::try_from(size).map_err(|_| crate::platform::out_of_memory())?;
            if len == 0 {
                return Ok(None);
            }
            let mut v = PrivateMemory::new(len)?;
            read_polling(file, &mut v, 0, cancel)?;
            Ok(Some(Held::Read(v)))
        }
    }
}
