//! One weight being quantized to scaled FP8, chunk after chunk: its codes,
//! or its scales, as the executor and validate drive them.
//!
//! A scale must be known before the first code it scales is written, so
//! the weight is read twice, as two sequential streams: a *lead* that reads
//! one stripe of rows (a block row of scales: the whole tensor for a
//! per-tensor scale, one row per channel, `block_rows` rows per block row)
//! and takes each block's absmax, and a *follow* that reads the same stripe
//! again (from the page cache) into the caller's buffer and writes the
//! codes. Memory beyond the caller's buffer is a fixed scratch for the lead
//! and one block row of scales, whatever the tensor.

use super::recipe::{code, dequantized, round_to, source_value, QuantQuality, Recipe, Scale};
use crate::cast::dequant::{Chunk, ChunkStream, DequantError};
use crate::cast::policy::CastStats;
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{Dtype, Tensor};

/// Elements the lead reads at once.
const LEAD_VALUES: usize = 64 * 1024;

/// Scales one block row may hold: a stripe's absmax per block column is
/// kept while the stripe is read (the planner refuses block sizes past it).
pub const MAX_ROW_SCALES: u64 = 1 << 20;

/// Which tensor of a quantized weight a stream writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// The F8_E4M3 codes, shaped as the weight.
    Codes,
    /// The scales (see [`Recipe::scale_shape`]).
    Scales,
}

/// One 2-D weight being quantized by `recipe`.
pub struct QuantizeStream<'a> {
    reader: &'a SourceReader,
    tensor: &'a Tensor,
    recipe: Recipe,
    work: Dtype,
    part: Part,
    rows: u64,
    cols: u64,
    block_rows: u64,
    block_cols: u64,
    lead: TensorBytes,
    follow: TensorBytes,
    /// Codes: elements written. Scales: block rows written.
    done: u64,
    /// The block row whose scales are in `scales`.
    stripe: Option<u64>,
    scales: Vec<Scale>,
    amax: Vec<f32>,
    scratch: Vec<u8>,
    /// Scales: serialized bytes not yet handed out.
    pending: Vec<u8>,
    quality: QuantQuality,
}

impl<'a> QuantizeStream<'a> {
    /// Starts quantizing `tensor` (a 2-D F32, F16, BF16 or F64 weight)
    /// with `recipe` in working dtype `work`, writing `part`.
    pub fn open(
        reader: &'a SourceReader,
        tensor: &'a Tensor,
        recipe: Recipe,
        work: Dtype,
        part: Part,
    ) -> Result<Self, DequantError> {
        let float = matches!(
            tensor.dtype,
            Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64
        );
        if !float || tensor.shape.len() != 2 || !matches!(work, Dtype::F32 | Dtype::F16 | Dtype::BF16)
        {
            return Err(DequantError::Unsupported {
                tensor: tensor.name.clone(),
                from: tensor.dtype,
                to: Dtype::F8_E4M3,
            });
        }
        let (rows, cols) = (tensor.shape[0], tensor.shape[1]);
        let (block_rows, block_cols) = recipe.block(rows, cols);
        let row_scales = cols.div_ceil(block_cols);
        if row_scales > MAX_ROW_SCALES {
            return Err(DequantError::Rows {
                tensor: tensor.name.clone(),
                reason: format!(
                    "{row_scales} scales in one block row (more than {MAX_ROW_SCALES}); use wider blocks"
                ),
            });
        }
        let in_elem = (tensor.dtype.bits() / 8) as usize;
        Ok(QuantizeStream {
            reader,
            tensor,
            recipe,
            work,
            part,
            rows,
            cols,
            block_rows,
            block_cols,
            lead: reader.tensor_bytes_gathered(tensor, 0),
            follow: reader.tensor_bytes_gathered(tensor, 0),
            done: 0,
            stripe: None,
            scales: Vec::new(),
            amax: Vec::new(),
            scratch: vec![0; LEAD_VALUES * in_elem],
            pending: Vec::new(),
            quality: QuantQuality::default(),
        })
    }

    fn in_elem(&self) -> u64 {
        self.tensor.dtype.bits() / 8
    }

    fn stripes(&self) -> u64 {
        self.rows.div_ceil(self.block_rows)
    }

    /// Elements of block row `s`.
    fn stripe_len(&self, s: u64) -> u64 {
        let first = s * self.block_rows;
        self.block_rows.min(self.rows - first) * self.cols
    }

    /// Reads block row `s` through the lead and sets its scales.
    fn lead_stripe(&mut self, s: u64) -> Result<(), DequantError> {
        let n_scales = self.cols.div_ceil(self.block_cols) as usize;
        self.amax.clear();
        self.amax.resize(n_scales, 0.0);
        let in_elem = self.in_elem() as usize;
        let mut left = self.stripe_len(s);
        let mut at = 0u64; // element index inside the stripe
        while left > 0 {
            let n = left.min(LEAD_VALUES as u64) as usize;
            let bytes = &mut self.scratch[..n * in_elem];
            self.reader
                .read_chunk(self.tensor, &mut self.lead, bytes)?;
            for i in 0..n {
                let (v, _) = source_value(self.tensor.dtype, bytes, i);
                let a = round_to(self.work, v).abs();
                let col = (at + i as u64) % self.cols;
                let slot = &mut self.amax[(col / self.block_cols) as usize];
                // NaN is left out (the comparison is false).
                if a > *slot {
                    *slot = a;
                }
            }
            at += n as u64;
            left -= n as u64;
        }
        let (recipe, work) = (self.recipe, self.work);
        self.scales.clear();
        self.scales
            .extend(self.amax.iter().map(|&a| Scale::of(recipe, work, a)));
        self.stripe = Some(s);
        Ok(())
    }

    /// True once every output byte has been written.
    pub fn is_done(&self) -> bool {
        match self.part {
            Part::Codes => self.done >= self.rows.saturating_mul(self.cols),
            Part::Scales => self.done >= self.stripes() && self.pending.is_empty(),
        }
    }

    /// How far the codes written so far are from the source.
    pub fn quality(&self) -> QuantQuality {
        self.quality
    }

    /// The smallest buffer [`QuantizeStream::fill`] accepts.
    pub fn min_buffer(&self) -> u64 {
        match self.part {
            Part::Codes => self.in_elem() + 1,
            Part::Scales => 1,
        }
    }

    /// Writes the next chunk of codes (after the source bytes they are
    /// made from, at the front of `buf`) or of scale bytes.
    pub fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let need = self.min_buffer();
        if (buf.len() as u64) < need {
            return Err(DequantError::BufferTooSmall {
                tensor: self.tensor.name.clone(),
                needed: need,
                have: buf.len() as u64,
            });
        }
        match self.part {
            Part::Codes => self.fill_codes(buf),
            Part::Scales => self.fill_scales(buf),
        }
    }

    fn fill_codes(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let cols = self.cols.max(1);
        let stripe = self.done / cols / self.block_rows;
        if self.stripe != Some(stripe) {
            self.lead_stripe(stripe)?;
        }
        let stripe_end = (stripe * self.block_rows * cols).saturating_add(self.stripe_len(stripe));
        let in_elem = self.in_elem() as usize;
        let n = (stripe_end - self.done).min((buf.len() / (in_elem + 1)) as u64) as usize;
        let (input, rest) = buf.split_at_mut(n * in_elem);
        self.reader
            .read_chunk(self.tensor, &mut self.follow, input)?;
        let out = &mut rest[..n];
        let (from, recipe, work) = (self.tensor.dtype, self.recipe, self.work);
        for (i, o) in out.iter_mut().enumerate() {
            let col = (self.done + i as u64) % cols;
            let scale = &self.scales[(col / self.block_cols) as usize];
            let (v, reference) = source_value(from, input, i);
            let c = code(recipe, work, round_to(work, v), scale);
            *o = c;
            self.quality.add(reference, dequantized(c, scale));
        }
        self.done += n as u64;
        Ok(Chunk {
            start: n * in_elem,
            len: n,
            read: (n * in_elem) as u64,
        })
    }

    fn fill_scales(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let mut read = 0u64;
        while self.pending.is_empty() && self.done < self.stripes() {
            let s = self.done;
            self.lead_stripe(s)?;
            read += self.stripe_len(s) * self.in_elem();
            let dtype = self.recipe.scale_dtype(self.work);
            for sc in &self.scales {
                sc.stored_bytes(dtype, &mut self.pending);
            }
            self.done += 1;
        }
        let n = self.pending.len().min(buf.len());
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(Chunk {
            start: 0,
            len: n,
            read,
        })
    }
}

impl ChunkStream for QuantizeStream<'_> {
    fn is_done(&self) -> bool {
        QuantizeStream::is_done(self)
    }
    fn fill(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        QuantizeStream::fill(self, buf)
    }
    fn stats(&self) -> CastStats {
        // Clamping is the scheme's rule, never an overflow to refuse.
        CastStats::default()
    }
    fn min_buffer(&self) -> u64 {
        QuantizeStream::min_buffer(self)
    }
    fn quality(&self) -> Option<QuantQuality> {
        (self.part == Part::Codes).then_some(self.quality)
    }
}
