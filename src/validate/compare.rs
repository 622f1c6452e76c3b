//! What every `--against` comparison shares: the three fixed buffers both
//! sides stream through, the two sides, and the chunk-by-chunk comparison
//! of an output tensor with a computed stream (a dequantized weight, a
//! decoded GGUF tensor).

use super::device::try_zeroed;
use super::{Cancel, ValidateError};
use crate::cast::dequant::ChunkStream;
use crate::cast::{self, OverflowPolicy};
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{Checkpoint, Tensor};

/// Source chunk, its cast, output chunk; and the Ctrl-C flag every chunk
/// streamed through them polls (a tensor of many GB is many chunks).
pub(super) struct Buffers {
    pub source: Vec<u8>,
    pub cast: Vec<u8>,
    pub output: Vec<u8>,
    pub cancel: Cancel,
}

impl Buffers {
    /// Three zeroed buffers of `chunk` bytes, or the bytes that could not
    /// be had.
    pub(super) fn new(chunk: usize, cancel: Cancel) -> Result<Buffers, u64> {
        let get = || try_zeroed(chunk).map_err(|_| chunk as u64);
        Ok(Buffers {
            source: get()?,
            cast: get()?,
            output: get()?,
            cancel,
        })
    }

    /// `Interrupted` once Ctrl-C was pressed, naming the output's file.
    pub(super) fn poll(
        &self,
        out_reader: &SourceReader,
        out: &Tensor,
    ) -> Result<(), ValidateError> {
        if self.cancel.is_set() {
            return Err(ValidateError::Interrupted {
                path: out_reader.file(out.file).1.to_path_buf(),
            });
        }
        Ok(())
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
            cancel: bufs.cancel,
        };
        *bufs = bigger;
    }
    let mut out_stream: TensorBytes = out_reader.tensor_bytes(out);
    let mut done = 0u64;
    let out_elem = (out.dtype.bits() / 8).max(1) as usize;
    let want_len = out.len;
    while !stream.is_done() {
        bufs.poll(out_reader, out)?;
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
        bufs.poll(out_reader, out)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `--against` looked at Ctrl-C between tensors only: one tensor of
    /// many GB was compared to its end first. Each chunk looks now.
    #[test]
    fn ctrl_c_stops_a_comparison_between_chunks() {
        static PRESSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let header = serde_json::json!({"t": {"dtype": "U8", "shape": [10_000], "data_offsets": [0, 10_000]}});
        crate::format::safetensors::write_test_file(&path, &header, &[&[7u8; 10_000]]);
        let ck = crate::format::open(dir.path()).unwrap();
        let reader = SourceReader::open(&ck).unwrap();
        let t = &ck.tensors[0];
        for cancel in [Cancel::default(), Cancel::new(&PRESSED)] {
            let mut bufs = Buffers::new(4096, cancel).unwrap();
            let got = first_difference(&reader, t, &reader, t, &mut bufs, OverflowPolicy::Error);
            match got {
                Ok(None) => assert!(!cancel.is_set()),
                Err(ValidateError::Interrupted { path: p }) => {
                    assert!(cancel.is_set());
                    assert_eq!(p, path);
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
