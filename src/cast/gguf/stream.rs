//! One GGUF tensor being decoded, chunk after chunk: the stream the
//! executor and validate drive for a GGUF source.
//!
//! Each chunk reads whole GGML blocks (or whole row groups, when rows are
//! put back in Hugging Face order) into the front of the caller's buffer,
//! dequantizes them to f32 exactly as gguf-py does ([`dequantize_blocks`])
//! through a small scratch of fixed size, and casts the f32 into the rest
//! of the buffer with the crate's cast kernels. Memory beyond the caller's
//! buffer is the scratch: [`SCRATCH_VALUES`] values, whatever the tensor.

use super::blocks::{dequantize_blocks, supports, DequantError as BlockError};
use super::legacy::q8_0_le_bytes;
use crate::cast::dequant::{Chunk, ChunkStream, DequantError};
use crate::cast::policy::{CastStats, OverflowPolicy, TARGETS};
use crate::format::gguf::ggml::{BlockLayout, GgmlType};
use crate::format::read::SourceReader;
use crate::format::{Dtype, Tensor};

/// Values dequantized at once: a multiple of every block size (32, 256).
pub const SCRATCH_VALUES: usize = 64 * 1024;

/// The order rows are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// As stored.
    Stored,
    /// llama.cpp's converter interleaved the two rotary halves of each of
    /// `heads` heads of a q or k projection (`LlamaModel.permute`); write
    /// them back as Hugging Face has them: see [`unpermuted_row`].
    Unpermute { heads: u64 },
}

/// The stored row a Hugging Face row `row` of one head of `head_rows` rows
/// comes from (both counted inside the head), undoing llama.cpp's
/// `w.reshape(n_head, 2, d // 2, ...).swapaxes(1, 2)`: Hugging Face row
/// `j * d/2 + i` (half `j`, pair `i`) is stored at `2 * i + j`.
pub fn unpermuted_row(row: u64, head_rows: u64) -> u64 {
    let half = head_rows / 2;
    2 * (row % half) + row / half
}

/// The GGML type a tensor's bytes are: its blocks' type, or the type of
/// its plain F32, F16 or BF16 elements.
pub fn ggml_type_of(tensor: &Tensor) -> Option<GgmlType> {
    tensor.ggml_type().or(match tensor.dtype {
        Dtype::F32 => Some(GgmlType::F32),
        Dtype::F16 => Some(GgmlType::F16),
        Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    })
}

/// One GGUF tensor being decoded into dtype `to`.
pub struct GgufStream<'a> {
    reader: &'a SourceReader,
    tensor: &'a Tensor,
    ty: GgmlType,
    to: Dtype,
    policy: OverflowPolicy,
    /// Bytes and values of one unit: a block, or a group of one head's rows.
    unit_bytes: u64,
    unit_values: u64,
    units: u64,
    /// Unpermuting: rows of a head, and bytes and values of a row.
    head_rows: u64,
    row_bytes: u64,
    row_values: u64,
    unpermute: bool,
    done: u64,
    values: Vec<f32>,
    bytes: Vec<u8>,
    stats: CastStats,
}

impl<'a> GgufStream<'a> {
    /// Starts decoding `tensor` into `to` (F64, F32, F16 or BF16), rows in
    /// `order`. Fails, naming the tensor, on a type reshard cannot
    /// dequantize, or rows that do not split into the heads asked for.
    pub fn open(
        reader: &'a SourceReader,
        tensor: &'a Tensor,
        to: Dtype,
        order: RowOrder,
        policy: OverflowPolicy,
    ) -> Result<Self, DequantError> {
        let unsupported = || DequantError::Unsupported {
            tensor: tensor.name.clone(),
            from: tensor.dtype,
            to,
        };
        let ty = ggml_type_of(tensor).ok_or_else(unsupported)?;
        if !TARGETS.contains(&to) {
            return Err(unsupported());
        }
        let layout = match ty.layout() {
            Some(l) if supports(ty) => l,
            _ => {
                return Err(DequantError::Blocks {
                    tensor: tensor.name.clone(),
                    source: BlockError::Unsupported { ty },
                })
            }
        };
        let numel = tensor.numel();
        if layout.byte_len(numel) != Some(tensor.len) {
            return Err(DequantError::Blocks {
                tensor: tensor.name.clone(),
                source: BlockError::PartialBlock {
                    ty,
                    bytes: usize::try_from(tensor.len).unwrap_or(usize::MAX),
                    block_bytes: layout.bytes,
                },
            });
        }
        let mut stream = GgufStream {
            reader,
            tensor,
            ty,
            to,
            policy,
            unit_bytes: layout.bytes,
            unit_values: layout.block,
            units: numel / layout.block,
            head_rows: 0,
            row_bytes: 0,
            row_values: 0,
            unpermute: false,
            done: 0,
            // Q8_0 writes its f32 bytes directly (`q8_0_le_bytes`).
            values: match ty {
                GgmlType::Q8_0 => Vec::new(),
                _ => vec![0.0; SCRATCH_VALUES],
            },
            bytes: vec![0; SCRATCH_VALUES * 4],
            stats: CastStats::default(),
        };
        // A tensor of no elements has no rows to put back (and head groups
        // of zero bytes would make a unit of nothing).
        if let (RowOrder::Unpermute { heads }, 1..) = (order, numel) {
            stream.group_heads(layout, heads)?;
        }
        Ok(stream)
    }

    /// Switches to units of one head's rows, checking they split evenly.
    fn group_heads(&mut self, layout: BlockLayout, heads: u64) -> Result<(), DequantError> {
        let shape = &self.tensor.shape;
        let rows = shape.first().copied().unwrap_or(1);
        let cols: u64 = shape.iter().skip(1).product();
        let bad = |reason: String| DequantError::Rows {
            tensor: self.tensor.name.clone(),
            reason,
        };
        if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
            return Err(bad(format!(
                "{rows} rows do not split into {heads} heads of an even number of rows"
            )));
        }
        if !cols.is_multiple_of(layout.block) {
            return Err(bad(format!(
                "rows of {cols} values are not whole {}-value blocks of {}",
                layout.block, self.ty
            )));
        }
        self.head_rows = rows / heads;
        self.row_values = cols;
        self.row_bytes = cols / layout.block * layout.bytes;
        self.unit_bytes = self.head_rows * self.row_bytes;
        self.unit_values = self.head_rows * cols;
        self.units = heads;
        self.unpermute = true;
        Ok(())
    }

    /// True once every value has been written.
    pub fn is_done(&self) -> bool {
        self.done >= self.units
    }

    /// Counts so far (overflow, underflow, NaN), as for a cast.
    pub fn stats(&self) -> CastStats {
        self.stats
    }

    /// The GGML type being read.
    pub fn ggml_type(&self) -> GgmlType {
        self.ty
    }

    fn out_elem(&self) -> u64 {
        self.to.bits() / 8
    }

    /// The smallest buffer [`GgufStream::fill`] accepts: one unit's bytes
    /// and its values in the output dtype.
    pub fn min_buffer(&self) -> u64 {
        self.unit_bytes + self.unit_values * self.out_elem()
    }

    /// Reads the next whole units into the front of `buf` and writes their
    /// values, in the output dtype and order, after them.
    pub fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let need = self.min_buffer();
        if (buf.len() as u64) < need {
            return Err(DequantError::BufferTooSmall {
                tensor: self.tensor.name.clone(),
                needed: need,
                have: buf.len() as u64,
            });
        }
        let n = (buf.len() as u64 / need).min(self.units - self.done);
        // Both fit in `buf`, so in usize.
        let in_len = (n * self.unit_bytes) as usize;
        let out_len = (n * self.unit_values * self.out_elem()) as usize;
        let (input, rest) = buf.split_at_mut(in_len);
        self.reader
            .read_tensor_at(self.tensor, self.done * self.unit_bytes, input)?;
        let out = &mut rest[..out_len];
        if self.unpermute {
            let (unit_bytes, row_bytes) = (self.unit_bytes as usize, self.row_bytes as usize);
            let row_out = (self.row_values * self.out_elem()) as usize;
            for (g, group) in input.chunks_exact(unit_bytes).enumerate() {
                for r in 0..self.head_rows {
                    let src = unpermuted_row(r, self.head_rows) as usize;
                    let row = &group[src * row_bytes..][..row_bytes];
                    let at = (g * self.head_rows as usize + r as usize) * row_out;
                    self.decode(row, &mut out[at..at + row_out])?;
                }
            }
        } else {
            self.decode(input, out)?;
        }
        self.done += n;
        Ok(Chunk {
            start: in_len,
            len: out_len,
            read: in_len as u64,
        })
    }

    /// Dequantizes whole blocks `src` into `out` (their values in the output
    /// dtype), through the scratch.
    fn decode(&mut self, src: &[u8], out: &mut [u8]) -> Result<(), DequantError> {
        let layout = self
            .ty
            .layout()
            .unwrap_or(BlockLayout { block: 1, bytes: 1 });
        let blocks_per_batch = SCRATCH_VALUES / layout.block as usize;
        let batch_bytes = blocks_per_batch * layout.bytes as usize;
        let out_elem = self.out_elem() as usize;
        let mut at = 0;
        for part in src.chunks(batch_bytes) {
            let values = part.len() / layout.bytes as usize * layout.block as usize;
            let f32s = &mut self.bytes[..values * 4];
            if self.ty == GgmlType::Q8_0 {
                // `part` is whole blocks: every unit is.
                q8_0_le_bytes(part, f32s);
            } else {
                let vals = &mut self.values[..values];
                dequantize_blocks(self.ty, part, vals).map_err(|source| DequantError::Blocks {
                    tensor: self.tensor.name.clone(),
                    source,
                })?;
                for (b, v) in f32s.chunks_exact_mut(4).zip(vals.iter()) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
            let dst = &mut out[at..at + values * out_elem];
            self.stats +=
                crate::cast::slice::cast_slice(Dtype::F32, self.to, f32s, dst, self.policy);
            at += values * out_elem;
        }
        Ok(())
    }
}

impl ChunkStream for GgufStream<'_> {
    fn is_done(&self) -> bool {
        GgufStream::is_done(self)
    }
    fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        GgufStream::fill(self, buf)
    }
    fn stats(&self) -> CastStats {
        GgufStream::stats(self)
    }
    fn min_buffer(&self) -> u64 {
        GgufStream::min_buffer(self)
    }
}
