//! One weight being quantized to scaled FP8, chunk after chunk: its codes,
//! or its scales, as the executor and validate drive them.
//!
//! A scale must be known before the first code it scales is written. A
//! *stripe* is the rows one block row of scales covers (the whole tensor
//! for a per-tensor scale, one row per channel, `block_rows` rows per
//! block row). Where whole stripes fit the caller's buffer, each chunk is
//! read once and its scales taken from the buffer before its codes are
//! written. A stripe larger than the buffer (a per-tensor scale of a large
//! weight) is read twice, as two sequential streams: a *lead* that reads
//! the stripe through a fixed scratch and takes each block's absmax, and a
//! *follow* that reads it again (from the page cache) into the caller's
//! buffer and writes the codes. The scales the codes were made with are
//! left in a [`ScaleMemo`] for the weight's scales tensor, which then reads
//! nothing (and the other way round when the scales come first). Memory
//! beyond the caller's buffer is a fixed scratch for the lead and the
//! scales (at most [`MEMO_SCALES`] kept for the other stream).

use super::memo::{MemoKey, ScaleMemo, MEMO_SCALES};
use super::recipe::{
    abs_max, e4m3_code, e4m3_values, finite_abs_max, round_to, source_value, QuantQuality, Recipe,
    Scale,
};
use crate::cast::dequant::{Chunk, ChunkStream, DequantError};
use crate::cast::policy::{CastStats, OverflowPolicy};
use crate::cast::simd::{vectorized, Vectorized};
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{DataRef, Dtype, Tensor};

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
    /// The element the lead reads next.
    lead_at: u64,
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
    /// Where this weight's scales are left for its other stream.
    memo: Option<&'a ScaleMemo>,
    /// Every scale derived so far, in order, for the memo (`None` without
    /// one, once the scales came from it, or past [`MEMO_SCALES`]).
    derived: Option<Vec<Scale>>,
    /// Codes: the most source bytes one mapping holds, when the codes'
    /// input comes from mappings (`ChunkStream::map_input`) instead of
    /// reads into the front of the caller's buffer.
    map_len: Option<usize>,
}

impl<'a> QuantizeStream<'a> {
    /// Starts quantizing `tensor` (a 2-D F32, F16, BF16 or F64 weight)
    /// with `recipe` in working dtype `work`, writing `part`. `policy`
    /// decides what a value infinite in `work` does: refuses the tensor
    /// (`error`), or is left out of the scale and clamped to ±448. With a
    /// `memo`, scales the weight's other stream left there are used instead
    /// of reading the weight for them, and the scales this one derives are
    /// left there.
    pub fn open(
        reader: &'a SourceReader,
        tensor: &'a Tensor,
        recipe: Recipe,
        work: Dtype,
        part: Part,
        policy: OverflowPolicy,
        memo: Option<&'a ScaleMemo>,
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
        let mut stream = QuantizeStream {
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
            lead_at: 0,
            follow: reader.tensor_bytes_gathered(tensor, 0),
            done: 0,
            group: None,
            scales: Vec::new(),
            row_scales,
            amax: Vec::new(),
            scratch: vec![0; LEAD_VALUES * in_elem],
            pending: Vec::new(),
            quality: QuantQuality::default(),
            memo,
            derived: memo.map(|_| Vec::new()),
            map_len: None,
        };
        let left = memo.and_then(|m| m.take(&stream.memo_key()));
        if let Some(scales) = left {
            stream.use_scales(scales);
        }
        Ok(stream)
    }

    fn memo_key(&self) -> MemoKey {
        MemoKey {
            tensor: self.tensor.name.clone(),
            recipe: self.recipe,
            work: self.work,
        }
    }

    /// Takes every scale of the weight from its other stream: the codes
    /// need no lead, the scales are all pending.
    fn use_scales(&mut self, scales: Vec<Scale>) {
        self.derived = None;
        self.scales = scales;
        self.group = Some((0, self.stripes()));
        if self.part == Part::Scales {
            let dtype = self.recipe.scale_dtype(self.work);
            for sc in &self.scales {
                sc.stored_bytes(dtype, &mut self.pending);
            }
            self.done = self.stripes();
        }
    }

    /// Leaves every scale derived for the weight's other stream.
    fn leave_scales(&mut self) {
        if let (Some(memo), Some(scales)) = (self.memo, self.derived.take()) {
            memo.put(self.memo_key(), scales);
        }
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
        let mut pass = self.amax_pass(count);
        let in_elem = self.in_elem() as usize;
        // Chunks that were whole stripes took their scales without the
        // lead: it starts where this group does.
        let start = s * self.block_rows * self.cols;
        if self.lead_at != start {
            self.lead = self
                .reader
                .tensor_bytes_from(self.tensor, start * in_elem as u64, 0)?;
            self.lead_at = start;
        }
        let mut left: u64 = (s..s + count).map(|x| self.stripe_len(x)).sum();
        self.lead_at += left;
        while left > 0 {
            let n = left.min(LEAD_VALUES as u64) as usize;
            let bytes = &mut self.scratch[..n * in_elem];
            self.reader.read_chunk(self.tensor, &mut self.lead, bytes)?;
            pass.add(bytes);
            left -= n as u64;
        }
        self.set_group(s, count, pass)
    }

    /// A pass over the values of `count` stripes, its absmax slots zeroed.
    fn amax_pass(&mut self, count: u64) -> AmaxPass {
        let mut amax = std::mem::take(&mut self.amax);
        amax.clear();
        amax.resize(self.row_scales as usize * count as usize, 0.0);
        AmaxPass {
            from: self.tensor.dtype,
            work: self.work,
            cols: self.cols as usize,
            block_cols: self.block_cols as usize,
            block_rows: self.block_rows as usize,
            row_scales: self.row_scales as usize,
            amax,
            infinite: 0,
            row: 0,
            col: 0,
        }
    }

    /// Makes the scales of stripes `s..s + count` from a finished pass
    /// over their values: the current group.
    fn set_group(&mut self, s: u64, count: u64, pass: AmaxPass) -> Result<(), DequantError> {
        self.infinite += pass.infinite;
        self.amax = pass.amax;
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
        if let Some(derived) = &mut self.derived {
            if derived.len() + self.scales.len() <= MEMO_SCALES {
                derived.extend_from_slice(&self.scales);
            } else {
                self.derived = None;
            }
        }
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

    /// The smallest buffer [`QuantizeStream::fill`] accepts: one value's
    /// input and code (from a mapping: its code).
    pub fn min_buffer(&self) -> u64 {
        match (self.part, self.map_len) {
            (Part::Codes, None) => self.in_elem() + 1,
            (Part::Codes, Some(_)) | (Part::Scales, _) => 1,
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

    /// Reads (or maps) the next chunk of the weight and writes its codes:
    /// read, the input takes the front of `buf` and the codes follow it;
    /// mapped, the codes take the front.
    fn fill_codes(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let in_elem = self.in_elem() as usize;
        let room = match self.map_len {
            Some(max) => (max / in_elem).min(buf.len()),
            None => buf.len() / (in_elem + 1),
        } as u64;
        let whole = self.whole_stripes(room);
        let total = self.rows.saturating_mul(self.cols.max(1));
        let n = match whole {
            Some((_, _, values)) => values,
            None => (total - self.done).min(room),
        } as usize;
        // One read (or mapping) for the whole chunk, however many block
        // rows it spans: its scales are taken from it when it is whole
        // stripes, else the lead reads each group (for its scales) before
        // its codes.
        let start = if self.map_len.is_some() {
            let from = self.done * self.in_elem();
            let map = self.reader.map_chunk(self.tensor, from, n * in_elem)?;
            self.codes_of(whole, &map, &mut buf[..n])?;
            0
        } else {
            let (input, rest) = buf.split_at_mut(n * in_elem);
            self.reader
                .read_chunk(self.tensor, &mut self.follow, input)?;
            self.codes_of(whole, input, &mut rest[..n])?;
            n * in_elem
        };
        self.done += n as u64;
        if self.done >= total {
            self.leave_scales();
        }
        Ok(Chunk {
            start,
            len: n,
            read: (n * in_elem) as u64,
        })
    }

    /// Writes the codes of `input` (the source values from element
    /// `self.done` on; whole stripes `whole` when it is some) into `out`.
    fn codes_of(
        &mut self,
        whole: Option<(u64, u64, u64)>,
        input: &[u8],
        out: &mut [u8],
    ) -> Result<(), DequantError> {
        let cols = self.cols.max(1);
        let in_elem = self.in_elem() as usize;
        let n = out.len();
        if let Some((first, count, _)) = whole {
            let mut pass = self.amax_pass(count);
            pass.add(input);
            self.set_group(first, count, pass)?;
        }
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
        Ok(())
    }

    /// The stripes the next chunk of codes takes whole, when it starts a
    /// stripe whose scales are not known yet and at least that stripe fits
    /// `room` values: (first stripe, count, values).
    fn whole_stripes(&self, room: u64) -> Option<(u64, u64, u64)> {
        let cols = self.cols.max(1);
        let first = self.done / cols / self.block_rows;
        let known = self
            .group
            .is_some_and(|(s, count)| (s..s + count).contains(&first));
        if known || self.done != first * self.block_rows * cols {
            return None;
        }
        let (mut count, mut values) = (0, 0);
        while first + count < self.stripes() {
            let next = self.stripe_len(first + count);
            if values + next > room {
                break;
            }
            values += next;
            count += 1;
        }
        (count > 0).then_some((first, count, values))
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
            if self.done >= self.stripes() {
                self.leave_scales();
            }
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
    /// Codes map their input where the weight is one contiguous range.
    /// Scales read nothing into the caller's buffer (the lead has its own
    /// scratch), so they take any buffer.
    fn map_input(&mut self, max_len: usize) -> bool {
        match self.part {
            Part::Scales => true,
            Part::Codes => {
                let contiguous = matches!(self.tensor.data, DataRef::Contiguous { .. });
                let fits = max_len as u64 >= self.in_elem();
                if contiguous && fits {
                    self.map_len = Some(max_len);
                }
                contiguous && fits
            }
        }
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

/// A walk over the values of a group of stripes, in order, taking each
/// block's absmax (values infinite in the working dtype left out and
/// counted), without a division per value.
struct AmaxPass {
    from: Dtype,
    work: Dtype,
    cols: usize,
    block_cols: usize,
    block_rows: usize,
    row_scales: usize,
    /// `row_scales` slots per stripe of the group.
    amax: Vec<f32>,
    infinite: u64,
    /// Where the next value falls, counted from the group's first row.
    row: usize,
    col: usize,
}

impl AmaxPass {
    /// Takes in the next values of the group (`bytes`, whole elements).
    fn add(&mut self, bytes: &[u8]) {
        let in_elem = (self.from.bits() / 8) as usize;
        let n = bytes.len() / in_elem;
        let (cols, block_cols) = (self.cols, self.block_cols);
        let mut i = 0;
        while i < n {
            let run = (block_cols - self.col % block_cols)
                .min(cols - self.col)
                .min(n - i);
            let slot = (self.row / self.block_rows) * self.row_scales + self.col / block_cols;
            let values = &bytes[i * in_elem..(i + run) * in_elem];
            let mut a = vectorized(AbsMax(self.from, values));
            if round_to(self.work, a).is_infinite() {
                let (finite, infinite) = finite_abs_max(self.from, self.work, values);
                a = finite;
                self.infinite += infinite;
            }
            self.amax[slot] = self.amax[slot].max(a);
            i += run;
            self.col += run;
            if self.col == cols {
                self.col = 0;
                self.row += 1;
            }
        }
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

    /// One F32 weight of `rows x cols` in a safetensors file of its own,
    /// values of mixed magnitudes (a zero row among them).
    fn weight_file(dir: &std::path::Path, rows: u64, cols: u64) -> crate::format::Checkpoint {
        let values: Vec<u8> = (0..rows * cols)
            .flat_map(|i| {
                let row = i / cols;
                let v = if row == 2 {
                    0.0
                } else {
                    ((i * 2_654_435_761 % 1000) as f32 - 500.0) * (1 + row % 5) as f32 * 1e-3
                };
                v.to_le_bytes()
            })
            .collect();
        let header = serde_json::json!({
            "w": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [0, values.len()]}
        });
        let path = dir.join("model.safetensors");
        crate::format::safetensors::write_test_file(&path, &header, &[&values]);
        crate::format::open(&path).unwrap()
    }

    /// Every byte of `part`, through buffers of `buf` bytes, and the source
    /// bytes the stream reported reading.
    fn drain(
        reader: &SourceReader,
        tensor: &Tensor,
        recipe: Recipe,
        part: Part,
        buf: usize,
        memo: Option<&ScaleMemo>,
    ) -> (Vec<u8>, u64, u64) {
        let policy = OverflowPolicy::Error;
        let mut stream =
            QuantizeStream::open(reader, tensor, recipe, Dtype::BF16, part, policy, memo).unwrap();
        let (mut out, mut read) = (Vec::new(), 0);
        let mut b = vec![0u8; buf];
        while !stream.is_done() {
            let c = stream.fill(&mut b).unwrap();
            out.extend_from_slice(&b[c.start..c.start + c.len]);
            read += c.read;
        }
        (out, read, stream.lead_at)
    }

    /// The codes and scales are the same bytes whichever stream derives
    /// the scales (from the buffer, through the lead, or from the memo the
    /// other stream left), for every recipe and buffer size (whole
    /// tensor, a few stripes, less than one stripe); where stripes fit, the
    /// codes never use the lead, and a scales stream after its codes reads
    /// nothing.
    #[test]
    fn codes_and_scales_are_the_same_however_the_scales_were_derived() {
        let dir = tempfile::tempdir().unwrap();
        let (rows, cols) = (7u64, 96u64);
        let ck = weight_file(dir.path(), rows, cols);
        let reader = SourceReader::open(&ck).unwrap();
        let t = &ck.tensors[0];
        let recipes = [
            Recipe::PerTensor,
            Recipe::PerChannel,
            Recipe::Block { rows: 2, cols: 32 },
        ];
        for recipe in recipes {
            let (block_rows, _) = recipe.block(rows, cols);
            let stripe_bytes = (block_rows.min(rows) * cols * 5) as usize;
            for buf in [
                (rows * cols * 5) as usize,
                2 * stripe_bytes + 7,
                stripe_bytes / 2 + 5,
            ] {
                let what = format!("{recipe:?}, buffer {buf}");
                let (codes, _, _) = drain(&reader, t, recipe, Part::Codes, buf, None);
                let (scales, read, _) = drain(&reader, t, recipe, Part::Scales, buf, None);
                assert_eq!(
                    read,
                    rows * cols * 4,
                    "{what}: scales alone read the weight"
                );
                let fits = buf >= stripe_bytes;
                // Codes first, then the scales from the memo.
                let memo = ScaleMemo::default();
                let (c, _, lead_at) = drain(&reader, t, recipe, Part::Codes, buf, Some(&memo));
                assert_eq!(c, codes, "{what}: codes");
                assert_eq!(lead_at == 0, fits, "{what}: the lead was used");
                let (sc, read, _) = drain(&reader, t, recipe, Part::Scales, buf, Some(&memo));
                assert_eq!(
                    (sc, read),
                    (scales.clone(), 0),
                    "{what}: scales from the memo"
                );
                // Scales first, then the codes with the lead left unused.
                let (sc, _, _) = drain(&reader, t, recipe, Part::Scales, buf, Some(&memo));
                assert_eq!(sc, scales, "{what}: scales");
                let (c, _, lead_at) = drain(&reader, t, recipe, Part::Codes, buf, Some(&memo));
                assert_eq!(
                    (c, lead_at),
                    (codes.clone(), 0),
                    "{what}: codes from the memo"
                );
                assert_eq!(
                    memo.take(&MemoKey {
                        tensor: "w".into(),
                        recipe,
                        work: Dtype::BF16,
                    }),
                    None,
                    "{what}: nothing left behind"
                );
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
