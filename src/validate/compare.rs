//! What every `--against` comparison shares: the three fixed buffers both
//! sides stream through, the two sides, and the chunk-by-chunk comparison
//! of an output tensor with a computed stream (a dequantized weight, a
//! decoded GGUF tensor).

use super::device::try_zeroed;
use super::ValidateError;
use crate::cast::dequant::ChunkStream;
use crate::cast::{self, OverflowPolicy};
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{Checkpoint, Tensor};

/// Source chunk, its cast, output chunk.
pub(super) struct Buffers {
    pub source: Vec<u8>,
    pub cast: Vec<u8>,
    pub output: Vec<u8>,
}

impl Buffers {
    /// Three zeroed buffers of `chunk` bytes, or the bytes that could not
    /// be had.
    pub(super) fn new(chunk: usize) -> Result<Buffers, u64> {
        let get = || try_zeroed(chunk).map_err(|_| chunk as u64);
        Ok(Buffers {
            source: get()?,
            cast: get()?,
            output: get()?,
        })
    }
}

/// Why `out` is not what `stream` computes (`what`, for the message), or
/// `None` when it is, bit for bit.
pub(super) fn stream_difference(
    stream: &mut dyn ChunkStream,
    what: &str,
    out_reader: &SourceReader,
    out: &Tensor,
    bufs: &mut Buffers,
) -> Result<Option<String>, ValidateError> {
    let expected_len = stream.min_buffer();
    if expected_len > bufs.source.len() as u64 {
        // A unit (an MXFP4 expert, a head's rows) larger than the compare
        // chunk: its own buffers.
        let len = usize::try_from(expected_len).unwrap_or(usize::MAX);
        let bigger = Buffers {
            source: try_zeroed(len).map_err(|_| too_big(out))?,
            cast: Vec::new(),
            output: try_zeroed(len).map_err(|_| too_big(out))?,
        };
        *bufs = bigger;
    }
    let mut out_stream: TensorBytes = out_reader.tensor_bytes(out);
    let mut done = 0u64;
    let out_elem = (out.dtype.bits() / 8).max(1) as usize;
    let want_len = out.len;
    while !stream.is_done() {
        let chunk = stream.fill(&mut bufs.source)?;
        if done + chunk.len as u64 > want_len {
            return Ok(Some(format!("holds {want_len} bytes, fewer than {what}")));
        }
        let got = &mut bufs.output[..chunk.len];
        out_reader.read_chunk(out, &mut out_stream, got)?;
        let expected = &bufs.source[chunk.start..chunk.start + chunk.len];
        if let Some(at) = first_unequal(expected, got, out_elem) {
            let element = done / out_elem as u64 + at as u64;
            return Ok(Some(format!("differs from {what} at element {element}")));
        }
        done += chunk.len as u64;
    }
    Ok((done != want_len).then(|| format!("holds {want_len} bytes; {what} {done}")))
}

/// The first element (of `elem` bytes) where the two slices differ.
pub(super) fn first_unequal(expected: &[u8], got: &[u8], elem: usize) -> Option<usize> {
    (expected != got).then(|| {
        expected
            .chunks(elem)
            .zip(got.chunks(elem))
            .position(|(a, b)| a != b)
            .unwrap_or(0)
    })
}

/// The two checkpoints compared and their readers.
pub(super) struct Sides<'a> {
    pub source: &'a Checkpoint,
    pub src_reader: &'a SourceReader,
    pub out: &'a Checkpoint,
    pub out_reader: &'a SourceReader,
}

pub(super) fn too_big_buffers(needed: u64) -> ValidateError {
    ValidateError::Io {
        what: format!("reserve {needed} bytes of --against buffers"),
        source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
    }
}

fn too_big(out: &Tensor) -> ValidateError {
    ValidateError::Io {
        what: format!("reserve memory to compare {:?}", out.name),
        source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
    }
}

/// The index of the first element where `out` differs from `theirs` (cast
/// to `out`'s dtype when they differ), or `None` when equal.
pub(super) fn first_difference(
    src_reader: &SourceReader,
    theirs: &Tensor,
    out_reader: &SourceReader,
    out: &Tensor,
    bufs: &mut Buffers,
    policy: OverflowPolicy,
) -> Result<Option<u64>, ValidateError> {
    let in_elem = (theirs.dtype.bits() / 8).max(1) as usize;
    let out_elem = (out.dtype.bits() / 8).max(1) as usize;
    let casting = theirs.dtype != out.dtype;
    let per_chunk = bufs.source.len() / in_elem.max(out_elem);
    let numel = out.numel();
    let mut src_stream: TensorBytes = src_reader.tensor_bytes(theirs);
    let mut out_stream: TensorBytes = out_reader.tensor_bytes(out);
    let mut done = 0u64;
    while done < numel {
        let n = usize::try_from(numel - done)
            .unwrap_or(usize::MAX)
            .min(per_chunk);
        let input = &mut bufs.source[..n * in_elem];
        src_reader.read_chunk(theirs, &mut src_stream, input)?;
        let expected: &[u8] = if casting {
            let output = &mut bufs.cast[..n * out_elem];
            cast::cast_parallel(theirs.dtype, out.dtype, input, output, policy);
            output
        } else {
            input
        };
        let got = &mut bufs.output[..n * out_elem];
        out_reader.read_chunk(out, &mut out_stream, got)?;
        if let Some(at) = first_unequal(expected, got, out_elem) {
            return Ok(Some(done + at as u64));
        }
        done += n as u64;
    }
    Ok(None)
}
