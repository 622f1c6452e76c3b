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

use super::recipe::{
    abs_max, e4m3_code, e4m3_values, finite_abs_max, round_to, source_value, QuantQuality, Recipe,
    Scale,
};
use crate::cast::dequant::{Chunk, ChunkStream, DequantError};
use crate::cast::policy::{CastStats, OverflowPolicy};
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
    policy: OverflowPolicy,
    /// Values infinite in the working dtype, left out of the scales
    /// (under `--on-overflow saturate` or `inf`).
    infinite: u64,
    rows: u64,
    cols: u64,
    block_rows: u64,
    block_cols: u64,
    lead: TensorBytes,
    follow: TensorBytes,
    /// Codes: elements written. Scales: block rows written.
    done: u64,
    /// The block rows whose scales are in `scales`: the first, and how
    /// many (as many whole block rows as the lead reads at once).
    group: Option<(u64, u64)>,
    /// `row_scales` scales per block row of the group, in order.
    scales: Vec<Scale>,
    row_scales: u64,
    amax: Vec<f32>,
    scratch: Vec<u8>,
    /// Scales: serialized bytes not yet handed out.
    pending: Vec<u8>,
    quality: QuantQuality,
}

impl<'a> QuantizeStream<'a> {
    /// Starts quantizing `tensor` (a 2-D F32, F16, BF16 or F64 weight)
    /// with `recipe` in working dtype `work`, writing `part`. `policy`
    /// decides what a value infinite in `work` does: refuses the tensor
    /// (`error`), or is left out of the scale and clamped to ±448.
    pub fn open(
        reader: &'a SourceReader,
        tensor: &'a Tensor,
        recipe: Recipe,
        work: Dtype,
        part: Part,
        policy: OverflowPolicy,
    ) -> Result<Self, DequantError> {
        let float = matches!(
            tensor.dtype,
            Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64
        );
        if !float
            || tensor.shape.len() != 2
            || !matches!(work, Dtype::F32 | Dtype::F16 | Dtype::BF16)
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
            policy,
            infinite: 0,
            rows,
            cols,
            block_rows,
            block_cols,
            lead: reader.tensor_bytes_gathered(tensor, 0),
            follow: reader.tensor_bytes_gathered(tensor, 0),
            done: 0,
            group: None,
            scales: Vec::new(),
            row_scales,
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

    /// Reads the block rows from `s` on through the lead (as many whole
    /// ones as [`LEAD_VALUES`] holds, at least one) and sets their scales.
    fn lead_group(&mut self, s: u64) -> Result<(), DequantError> {
        let stripe_len = self.stripe_len(s).max(1);
        let count = (LEAD_VALUES as u64 / stripe_len)
            .max(1)
            .min(self.stripes() - s);
        let row_scales = self.row_scales as usize;
        self.amax.clear();
        self.amax.resize(row_scales * count as usize, 0.0);
        let in_elem = self.in_elem() as usize;
        let (cols, block_cols) = (self.cols as usize, self.block_cols as usize);
        let block_rows = self.block_rows as usize;
        let mut left: u64 = (s..s + count).map(|x| self.stripe_len(x)).sum();
        // Walk rows and columns without a division per value.
        let (mut row, mut col) = (0usize, 0usize);
        while left > 0 {
            let n = left.min(LEAD_VALUES as u64) as usize;
            let bytes = &mut self.scratch[..n * in_elem];
            self.reader.read_chunk(self.tensor, &mut self.lead, bytes)?;
            let mut i = 0;
            while i < n {
                let run = (block_cols - col % block_cols).min(cols - col).min(n - i);
                let slot = &mut self.amax[(row / block_rows) * row_scales + col / block_cols];
                let values = &bytes[i * in_elem..(i + run) * in_elem];
                let mut a = abs_max(self.tensor.dtype, values);
                if round_to(self.work, a).is_infinite() {
                    let (finite, infinite) = finite_abs_max(self.tensor.dtype, self.work, values);
                    a = finite;
                    self.infinite += infinite;
                }
                *slot = slot.max(a);
                i += run;
                col += run;
                if col == cols {
                    col = 0;
                    row += 1;
                }
            }
            left -= n as u64;
        }
        if self.infinite > 0 && self.policy == OverflowPolicy::Error {
            return Err(self.not_finite());
        }
        let (recipe, work) = (self.recipe, self.work);
        self.scales.clear();
        self.scales.extend(
            self.amax
                .iter()
                .map(|&a| Scale::of(recipe, work, round_to(work, a))),
        );
        self.group = Some((s, count));
        Ok(())
    }

    fn not_finite(&self) -> DequantError {
        let (_, path) = self.reader.file(self.tensor.file);
        DequantError::NotFinite {
            file: path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            tensor: self.tensor.name.clone(),
            count: self.infinite,
            work: self.work,
        }
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
        let in_elem = self.in_elem() as usize;
        let total = self.rows.saturating_mul(cols);
        let n = (total - self.done).min((buf.len() / (in_elem + 1)) as u64) as usize;
        let (input, rest) = buf.split_at_mut(n * in_elem);
        // One read for the whole chunk, however many block rows it spans:
        // the lead reads each group (for its scales) before its codes.
        self.reader
            .read_chunk(self.tensor, &mut self.follow, input)?;
        let out = &mut rest[..n];
        let mut i = 0usize;
        while i < n {
            let at = self.done + i as u64;
            let stripe = at / cols / self.block_rows;
            let in_group = self
                .group
                .is_some_and(|(first, count)| (first..first + count).contains(&stripe));
            if !in_group {
                self.lead_group(stripe)?;
            }
            let (first, count) = self.group.unwrap_or((stripe, 1));
            let group_end = ((first + count) * self.block_rows).min(self.rows) * cols;
            let len = ((group_end - at) as usize).min(n - i);
            let runs = Runs {
                from: self.tensor.dtype,
                recipe: self.recipe,
                work: self.work,
                cols,
                block_cols: self.block_cols,
                block_rows: self.block_rows,
                row_scales: self.row_scales,
                first_row: first * self.block_rows,
                scales: &self.scales,
            };
            let q = runs.quantize(
                at,
                &input[i * in_elem..(i + len) * in_elem],
                &mut out[i..i + len],
            );
            self.quality += q;
            i += len;
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
            self.lead_group(s)?;
            let (_, count) = self.group.unwrap_or((s, 1));
            read += (s..s + count).map(|x| self.stripe_len(x)).sum::<u64>() * self.in_elem();
            let dtype = self.recipe.scale_dtype(self.work);
            for sc in &self.scales {
                sc.stored_bytes(dtype, &mut self.pending);
            }
            self.done += count;
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
        // Clamping finite values is the scheme's rule; values infinite in
        // the working dtype were refused under `error` or clamped.
        CastStats {
            overflow: self.infinite,
            ..CastStats::default()
        }
    }
    fn min_buffer(&self) -> u64 {
        QuantizeStream::min_buffer(self)
    }
    fn quality(&self) -> Option<QuantQuality> {
        (self.part == Part::Codes).then_some(self.quality)
    }
}

/// Values per rayon task when quantizing a chunk's codes: tasks start at
/// multiples of it (from the tensor's start), so the error sums are added
/// in the same order whatever the thread count.
const TASK_VALUES: u64 = 64 * 1024;

/// What quantizing a stretch of one group's codes needs.
struct Runs<'s> {
    from: Dtype,
    recipe: Recipe,
    work: Dtype,
    cols: u64,
    block_cols: u64,
    block_rows: u64,
    row_scales: u64,
    /// The first row of the group `scales` belongs to.
    first_row: u64,
    scales: &'s [Scale],
}

impl Runs<'_> {
    /// Writes the codes of elements `at..at + out.len()` (all in this
    /// group) from `input`, in parallel tasks; their error figures.
    fn quantize(&self, at: u64, input: &[u8], out: &mut [u8]) -> QuantQuality {
        use rayon::prelude::*;
        let in_elem = (self.from.bits() / 8) as usize;
        // Task boundaries at multiples of TASK_VALUES.
        let mut bounds = vec![0usize];
        let mut next = (at / TASK_VALUES + 1) * TASK_VALUES;
        while next < at + out.len() as u64 {
            bounds.push((next - at) as usize);
            next += TASK_VALUES;
        }
        bounds.push(out.len());
        let mut tasks: Vec<(u64, &[u8], &mut [u8])> = Vec::with_capacity(bounds.len());
        let mut rest = out;
        for w in bounds.windows(2) {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(w[1] - w[0]);
            tasks.push((
                at + w[0] as u64,
                &input[w[0] * in_elem..w[1] * in_elem],
                head,
            ));
            rest = tail;
        }
        let parts: Vec<QuantQuality> = tasks
            .into_par_iter()
            .map(|(start, input, out)| self.quantize_serial(start, input, out))
            .collect();
        let mut total = QuantQuality::default();
        for p in parts {
            total += p;
        }
        total
    }

    fn quantize_serial(&self, at: u64, input: &[u8], out: &mut [u8]) -> QuantQuality {
        // Four partial sums (element j in lane j % 4) break the chain of
        // dependent f64 additions; lanes are added in a fixed order.
        let mut lanes = [QuantQuality::default(); 4];
        let in_elem = (self.from.bits() / 8) as usize;
        let mut row = at / self.cols - self.first_row;
        let mut col = at % self.cols;
        let mut i = 0usize;
        while i < out.len() {
            let run = (self.block_cols - col % self.block_cols)
                .min(self.cols - col)
                .min((out.len() - i) as u64) as usize;
            let index = (row / self.block_rows) * self.row_scales + col / self.block_cols;
            let scale = self.scales[index as usize];
            // In batches, each stage one loop with its dtype and recipe
            // decided outside it, so the loops vectorize.
            let mut j = i;
            while j < i + run {
                let n = (i + run - j).min(BATCH);
                let batch = Batch::new(self.from, &input[j * in_elem..(j + n) * in_elem]);
                batch.quantize(
                    self.recipe,
                    self.work,
                    &scale,
                    &mut out[j..j + n],
                    &mut lanes,
                    j,
                );
                j += n;
            }
            i += run;
            col += run as u64;
            if col == self.cols {
                col = 0;
                row += 1;
            }
        }
        let mut quality = lanes[0];
        for l in &lanes[1..] {
            quality += *l;
        }
        quality
    }
}

/// Values one [`Batch`] holds.
const BATCH: usize = 256;

/// Up to [`BATCH`] source values, decoded to f32.
struct Batch<'b> {
    from: Dtype,
    bytes: &'b [u8],
    values: [f32; BATCH],
    len: usize,
}

impl<'b> Batch<'b> {
    fn new(from: Dtype, bytes: &'b [u8]) -> Batch<'b> {
        let len = bytes.len() / (from.bits() / 8) as usize;
        let mut values = [0f32; BATCH];
        let v = &mut values[..len];
        match from {
            Dtype::BF16 => {
                for (o, c) in v.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
                }
            }
            Dtype::F32 => {
                for (o, c) in v.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            _ => {
                for (k, o) in v.iter_mut().enumerate() {
                    *o = source_value(from, bytes, k).0;
                }
            }
        }
        Batch {
            from,
            bytes,
            values,
            len,
        }
    }

    /// Writes the codes of the batch under `scale` into `out` and adds
    /// their error to `lanes` (element `first + k` in lane `(first + k) %
    /// 4`, as a one-by-one loop would).
    fn quantize(
        &self,
        recipe: Recipe,
        work: Dtype,
        scale: &Scale,
        out: &mut [u8],
        lanes: &mut [QuantQuality; 4],
        first: usize,
    ) {
        let n = self.len;
        let mut t = self.values;
        if self.from != work {
            for x in &mut t[..n] {
                *x = round_to(work, *x);
            }
        }
        // The value the code is the E4M3 rounding of.
        match recipe {
            Recipe::PerTensor => {
                for x in &mut t[..n] {
                    *x = round_to(work, *x * scale.apply);
                }
            }
            Recipe::PerChannel => {
                // + 0: compressed-tensors adds its zero point, so -0.0
                // becomes +0.0 (see `recipe::code`).
                for x in &mut t[..n] {
                    *x = round_to(work, *x / scale.apply) + 0.0;
                }
            }
            Recipe::Block { .. } => {
                for x in &mut t[..n] {
                    *x *= scale.apply;
                }
            }
        }
        for (o, x) in out[..n].iter_mut().zip(&t[..n]) {
            *o = e4m3_code(*x);
        }
        let values = e4m3_values();
        let stored = f64::from(scale.stored);
        for k in 0..n {
            // An f64 past f32's range is infinite where it is quantized:
            // not measured, as an inf is (its square would overflow).
            let reference = match self.from {
                Dtype::F64 if self.values[k].is_finite() => {
                    source_value(self.from, self.bytes, k).1
                }
                _ => f64::from(self.values[k]),
            };
            let back = f64::from(values[out[k] as usize]) * stored;
            lanes[(first + k) % 4].add(reference, back);
        }
    }
}
