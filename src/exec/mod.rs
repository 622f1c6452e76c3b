//! Execution: stream every planned tensor from the source into its shard
//! through buffers from one [`WindowPool`], casting and hashing on the way.
//!
//! Shards are written in parallel (rayon, `--threads`), each by one worker
//! holding one buffer for the whole shard, so memory in flight is at most the
//! window. Large tensors stream through in chunks. A shard that needs no cast
//! is written straight from read-only mappings of the source ([`copy`]); a
//! casting shard of plain contiguous tensors casts from such mappings
//! ([`mapped`]) instead of reading into a buffer. The
//! executor writes shards only; the index and manifest are the caller's
//! commit step.

pub(crate) mod computed;
mod copy;
mod job;
pub(crate) mod mapped;
pub(crate) mod reporter;
pub(crate) mod window;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use crate::write::digest::Xxh3;
use rayon::prelude::*;

use crate::cast::{self, CastError, OverflowPolicy};
use crate::format::read::SourceReader;
use crate::format::strided::GATHER_MAX;
use crate::format::{Checkpoint, DataRef, Dtype};
use crate::plan::{Plan, ShardPlan, TensorInput};
use crate::write::manifest::{CastRecord, ShardRecord, TensorRecord};
use crate::write::shard::ShardWriter;
use crate::write::WriteError;

use self::job::Job;
pub use self::job::{CopyPath, ExecError, ExecOptions, MAX_CHUNK};
pub use self::reporter::{NoReport, Reporter};
pub use self::window::{PeakMeter, WindowBuf, WindowPool, WindowTooSmall};

/// Writes the shards of `plan` that `options.skip` does not rule out into
/// `dst`, calling `options.on_shard` as each one is committed.
pub fn execute(
    ck: &Checkpoint,
    plan: &Plan,
    dst: &Path,
    pool: &WindowPool,
    options: &ExecOptions<'_>,
    reporter: &dyn Reporter,
) -> Result<Vec<ShardRecord>, ExecError> {
    let reader = SourceReader::open(ck)?;
    let todo: Vec<&ShardPlan> = plan.shards.iter().filter(|s| !(options.skip)(s)).collect();
    let workers = options.threads.clamp(1, todo.len().max(1));
    let buffer = buffer_len(pool.budget(), workers as u64, plan);
    // Set once the file system refuses a mapping: the other shards go
    // buffered too.
    let refused = AtomicBool::new(options.copy == CopyPath::ReadWrite);
    let memo = crate::cast::quantize::ScaleMemo::default();
    let job = Job {
        reader: &reader,
        ck,
        plan,
        dst,
        pool,
        options,
        reporter,
        memo: &memo,
    };
    let run = || {
        todo.par_iter()
            .map(|shard| {
                let mut copied = None;
                if !refused.load(Ordering::Relaxed) && copy::eligible(ck, shard) {
                    match copy::copy_shard(&job, shard, buffer as u64)? {
                        copy::Copied::Done(record) => copied = Some(record),
                        copy::Copied::TooSmall => {}
                        copy::Copied::Refused => refused.store(true, Ordering::Relaxed),
                    }
                }
                let record = match copied {
                    Some(record) => record,
                    None => buffered_shard(&job, shard, buffer)?,
                };
                (options.on_shard)(&record)?;
                Ok(record)
            })
            .collect::<Result<Vec<_>, ExecError>>()
    };
    // Every thread of --threads: shards take `workers` of them, and a
    // stream that splits a chunk across rayon (the GGUF encoder) the rest.
    let threads = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads.max(workers))
        .build();
    match threads {
        Ok(tp) => tp.install(run),
        Err(_) => run(),
    }
}

/// Writes one shard through buffers from `pool` ([`write_shard`]).
fn buffered_shard(
    job: &Job<'_>,
    shard: &ShardPlan,
    buffer: usize,
) -> Result<ShardRecord, ExecError> {
    let Job {
        ck, pool, options, ..
    } = *job;
    if options.copy == CopyPath::Auto && mapped::eligible(ck, shard) {
        if let Some(layout) = mapped::acquire(ck, shard, pool, buffer)? {
            let input = Input::Mapped {
                map_len: layout.map_len,
            };
            let _reserved = layout.reserved;
            return write_shard(job, shard, layout.bufs, input);
        }
    }
    // A shard with a strided view takes a third buffer's worth of the
    // window for gathering the view's storage in memory.
    let count = if has_strided(ck, shard) { 3 } else { 2 };
    let mut bufs = pool.acquire_many((buffer / count).min(shard_need(ck, shard)), count)?;
    let gather = (count == 3).then(|| bufs.pop()).flatten();
    let input = Input::Read {
        gather: gather.as_deref().map_or(0, <[u8]>::len),
    };
    write_shard(job, shard, bufs, input)
}

/// Where the read stage takes a shard's input bytes from.
#[derive(Clone, Copy)]
enum Input {
    /// Positioned reads into the front of each buffer; a strided view
    /// gathers up to `gather` bytes of its storage in memory.
    Read { gather: usize },
    /// Mappings of at most `map_len` bytes of the source ([`mapped`]); the
    /// buffers hold output only.
    Mapped { map_len: usize },
}

/// Each worker's buffer: an equal share of the window, at most MAX_CHUNK of
/// input plus its cast output, and never less than one element's worth.
fn buffer_len(budget: u64, workers: u64, plan: &Plan) -> usize {
    let share = budget / workers;
    // Output can be up to 8x input (F8 -> F64); size the input chunk so the
    // input plus its cast output fits the share.
    let max_ratio = plan
        .tensors()
        .map(|t| t.dtype.bits().div_ceil(t.source_dtype.bits().max(1)))
        .max()
        .unwrap_or(1)
        .max(1);
    // A dequantized MXFP4 expert is one chunk: both buffers must hold one.
    let dequant = plan
        .tensors()
        .filter_map(|t| Some(t.input.dequantized()?.1.min_buffer(t.dtype)))
        .max()
        .unwrap_or(0);
    let per_chunk = share.min((MAX_CHUNK * (1 + max_ratio)).max(dequant.saturating_mul(2)));
    usize::try_from(per_chunk).unwrap_or(usize::MAX)
}

/// Whether a shard holds a strided view (which gathers its storage span).
fn has_strided(ck: &Checkpoint, shard: &ShardPlan) -> bool {
    shard
        .tensors
        .iter()
        .any(|t| matches!(ck.tensors[t.input.primary()].data, DataRef::Strided { .. }))
}

/// The most buffer a shard can use: its largest tensor plus its cast output.
fn shard_need(ck: &Checkpoint, shard: &ShardPlan) -> usize {
    let need = shard
        .tensors
        .iter()
        .map(|t| {
            let input = ck.tensors[t.input.primary()].len;
            let scale = t.input.dequantized().map_or(0, |(s, _)| ck.tensors[s].len);
            if t.dtype == t.source_dtype && t.input.is_source() {
                input
            } else {
                input + t.len + scale
            }
        })
        .max()
        .unwrap_or(0)
        .max(64);
    usize::try_from(need).unwrap_or(usize::MAX)
}

/// A filled buffer on its way to the writer: `buf[start..start + len]` is
/// the output.
struct Filled<'p> {
    buf: WindowBuf<'p>,
    start: usize,
    len: usize,
}

/// Writes one shard in two stages that overlap: this thread reads, casts and
/// checksums chunk N+1 while a scoped writer thread takes the shard digest
/// of chunk N and writes it. Two buffers circulate between them, so memory stays at the
/// two buffers the pool lent.
fn write_shard(
    job: &Job<'_>,
    shard: &ShardPlan,
    bufs: Vec<WindowBuf<'_>>,
    input: Input,
) -> Result<ShardRecord, ExecError> {
    let Job {
        plan,
        dst,
        options,
        reporter,
        ..
    } = *job;
    let path = dst.join(&shard.file);
    let header = crate::write::format::of_plan(plan).header_bytes(&path, plan, shard)?;
    let mut writer =
        ShardWriter::create(dst, &shard.file, &header, shard.data_len, options.digest)?;
    reporter.shard_started(&shard.file);
    let (to_writer, filled) = mpsc::sync_channel::<Filled<'_>>(bufs.len());
    let (to_reader, free) = mpsc::sync_channel::<WindowBuf<'_>>(bufs.len());
    for b in bufs {
        // The channel holds every buffer, so these sends never block or fail.
        let _ = to_reader.send(b);
    }
    let (records, written) = std::thread::scope(|scope| {
        let write_stage = scope.spawn(move || -> Result<ShardWriter, WriteError> {
            for chunk in filled {
                writer.write(&chunk.buf[chunk.start..chunk.start + chunk.len])?;
                // The reader may have stopped (an error): nothing to return to.
                let _ = to_reader.send(chunk.buf);
            }
            Ok(writer)
        });
        let records = fill_shard(job, shard, &free, &to_writer, input);
        drop(to_writer);
        let written = write_stage.join().unwrap_or_else(|_| {
            Err(WriteError::io(
                &path,
                std::io::Error::other("the writer thread panicked"),
            ))
        });
        (records, written)
    });
    // A write error explains a reader that stopped early; report it first.
    let writer = written?;
    let records = records?;
    let finished = writer.finish()?;
    reporter.shard_done(&shard.file);
    Ok(ShardRecord {
        file: finished.file,
        size: finished.size,
        digest: finished.digest,
        tensors: records,
    })
}

/// The read stage: streams every tensor of the shard through the free
/// buffers, casting and taking each tensor's xxh3, and hands the output to
/// the write stage. Stops early (Ok) if the write stage is gone.
fn fill_shard<'p>(
    job: &Job<'_>,
    shard: &ShardPlan,
    free: &mpsc::Receiver<WindowBuf<'p>>,
    to_writer: &mpsc::SyncSender<Filled<'p>>,
    input: Input,
) -> Result<Vec<TensorRecord>, ExecError> {
    let Job {
        reader,
        ck,
        plan,
        options,
        reporter,
        ..
    } = *job;
    let mut records = Vec::with_capacity(shard.tensors.len());
    let policy = plan.options.on_overflow;
    // Bytes of the data section handed to the writer: the gaps a format
    // aligns tensors with (GGUF) are zeros.
    let mut pos = 0u64;
    for planned in &shard.tensors {
        if !send_zeros(free, to_writer, planned.offset.saturating_sub(pos)) {
            return Ok(records);
        }
        pos = planned.offset.saturating_add(planned.len);
        // One arm per input kind (no wildcard): a new kind must say how it
        // streams before this compiles.
        let tensor = match &planned.input {
            TensorInput::Dequantized { .. }
            | TensorInput::Gguf { .. }
            | TensorInput::Quantized { .. }
            | TensorInput::ToGgml { .. }
            | TensorInput::Constant { .. } => {
                let sent = fill_dequantized(job, planned, free, to_writer, input)?;
                let Some(record) = sent else {
                    return Ok(records); // the write stage failed; it reports why
                };
                reporter.advance(ck.tensors[planned.input.primary()].len);
                records.push(record);
                continue;
            }
            TensorInput::Source { tensor } => *tensor,
        };
        let source = &ck.tensors[tensor];
        let (from, to) = (source.dtype, planned.dtype);
        let casting = from != to;
        let in_elem = (from.bits() / 8).max(1) as usize;
        let out_elem = (to.bits() / 8).max(1) as usize;
        // A small tensor of a mapped shard is read like the read path's.
        let mut stream = match input {
            Input::Mapped { .. } if source.len >= mapped::MAP_MIN => None,
            Input::Mapped { .. } => Some(reader.tensor_bytes_gathered(source, 0)),
            Input::Read { gather } => {
                Some(reader.tensor_bytes_gathered(source, gather.min(GATHER_MAX)))
            }
        };
        let mut hash = Xxh3::new();
        let mut stats = cast::CastStats::default();
        let mut left = source.len;
        while left > 0 {
            if options.cancel.load(Ordering::Relaxed) {
                return Err(ExecError::Interrupted);
            }
            let Ok(mut buf) = free.recv() else {
                return Ok(records); // the write stage failed; it reports why
            };
            // Input chunk: whole elements; a read chunk shares the buffer
            // with its cast output, a mapped one leaves it all to output.
            let chunk_in = match input {
                Input::Mapped { map_len } if stream.is_none() => {
                    (buf.len() / out_elem).min(map_len / in_elem) * in_elem
                }
                _ if casting => (buf.len() / (in_elem + out_elem)) * in_elem,
                _ => buf.len(),
            };
            if chunk_in == 0 {
                return Err(WindowTooSmall {
                    requested: (in_elem + out_elem) as u64,
                    budget: buf.len() as u64,
                }
                .into());
            }
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(chunk_in);
            let out_len = n / in_elem * out_elem;
            let (start, len) = match stream.as_mut() {
                Some(stream) => {
                    let (input, rest) = buf.split_at_mut(n);
                    reader.read_chunk(source, stream, input)?;
                    if casting {
                        let out = &mut rest[..out_len];
                        stats += mapped::cast_hashed(from, to, input, out, policy, &mut hash);
                        (n, out_len)
                    } else {
                        hash.update(input);
                        (0, n)
                    }
                }
                None => {
                    let map = reader.map_chunk(source, source.len - left, n)?;
                    let out = &mut buf[..out_len];
                    stats += mapped::cast_hashed(from, to, &map, out, policy, &mut hash);
                    (0, out_len)
                }
            };
            if to_writer.send(Filled { buf, start, len }).is_err() {
                return Ok(records);
            }
            reporter.advance(n as u64);
            left -= n as u64;
        }
        // FP8 storage (--quantize) clamps by its rule: a clamp is not an
        // overflow to refuse.
        let clamps = matches!(to, Dtype::F8_E4M3 | Dtype::F8_E5M2);
        if casting && !clamps && stats.overflow > 0 && policy == OverflowPolicy::Error {
            return Err(CastError::Overflow {
                tensor: planned.name.clone(),
                from,
                to,
                count: stats.overflow,
            }
            .into());
        }
        records.push(TensorRecord {
            name: planned.name.clone(),
            dtype: to,
            shape: planned.shape.clone(),
            xxh3: format!("{:016x}", hash.digest()),
            cast: casting.then_some(CastRecord { from, to, stats }),
            quantized: None,
        });
    }
    if !send_zeros(free, to_writer, shard.data_len.saturating_sub(pos)) {
        return Ok(records);
    }
    Ok(records)
}

/// Hands `n` zero bytes to the writer through the free buffers; false when
/// the write stage is gone.
fn send_zeros<'p>(
    free: &mpsc::Receiver<WindowBuf<'p>>,
    to_writer: &mpsc::SyncSender<Filled<'p>>,
    mut n: u64,
) -> bool {
    while n > 0 {
        let Ok(mut buf) = free.recv() else {
            return false;
        };
        let len = usize::try_from(n).unwrap_or(usize::MAX).min(buf.len());
        buf[..len].fill(0);
        if to_writer.send(Filled { buf, start: 0, len }).is_err() {
            return false;
        }
        n -= len as u64;
    }
    true
}

/// The read stage for a tensor computed by a stream (see
/// [`crate::cast::dequant`] and [`crate::cast::gguf`]): each free buffer
/// takes a chunk of input and the output made from it, and the output goes
/// to the writer. `None` when the write stage is gone.
fn fill_dequantized<'p>(
    job: &Job<'_>,
    planned: &crate::plan::PlannedTensor,
    free: &mpsc::Receiver<WindowBuf<'p>>,
    to_writer: &mpsc::SyncSender<Filled<'p>>,
    input: Input,
) -> Result<Option<TensorRecord>, ExecError> {
    let Job {
        reader,
        ck,
        plan,
        options,
        memo,
        ..
    } = *job;
    let source = &ck.tensors[planned.input.primary()];
    let policy = plan.options.on_overflow;
    let to = planned.dtype;
    let Some(mut stream) = computed::open(reader, ck, planned, policy, Some(memo))? else {
        return Err(ExecError::NotComputed {
            tensor: planned.name.clone(),
        });
    };
    // A mapped shard's buffers hold output only (see `mapped::acquire`):
    // its larger tensors are mapped, as on the cast path.
    if let Input::Mapped { map_len } = input {
        if source.len >= mapped::MAP_MIN && !stream.map_input(map_len) {
            return Err(ExecError::NotMappable {
                tensor: planned.name.clone(),
            });
        }
    }
    let mut hash = Xxh3::new();
    while !stream.is_done() {
        if options.cancel.load(Ordering::Relaxed) {
            return Err(ExecError::Interrupted);
        }
        let Ok(mut buf) = free.recv() else {
            return Ok(None);
        };
        let chunk = stream.fill(&mut buf)?;
        hash.update(&buf[chunk.start..chunk.start + chunk.len]);
        let filled = Filled {
            buf,
            start: chunk.start,
            len: chunk.len,
        };
        if to_writer.send(filled).is_err() {
            return Ok(None);
        }
    }
    // A GGUF tensor's values are f32 before they are rounded (its dtype is
    // the U8 of its blocks).
    let from = match planned.input {
        TensorInput::Gguf { .. } => crate::format::Dtype::F32,
        _ => source.dtype,
    };
    let stats = stream.stats();
    if stats.overflow > 0 && policy == OverflowPolicy::Error {
        let count = stats.overflow;
        let tensor = planned.name.clone();
        return Err(CastError::Overflow {
            tensor,
            from,
            to,
            count,
        }
        .into());
    }
    let (cast, quantized) = match planned.input {
        TensorInput::Quantized { .. } | TensorInput::Constant { .. } => (None, stream.quality()),
        _ => (Some(CastRecord { from, to, stats }), None),
    };
    Ok(Some(TensorRecord {
        name: planned.name.clone(),
        dtype: to,
        shape: planned.shape.clone(),
        xxh3: format!("{:016x}", hash.digest()),
        cast,
        quantized,
    }))
}
