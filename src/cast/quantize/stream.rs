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
use crate::cast::simd::{vectorized, Vectorized};
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
                let mut a = vectorized(AbsMax(self.tensor.dtype, values));
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
            .map(|(at, input, out)| {
                vectorized(Serial {
                    runs: self,
                    at,
                    input,
                    out,
                })
            })
            .collect();
        let mut total = QuantQuality::default();
        for p in parts {
            total += p;
        }
        total
    }

    #[inline(always)]
    fn quantize_serial(&self, at: u64, input: &[u8], out: &mut [u8]) -> QuantQuality {
        // Four partial sums (element j in lane j % 4) break the chain of
        // dependent f64 additions; lanes are added in a fixed order.
        let mut lanes = Lanes::default();
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
        lanes.total()
    }
}

/// One task's [`Runs::quantize_serial`], for [`vectorized`].
struct Serial<'r, 's, 'b> {
    runs: &'r Runs<'s>,
    at: u64,
    input: &'b [u8],
    out: &'b mut [u8],
}

impl Vectorized for Serial<'_, '_, '_> {
    type Output = QuantQuality;
    #[inline(always)]
    fn run(self) -> QuantQuality {
        self.runs.quantize_serial(self.at, self.input, self.out)
    }
}

/// [`abs_max`] of a run of values, for [`vectorized`].
struct AbsMax<'b>(Dtype, &'b [u8]);

impl Vectorized for AbsMax<'_> {
    type Output = f32;
    #[inline(always)]
    fn run(self) -> f32 {
        abs_max(self.0, self.1)
    }
}

/// Four [`QuantQuality`] lanes (element j in lane j % 4), field by field
/// so that the four additions of one step are one vector operation.
#[derive(Default)]
struct Lanes {
    elements: [u64; 4],
    not_finite: [u64; 4],
    max_abs_error: [f64; 4],
    sum_sq_source: [f64; 4],
    sum_sq_error: [f64; 4],
}

impl Lanes {
    /// [`QuantQuality::add`] on lane `l`.
    #[inline(always)]
    fn add(&mut self, l: usize, x: f64, y: f64) {
        let e = x - y;
        let finite = e.is_finite();
        let (x, e) = if finite { (x, e) } else { (0.0, 0.0) };
        self.elements[l] += u64::from(finite);
        self.not_finite[l] += u64::from(!finite);
        self.max_abs_error[l] = self.max_abs_error[l].max(e.abs());
        self.sum_sq_source[l] += x * x;
        self.sum_sq_error[l] += e * e;
    }

    /// Adds elements `first..first + x.len()`: source `x[k]`, read back as
    /// `y[k]`.
    #[inline(always)]
    fn add_all(&mut self, first: usize, x: &[f64], y: &[f64]) {
        let n = x.len().min(y.len());
        let head = ((4 - first % 4) % 4).min(n);
        for k in 0..head {
            self.add((first + k) % 4, x[k], y[k]);
        }
        let (xs, xt) = x[head..n].as_chunks::<4>();
        let (ys, yt) = y[head..n].as_chunks::<4>();
        for (x4, y4) in xs.iter().zip(ys) {
            for l in 0..4 {
                self.add(l, x4[l], y4[l]);
            }
        }
        for (l, (x, y)) in xt.iter().zip(yt).enumerate() {
            self.add(l, *x, *y);
        }
    }

    /// The four lanes added in order, as the one-by-one sums would be.
    #[inline(always)]
    fn total(&self) -> QuantQuality {
        let lane = |l: usize| QuantQuality {
            elements: self.elements[l],
            not_finite: self.not_finite[l],
            max_abs_error: self.max_abs_error[l],
            sum_sq_source: self.sum_sq_source[l],
            sum_sq_error: self.sum_sq_error[l],
        };
        let mut quality = lane(0);
        for l in 1..4 {
            quality += lane(l);
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
    #[inline(always)]
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
    #[inline(always)]
    fn quantize(
        &self,
        recipe: Recipe,
        work: Dtype,
        scale: &Scale,
        out: &mut [u8],
        lanes: &mut Lanes,
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
        let mut reference = [0f64; BATCH];
        let mut back = [0f64; BATCH];
        for (b, o) in back[..n].iter_mut().zip(&out[..n]) {
            *b = f64::from(values[usize::from(*o)]) * stored;
        }
        for (r, v) in reference[..n].iter_mut().zip(&self.values[..n]) {
            *r = f64::from(*v);
        }
        if self.from == Dtype::F64 {
            // An f64 past f32's range is infinite where it is quantized:
            // not measured, as an inf is (its square would overflow).
            for (k, r) in reference[..n].iter_mut().enumerate() {
                if r.is_finite() {
                    *r = source_value(self.from, self.bytes, k).1;
                }
            }
        }
        lanes.add_all(first, &reference[..n], &back[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::super::recipe::{code, dequantized};
    use super::*;
    use crate::cast::simd::vectorized_builds;

    /// Every bf16 bit pattern once, in a scrambled order (so rows mix
    /// magnitudes), and an f32 set with random low bits under them.
    fn inputs() -> Vec<(Dtype, Vec<u8>)> {
        let order = |i: u32| (i.wrapping_mul(40503) ^ (i >> 3)) & 0xffff;
        let bf16: Vec<u8> = (0..1u32 << 16)
            .flat_map(|i| (order(i) as u16).to_le_bytes())
            .collect();
        let f32s: Vec<u8> = (0..1u32 << 16)
            .flat_map(|i| ((order(i) << 16) | (i.wrapping_mul(2_654_435_761) >> 16)).to_le_bytes())
            .collect();
        vec![(Dtype::BF16, bf16), (Dtype::F32, f32s)]
    }

    /// Each build of the batched, vectorized code gives the codes and the
    /// error sums of the one-element-at-a-time arithmetic of `recipe`
    /// (`code`, `dequantized`, `QuantQuality::add` in lanes j % 4), bit for
    /// bit, on every bf16 value (NaN and infinities included), from a task
    /// start that is not a multiple of 4.
    #[test]
    fn vectorized_builds_match_the_scalar_reference() {
        let (rows, cols) = (4u64, 16384u64);
        for (from, bytes) in inputs() {
            let in_elem = (from.bits() / 8) as usize;
            for recipe in [
                Recipe::PerTensor,
                Recipe::PerChannel,
                Recipe::Block {
                    rows: 2,
                    cols: 4096,
                },
            ] {
                for work in [Dtype::BF16, Dtype::F16, Dtype::F32] {
                    let (block_rows, block_cols) = recipe.block(rows, cols);
                    let row_scales = cols.div_ceil(block_cols);
                    let value = |i: usize| round_to(work, source_value(from, &bytes, i).0);
                    let mut amax = vec![0f32; (rows / block_rows * row_scales) as usize];
                    for i in 0..(rows * cols) as usize {
                        let (r, c) = (i as u64 / cols, i as u64 % cols);
                        let slot =
                            &mut amax[((r / block_rows) * row_scales + c / block_cols) as usize];
                        let v = value(i).abs();
                        if v.is_finite() {
                            *slot = slot.max(v);
                        }
                    }
                    let scales: Vec<Scale> =
                        amax.iter().map(|&a| Scale::of(recipe, work, a)).collect();
                    let scale_of = |i: usize| {
                        let (r, c) = (i as u64 / cols, i as u64 % cols);
                        scales[((r / block_rows) * row_scales + c / block_cols) as usize]
                    };
                    let at = 1usize;
                    let n = (rows * cols) as usize - at;
                    let mut want = vec![0u8; n];
                    let mut lanes = [QuantQuality::default(); 4];
                    for k in 0..n {
                        let s = scale_of(at + k);
                        want[k] = code(recipe, work, value(at + k), &s);
                        let x = f64::from(source_value(from, &bytes, at + k).0);
                        lanes[k % 4].add(x, dequantized(want[k], &s));
                    }
                    let mut quality = lanes[0];
                    for l in &lanes[1..] {
                        quality += *l;
                    }
                    let runs = Runs {
                        from,
                        recipe,
                        work,
                        cols,
                        block_cols,
                        block_rows,
                        row_scales,
                        first_row: 0,
                        scales: &scales,
                    };
                    let builds = vectorized_builds::<AbsMax>().len();
                    for b in 0..builds {
                        let (build, run) = vectorized_builds::<Serial>()[b];
                        let mut out = vec![0u8; n];
                        let got = run(Serial {
                            runs: &runs,
                            at: at as u64,
                            input: &bytes[at * in_elem..],
                            out: &mut out,
                        });
                        let what = format!("{build} {from} {recipe:?} {work}");
                        let bad = (0..n).find(|&k| out[k] != want[k]);
                        assert_eq!(bad, None, "{what}: first differing code");
                        assert_eq!(got, quality, "{what}: error sums");
                        assert!(
                            quality.not_finite > 0 && quality.elements > 60_000,
                            "{what}"
                        );
                    }
                }
            }
        }
    }

    /// `abs_max` gives the same on every build, over every bf16 value and
    /// over a stretch of them.
    #[test]
    fn abs_max_is_the_same_on_every_build() {
        for (from, bytes) in inputs() {
            let want = abs_max(from, &bytes);
            // NaN is left out: bf16 holds infinity, the f32 set (random
            // low bits) only NaNs above the largest finite values.
            let largest = if from == Dtype::BF16 {
                f32::INFINITY
            } else {
                3.4e38
            };
            assert!(want >= largest, "{from}: {want}");
            for (build, run) in vectorized_builds::<AbsMax>() {
                assert_eq!(
                    run(AbsMax(from, &bytes)).to_bits(),
                    want.to_bits(),
                    "{build} {from}"
                );
                assert_eq!(
                    run(AbsMax(from, &bytes[..2000])),
                    abs_max(from, &bytes[..2000])
                );
            }
        }
    }
}
