//! One quantized weight being dequantized, chunk after chunk: the stream
//! the executor and validate drive. The per-scheme arithmetic is in
//! [`super::fp8`] and [`super::mxfp4`], as `impl` blocks of this type.

use super::error::DequantError;
use super::fp8::{self, code_table, run, scale_decoder};
use super::mxfp4::expert;
use crate::cast::policy::{CastStats, OverflowPolicy, TARGETS};
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{DataRef, Dtype, Tensor};
use crate::quant::Scheme;

/// Most FP8 scale values a stream holds at once (64 KiB as f32): the
/// scales of one block row are read in segments of this many, a fixed
/// overhead beside the window whatever the row's width.
const SCALE_SEGMENT: u64 = 16 << 10;

/// Largest storage span of a strided scale view (a transposed scale in a
/// `.bin`) read into memory at once, beside the segment: the scales of a
/// real FP8 weight (128 x 128 blocks) are tens of KiB, so each segment is
/// gathered from one read instead of one read per scale. A larger view is
/// read one element at a time.
const SCALE_GATHER: usize = 256 << 10;

/// The output chunk [`DequantStream::fill`] wrote: `buf[start..start + len]`,
/// from `read` bytes of the weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub start: usize,
    pub len: usize,
    pub read: u64,
}

/// A tensor whose output bytes are computed chunk after chunk (a
/// dequantized weight, a decoded GGUF tensor): what the executor and
/// validate drive, whatever the input kind.
pub trait ChunkStream {
    /// True once every output byte has been written.
    fn is_done(&self) -> bool;
    /// Writes the next chunk of output into `buf` (the front may hold the
    /// input it was made from) and says where it is.
    fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError>;
    /// Counts so far (overflow, underflow, NaN), as for a cast.
    fn stats(&self) -> CastStats;
    /// The smallest buffer `fill` accepts.
    fn min_buffer(&self) -> u64;
    /// For quantized codes: how far they are from the source so far.
    fn quality(&self) -> Option<crate::cast::quantize::QuantQuality> {
        None
    }
    /// Asks the stream to take its input from read-only shared mappings
    /// of at most `max_len` source bytes, one at a time (see
    /// [`crate::format::mapped`]), instead of reads into the front of each
    /// buffer, which then holds output only. False when it cannot (it then
    /// reads, as before).
    fn map_input(&mut self, max_len: usize) -> bool {
        let _ = max_len;
        false
    }
}

impl ChunkStream for DequantStream<'_> {
    fn is_done(&self) -> bool {
        DequantStream::is_done(self)
    }
    fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        DequantStream::fill(self, buf)
    }
    fn stats(&self) -> CastStats {
        DequantStream::stats(self)
    }
    fn min_buffer(&self) -> u64 {
        DequantStream::min_buffer(self)
    }
}

/// One quantized weight being dequantized, chunk after chunk.
pub struct DequantStream<'a> {
    reader: &'a SourceReader,
    weight: &'a Tensor,
    scale: &'a Tensor,
    weights: TensorBytes,
    scales: TensorBytes,
    scheme: Scheme,
    to: Dtype,
    policy: OverflowPolicy,
    /// Elements (FP8) or experts (MXFP4) done.
    done: u64,
    /// FP8: scale row `.0` from block column `.1` on, as f32 (at most
    /// [`SCALE_SEGMENT`] values).
    segment: Option<(u64, u64)>,
    segment_values: Vec<f32>,
    /// FP8: bytes of the scale tensor read through `scales` so far.
    scales_pos: u64,
    stats: CastStats,
}

impl<'a> DequantStream<'a> {
    /// Starts dequantizing `weight` with `scale` into `to` (BF16, F16, F32 or
    /// F64). Fails on a dtype pair this stage has no kernel for.
    pub fn open(
        reader: &'a SourceReader,
        weight: &'a Tensor,
        scale: &'a Tensor,
        scheme: &Scheme,
        to: Dtype,
        policy: OverflowPolicy,
    ) -> Result<Self, DequantError> {
        let codes_ok = match scheme {
            Scheme::Blocks { .. } => matches!(weight.dtype, Dtype::F8_E4M3 | Dtype::F8_E5M2),
            Scheme::Mxfp4 { .. } => weight.dtype == Dtype::U8,
        };
        if !codes_ok || !TARGETS.contains(&to) {
            return Err(DequantError::Unsupported {
                tensor: weight.name.clone(),
                from: weight.dtype,
                to,
            });
        }
        let scale_ok = match scheme {
            Scheme::Blocks { .. } => fp8::scale_decoder(scale.dtype).is_some(),
            Scheme::Mxfp4 { .. } => matches!(scale.dtype, Dtype::U8 | Dtype::F8_E8M0),
        };
        if !scale_ok {
            return Err(DequantError::ScaleDtype {
                tensor: weight.name.clone(),
                scale: scale.name.clone(),
                dtype: scale.dtype,
            });
        }
        Ok(DequantStream {
            reader,
            weight,
            scale,
            weights: reader.tensor_bytes_gathered(weight, 0),
            scales: reader.tensor_bytes_gathered(scale, SCALE_GATHER),
            scheme: scheme.clone(),
            to,
            policy,
            done: 0,
            segment: None,
            segment_values: Vec::new(),
            scales_pos: 0,
            stats: CastStats::default(),
        })
    }

    /// True once every element has been written.
    pub fn is_done(&self) -> bool {
        self.done >= self.units()
    }

    /// Counts so far (overflow, underflow, NaN), as for a cast.
    pub fn stats(&self) -> CastStats {
        self.stats
    }

    /// The smallest buffer [`DequantStream::fill`] accepts.
    pub fn min_buffer(&self) -> u64 {
        self.scheme.min_buffer(self.to)
    }

    fn units(&self) -> u64 {
        match self.scheme {
            Scheme::Blocks { rows, cols, .. } => rows.saturating_mul(cols),
            // An expert of no values has nothing to write: a `[1, 2^62, 0,
            // 16]` weight is done at once, not after 2^62 empty rows.
            Scheme::Mxfp4 {
                experts,
                rows,
                groups,
            } if rows.saturating_mul(groups) > 0 => experts,
            Scheme::Mxfp4 { .. } => 0,
        }
    }

    /// Reads the next chunk of the weight into the front of `buf` and
    /// writes its dequantized values after it.
    pub fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let need = self.min_buffer();
        if (buf.len() as u64) < need {
            return Err(DequantError::BufferTooSmall {
                tensor: self.weight.name.clone(),
                needed: need,
                have: buf.len() as u64,
            });
        }
        match self.scheme {
            Scheme::Blocks { .. } => self.fill_fp8(buf),
            Scheme::Mxfp4 { .. } => self.fill_mxfp4(buf),
        }
    }

    /// Reads `n` scale values' bytes (sequentially) into `out`.
    fn read_scales(&mut self, out: &mut [u8]) -> Result<(), DequantError> {
        self.reader
            .read_chunk(self.scale, &mut self.scales, out)
            .map_err(DequantError::from)
    }
}

impl DequantStream<'_> {
    fn fill_fp8(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let Scheme::Blocks {
            cols,
            block_rows,
            block_cols,
            ..
        } = self.scheme
        else {
            unreachable!("fill_fp8 on a blocks scheme only");
        };
        let (block_rows, block_cols, cols) = (block_rows.max(1), block_cols.max(1), cols.max(1));
        let osz = (self.to.bits() / 8) as usize;
        let left = self.units() - self.done;
        let n = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(buf.len() / (1 + osz));
        let (input, rest) = buf.split_at_mut(n);
        self.reader
            .read_chunk(self.weight, &mut self.weights, input)?;
        let out = &mut rest[..n * osz];
        let table = code_table(self.weight.dtype);
        let mut at = 0usize;
        while at < n {
            let pos = self.done + at as u64;
            let (r, c) = (pos / cols, pos % cols);
            let (scale_row, block) = (r / block_rows, c / block_cols);
            let held = |&(row, first): &(u64, u64)| {
                row == scale_row
                    && block >= first
                    && block - first < self.segment_values.len() as u64
            };
            if !self.segment.as_ref().is_some_and(held) {
                self.load_scales(scale_row, block)?;
            }
            let first = self.segment.map_or(0, |(_, first)| first);
            let run_len = (block_cols - c % block_cols).min(cols - c);
            let run_len = usize::try_from(run_len).unwrap_or(usize::MAX).min(n - at);
            let s = self.segment_values[usize::try_from(block - first).unwrap_or(usize::MAX)];
            self.stats += run(
                &table,
                s,
                self.to,
                self.policy,
                &input[at..at + run_len],
                &mut out[at * osz..(at + run_len) * osz],
            );
            at += run_len;
        }
        self.done += n as u64;
        Ok(Chunk {
            start: n,
            len: n * osz,
            read: n as u64,
        })
    }

    /// Holds the scales of block row `row` from block column `block` on,
    /// [`SCALE_SEGMENT`] at most: a `[1, 2^25]` weight of 1x1 blocks holds
    /// 64 KiB of scales at a time, not a 128 MiB row outside the window.
    /// Contiguous scales are read where they are (a block row is met once
    /// per weight row it covers); others through the stream, reopened when
    /// a block row is met again.
    fn load_scales(&mut self, row: u64, block: u64) -> Result<(), DequantError> {
        let Some((size, decode)) = scale_decoder(self.scale.dtype) else {
            return Err(DequantError::ScaleDtype {
                tensor: self.weight.name.clone(),
                scale: self.scale.name.clone(),
                dtype: self.scale.dtype,
            });
        };
        let per_row = self.scheme.scale_row();
        let count = per_row.saturating_sub(block).min(SCALE_SEGMENT);
        // Within the scale tensor, whose shape the scheme was checked
        // against; the reads check it again.
        let at = row
            .saturating_mul(per_row)
            .saturating_add(block)
            .saturating_mul(size as u64);
        let mut bytes = vec![0u8; count as usize * size];
        if matches!(
            self.scale.data,
            DataRef::Contiguous { .. } | DataRef::Blocks { .. }
        ) {
            self.reader.read_tensor_at(self.scale, at, &mut bytes)?;
        } else {
            // A strided view (a transposed scale in a `.bin`) is entered at
            // the segment's first element, not read again from its start
            // each time a block row is met again: that made its reads grow
            // with the square of the rows. A deflated entry still inflates
            // from its start, as it must.
            if at != self.scales_pos {
                self.scales = self
                    .reader
                    .tensor_bytes_from(self.scale, at, SCALE_GATHER)?;
                self.scales_pos = at;
            }
            self.read_scales(&mut bytes)?;
            self.scales_pos += bytes.len() as u64;
        }
        self.segment_values.clear();
        self.segment_values
            .extend(bytes.chunks_exact(size).map(decode));
        self.segment = Some((row, block));
        Ok(())
    }
}

impl DequantStream<'_> {
    fn fill_mxfp4(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let Scheme::Mxfp4 { rows, groups, .. } = self.scheme else {
            unreachable!("fill_mxfp4 on an mxfp4 scheme only");
        };
        let (rows, groups) = (
            usize::try_from(rows).unwrap_or(usize::MAX),
            usize::try_from(groups).unwrap_or(usize::MAX),
        );
        // min_buffer() checked that codes, scales and output fit.
        let osz = (self.to.bits() / 8) as usize;
        let cells = rows * groups;
        let (codes, rest) = buf.split_at_mut(cells * 16);
        let (scales, rest) = rest.split_at_mut(cells);
        let out = &mut rest[..cells * 32 * osz];
        self.reader
            .read_chunk(self.weight, &mut self.weights, codes)?;
        self.read_scales(scales)?;
        self.stats += match self.policy {
            OverflowPolicy::Saturate => expert::<true>(codes, scales, rows, groups, self.to, out),
            OverflowPolicy::Error | OverflowPolicy::Inf => {
                expert::<false>(codes, scales, rows, groups, self.to, out)
            }
        };
        self.done += 1;
        Ok(Chunk {
            start: cells * 17,
            len: cells * 32 * osz,
            read: (cells * 16) as u64,
        })
    }
}
