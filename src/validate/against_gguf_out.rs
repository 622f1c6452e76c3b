//! `--against SRC` on a GGUF that `convert` wrote: the conversion of the
//! source is planned again ([`crate::write::format::plan`] in GGUF) and
//! every output tensor must be the planned tensor of its name, in the same
//! GGML type and shape, with the bytes the executor's own stream
//! ([`crate::exec::computed::open`]) computes for it: names (the wrapper
//! stripped, the GGUF names of an LLM), Llama's permuted q/k rows, stacked
//! experts and every encoder are compared byte for byte.
//!
//! A GGUF holds no `reshard.json`, so the options are taken from what the
//! output holds: `--quantize` is the block type its tensors have (none:
//! no `--quantize`), and `--dtype` the first of none, f16, bf16, f32 whose
//! plan gives every output tensor its type. Outputs written with `--keep`,
//! `--quantize-only` or `--keep-dtype` are not re-planned: the tensors
//! those options changed are reported with the type the plan gives.
//!
//! The error figures of each lossy tensor (a block type, or F16/BF16 from
//! a wider source) are measured by decoding the output's codes with the
//! GGUF reader's stream and comparing with the source's values, chunk by
//! chunk through the same three buffers.

use std::collections::{BTreeSet, HashMap};

use super::compare::{stream_difference, Buffers, Sides};
use super::report::{AgainstReport, Failure, ValidateReport};
use super::ValidateError;
use crate::cast::gguf::{GgufStream, RowOrder};
use crate::cast::quantize::{QualityReport, QuantQuality};
use crate::cast::{self, OverflowPolicy};
use crate::format::gguf::ggml::GgmlType;
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{Dtype, Tensor};
use crate::plan::quantize::QuantizeScheme;
use crate::plan::{OutputFormat, Plan, PlanOptions, PlannedTensor, TensorInput};

/// Compares the GGUF `sides.out` with the conversion of `sides.source`.
pub(super) fn compare(
    sides: &Sides,
    policy: OverflowPolicy,
    bufs: &mut Buffers,
    report: &mut ValidateReport,
    summary: &mut AgainstReport,
) -> Result<(), ValidateError> {
    let out = sides.out;
    let plan = match replan(sides) {
        Ok(plan) => plan,
        Err(reason) => {
            report.fail(Failure::FileChanged {
                file: sides.source.dir.display().to_string(),
                reason,
            });
            return Ok(());
        }
    };
    let expected: HashMap<&str, &PlannedTensor> =
        plan.tensors().map(|t| (t.name.as_str(), t)).collect();
    let mut quality = QualityReport::default();
    let mut types = BTreeSet::new();
    for t in &out.tensors {
        bufs.poll(sides.out_reader, t)?;
        let file = out.files[t.file].name();
        let mismatch = |reason: String| Failure::AgainstMismatch {
            tensor: t.name.clone(),
            file: file.clone(),
            reason,
        };
        let Some(&planned) = expected.get(t.name.as_str()) else {
            report.fail(Failure::AgainstMissing {
                tensor: t.name.clone(),
                side: "the source converted again".into(),
            });
            continue;
        };
        let ours = type_of(t);
        // A tensor the options the output shows would give another type,
        // held as a float type (`--keep`, `--quantize-only`, `--keep-dtype`
        // leave no trace in a GGUF): compared with the source encoded as
        // that type, rows permuted and experts stacked as planned.
        let kept;
        let planned = match kept_as(planned, ours) {
            Some(k) if planned.shape == t.shape => {
                summary.kept_as_float += 1;
                kept = k;
                &kept
            }
            _ => planned,
        };
        let theirs = planned.input.ggml();
        if theirs != Some(ours) || planned.shape != t.shape {
            report.fail(mismatch(format!(
                "{ours} {:?}, but converting the source gives {} {:?}",
                t.shape,
                theirs.map_or_else(|| planned.dtype.to_string(), |g| g.to_string()),
                planned.shape
            )));
            continue;
        }
        let Some(mut stream) =
            crate::exec::computed::open(sides.src_reader, sides.source, planned, policy, None)?
        else {
            continue;
        };
        let what = format!(
            "encoding the source's {} as {ours}",
            sides.source.tensors[planned.input.primary()].name
        );
        summary.tensors_compared += 1;
        summary.quantized_compared += 1;
        types.insert(ours.to_string());
        if let Some(reason) = stream_difference(&mut *stream, &what, sides.out_reader, t, bufs)? {
            report.fail(mismatch(reason));
            continue;
        }
        if lossy(ours, planned.source_dtype) {
            let q = measure(sides, planned, t, bufs, policy)?;
            quality.add(&t.name, &q);
        }
    }
    let ours: std::collections::HashSet<&str> =
        out.tensors.iter().map(|t| t.name.as_str()).collect();
    for t in plan.tensors() {
        if !ours.contains(t.name.as_str()) {
            report.fail(Failure::AgainstMissing {
                tensor: t.name.clone(),
                side: "the output".into(),
            });
        }
    }
    summary.gguf_types = types.into_iter().collect();
    summary.quality = Some(quality);
    Ok(())
}

/// `planned` encoded as the float type `ours` instead of its own type, when
/// it is a GGML encoding planned as another type.
fn kept_as(planned: &PlannedTensor, ours: GgmlType) -> Option<PlannedTensor> {
    let float = matches!(ours, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    match &planned.input {
        TensorInput::ToGgml { ggml, .. } if float && *ggml != ours => {
            let mut k = planned.clone();
            if let TensorInput::ToGgml { ggml, .. } = &mut k.input {
                *ggml = ours;
            }
            Some(k)
        }
        _ => None,
    }
}

/// The GGML type of an output tensor.
fn type_of(t: &Tensor) -> GgmlType {
    crate::cast::gguf::ggml_type_of(t).unwrap_or(match t.dtype {
        Dtype::F16 => GgmlType::F16,
        Dtype::BF16 => GgmlType::BF16,
        _ => GgmlType::F32,
    })
}

/// Whether writing `from` values as `ty` can change them.
fn lossy(ty: GgmlType, from: Dtype) -> bool {
    match ty {
        GgmlType::F32 => false,
        GgmlType::F16 => from != Dtype::F16,
        GgmlType::BF16 => from != Dtype::BF16,
        _ => true,
    }
}

/// The source's plan under the options the output shows, or why there is
/// none.
fn replan(sides: &Sides) -> Result<Plan, String> {
    let blocks: BTreeSet<GgmlType> = sides
        .out
        .tensors
        .iter()
        .filter_map(|t| t.ggml_type())
        .filter(|g| !matches!(*g, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16))
        .collect();
    let quantize = match blocks.iter().collect::<Vec<_>>().as_slice() {
        [] => None,
        [one] => Some(
            QuantizeScheme::ALL
                .into_iter()
                .find(|s| s.ggml() == Some(**one))
                .ok_or_else(|| format!("the output holds {one}, which reshard does not write"))?,
        ),
        many => {
            let names: Vec<String> = many.iter().map(|g| g.to_string()).collect();
            return Err(format!(
                "the output holds several block types ({}); reshard writes one",
                names.join(", ")
            ));
        }
    };
    let mut best: Option<(usize, Plan)> = None;
    let mut last_error = String::new();
    for dtype in [None, Some(Dtype::F16), Some(Dtype::BF16), Some(Dtype::F32)] {
        let options = PlanOptions {
            format: OutputFormat::Gguf,
            quantize,
            dtype,
            ..PlanOptions::default()
        };
        let plan = match crate::write::format::plan(sides.source, &options) {
            Ok(plan) => plan,
            Err(e) => {
                last_error = e.to_string();
                continue;
            }
        };
        let matching = matching_types(sides.out, &plan);
        if matching == sides.out.tensors.len() {
            return Ok(plan);
        }
        if best.as_ref().is_none_or(|(n, _)| matching > *n) {
            best = Some((matching, plan));
        }
    }
    let scheme = quantize.map_or("none", QuantizeScheme::name);
    best.map(|(_, plan)| plan).ok_or_else(|| {
        format!("cannot be converted to GGUF again (--quantize {scheme}): {last_error}")
    })
}

/// How many of `out`'s tensors `plan` gives their type and shape.
fn matching_types(out: &crate::format::Checkpoint, plan: &Plan) -> usize {
    let planned: HashMap<&str, &PlannedTensor> =
        plan.tensors().map(|t| (t.name.as_str(), t)).collect();
    out.tensors
        .iter()
        .filter(|t| {
            planned
                .get(t.name.as_str())
                .is_some_and(|p| p.input.ggml() == Some(type_of(t)) && p.shape == t.shape)
        })
        .count()
}

/// The error figures of the output tensor `t` (already proven to be the
/// encoding of `planned`): its codes decoded to f32, in the source's row
/// order, against the source's values (several tensors, one after the
/// other, for stacked experts).
fn measure(
    sides: &Sides,
    planned: &PlannedTensor,
    t: &Tensor,
    bufs: &mut Buffers,
    policy: OverflowPolicy,
) -> Result<QuantQuality, ValidateError> {
    let TensorInput::ToGgml {
        tensor,
        permute_heads,
        stacked,
        ..
    } = &planned.input
    else {
        return Ok(QuantQuality::default());
    };
    let order = permute_heads.map_or(RowOrder::Stored, |heads| RowOrder::Unpermute { heads });
    let mut decoded = GgufStream::open(sides.out_reader, t, Dtype::F32, order, policy)?;
    let min = usize::try_from(decoded.min_buffer()).unwrap_or(usize::MAX);
    if min > bufs.output.len() {
        bufs.output = super::device::try_zeroed(min)
            .map_err(|_| super::compare::too_big_buffers(min as u64))?;
    }
    let inputs: Vec<&Tensor> = std::iter::once(tensor)
        .chain(stacked)
        .map(|&i| &sides.source.tensors[i])
        .collect();
    let mut source = SourceValues::new(sides.src_reader, inputs);
    let mut q = QuantQuality::default();
    while !decoded.is_done() {
        bufs.poll(sides.out_reader, t)?;
        let Buffers {
            source: raw,
            cast: values,
            output,
            ..
        } = &mut *bufs;
        let chunk = decoded.fill(output)?;
        let got = &output[chunk.start..chunk.start + chunk.len];
        for piece in got.chunks(values.len() / 4 * 4) {
            let want = source.next(piece.len() / 4, raw, values)?;
            if want.len() != piece.len() {
                break;
            }
            for (x, y) in want.chunks_exact(4).zip(piece.chunks_exact(4)) {
                let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
                let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
                q.add(f64::from(x), f64::from(y));
            }
        }
    }
    Ok(q)
}

/// The values of a sequence of source tensors as f32, read on demand.
struct SourceValues<'a> {
    reader: &'a SourceReader,
    tensors: Vec<&'a Tensor>,
    current: usize,
    stream: Option<TensorBytes>,
    left: u64,
}

impl<'a> SourceValues<'a> {
    fn new(reader: &'a SourceReader, tensors: Vec<&'a Tensor>) -> Self {
        SourceValues {
            reader,
            tensors,
            current: 0,
            stream: None,
            left: 0,
        }
    }

    /// The next `n` values (at most `values.len() / 4`) as f32 bytes in
    /// `values`, read through `raw`; fewer when the sources end.
    fn next<'b>(
        &mut self,
        n: usize,
        raw: &mut [u8],
        values: &'b mut [u8],
    ) -> Result<&'b [u8], ValidateError> {
        let mut done = 0usize;
        while done < n && self.current < self.tensors.len() {
            let t = self.tensors[self.current];
            if self.stream.is_none() {
                self.stream = Some(self.reader.tensor_bytes(t));
                self.left = t.numel();
            }
            let elem = (t.dtype.bits() / 8).max(1) as usize;
            let room = (raw.len() / elem).min(n - done);
            let take = usize::try_from(self.left).unwrap_or(usize::MAX).min(room);
            if take == 0 {
                self.current += 1;
                self.stream = None;
                continue;
            }
            let input = &mut raw[..take * elem];
            if let Some(stream) = self.stream.as_mut() {
                self.reader.read_chunk(t, stream, input)?;
            }
            let output = &mut values[done * 4..(done + take) * 4];
            if t.dtype == Dtype::F32 {
                output.copy_from_slice(input);
            } else {
                cast::cast_parallel(t.dtype, Dtype::F32, input, output, OverflowPolicy::Inf);
            }
            done += take;
            self.left -= take as u64;
        }
        Ok(&values[..done * 4])
    }
}
