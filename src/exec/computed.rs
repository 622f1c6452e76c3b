//! The streams of computed tensors: one constructor for every planned input
//! whose bytes are not a source tensor's (copied or cast), used by the
//! executor and by `validate --against`, so both compute the same bytes.

use crate::cast::dequant::{Chunk, ChunkStream, DequantError, DequantStream};
use crate::cast::gguf::{EncodeStream, GgufStream, RowOrder, StackStream};
use crate::cast::quantize::{QuantizeStream, ScaleMemo};
use crate::cast::CastStats;
use crate::cast::OverflowPolicy;
use crate::format::read::SourceReader;
use crate::format::Checkpoint;
use crate::plan::{PlannedTensor, TensorInput};

/// The stream that writes `planned`'s bytes from `ck`, `None` for a source
/// tensor (copied or cast by the caller). A quantized weight's codes and
/// scales share what they derive through `memo`, when there is one (see
/// [`ScaleMemo`]).
pub fn open<'a>(
    reader: &'a SourceReader,
    ck: &'a Checkpoint,
    planned: &PlannedTensor,
    policy: OverflowPolicy,
    memo: Option<&'a ScaleMemo>,
) -> Result<Option<Box<dyn ChunkStream + 'a>>, DequantError> {
    let to = planned.dtype;
    // One arm per input kind (no wildcard): a new kind must say how it
    // streams before this compiles.
    Ok(match &planned.input {
        TensorInput::Source { .. } => None,
        TensorInput::Dequantized {
            weight,
            scale,
            scheme,
        } => Some(Box::new(DequantStream::open(
            reader,
            &ck.tensors[*weight],
            &ck.tensors[*scale],
            scheme,
            to,
            policy,
        )?)),
        TensorInput::Gguf {
            tensor,
            unpermute_heads,
        } => {
            let order = match unpermute_heads {
                Some(heads) => RowOrder::Unpermute { heads: *heads },
                None => RowOrder::Stored,
            };
            Some(Box::new(GgufStream::open(
                reader,
                &ck.tensors[*tensor],
                to,
                order,
                policy,
            )?))
        }
        TensorInput::Quantized {
            tensor,
            recipe,
            work,
            part,
        } => Some(Box::new(QuantizeStream::open(
            reader,
            &ck.tensors[*tensor],
            *recipe,
            *work,
            *part,
            policy,
            memo,
        )?)),
        TensorInput::ToGgml {
            tensor,
            ggml,
            permute_heads,
            stacked,
        } if stacked.is_empty() => Some(Box::new(EncodeStream::open(
            reader,
            &ck.tensors[*tensor],
            *ggml,
            *permute_heads,
            policy,
        )?)),
        TensorInput::ToGgml {
            tensor,
            ggml,
            stacked,
            ..
        } => {
            let tensors = std::iter::once(tensor).chain(stacked);
            let tensors = tensors.map(|&i| &ck.tensors[i]).collect();
            Some(Box::new(StackStream::open(reader, tensors, *ggml, policy)?))
        }
        TensorInput::Constant { bytes, .. } => Some(Box::new(Constant {
            bytes: bytes.clone(),
            done: false,
        })),
    })
}

/// Fixed bytes, written in one chunk.
struct Constant {
    bytes: Vec<u8>,
    done: bool,
}

impl ChunkStream for Constant {
    fn is_done(&self) -> bool {
        self.done
    }
    fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        // The plan keeps constants small (a layer's JSON config, an empty
        // marker): far below any window.
        let len = self.bytes.len().min(buf.len());
        buf[..len].copy_from_slice(&self.bytes[..len]);
        self.bytes.drain(..len);
        self.done = self.bytes.is_empty();
        Ok(Chunk {
            start: 0,
            len,
            read: 0,
        })
    }
    fn stats(&self) -> CastStats {
        CastStats::default()
    }
    fn min_buffer(&self) -> u64 {
        1
    }
    /// Reads no source bytes at all.
    fn map_input(&mut self, _max_len: usize) -> bool {
        true
    }
}
