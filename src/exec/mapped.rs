//! The mapped-input path: a casting, FP8-quantizing or GGUF-encoding shard
//! whose tensors are all stored as one contiguous byte range reads its
//! input from read-only *shared* mappings of the source files, one chunk at
//! a time ([`crate::format::mapped`]), and casts, quantizes or encodes
//! straight from the mapping into the output buffer (the FP8 and GGUF
//! streams through `ChunkStream::map_input`). The input bytes are never copied by `pread`
//! into a buffer of ours, and the buffers hold output only.
//!
//! Memory: a worker maps at most one chunk of input at a time, and that
//! chunk (plus [`MAP_SLACK`] for the page rounding of the mapping) is
//! reserved from the [`WindowPool`] for the whole shard, next to the two
//! output buffers, so the window bound holds as on the read path: the
//! mapped pages count in RSS while they are mapped.
//!
//! What this path does not take: strided views, deflated zip entries,
//! dequantized weights, GGUF input and stacked GGUF experts (they keep
//! [`super::fill_shard`]'s read path), shards that need no cast (the
//! mapped-copy path, [`super::copy`], which writes straight from the same
//! kind of mapping), and anything at all under `--no-mmap`
//! ([`super::CopyPath::ReadWrite`]), which stays plain read and write for
//! everything.
//!
//! A shared mapping of a file that shrinks under it faults instead of
//! returning an error: see [`crate::format::mapped`]. A temporary file
//! stays in the output folder after such an exit, cleaned by the next
//! run, as after a crash. `--no-mmap` reads through buffers instead.

use super::{WindowBuf, WindowPool, WindowTooSmall};
use crate::cast::{self, CastStats, OverflowPolicy};
use crate::format::{Checkpoint, DataRef, Dtype};
use crate::plan::{ShardPlan, TensorInput};
use crate::write::digest::Xxh3;

/// Budget reserved beyond the mapped bytes: a mapping starts at a page
/// (Unix) or at a 64 KiB allocation granularity (Windows) boundary, so it
/// may reach that much before the chunk.
pub const MAP_SLACK: u64 = 64 << 10;

/// Most input bytes one mapping holds: past a few MiB, larger mappings are
/// no faster; they only hold more pages and larger output buffers, which
/// are fresh memory to fault in.
const MAP_CHUNK: u64 = 8 << 20;

/// Tensors smaller than this are read (`pread`) into the output buffer's
/// spare room even on a mapped shard: mapping and unmapping (page faults,
/// a TLB flush on every core the process runs on) costs more than copying
/// a few hundred KiB. A model of 3,747 small tensors spent 6% of its time
/// in munmap when every tensor was mapped.
pub const MAP_MIN: u64 = 256 << 10;

/// Input bytes cast and hashed at a time: small enough that the output
/// block is still in the CPU's cache when the hash reads it.
const FUSE_BLOCK: usize = 256 << 10;

/// Whether `shard` can take the mapped-input path: every tensor stored as
/// one contiguous range and either a source tensor, an FP8-quantized one
/// (`crate::cast::quantize::QuantizeStream` maps its codes' input), a
/// constant beside one, or one encoded as a GGML type from a single source
/// tensor (`crate::cast::gguf::EncodeStream` maps too), and at least one
/// tensor cast, quantized or encoded. Dequantized tensors and GGUF input
/// keep the read path.
pub fn eligible(ck: &Checkpoint, shard: &ShardPlan) -> bool {
    let mappable = shard.tensors.iter().all(|t| {
        let contiguous = matches!(
            ck.tensors[t.input.primary()].data,
            DataRef::Contiguous { .. }
        );
        let kind = match &t.input {
            TensorInput::Source { .. }
            | TensorInput::Quantized { .. }
            | TensorInput::Constant { .. } => true,
            TensorInput::ToGgml { stacked, .. } => stacked.is_empty(),
            TensorInput::Dequantized { .. } | TensorInput::Gguf { .. } => false,
        };
        contiguous && kind
    });
    mappable
        && shard
            .tensors
            .iter()
            .any(|t| !t.input.is_source() || t.dtype != t.source_dtype)
}

/// What a mapped shard holds from the pool: two output buffers and the
/// reservation for one mapped chunk of input.
pub struct Layout<'p> {
    pub bufs: Vec<WindowBuf<'p>>,
    pub reserved: super::window::Reservation<'p>,
    /// Input bytes one mapping may hold.
    pub map_len: usize,
}

/// Splits a worker's `buffer` bytes for a mapped shard: half for the mapped
/// input (less [`MAP_SLACK`]), a quarter for each output buffer, each no
/// larger than the shard's largest tensor needs (a tensor under
/// [`MAP_MIN`] is read into an output buffer with room for its cast). `None` when the share is
/// too small to be worth mapping (the read path takes the shard).
pub fn acquire<'p>(
    ck: &Checkpoint,
    shard: &ShardPlan,
    pool: &'p WindowPool,
    buffer: usize,
) -> Result<Option<Layout<'p>>, WindowTooSmall> {
    let buffer = buffer as u64;
    if buffer < 4 * MAP_SLACK {
        return Ok(None);
    }
    let largest_in = shard
        .tensors
        .iter()
        .map(|t| ck.tensors[t.input.primary()].len);
    let largest_in = largest_in.max().unwrap_or(0).max(8);
    let map_len = (buffer / 2 - MAP_SLACK).min(MAP_CHUNK).min(largest_in);
    // Room for the cast or encoding of one full mapping of any mapped
    // tensor of the shard, or for a small tensor read whole with its
    // output.
    let out_len = shard
        .tensors
        .iter()
        .map(|t| {
            let source = &ck.tensors[t.input.primary()];
            let (from, to) = (source.dtype, t.dtype);
            if source.len < MAP_MIN {
                source.len
                    + if from == to && t.input.is_source() {
                        0
                    } else {
                        t.len
                    }
            } else if t.input.is_source() {
                (map_len / elem_size(from) * elem_size(to)).min(t.len)
            } else {
                // Encoded: the output of a mapping's bytes, at the
                // tensor's own ratio of output to input.
                let out = u128::from(map_len) * u128::from(t.len);
                let out = out.div_ceil(u128::from(source.len.max(1)));
                u64::try_from(out).unwrap_or(u64::MAX).min(t.len)
            }
        })
        .max()
        .unwrap_or(0)
        .clamp(8, buffer / 4);
    // A head's rows are encoded together (llama's q and k): they must fit
    // one mapping and one output buffer, or the shard is read instead.
    let heads_fit = shard.tensors.iter().all(|t| match &t.input {
        TensorInput::ToGgml {
            permute_heads: Some(heads),
            ..
        } => {
            let source = &ck.tensors[t.input.primary()];
            let heads = (*heads).max(1);
            source.len < MAP_MIN || (source.len / heads <= map_len && t.len / heads <= out_len)
        }
        _ => true,
    });
    if !heads_fit {
        return Ok(None);
    }
    let map_len = usize::try_from(map_len).unwrap_or(usize::MAX);
    let out_len = usize::try_from(out_len).unwrap_or(usize::MAX);
    // Both at once, so a waiting worker holds nothing.
    let (bufs, reserved) = pool.acquire_and_reserve(out_len, 2, map_len as u64 + MAP_SLACK)?;
    Ok(Some(Layout {
        bufs,
        reserved,
        map_len,
    }))
}

/// Casts `input` (`from`) into `output` (`to`) block by block, taking the
/// xxh3 of each output block while it is still in cache. Returns the
/// cast's counts; equal dtypes are a plain copy and count nothing (the
/// manifest records counts for casts only).
pub fn cast_hashed(
    from: Dtype,
    to: Dtype,
    input: &[u8],
    output: &mut [u8],
    policy: OverflowPolicy,
    hash: &mut Xxh3,
) -> CastStats {
    let mut stats = CastStats::default();
    if from == to {
        for (i, o) in input.chunks(FUSE_BLOCK).zip(output.chunks_mut(FUSE_BLOCK)) {
            o.copy_from_slice(i);
            hash.update(o);
        }
        return stats;
    }
    let (in_elem, out_elem) = (elem_size(from) as usize, elem_size(to) as usize);
    let elems = (FUSE_BLOCK / in_elem).max(1);
    let blocks = input
        .chunks(elems * in_elem)
        .zip(output.chunks_mut(elems * out_elem));
    for (i, o) in blocks {
        stats += cast::cast_slice(from, to, i, o, policy);
        hash.update(o);
    }
    stats
}

/// Bytes per element (at least 1).
fn elem_size(d: Dtype) -> u64 {
    (d.bits() / 8).max(1)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::exec::{CopyPath, ExecOptions, NoReport};
    use crate::format::read::SourceReader;
    use crate::plan::{Plan, PlanOptions};
    use crate::write::manifest::ShardRecord;

    /// f32 values with every kind of edge: ties, subnormals, NaN, infinity,
    /// signed zeros, values too large for f16.
    fn f32_bytes(n: u32) -> Vec<u8> {
        let edges = [0.0f32, -0.0, 1.0 + f32::EPSILON, 1e-40, 7e4, f32::NAN];
        (0..n)
            .flat_map(|i| {
                let v = match i % 7 {
                    6 => f32::from_bits(i.wrapping_mul(2_654_435_761)),
                    k => edges[k as usize] * if i % 2 == 0 { 1.0 } else { -3.0 },
                };
                v.to_le_bytes()
            })
            .collect()
    }

    /// One safetensors file: a large f32 tensor (several mapped chunks),
    /// an i32 tensor that is not cast, and a 3-element f32 tensor. The
    /// header length puts the data at an offset that is not page aligned.
    fn source(dir: &Path) -> Checkpoint {
        let a = f32_bytes(300_001);
        let b: Vec<u8> = (0..10_000i32)
            .flat_map(|i| (i * 31).to_le_bytes())
            .collect();
        let c = f32_bytes(3);
        let (a_end, b_end) = (a.len(), a.len() + b.len());
        let header = serde_json::json!({
            "a": {"dtype": "F32", "shape": [300_001], "data_offsets": [0, a_end]},
            "b": {"dtype": "I32", "shape": [10_000], "data_offsets": [a_end, b_end]},
            "c": {"dtype": "F32", "shape": [3], "data_offsets": [b_end, b_end + 12]},
        });
        let path = dir.join("model.safetensors");
        crate::format::safetensors::write_test_file(&path, &header, &[&a, &b, &c]);
        crate::format::open(&path).unwrap()
    }

    fn plan(ck: &Checkpoint, dtype: Dtype) -> Plan {
        let options = PlanOptions {
            dtype: Some(dtype),
            on_overflow: OverflowPolicy::Inf,
            ..PlanOptions::default()
        };
        crate::write::format::plan(ck, &options).unwrap()
    }

    fn run(ck: &Checkpoint, plan: &Plan, dst: &Path, copy: CopyPath) -> Vec<ShardRecord> {
        run_in(ck, plan, dst, copy, 1 << 20)
    }

    /// Executes `plan` into `dst` through `copy` under a `window`-byte pool,
    /// which it must not pass.
    pub(super) fn run_in(
        ck: &Checkpoint,
        plan: &Plan,
        dst: &Path,
        copy: CopyPath,
        window: u64,
    ) -> Vec<ShardRecord> {
        std::fs::create_dir_all(dst).unwrap();
        let cancel = AtomicBool::new(false);
        let options = ExecOptions {
            threads: 2,
            cancel: &cancel,
            skip: &|_| false,
            on_shard: &|_| Ok(()),
            digest: Default::default(),
            copy,
        };
        let pool = WindowPool::new(window);
        let records = crate::exec::execute(ck, plan, dst, &pool, &options, &NoReport).unwrap();
        assert!(pool.peak() <= pool.budget());
        records
    }

    /// Every shard file of `records` under `dir`, read back.
    fn files(dir: &Path, records: &[ShardRecord]) -> Vec<Vec<u8>> {
        records
            .iter()
            .map(|r| std::fs::read(dir.join(&r.file)).unwrap())
            .collect()
    }

    #[test]
    fn mapped_input_writes_what_the_read_path_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path());
        for dtype in [Dtype::BF16, Dtype::F16, Dtype::F64] {
            let plan = plan(&ck, dtype);
            assert!(plan.shards.iter().all(|s| eligible(&ck, s)));
            let fast = tmp.path().join(format!("{dtype}-mapped"));
            let slow = tmp.path().join(format!("{dtype}-read"));
            let mapped = run(&ck, &plan, &fast, CopyPath::Auto);
            let read = run(&ck, &plan, &slow, CopyPath::ReadWrite);
            assert_eq!(mapped, read, "{dtype}: records (digests, xxh3, stats)");
            assert_eq!(files(&fast, &mapped), files(&slow, &read), "{dtype}");
        }
    }

    #[test]
    fn one_shard_through_both_inputs_gives_the_same_record() {
        // The mapped layout is taken directly, so this test fails if the
        // mapped path is silently not used.
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path());
        let plan = plan(&ck, Dtype::BF16);
        let shard = &plan.shards[0];
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
        let layout = acquire(&ck, shard, &pool, 1 << 20).unwrap().unwrap();
        // Tensor `a` (1.2 MB) takes several mappings.
        assert!(layout.map_len < 1_200_000, "{}", layout.map_len);
        assert_eq!(pool.in_use(), pool.peak());
        assert!(pool.peak() <= 1 << 20);
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let input = super::super::Input::Mapped {
            map_len: layout.map_len,
        };
        let memo = Default::default();
        let job = |dst| super::super::Job {
            reader: &reader,
            ck: &ck,
            plan: &plan,
            dst,
            pool: &pool,
            options: &options,
            reporter: &NoReport,
            memo: &memo,
        };
        let mapped = super::super::write_shard(&job(&a), shard, layout.bufs, input).unwrap();
        drop(layout.reserved);
        assert_eq!(pool.in_use(), 0);
        let bufs = pool.acquire_many(300 << 10, 2).unwrap();
        let input = super::super::Input::Read { gather: 0 };
        let read = super::super::write_shard(&job(&b), shard, bufs, input).unwrap();
        assert_eq!(mapped, read);
        let file = &shard.file;
        assert_eq!(
            std::fs::read(a.join(file)).unwrap(),
            std::fs::read(b.join(file)).unwrap()
        );
    }

    #[test]
    fn a_source_shorter_than_its_header_is_an_error_not_a_fault() {
        let tmp = tempfile::tempdir().unwrap();
        let ck = source(tmp.path());
        let reader = SourceReader::open(&ck).unwrap();
        // Truncated after the checkpoint was opened: the tensor `c` at the
        // end is now partly past the end of the file.
        let path = tmp.path().join("model.safetensors");
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 4).unwrap();
        let c = ck.tensors.iter().find(|t| t.name == "c").unwrap();
        let err = reader.map_chunk(c, 0, 12).map(|_| ()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("model.safetensors"), "{text}");
        assert!(text.contains("\"c\"") || text.contains(" c"), "{text}");
        assert!(text.contains("ends early"), "{text}");
        // What is still there maps.
        assert_eq!(reader.map_chunk(c, 0, 8).unwrap().len(), 8);
    }

    #[test]
    fn the_fused_cast_hashes_what_a_whole_cast_hashes() {
        // Lengths across block edges, and a copy (equal dtypes).
        for (from, to) in [(Dtype::F32, Dtype::BF16), (Dtype::F32, Dtype::F32)] {
            for n in [1u32, 65_535, 65_536, 200_003] {
                let input = f32_bytes(n);
                let out_len = input.len() / 4 * elem_size(to) as usize;
                let mut whole = vec![0u8; out_len];
                let want = cast::cast_slice(from, to, &input, &mut whole, OverflowPolicy::Inf);
                let mut fused = vec![0u8; out_len];
                let mut hash = Xxh3::new();
                let got = cast_hashed(from, to, &input, &mut fused, OverflowPolicy::Inf, &mut hash);
                assert_eq!(fused, whole, "{from}->{to} {n}");
                if from == to {
                    assert_eq!(got, CastStats::default(), "a copy counts nothing");
                } else {
                    assert_eq!(got, want, "{from}->{to} {n}");
                    assert!(n < 7 || got.nan > 0, "{got:?}");
                }
                let digest = crate::write::digest::xxh3_64(&whole);
                assert_eq!(hash.digest(), digest, "{from}->{to} {n}");
            }
        }
    }
}

#[cfg(test)]
#[path = "mapped_gguf_tests.rs"]
mod gguf_tests;
