//! The sampled error estimate of `fit --for`: how far a form's values are
//! from this checkpoint's, measured by quantizing a sample of its weights
//! with the arithmetic `convert` uses.
//!
//! **What is measured** is what the quality report of `convert` and
//! `validate --against` measures, over the tensors the form's plan changes:
//! a weight quantized to scaled FP8 ([`crate::cast::quantize`]'s recipes)
//! or to a GGML type ([`crate::cast::gguf::quantize::quantize_blocks`],
//! read back with [`crate::cast::gguf::dequantize_blocks`]), or cast to a
//! narrower float ([`crate::cast::cast_slice`]: a 16-bit cast, plain FP8).
//! The figure is the element-weighted relative RMS error `sqrt(sum (x -
//! y)^2 / sum x^2)` of [`QuantQuality`]. Tensors read from a quantized
//! source (dequantized FP8, GGUF blocks) are not measured.
//!
//! **The sample** is made of whole quantization units, so every scale is
//! the one `convert` computes: a run of whole GGML blocks of one row, one
//! full row for a per-channel FP8 scale, one block of `fp8-block`, a run of
//! at most [`SEGMENT`] values of a row for a cast. The units are spread
//! evenly over every tensor *kind* (its name with the block numbers
//! removed: `double_blocks.#.img_attn.qkv.weight`), in layer order, so
//! every block and every part of a row range is visited; each kind's sums
//! are scaled by its elements over its sampled elements (a stratified
//! estimate, so a kind sampled more densely does not weigh more). One
//! exception to exactness: a per-tensor FP8 scale (`fp8-scaled`) needs the
//! tensor's absmax, which the sample does not read; it takes the sample's.
//! FP8 is a float format, so its relative step is the same at every
//! magnitude and the scale only decides which tiny values fall into its
//! subnormals (below `absmax / 28672`): an absmax estimated a few times too
//! low leaves the estimate almost unchanged.
//!
//! **Cost.** At most [`SAMPLE_FRACTION`] of a form's changed elements and
//! [`SAMPLE_ELEMENTS`] of them (8 MiB of bf16 reads per form: 0.04% of a
//! 12-billion-weight model), and never more than [`MAX_FRACTION`], the
//! bound of issue 29, even with the one unit each kind is given when its
//! share rounds to none. Reads are positioned reads of one unit's rows;
//! memory is one tensor's sample at a time per worker. An all-zero unit
//! (a sparse test file) is counted without being quantized: it adds
//! nothing to either sum, and an all-zero sample has no estimate (`None`,
//! "n/a").
//!
//! **Values that are not finite** are left out of both sums, as the
//! quality report leaves them out, and counted: [`Estimate::not_finite`]
//! (NaN or infinite in the checkpoint) and [`Estimate::overflow`] (finite
//! in the checkpoint, infinite or NaN once written in the form: past an
//! f16 range, or a GGML block scale past f16's). `fit --for` reports both,
//! so a sample that is not all zeros never reads as "n/a".

use std::collections::HashMap;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::cast::gguf::dequantize_blocks;
use crate::cast::gguf::quantize::quantize_blocks;
use crate::cast::quantize::{code, dequantized, round_to, QuantQuality, Recipe, Scale};
use crate::cast::{cast_slice, supports, OverflowPolicy};
use crate::format::gguf::ggml::GgmlType;
use crate::format::read::SourceReader;
use crate::format::{Checkpoint, Dtype, FormatError, Tensor};
use crate::plan::order::natural_cmp;
use crate::plan::{Plan, TensorInput};

/// The share of a form's changed elements sampled by default.
pub const SAMPLE_FRACTION: f64 = 0.05;

/// The most elements sampled for one form (before the one-unit minimum
/// of each kind).
pub const SAMPLE_ELEMENTS: u64 = 1 << 22;

/// The share of a form's changed elements never exceeded.
pub const MAX_FRACTION: f64 = 0.10;

/// The longest run of one row a cast or a GGML unit takes.
pub const SEGMENT: u64 = 4096;

/// A form's estimated error, and how much of it was sampled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// Relative RMS error over the finite values; `None` when no sampled
    /// value is both finite and non-zero (see [`Estimate::not_finite`] and
    /// [`Estimate::overflow`] for which).
    pub relative_rms: Option<f64>,
    /// Sampled values NaN or infinite in the checkpoint (not measured).
    #[serde(default)]
    pub not_finite: u64,
    /// Sampled finite values the form writes as infinity or NaN (not
    /// measured).
    #[serde(default)]
    pub overflow: u64,
    /// Elements sampled.
    pub sampled: u64,
    /// Elements of the tensors the form changes.
    pub changed: u64,
}

impl Estimate {
    /// Nothing changes: no error.
    pub const EXACT: Estimate = Estimate {
        relative_rms: Some(0.0),
        sampled: 0,
        changed: 0,
        not_finite: 0,
        overflow: 0,
    };

    /// The share of the changed elements sampled.
    pub fn fraction(&self) -> f64 {
        match self.changed {
            0 => 0.0,
            n => self.sampled as f64 / n as f64,
        }
    }
}

/// Why a sample could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error(transparent)]
    Read(#[from] FormatError),
    #[error("cannot quantize a sample of {tensor}: {reason}")]
    Quantize { tensor: String, reason: String },
}

/// Measures the forms of one checkpoint, opening its files on the first
/// sample that needs them.
pub struct Sampler<'a> {
    ck: &'a Checkpoint,
    reader: Option<SourceReader>,
}

/// How a form changes one tensor's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Cast to a narrower float, overflows as `policy`.
    Cast { to: Dtype, policy: OverflowPolicy },
    /// Scaled FP8 by `recipe` in working dtype `work`.
    Fp8 { recipe: Recipe, work: Dtype },
    /// A GGML type.
    Ggml(GgmlType),
}

/// A changed source tensor and its units.
struct Target {
    tensor: usize,
    op: Op,
    rows: u64,
    cols: u64,
    unit_rows: u64,
    unit_cols: u64,
}

impl Target {
    fn new(ck: &Checkpoint, tensor: usize, op: Op) -> Target {
        let t = &ck.tensors[tensor];
        let cols = match t.shape.len() {
            0 => 1,
            _ => t.shape[t.shape.len() - 1].max(1),
        };
        let rows = t.numel() / cols;
        let (unit_rows, unit_cols) = match op {
            Op::Cast { .. }
            | Op::Fp8 {
                recipe: Recipe::PerTensor,
                ..
            } => (1, cols.min(SEGMENT)),
            Op::Fp8 {
                recipe: Recipe::PerChannel,
                ..
            } => (1, cols),
            Op::Fp8 { recipe, .. } => recipe.block(rows, cols),
            Op::Ggml(ty) => {
                let block = ty.layout().map_or(1, |l| l.block).max(1);
                (1, cols.min((SEGMENT / block).max(1) * block))
            }
        };
        Target {
            tensor,
            op,
            rows,
            cols,
            unit_rows,
            unit_cols,
        }
    }

    fn col_units(&self) -> u64 {
        self.cols.div_ceil(self.unit_cols)
    }

    fn units(&self) -> u64 {
        self.rows.div_ceil(self.unit_rows) * self.col_units()
    }

    /// Rows and columns of unit `u`: (first row, rows, first column, columns).
    fn unit(&self, u: u64) -> (u64, u64, u64, u64) {
        let (r, c) = (u / self.col_units(), u % self.col_units());
        let (r0, c0) = (r * self.unit_rows, c * self.unit_cols);
        (
            r0,
            self.unit_rows.min(self.rows - r0),
            c0,
            self.unit_cols.min(self.cols - c0),
        )
    }

    fn unit_len(&self, u: u64) -> u64 {
        let (_, rows, _, cols) = self.unit(u);
        rows * cols
    }
}

/// The tensors of one kind changed by one op, and the units taken.
struct Group {
    targets: Vec<usize>,
    elements: u64,
    picked: u64,
}

impl<'a> Sampler<'a> {
    pub fn new(ck: &'a Checkpoint) -> Sampler<'a> {
        Sampler { ck, reader: None }
    }

    /// The estimated error of the form `plan` writes.
    pub fn estimate(&mut self, plan: &Plan) -> Result<Estimate, SampleError> {
        let targets = targets(self.ck, plan);
        if targets.is_empty() {
            return Ok(Estimate::EXACT);
        }
        let mut groups = group(self.ck, &targets);
        let picks = pick(&targets, &mut groups);
        if self.reader.is_none() {
            self.reader = Some(SourceReader::open(self.ck)?);
        }
        let reader = self.reader.as_ref().expect("opened above");
        let ck = self.ck;
        // One task per target tensor, summed in target order whatever
        // the thread count.
        let measured: Vec<Measured> = picks
            .par_iter()
            .enumerate()
            .map(|(i, units)| measure(reader, ck, &targets[i], units))
            .collect::<Result<_, _>>()?;
        let (mut source, mut error) = (0f64, 0f64);
        let (mut sampled, mut not_finite, mut overflow) = (0u64, 0u64, 0u64);
        for g in &groups {
            let mut q = QuantQuality::default();
            let mut n = 0u64;
            for &t in &g.targets {
                q += measured[t].quality;
                n += measured[t].elements;
                not_finite += measured[t].not_finite;
                overflow += measured[t].quality.not_finite - measured[t].not_finite;
            }
            sampled += n;
            if n > 0 {
                let weight = g.elements as f64 / n as f64;
                source += q.sum_sq_source * weight;
                error += q.sum_sq_error * weight;
            }
        }
        let changed = groups.iter().map(|g| g.elements).sum();
        Ok(Estimate {
            relative_rms: (source > 0.0).then(|| (error / source).sqrt()),
            sampled,
            changed,
            not_finite,
            overflow,
        })
    }
}

/// Whether writing `from` values as `to` can change them.
fn lossy(from: Dtype, to: Dtype) -> bool {
    from != to && from.is_float() && to.is_float() && from.bits() >= to.bits()
}

/// Every source tensor `plan` changes, and how.
fn targets(ck: &Checkpoint, plan: &Plan) -> Vec<Target> {
    let readable = |i: usize| {
        let d = ck.tensors[i].dtype;
        matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64) && ck.tensors[i].numel() > 0
    };
    // A value past the target's range is measured at the largest finite
    // value (never left out as an infinity would be), unless the plan
    // writes infinities.
    let policy = match plan.options.on_overflow {
        OverflowPolicy::Error => OverflowPolicy::Saturate,
        p => p,
    };
    let mut out = Vec::new();
    for p in plan.tensors() {
        match &p.input {
            TensorInput::Source { tensor } if readable(*tensor) => {
                let from = ck.tensors[*tensor].dtype;
                // What the cast kernels write and read back (a panic
                // otherwise); every dtype a plan casts to is one.
                let castable = supports(from, p.dtype) && supports(p.dtype, Dtype::F32);
                if lossy(from, p.dtype) && castable {
                    let op = Op::Cast {
                        to: p.dtype,
                        policy,
                    };
                    out.push(Target::new(ck, *tensor, op));
                }
            }
            TensorInput::Quantized {
                tensor,
                recipe,
                work,
                part: crate::cast::quantize::Part::Codes,
            } if readable(*tensor) => {
                let op = Op::Fp8 {
                    recipe: *recipe,
                    work: *work,
                };
                out.push(Target::new(ck, *tensor, op));
            }
            TensorInput::ToGgml {
                tensor,
                ggml,
                stacked,
                ..
            } => {
                for &i in std::iter::once(tensor).chain(stacked) {
                    let from = ck.tensors[i].dtype;
                    let changes = match *ggml {
                        GgmlType::F32 => lossy(from, Dtype::F32),
                        GgmlType::F16 => lossy(from, Dtype::F16),
                        GgmlType::BF16 => lossy(from, Dtype::BF16),
                        _ => true,
                    };
                    if changes && readable(i) {
                        out.push(Target::new(ck, i, Op::Ggml(*ggml)));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// `name` with its all-digit parts (block and expert numbers) made `#`.
pub fn kind(name: &str) -> String {
    name.split('.')
        .map(
            |p| match !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                true => "#",
                false => p,
            },
        )
        .collect::<Vec<_>>()
        .join(".")
}

/// The targets by kind and op, each kind's in layer order.
fn group(ck: &Checkpoint, targets: &[Target]) -> Vec<Group> {
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let key = (kind(&ck.tensors[t.tensor].name), format!("{:?}", t.op));
        let at = *index.entry(key).or_insert_with(|| {
            groups.push(Group {
                targets: Vec::new(),
                elements: 0,
                picked: 0,
            });
            groups.len() - 1
        });
        groups[at].targets.push(i);
        groups[at].elements += t.rows * t.cols;
    }
    for g in &mut groups {
        g.targets.sort_by(|&a, &b| {
            natural_cmp(
                &ck.tensors[targets[a].tensor].name,
                &ck.tensors[targets[b].tensor].name,
            )
        });
    }
    groups
}

/// The units of each target to sample (indexed as `targets`).
fn pick(targets: &[Target], groups: &mut [Group]) -> Vec<Vec<u64>> {
    let total: u64 = groups.iter().map(|g| g.elements).sum();
    let fraction = (SAMPLE_ELEMENTS as f64 / total.max(1) as f64).min(SAMPLE_FRACTION);
    let cap = (total as f64 * MAX_FRACTION) as u64;
    let mut picks: Vec<Vec<u64>> = targets.iter().map(|_| Vec::new()).collect();
    let mut taken = 0u64;
    let units = |g: &Group| -> u64 { g.targets.iter().map(|&t| targets[t].units()).sum() };
    for g in groups.iter_mut() {
        let n = units(g);
        g.picked = ((n as f64 * fraction) as u64).min(n);
        taken += spread(targets, g, &mut picks);
    }
    // A kind whose share rounds to no unit gets one while the bound
    // allows, smallest units first.
    let mut empty: Vec<usize> = (0..groups.len())
        .filter(|&i| groups[i].picked == 0)
        .collect();
    empty.sort_by_key(|&i| targets[groups[i].targets[0]].unit_len(0));
    for i in empty {
        let g = &mut groups[i];
        let len = targets[g.targets[0]].unit_len(0);
        if taken + len <= cap && units(g) > 0 {
            g.picked = 1;
            taken += spread(targets, g, &mut picks);
        }
    }
    picks
}

/// Chooses `g.picked` units evenly over the group's units (the midpoints
/// of equal stretches, in layer order); their elements.
fn spread(targets: &[Target], g: &Group, picks: &mut [Vec<u64>]) -> u64 {
    let counts: Vec<u64> = g.targets.iter().map(|&t| targets[t].units()).collect();
    let n: u64 = counts.iter().sum();
    let m = g.picked;
    let mut elements = 0;
    let (mut at, mut before) = (0usize, 0u64);
    for j in 0..m {
        let u = ((2 * u128::from(j) + 1) * u128::from(n) / (2 * u128::from(m))) as u64;
        while u >= before + counts[at] {
            before += counts[at];
            at += 1;
        }
        let t = g.targets[at];
        picks[t].push(u - before);
        elements += targets[t].unit_len(u - before);
    }
    elements
}

/// What the units of one target gave.
struct Measured {
    /// The error sums; its `not_finite` counts every value left out.
    quality: QuantQuality,
    elements: u64,
    /// Of those left out, the values not finite in the checkpoint.
    not_finite: u64,
}

/// The error sums of `units` of one target, and their elements.
fn measure(
    reader: &SourceReader,
    ck: &Checkpoint,
    target: &Target,
    units: &[u64],
) -> Result<Measured, SampleError> {
    let t = &ck.tensors[target.tensor];
    let mut values = Vec::new();
    let mut reference = Vec::new();
    let mut read = Vec::new();
    let mut bytes = Vec::new();
    // A per-tensor scale is the sample's absmax (see the module doc).
    let mut tensor_scale = None;
    if let Op::Fp8 {
        recipe: Recipe::PerTensor,
        work,
    } = target.op
    {
        let mut amax = 0f32;
        for &u in units {
            if unit_values(reader, t, target, u, &mut read, &mut values, &mut reference)? {
                amax = amax.max(abs_max(work, &values));
            }
        }
        tensor_scale = Some(Scale::of(Recipe::PerTensor, work, round_to(work, amax)));
    }
    let mut q = QuantQuality::default();
    let mut elements = 0;
    let mut not_finite = 0u64;
    for &u in units {
        elements += target.unit_len(u);
        let nonzero = unit_values(reader, t, target, u, &mut read, &mut values, &mut reference)?;
        if !nonzero || reference.iter().all(|&x| x == 0.0) {
            continue;
        }
        let mut back = vec![0f64; values.len()];
        match target.op {
            Op::Cast { to, policy } => {
                let n = values.len();
                bytes.resize(n * (to.bits() / 8) as usize, 0);
                cast_slice(t.dtype, to, &read, &mut bytes, policy);
                let mut wide = vec![0u8; n * 4];
                cast_slice(to, Dtype::F32, &bytes, &mut wide, policy);
                for (b, w) in back.iter_mut().zip(wide.chunks_exact(4)) {
                    *b = f64::from(f32::from_le_bytes([w[0], w[1], w[2], w[3]]));
                }
            }
            Op::Fp8 { recipe, work } => {
                let scale = tensor_scale.unwrap_or_else(|| {
                    Scale::of(recipe, work, round_to(work, abs_max(work, &values)))
                });
                for (b, &v) in back.iter_mut().zip(&values) {
                    *b = dequantized(code(recipe, work, round_to(work, v), &scale), &scale);
                }
            }
            Op::Ggml(ty) => ggml_round_trip(ty, t, &values, &mut bytes, &mut back)?,
        }
        for (&x, &y) in reference.iter().zip(&back) {
            q.add(x, y);
        }
        not_finite += reference.iter().filter(|x| !x.is_finite()).count() as u64;
    }
    Ok(Measured {
        quality: q,
        elements,
        not_finite,
    })
}

/// The values of `ty` read back after encoding `values` (whole blocks).
fn ggml_round_trip(
    ty: GgmlType,
    t: &Tensor,
    values: &[f32],
    bytes: &mut Vec<u8>,
    back: &mut [f64],
) -> Result<(), SampleError> {
    let bad = |reason: String| SampleError::Quantize {
        tensor: t.name.clone(),
        reason,
    };
    let layout = ty
        .layout()
        .ok_or_else(|| bad(format!("{ty} has no block layout")))?;
    let blocks = values.len() as u64 / layout.block;
    bytes.resize((blocks * layout.bytes) as usize, 0);
    quantize_blocks(ty, values, bytes).map_err(|e| bad(e.to_string()))?;
    let mut decoded = vec![0f32; values.len()];
    dequantize_blocks(ty, bytes, &mut decoded).map_err(|e| bad(e.to_string()))?;
    for (b, d) in back.iter_mut().zip(decoded) {
        *b = f64::from(d);
    }
    Ok(())
}

/// The largest magnitude of `values` that stays finite in `work` (NaN
/// left out), as the quantize stream's lead takes it.
fn abs_max(work: Dtype, values: &[f32]) -> f32 {
    values
        .iter()
        .map(|v| v.abs())
        .filter(|a| !a.is_nan() && round_to(work, *a).is_finite())
        .fold(0.0, f32::max)
}

/// Reads unit `u` of `target` (row by row) into `read` (source bytes),
/// `values` (as f32, what is quantized) and `reference` (the exact
/// source values the error is measured against). False, with nothing
/// decoded, when its bytes are all zero (it adds nothing to the sums).
fn unit_values(
    reader: &SourceReader,
    t: &Tensor,
    target: &Target,
    u: u64,
    read: &mut Vec<u8>,
    values: &mut Vec<f32>,
    reference: &mut Vec<f64>,
) -> Result<bool, SampleError> {
    let (r0, rows, c0, cols) = target.unit(u);
    let elem = t.dtype.bits() / 8;
    let row_bytes = (cols * elem) as usize;
    read.resize(rows as usize * row_bytes, 0);
    for (r, buf) in (r0..r0 + rows).zip(read.chunks_exact_mut(row_bytes)) {
        let pos = (r * target.cols + c0) * elem;
        let mut stream = reader.tensor_bytes_from(t, pos, 0)?;
        reader.read_chunk(t, &mut stream, buf)?;
    }
    let words = read.chunks_exact(8);
    let tail = words.remainder().iter().all(|&b| b == 0);
    if tail && words.into_iter().all(|w| w == [0; 8]) {
        return Ok(false);
    }
    let n = (rows * cols) as usize;
    let mut f32s = Vec::new();
    let f32s: &[u8] = match t.dtype {
        Dtype::F32 => read,
        from => {
            f32s.resize(n * 4, 0);
            cast_slice(from, Dtype::F32, read, &mut f32s, OverflowPolicy::Inf);
            &f32s
        }
    };
    values.clear();
    values.extend(
        f32s.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    reference.clear();
    match t.dtype {
        Dtype::F64 => reference.extend(
            read.chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
        ),
        _ => reference.extend(values.iter().map(|&v| f64::from(v))),
    }
    Ok(true)
}

#[cfg(test)]
#[path = "sample_tests.rs"]
mod tests;
