//! The mapped-copy path: a shard whose tensors are all stored contiguously
//! and not cast is written straight from read-only *shared* mappings of the
//! source files, one chunk at a time. Each 256 KiB block of a mapping is
//! hashed (the shard digest, then the tensor's xxh3) and written from the
//! mapping while it is in the CPU's cache, so every byte is copied once
//! (into the page cache of the output, by `write`) and read from memory
//! once.
//!
//! Why not `copy_file_range`, which the previous version used: it copied
//! in the kernel through a pipe, and the output then had to be mapped and
//! read back from memory for the hashes. On the 1 GB benchmark that cost
//! 0.45 to 0.5 CPU s per 536 MB against 0.3 to 0.4 for this path (each
//! run after touching 1.5 GB, see docs/performance.md), and it only ever
//! worked on Linux; this path is the same on Windows, where a shared
//! read-only view is not charged against the commit limit.
//!
//! Runs of tensors that are adjacent in the source (and in the shard) are
//! mapped together, so a layer's small norms and biases do not each cost a
//! mapping. A run shorter than [`MAP_MIN`] is read with `pread` into a
//! small buffer instead: mapping and unmapping costs more than copying it.
//!
//! Memory: a worker maps at most one chunk at a time; that chunk (plus
//! [`MAP_SLACK`]) and the small-run buffer are reserved from the
//! [`WindowPool`] for the whole shard, so the window bound holds as on the
//! buffered path. The first mapping is asked for before anything is
//! written: a file system that refuses it sends the shard (and the rest) to
//! the buffered path.
//!
//! Each block is read twice from the page cache (by the hashes, then by
//! `write`), so a source rewritten in place during the copy could leave a
//! shard whose bytes differ from its recorded hashes; the sources' size and
//! mtime are checked again before the conversion commits
//! (`Checkpoint::check_unchanged`), and a change fails the run. The
//! source-truncation race of mappings is the one [`super::mapped`]
//! describes; `--no-mmap` (plain read and write for everything)
//! avoids it.

use std::sync::atomic::Ordering;

use super::job::{ExecError, Job};
use super::mapped::{MAP_MIN, MAP_SLACK};
use super::Reporter;
use crate::format::read::SourceReader;
use crate::format::{Checkpoint, DataRef, FormatError, Tensor};
use crate::plan::{PlannedTensor, ShardPlan};
use crate::write::digest::Xxh3;
use crate::write::manifest::{ShardRecord, TensorRecord};
use crate::write::shard::ShardWriter;

/// Most input bytes one mapping holds: larger mappings are no faster.
const MAP_CHUNK: u64 = 8 << 20;

/// Whether `shard` can take the mapped-copy path: every tensor keeps its
/// dtype and is stored as one contiguous range.
pub fn eligible(ck: &Checkpoint, shard: &ShardPlan) -> bool {
    shard.tensors.iter().all(|t| {
        t.dtype == t.source_dtype
            && t.input.is_source()
            && matches!(
                ck.tensors[t.input.primary()].data,
                DataRef::Contiguous { .. }
            )
    })
}

/// A run of planned tensors, `shard.tensors[first..end]`, whose bytes lie
/// back to back in one source file from `start`, `len` bytes in all.
struct Run {
    first: usize,
    end: usize,
    start: u64,
    len: u64,
}

/// The shard's tensors cut into runs that are adjacent in the source.
fn runs(ck: &Checkpoint, shard: &ShardPlan) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (k, planned) in shard.tensors.iter().enumerate() {
        let source = &ck.tensors[planned.input.primary()];
        let start = source.offset();
        match runs.last_mut() {
            Some(run)
                if ck.tensors[shard.tensors[run.first].input.primary()].file == source.file
                    && run.start.checked_add(run.len) == Some(start) =>
            {
                run.end = k + 1;
                run.len += source.len;
            }
            _ => runs.push(Run {
                first: k,
                end: k + 1,
                start,
                len: source.len,
            }),
        }
    }
    runs
}

/// What [`copy_shard`] did.
#[derive(Debug)]
pub enum Copied {
    /// The shard is written.
    Done(ShardRecord),
    /// This worker's share of the window is too small to map this shard:
    /// write it through buffers (other shards may still map).
    TooSmall,
    /// The file system refused to map the source: write this shard, and
    /// the rest, through buffers.
    Refused,
}

/// Writes `shard` from mappings of its source, at most `buffer` bytes of
/// the window (this worker's share) in use. Unless it is `Done`, nothing
/// was written or reported and the caller writes the shard through buffers.
pub(crate) fn copy_shard(
    job: &Job<'_>,
    shard: &ShardPlan,
    buffer: u64,
) -> Result<Copied, ExecError> {
    let Job {
        reader,
        ck,
        plan,
        dst,
        pool,
        options,
        reporter,
        ..
    } = *job;
    let runs = runs(ck, shard);
    let longest = |small: bool| {
        runs.iter()
            .map(|r| r.len)
            .filter(|&l| (l < MAP_MIN) == small)
            .max()
            .unwrap_or(0)
    };
    let small_len = longest(true);
    if buffer < 4 * MAP_SLACK + small_len {
        return Ok(Copied::TooSmall);
    }
    let map_len = (buffer - MAP_SLACK - small_len)
        .min(MAP_CHUNK)
        .min(longest(false))
        .max(1);
    let small_len = usize::try_from(small_len).unwrap_or(usize::MAX);
    let map_len = usize::try_from(map_len).unwrap_or(usize::MAX);
    let (mut small, _reserved) =
        pool.acquire_and_reserve(small_len, 1, map_len as u64 + MAP_SLACK)?;
    let mut small = small.pop();
    // Ask for the first mapping before anything is written, so a file
    // system that refuses to map leaves nothing to undo (the shard's small
    // runs may come first).
    if let Some(run) = runs.iter().find(|r| r.len >= MAP_MIN) {
        let first = &ck.tensors[shard.tensors[run.first].input.primary()];
        match reader.map_at(first, run.start, run.len.min(map_len as u64) as usize) {
            Ok(_) => {}
            Err(FormatError::Io { .. }) => return Ok(Copied::Refused),
            Err(e) => return Err(e.into()),
        }
    }
    let path = dst.join(&shard.file);
    let header = crate::write::format::of_plan(plan).header_bytes(&path, plan, shard)?;
    let mut writer =
        ShardWriter::create(dst, &shard.file, &header, shard.data_len, options.digest)?;
    reporter.shard_started(&shard.file);
    let mut tensors = TensorHashes::new(&shard.tensors);
    for run in &runs {
        let mut done = 0u64;
        while done < run.len {
            if options.cancel.load(Ordering::Relaxed) {
                return Err(ExecError::Interrupted);
            }
            let at = run.start + done;
            let n = if run.len < MAP_MIN {
                run.len
            } else {
                (run.len - done).min(map_len as u64)
            };
            check_length(reader, ck, shard, run, at + n)?;
            tensors.close_full();
            // The tensor these bytes start in, for messages.
            let named = &ck.tensors[shard.tensors[tensors.next].input.primary()];
            if run.len < MAP_MIN {
                let buf = small.as_deref_mut().unwrap_or(&mut []);
                let buf = &mut buf[..n as usize];
                read_at(reader, named, at, buf)?;
                tensors.write(&mut writer, buf, reporter)?;
            } else {
                let map = reader.map_at(named, at, n as usize)?;
                let written = tensors.write(&mut writer, &map, reporter);
                written.map_err(|e| {
                    blame_source(e, || check_length(reader, ck, shard, run, at + n))
                })?;
            }
            done += n;
        }
    }
    let records = tensors.finish();
    let finished = writer.finish()?;
    reporter.shard_done(&shard.file);
    Ok(Copied::Done(ShardRecord {
        file: finished.file,
        size: finished.size,
        digest: finished.digest,
        tensors: records,
    }))
}

/// A write from a mapping of a source that shrank under it fails in the
/// kernel (`EFAULT`, "Bad address", for the output file) rather than by a
/// fault: any error while writing from a mapping is first checked against
/// the source, and when the source no longer holds the bytes, the error
/// names the source and the tensor instead of the output.
fn blame_source(e: ExecError, source_check: impl FnOnce() -> Result<(), FormatError>) -> ExecError {
    match (&e, source_check()) {
        (ExecError::Write(_), Err(short)) => short.into(),
        _ => e,
    }
}

/// Checks that the source file of `run` still holds its bytes up to `end`
/// (it was checked at open; this catches a file truncated since, before a
/// mapping of it could fault): an error names the file and the first
/// tensor whose bytes are gone.
fn check_length(
    reader: &SourceReader,
    ck: &Checkpoint,
    shard: &ShardPlan,
    run: &Run,
    end: u64,
) -> Result<(), FormatError> {
    let tensors = || {
        shard.tensors[run.first..run.end]
            .iter()
            .map(|p| &ck.tensors[p.input.primary()])
    };
    let Some(first) = tensors().next() else {
        return Ok(());
    };
    let (file, path) = reader.file(first.file);
    let len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    if len >= end {
        return Ok(());
    }
    let gone = tensors()
        .find(|t| t.offset() + t.len > len)
        .unwrap_or(first);
    Err(FormatError::BadData {
        path: path.to_path_buf(),
        tensor: gone.name.clone(),
        reason: "data ends early; the file was truncated or changed".into(),
    })
}

/// Reads `buf.len()` bytes of `tensor`'s file at `at`; a file that ends
/// early is an error naming the file and tensor.
fn read_at(
    reader: &SourceReader,
    tensor: &Tensor,
    at: u64,
    buf: &mut [u8],
) -> Result<(), FormatError> {
    let (file, path) = reader.file(tensor.file);
    crate::platform::read_exact_at(file, buf, at).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FormatError::BadData {
                path: path.to_path_buf(),
                tensor: tensor.name.clone(),
                reason: "data ends early; the file was truncated or changed".into(),
            }
        } else {
            FormatError::io(path, e)
        }
    })
}

/// The xxh3 of each tensor of a shard, taken as the shard's bytes pass in
/// order, and their records.
struct TensorHashes<'a> {
    planned: &'a [PlannedTensor],
    /// The tensor the next byte belongs to.
    next: usize,
    /// Bytes of it seen so far.
    seen: u64,
    hash: Xxh3,
    records: Vec<TensorRecord>,
}

impl<'a> TensorHashes<'a> {
    fn new(planned: &'a [PlannedTensor]) -> Self {
        TensorHashes {
            planned,
            next: 0,
            seen: 0,
            hash: Xxh3::new(),
            records: Vec::with_capacity(planned.len()),
        }
    }

    /// Closes every tensor whose bytes are all seen (zero-length ones at
    /// once), so `next` is the tensor the next byte belongs to.
    fn close_full(&mut self) {
        while let Some(t) = self.planned.get(self.next) {
            if self.seen < t.len {
                break;
            }
            let hash = std::mem::take(&mut self.hash);
            self.records.push(TensorRecord {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                xxh3: format!("{:016x}", hash.digest()),
                cast: None,
                quantized: None,
            });
            self.next += 1;
            self.seen = 0;
        }
    }

    /// Writes `bytes` (the next bytes of the shard's data) through
    /// `writer`, each tensor's share into its xxh3.
    fn write(
        &mut self,
        writer: &mut ShardWriter,
        mut bytes: &[u8],
        reporter: &dyn Reporter,
    ) -> Result<(), ExecError> {
        let total = bytes.len() as u64;
        while !bytes.is_empty() {
            self.close_full();
            let Some(t) = self.planned.get(self.next) else {
                break;
            };
            let take = usize::try_from(t.len - self.seen)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            writer.write_blocks(now, &mut |block| self.hash.update(block))?;
            self.seen += take as u64;
            bytes = rest;
        }
        self.close_full();
        reporter.advance(total);
        Ok(())
    }

    fn finish(mut self) -> Vec<TensorRecord> {
        self.close_full();
        self.records
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::NoReport;
    use crate::exec::{CopyPath, ExecOptions, WindowPool};
    use crate::plan::PlanOptions;
    use std::path::Path;
    use std::sync::atomic::AtomicBool;

    /// Names that sort in the file's order.
    const IN_ORDER: [&str; 5] = ["model.a", "model.b", "model.c", "model.d", "model.e"];

    /// A safetensors file of: a large u8 tensor (several 8 KiB mappings in
    /// the test), a run of small ones next to each other, an empty one, an
    /// f32 tensor. With `scramble`, the plan's order differs from the file's
    /// (names sort otherwise), so runs break.
    fn source(dir: &Path, names: [&str; 5]) -> Checkpoint {
        let a: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let s1: Vec<u8> = (0..1000u32).map(|i| (i % 13) as u8).collect();
        let s2: Vec<u8> = (0..3u8).collect();
        let b: Vec<u8> = (0..70_000u32)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let (e1, e2, e3) = (a.len(), a.len() + s1.len(), a.len() + s1.len() + s2.len());
        let e4 = e3 + b.len();
        let header = serde_json::json!({
            "__metadata__": {"format": "pt"},
            names[0]: {"dtype": "U8", "shape": [a.len()], "data_offsets": [0, e1]},
            names[1]: {"dtype": "U8", "shape": [s1.len()], "data_offsets": [e1, e2]},
            names[2]: {"dtype": "U8", "shape": [3], "data_offsets": [e2, e3]},
            names[3]: {"dtype": "U8", "shape": [0], "data_offsets": [e3, e3]},
            names[4]: {"dtype": "F32", "shape": [70_000], "data_offsets": [e3, e4]},
        });
        let path = dir.join("model.safetensors");
        crate::format::safetensors::write_test_file(&path, &header, &[&a, &s1, &s2, &b]);
        crate::format::open(&path).unwrap()
    }

    fn options<'a>(cancel: &'a AtomicBool, copy: CopyPath) -> ExecOptions<'a> {
        ExecOptions {
            threads: 1,
            cancel,
            skip: &|_| false,
            on_shard: &|_| Ok(()),
            digest: Default::default(),
            copy,
        }
    }

    fn run(ck: &Checkpoint, dst: &Path, copy: CopyPath) -> Vec<ShardRecord> {
        std::fs::create_dir_all(dst).unwrap();
        let plan = crate::write::format::plan(ck, &PlanOptions::default()).unwrap();
        let cancel = AtomicBool::new(false);
        let pool = WindowPool::new(1 << 20);
        crate::exec::execute(ck, &plan, dst, &pool, &options(&cancel, copy), &NoReport).unwrap()
    }

    #[test]
    fn the_mapped_copy_writes_what_read_write_writes() {
        let scrambled = ["model.e", "model.b", "model.d", "model.a", "model.c"];
        for names in [IN_ORDER, scrambled] {
            let tmp = tempfile::tempdir().unwrap();
            let ck = source(tmp.path(), names);
            let plan = crate::write::format::plan(&ck, &PlanOptions::default()).unwrap();
            let shard = &plan.shards[0];
            assert!(eligible(&ck, shard));
            // Called directly with a small share: many mappings per tensor.
            let direct = tmp.path().join("direct");
            std::fs::create_dir_all(&direct).unwrap();
            let reader = SourceReader::open(&ck).unwrap();
            let cancel = AtomicBool::new(false);
            let pool = WindowPool::new(1 << 20);
            let options = options(&cancel, CopyPath::Auto);
            let job = Job {
                reader: &reader,
                ck: &ck,
                plan: &plan,
                dst: &direct,
                pool: &pool,
                options: &options,
                reporter: &NoReport,
                memo: &Default::default(),
            };
            let got = copy_shard(&job, shard, 4 * MAP_SLACK + 8192).unwrap();
            let Copied::Done(got) = got else {
                panic!("the mapped copy did not take the shard: {got:?}");
            };
            assert_eq!(pool.in_use(), 0);
            assert!(pool.peak() <= 4 * MAP_SLACK + 8192, "{}", pool.peak());
            let slow = run(&ck, &tmp.path().join("slow"), CopyPath::ReadWrite);
            let auto = run(&ck, &tmp.path().join("auto"), CopyPath::Auto);
            assert_eq!(auto, slow, "{names:?}");
            assert_eq!(got, slow[0], "{names:?}");
            let want = std::fs::read(tmp.path().join("slow").join(&shard.file)).unwrap();
            for out in [direct, tmp.path().join("auto")] {
                assert_eq!(std::fs::read(out.join(&shard.file)).unwrap(), want);
            }
        }
    }

    #[test]
    fn adjacent_tensors_share_a_run() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path(), IN_ORDER);
        let plan = crate::write::format::plan(&ck, &PlanOptions::default()).unwrap();
        let mut shard = plan.shards[0].clone();
        // In the file's order, every byte is one run.
        shard.tensors.sort_by_key(|t| {
            (
                ck.tensors[t.input.primary()].offset(),
                ck.tensors[t.input.primary()].len,
            )
        });
        let total: u64 = ck.tensors.iter().map(|t| t.len).sum();
        let one = runs(&ck, &shard);
        assert_eq!(one.len(), 1);
        assert_eq!((one[0].first, one[0].end, one[0].len), (0, 5, total));
        // The large tensor moved to the end: it starts a run of its own,
        // and the rest stay one.
        let large = shard.tensors.remove(0);
        let large_at = ck.tensors[large.input.primary()].offset();
        shard.tensors.push(large);
        let two: Vec<_> = runs(&ck, &shard)
            .iter()
            .map(|r| (r.first, r.end, r.start))
            .collect();
        let rest_at = ck.tensors[shard.tensors[0].input.primary()].offset();
        assert_eq!(two, [(0, 4, rest_at), (4, 5, large_at)]);
    }

    #[test]
    fn a_source_truncated_after_open_is_an_error_naming_file_and_tensor() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path(), IN_ORDER);
        let plan = crate::write::format::plan(&ck, &PlanOptions::default()).unwrap();
        let reader = SourceReader::open(&ck).unwrap();
        let file = &ck.files[0].path;
        let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
        f.set_len(ck.files[0].size - 100_000).unwrap();
        let dst = tmp.path().join("out");
        std::fs::create_dir_all(&dst).unwrap();
        let cancel = AtomicBool::new(false);
        let pool = WindowPool::new(1 << 20);
        let options = options(&cancel, CopyPath::Auto);
        let job = Job {
            reader: &reader,
            ck: &ck,
            plan: &plan,
            dst: &dst,
            pool: &pool,
            options: &options,
            reporter: &NoReport,
            memo: &Default::default(),
        };
        let err = copy_shard(&job, &plan.shards[0], 1 << 20)
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.safetensors"), "{err}");
        assert!(err.contains("model.e"), "{err}");
        assert!(err.contains("ends early"), "{err}");
        // Nothing but the source is left.
        assert_eq!(std::fs::read_dir(&dst).unwrap().count(), 0);
    }

    #[test]
    fn a_write_error_from_a_shrunk_source_names_the_source() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path(), IN_ORDER);
        let plan = crate::write::format::plan(&ck, &PlanOptions::default()).unwrap();
        let reader = SourceReader::open(&ck).unwrap();
        let shard = &plan.shards[0];
        let run = runs(&ck, shard)
            .into_iter()
            .max_by_key(|r| r.start + r.len)
            .unwrap();
        let end = run.start + run.len;
        // What write(2) says when the mapping it copies from lost its pages.
        let efault = || {
            ExecError::Write(crate::write::WriteError::io(
                &tmp.path().join("out/model.safetensors"),
                std::io::Error::from_raw_os_error(14),
            ))
        };
        let check = || check_length(&reader, &ck, shard, &run, end);
        // The source intact: the output's error stands.
        assert!(matches!(blame_source(efault(), check), ExecError::Write(_)));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&ck.files[0].path)
            .unwrap();
        f.set_len(ck.files[0].size - 100_000).unwrap();
        let err = blame_source(efault(), check).to_string();
        assert!(
            err.contains(&ck.files[0].path.display().to_string()),
            "{err}"
        );
        assert!(err.contains("truncated"), "{err}");
        assert!(!err.contains("out/model.safetensors"), "{err}");
    }

    #[test]
    fn cast_or_strided_shards_are_not_eligible() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path(), IN_ORDER);
        let options = PlanOptions {
            dtype: Some(crate::format::Dtype::BF16),
            ..PlanOptions::default()
        };
        let plan = crate::write::format::plan(&ck, &options).unwrap();
        assert!(!eligible(&ck, &plan.shards[0]));
    }
}
