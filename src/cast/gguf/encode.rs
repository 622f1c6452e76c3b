//! One source tensor being written as a GGML type, chunk after chunk: the
//! GGUF writer's stream, as the executor drives it.
//!
//! The source (F32, F16, BF16 or F64 elements, read sequentially whatever
//! its storage) goes to f32 through scratches of at most [`SCRATCH_VALUES`]
//! values (one per rayon worker) and is encoded by [`super::quantize::quantize_blocks`] into the
//! back of the caller's buffer, the input it came from at the front. With
//! `permute_heads` (a Llama q or k projection), a unit is one head's rows,
//! read in Hugging Face order and written in GGUF order
//! ([`super::permuted_row`]); otherwise a unit is one GGML block.

use super::legacy;
use super::quantize::{quantize_blocks, EncodeError};
use super::SCRATCH_VALUES;
use crate::cast::dequant::{Chunk, ChunkStream, DequantError};
use crate::cast::{CastStats, OverflowPolicy};
use crate::format::gguf::ggml::GgmlType;
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{DataRef, Dtype, Tensor};

/// One source tensor being encoded as `ty`.
pub struct EncodeStream<'a> {
    reader: &'a SourceReader,
    tensor: &'a Tensor,
    stream: TensorBytes,
    ty: GgmlType,
    from: Dtype,
    in_elem: u64,
    block: u64,
    block_bytes: u64,
    /// Values of one unit (a block, or one head's rows).
    unit_values: u64,
    units: u64,
    done: u64,
    /// Permuting: rows of a head and values of a row.
    head_rows: u64,
    row_values: u64,
    stats: CastStats,
    /// Whether a NaN or infinite value may be written into a block type
    /// (anything but [`OverflowPolicy::Error`]: as gguf-py writes it).
    policy: OverflowPolicy,
    /// Input from mappings of at most this many bytes instead of reads
    /// ([`ChunkStream::map_input`]).
    map_len: Option<usize>,
}

impl<'a> EncodeStream<'a> {
    /// Starts encoding `tensor` as `ty`, rows of `permute_heads` heads put
    /// in GGUF order. Fails, naming the tensor, on a source dtype it
    /// cannot read, rows that are not whole blocks of `ty`, or rows that do
    /// not split into the heads; and, when filled, on a NaN or infinite
    /// value for a block type under [`OverflowPolicy::Error`] (its whole
    /// block would decode as NaN).
    pub fn open(
        reader: &'a SourceReader,
        tensor: &'a Tensor,
        ty: GgmlType,
        permute_heads: Option<u64>,
        policy: OverflowPolicy,
    ) -> Result<Self, DequantError> {
        let unsupported = || DequantError::Unsupported {
            tensor: tensor.name.clone(),
            from: tensor.dtype,
            to: Dtype::U8,
        };
        if !matches!(
            tensor.dtype,
            Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64
        ) {
            return Err(unsupported());
        }
        let layout = ty.layout().ok_or_else(unsupported)?;
        let numel = tensor.numel();
        let cols = tensor.shape.last().copied().unwrap_or(1);
        let rows_bad = |reason: String| DequantError::Rows {
            tensor: tensor.name.clone(),
            reason,
        };
        if !cols.is_multiple_of(layout.block) {
            return Err(rows_bad(format!(
                "rows of {cols} values are not whole {}-value blocks of {ty}",
                layout.block
            )));
        }
        let mut s = EncodeStream {
            reader,
            tensor,
            stream: reader.tensor_bytes_gathered(tensor, 0),
            ty,
            from: tensor.dtype,
            in_elem: tensor.dtype.bits() / 8,
            block: layout.block,
            block_bytes: layout.bytes,
            unit_values: layout.block,
            units: numel / layout.block,
            done: 0,
            head_rows: 0,
            row_values: cols,
            stats: CastStats::default(),
            policy,
            map_len: None,
        };
        if let (Some(heads), 1..) = (permute_heads, numel) {
            let rows = numel / cols;
            if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
                return Err(rows_bad(format!(
                    "{rows} rows do not split into {heads} heads of an even number of rows"
                )));
            }
            s.head_rows = rows / heads;
            s.unit_values = s.head_rows * cols;
            s.units = heads;
        }
        Ok(s)
    }

    fn unit_in(&self) -> u64 {
        self.unit_values * self.in_elem
    }

    fn unit_out(&self) -> u64 {
        self.unit_values / self.block * self.block_bytes
    }

    /// The smallest buffer [`EncodeStream::fill`] accepts reading: one
    /// unit's input and output (mapping: its output).
    pub fn min_buffer(&self) -> u64 {
        self.unit_in() + self.unit_out()
    }

    /// Reads the next whole units into the front of `buf` and writes their
    /// encoded bytes after them; or, taking its input from mappings, maps
    /// them and writes their encoded bytes at the front.
    pub fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let need = ChunkStream::min_buffer(self);
        let fits = match self.map_len {
            Some(max) => (max as u64 / self.unit_in()).min(buf.len() as u64 / need),
            None => buf.len() as u64 / need,
        };
        if fits == 0 {
            return Err(DequantError::BufferTooSmall {
                tensor: self.tensor.name.clone(),
                needed: need,
                have: buf.len() as u64,
            });
        }
        let n = fits.min(self.units - self.done);
        let in_len = (n * self.unit_in()) as usize;
        let out_len = (n * self.unit_out()) as usize;
        let start = if self.map_len.is_some() {
            let done = self.done * self.unit_in();
            let map = self.reader.map_chunk(self.tensor, done, in_len)?;
            self.encode_units(&map, &mut buf[..out_len])?;
            0
        } else {
            let (input, rest) = buf.split_at_mut(in_len);
            self.reader
                .read_chunk(self.tensor, &mut self.stream, input)?;
            self.encode_units(input, &mut rest[..out_len])?;
            in_len
        };
        self.done += n;
        Ok(Chunk {
            start,
            len: out_len,
            read: in_len as u64,
        })
    }

    /// Encodes whole units of input into `out`, a permuted unit's rows put
    /// in GGUF order.
    fn encode_units(&mut self, input: &[u8], out: &mut [u8]) -> Result<(), DequantError> {
        if self.head_rows == 0 {
            return self.encode(input, out);
        }
        let row_in = (self.row_values * self.in_elem) as usize;
        let row_out = (self.row_values / self.block * self.block_bytes) as usize;
        let (unit_in, unit_out) = (self.unit_in() as usize, self.unit_out() as usize);
        for (g, group) in input.chunks_exact(unit_in).enumerate() {
            for r in 0..self.head_rows {
                let src = super::permuted_row(r, self.head_rows) as usize;
                let row = &group[src * row_in..][..row_in];
                let at = g * unit_out + r as usize * row_out;
                self.encode(row, &mut out[at..at + row_out])?;
            }
        }
        Ok(())
    }

    /// Encodes the source elements `src` (whole blocks' worth) into `out`,
    /// batches of whole blocks spread over the rayon workers of the caller's
    /// pool (the K-quant search is the slow part of a GGUF conversion), each
    /// through a scratch of at most [`SCRATCH_VALUES`] values.
    fn encode(&mut self, src: &[u8], out: &mut [u8]) -> Result<(), DequantError> {
        use rayon::prelude::*;
        let batch = (SCRATCH_VALUES as u64 / self.block * self.block) as usize;
        let in_elem = self.in_elem as usize;
        let batch_out = batch / self.block as usize * self.block_bytes as usize;
        let (from, ty) = (self.from, self.ty);
        let (overflow, not_finite, scale_overflow) = src
            .par_chunks(batch * in_elem)
            .zip(out.par_chunks_mut(batch_out))
            .map(|(part, out)| {
                // F32 input in an aligned buffer is encoded where it lies;
                // anything else is decoded to f32 first.
                let stats = match f32_in_place(from, part) {
                    Some(vals) => quantize_blocks(ty, vals, out),
                    None => {
                        let mut vals = vec![0f32; part.len() / in_elem];
                        to_f32(from, part, &mut vals);
                        quantize_blocks(ty, &vals, out)
                    }
                };
                stats.map(|s| (s.overflow, s.not_finite, s.scale_overflow))
            })
            .try_reduce(|| (0, 0, 0), |a, b| Ok((a.0 + b.0, a.1 + b.1, a.2 + b.2)))
            .map_err(|e: EncodeError| DequantError::Rows {
                tensor: self.tensor.name.clone(),
                reason: e.to_string(),
            })?;
        self.stats.overflow += overflow;
        if self.policy != OverflowPolicy::Error {
            return Ok(());
        }
        let (_, path) = self.reader.file(self.tensor.file);
        let file = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        if not_finite > 0 {
            return Err(DequantError::NotFiniteInBlocks {
                file,
                tensor: self.tensor.name.clone(),
                count: not_finite,
                ty: self.ty.to_string(),
                block: self.block,
            });
        }
        if scale_overflow > 0 {
            return Err(DequantError::ScaleOverflow {
                file,
                tensor: self.tensor.name.clone(),
                count: scale_overflow,
                ty: self.ty.to_string(),
            });
        }
        Ok(())
    }
}

/// `part`'s little-endian F32 elements as they lie, when `from` is F32,
/// this machine is little-endian and `part` is 4-byte aligned (a chunk at
/// the front of a window buffer is).
fn f32_in_place(from: Dtype, part: &[u8]) -> Option<&[f32]> {
    let native = cfg!(target_endian = "little") && from == Dtype::F32;
    native
        .then(|| bytemuck::try_cast_slice(part).ok())
        .flatten()
}

/// Little-endian `from` elements as f32 (F64 rounded to nearest).
fn to_f32(from: Dtype, part: &[u8], vals: &mut [f32]) {
    match from {
        Dtype::F32 => legacy::f32s(part, vals),
        Dtype::F16 => legacy::f16s(part, vals),
        Dtype::BF16 => legacy::bf16s(part, vals),
        _ => {
            for (v, c) in vals.iter_mut().zip(part.chunks_exact(8)) {
                let b = [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
                *v = f64::from_le_bytes(b) as f32;
            }
        }
    }
}

impl ChunkStream for EncodeStream<'_> {
    fn is_done(&self) -> bool {
        self.done >= self.units
    }
    fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        EncodeStream::fill(self, buf)
    }
    fn stats(&self) -> CastStats {
        self.stats
    }
    fn min_buffer(&self) -> u64 {
        match self.map_len {
            Some(_) => self.unit_out(),
            None => EncodeStream::min_buffer(self),
        }
    }
    fn map_input(&mut self, max_len: usize) -> bool {
        let contiguous = matches!(self.tensor.data, DataRef::Contiguous { .. });
        let fits = max_len as u64 >= self.unit_in();
        if contiguous && fits {
            self.map_len = Some(max_len);
        }
        contiguous && fits
    }
}

/// Source tensors of one shape written one after the other as one GGML
/// tensor (MoE experts stacked along a new leading axis): each encoded in
/// turn, so the output is the concatenation of their encodings (GGML blocks
/// never cross a row, and a row never crosses a tensor).
pub struct StackStream<'a> {
    reader: &'a SourceReader,
    tensors: Vec<&'a Tensor>,
    ty: GgmlType,
    next: usize,
    current: Option<EncodeStream<'a>>,
    stats: CastStats,
    policy: OverflowPolicy,
}

impl<'a> StackStream<'a> {
    /// Starts encoding `tensors` (at least one, all of one shape) as `ty`.
    pub fn open(
        reader: &'a SourceReader,
        tensors: Vec<&'a Tensor>,
        ty: GgmlType,
        policy: OverflowPolicy,
    ) -> Result<Self, DequantError> {
        if let Some(odd) = tensors.iter().find(|t| t.shape != tensors[0].shape) {
            return Err(DequantError::Rows {
                tensor: odd.name.clone(),
                reason: format!(
                    "shape {:?} differs from {:?}'s {:?}; stacked tensors share one shape",
                    odd.shape, tensors[0].name, tensors[0].shape
                ),
            });
        }
        let mut s = StackStream {
            reader,
            tensors,
            ty,
            next: 0,
            current: None,
            stats: CastStats::default(),
            policy,
        };
        s.advance()?;
        Ok(s)
    }

    /// Opens the next tensor with something left to write, if any.
    fn advance(&mut self) -> Result<(), DequantError> {
        while self.current.as_ref().is_none_or(ChunkStream::is_done) {
            if let Some(done) = self.current.take() {
                self.stats.overflow += done.stats.overflow;
            }
            let Some(t) = self.tensors.get(self.next) else {
                return Ok(());
            };
            self.next += 1;
            self.current = Some(EncodeStream::open(
                self.reader,
                t,
                self.ty,
                None,
                self.policy,
            )?);
        }
        Ok(())
    }
}

impl ChunkStream for StackStream<'_> {
    fn is_done(&self) -> bool {
        self.current.is_none()
    }
    fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let Some(current) = self.current.as_mut() else {
            return Ok(Chunk {
                start: 0,
                len: 0,
                read: 0,
            });
        };
        let chunk = current.fill(buf)?;
        self.advance()?;
        Ok(chunk)
    }
    fn stats(&self) -> CastStats {
        let mut s = self.stats;
        if let Some(c) = &self.current {
            s.overflow += c.stats.overflow;
        }
        s
    }
    fn min_buffer(&self) -> u64 {
        self.current.as_ref().map_or(1, EncodeStream::min_buffer)
    }
}
