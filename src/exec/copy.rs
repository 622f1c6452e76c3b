//! The kernel-copy path: a shard whose tensors are all stored contiguously
//! and not cast is written by `copy_file_range` from the source files, so
//! its bytes never pass through a user-space buffer; each chunk is then
//! hashed (per-tensor xxh3, the shard digest) from a read-only shared
//! mapping of the output the copy just filled (see
//! [`crate::write::shard::ShardWriter::hash_copied`]). This spends one
//! in-kernel copy per byte where read-and-write spends two copies through
//! user space.
//!
//! Memory: a worker maps at most one chunk of output at a time, and that
//! chunk is reserved from the [`WindowPool`] (its resident pages count in
//! RSS while it is mapped), so the window bound holds as on the buffered
//! path. Where the platform or file system refuses kernel copies (not
//! Linux, EXDEV, EINVAL, ENOSYS, ...), [`copy_shard`] says so before
//! anything is kept and the caller writes the shard through buffers.

use std::path::Path;
use std::sync::atomic::Ordering;

use crate::write::digest::Xxh3;

use super::{ExecError, ExecOptions, Reporter, WindowPool};
use crate::format::read::SourceReader;
use crate::format::{Checkpoint, DataRef, FormatError};
use crate::plan::{Plan, ShardPlan};
use crate::write::manifest::{ShardRecord, TensorRecord};
use crate::write::shard::{header_bytes, ShardWriter};
use crate::write::WriteError;

/// How shard bytes that need no cast are moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyPath {
    /// Copy in the kernel where the platform and file system allow it,
    /// else read and write.
    #[default]
    Auto,
    /// Always read into a buffer and write from it.
    ReadWrite,
}

/// Whether `shard` can take the kernel-copy path: every tensor keeps its
/// dtype and is stored as one contiguous range.
pub fn eligible(ck: &Checkpoint, shard: &ShardPlan) -> bool {
    shard.tensors.iter().all(|t| {
        t.dtype == t.source_dtype && matches!(ck.tensors[t.source].data, DataRef::Contiguous { .. })
    })
}

/// Writes `shard` by kernel copies, `chunk` bytes (at most) mapped at a
/// time. `Ok(None)`: kernel copies are refused here; nothing was kept and
/// the caller should write the shard through buffers.
#[allow(clippy::too_many_arguments)]
pub fn copy_shard(
    reader: &SourceReader,
    ck: &Checkpoint,
    plan: &Plan,
    shard: &ShardPlan,
    dst: &Path,
    pool: &WindowPool,
    chunk: u64,
    options: &ExecOptions<'_>,
    reporter: &dyn Reporter,
) -> Result<Option<ShardRecord>, ExecError> {
    let largest = shard.tensors.iter().map(|t| t.len).max().unwrap_or(0);
    let chunk = chunk.min(largest).max(1);
    let _reserved = pool.reserve(chunk)?;
    let path = dst.join(&shard.file);
    let header = header_bytes(&path, shard, &plan.metadata)?;
    let mut writer =
        ShardWriter::create(dst, &shard.file, &header, shard.data_len, options.digest)?;
    reporter.shard_started(&shard.file);
    let mut copied_any = false;
    let mut records = Vec::with_capacity(shard.tensors.len());
    for planned in &shard.tensors {
        let source = &ck.tensors[planned.source];
        let DataRef::Contiguous { offset } = source.data else {
            return Ok(None);
        };
        let (file, src_path) = reader.file(source.file);
        let mut hash = Xxh3::new();
        let mut done = 0u64;
        while done < source.len {
            if options.cancel.load(Ordering::Relaxed) {
                return Err(ExecError::Interrupted);
            }
            let n = (source.len - done).min(chunk);
            let mut got = 0u64;
            while got < n {
                let pos = offset + done + got;
                match writer.copy_in_kernel(file, pos, n - got) {
                    Ok(0) => {
                        // The source ends here, or (some file systems) the
                        // kernel declined: the file's length tells which.
                        let len = file
                            .metadata()
                            .map_err(|e| FormatError::io(src_path, e))?
                            .len();
                        if len > pos && !copied_any {
                            return Ok(None);
                        }
                        return Err(FormatError::BadData {
                            path: src_path.to_path_buf(),
                            tensor: source.name.clone(),
                            reason: "data ends early; the file was truncated or changed".into(),
                        }
                        .into());
                    }
                    Ok(k) => got += k,
                    Err(e) if !copied_any && crate::platform::is_copy_unsupported(&e) => {
                        return Ok(None);
                    }
                    Err(e) => return Err(WriteError::io(writer.path(), e).into()),
                }
                copied_any = true;
            }
            writer.hash_copied(&mut |bytes| hash.update(bytes))?;
            reporter.advance(n);
            done += n;
        }
        records.push(TensorRecord {
            name: planned.name.clone(),
            dtype: planned.dtype,
            shape: planned.shape.clone(),
            xxh3: format!("{:016x}", hash.digest()),
            cast: None,
        });
    }
    let finished = writer.finish()?;
    reporter.shard_done(&shard.file);
    Ok(Some(ShardRecord {
        file: finished.file,
        size: finished.size,
        digest: finished.digest,
        tensors: records,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::NoReport;
    use crate::plan::PlanOptions;
    use std::sync::atomic::AtomicBool;

    /// A two-tensor safetensors file (u8 and f32) in `dir`.
    fn source(dir: &Path) -> Checkpoint {
        let a: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let b: Vec<u8> = (0..4_000u32)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let header = serde_json::json!({
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "U8", "shape": [50_000], "data_offsets": [0, 50_000]},
            "b": {"dtype": "F32", "shape": [4_000], "data_offsets": [50_000, 66_000]},
        });
        let path = dir.join("model.safetensors");
        crate::format::safetensors::write_test_file(&path, &header, &[&a, &b]);
        crate::format::open(&path).unwrap()
    }

    fn run(ck: &Checkpoint, dst: &Path, copy: CopyPath) -> Vec<ShardRecord> {
        std::fs::create_dir_all(dst).unwrap();
        let plan = Plan::build(ck, &PlanOptions::default()).unwrap();
        let cancel = AtomicBool::new(false);
        let options = ExecOptions {
            threads: 1,
            cancel: &cancel,
            skip: &|_| false,
            on_shard: &|_| Ok(()),
            digest: Default::default(),
            copy,
        };
        let pool = WindowPool::new(8 << 10);
        crate::exec::execute(ck, &plan, dst, &pool, &options, &NoReport).unwrap()
    }

    #[test]
    fn the_kernel_copy_writes_what_read_write_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path());
        let plan = Plan::build(&ck, &PlanOptions::default()).unwrap();
        assert!(eligible(&ck, &plan.shards[0]));
        // Called directly, the kernel path takes the shard where the
        // platform has one (Linux), in chunks smaller than a tensor.
        let direct = tmp.path().join("direct");
        std::fs::create_dir_all(&direct).unwrap();
        let reader = SourceReader::open(&ck).unwrap();
        let cancel = AtomicBool::new(false);
        let options = ExecOptions {
            threads: 1,
            cancel: &cancel,
            skip: &|_| false,
            on_shard: &|_| Ok(()),
            digest: Default::default(),
            copy: CopyPath::Auto,
        };
        let pool = WindowPool::new(1 << 20);
        let got = copy_shard(
            &reader,
            &ck,
            &plan,
            &plan.shards[0],
            &direct,
            &pool,
            4096,
            &options,
            &NoReport,
        )
        .unwrap();
        assert_eq!(pool.in_use(), 0);
        assert_eq!(pool.peak(), 4096);
        if crate::platform::Os::current() == crate::platform::Os::Linux {
            assert!(
                got.is_some(),
                "copy_file_range refused on the test file system"
            );
        }
        let slow = run(&ck, &tmp.path().join("slow"), CopyPath::ReadWrite);
        let auto = run(&ck, &tmp.path().join("auto"), CopyPath::Auto);
        assert_eq!(auto, slow);
        let file = &plan.shards[0].file;
        let want = std::fs::read(tmp.path().join("slow").join(file)).unwrap();
        assert_eq!(
            std::fs::read(tmp.path().join("auto").join(file)).unwrap(),
            want
        );
        if let Some(record) = got {
            assert_eq!(record, slow[0]);
            assert_eq!(std::fs::read(direct.join(file)).unwrap(), want);
        }
    }

    #[test]
    fn cast_or_strided_shards_are_not_eligible() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path());
        let options = PlanOptions {
            dtype: Some(crate::format::Dtype::BF16),
            ..PlanOptions::default()
        };
        let plan = Plan::build(&ck, &options).unwrap();
        assert!(!eligible(&ck, &plan.shards[0]));
    }
}
