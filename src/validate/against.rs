//! `--against SRC`: every tensor of the output equals the source's, bit for
//! bit, or equals `cast::cast_parallel` of it when the dtypes differ (with
//! the overflow policy the manifest records, else `inf`).
//!
//! A quantized source (see [`crate::quant`]) is compared through
//! the same dequantization `convert --dtype` runs: each dense output tensor
//! against its codes times its scales; the scales and activation scales a
//! dense output does not hold are not missing.
//!
//! Both sides stream through three fixed buffers (source chunk, its cast,
//! output chunk), whatever the tensor sizes. Names on one side only are
//! failures, except tied names the manifest says were dropped on purpose
//! and the source proves tied (same storage as the name kept).

use super::options::ValidateOptions;
use std::collections::HashMap;

use super::against_fp8::{plain_difference, plain_scheme};
use super::against_quantized::Requantized;
use super::compare::{first_difference, stream_difference, too_big_buffers, Buffers, Sides};
use super::ledger::CommitLedger;
use super::report::{AgainstReport, Failure, ValidateReport};
use super::ValidateError;
use crate::cast::dequant::DequantStream;
use crate::cast::quantize::QualityReport;
use crate::cast::{self, OverflowPolicy};
use crate::format::read::SourceReader;
use crate::format::{self, Checkpoint, Tensor};
use crate::plan::order::{sort_indices, Order};
use crate::plan::quantize::QuantizeScheme;
use crate::plan::{PlanOptions, PlannedTensor};
use crate::quant::Scheme;

/// Largest chunk compared at once.
pub(super) const MAX_CHUNK: usize = 8 << 20;

/// Stack size of the compute threads `cast_parallel` may use.
const THREAD_STACK: usize = 2 << 20;

/// Starts the global rayon pool now, so its thread stacks exist before the
/// commit baseline. Returns the bytes of stack it reserved.
pub fn warm_threads() -> u64 {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let built = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .stack_size(THREAD_STACK)
        .build_global();
    // An error means the pool already exists: its stacks predate us.
    if built.is_ok() {
        (threads * THREAD_STACK) as u64
    } else {
        0
    }
}

/// Compares every tensor of `ck` with the checkpoint at `src`.
pub fn compare(
    ck: &Checkpoint,
    src: &std::path::Path,
    options: Option<&PlanOptions>,
    dropped: &[(String, String)],
    validate: &ValidateOptions,
    ledger: &mut CommitLedger,
    report: &mut ValidateReport,
) -> Result<(), ValidateError> {
    let staging = super::device::staging_len(validate.staging, ck) as u64;
    let interrupted = || ValidateError::Interrupted {
        path: ck.dir.clone(),
    };
    let source = format::open(src)?;
    let dropped = proven_ties(&source, dropped);
    let dropped = dropped.as_slice();
    let src_reader = SourceReader::open(&source)?;
    let out_reader = SourceReader::open(ck)?;
    let policy = options.map_or(OverflowPolicy::Inf, |o| o.on_overflow);
    if ck.format == format::Format::Gguf || source.format == format::Format::Gguf {
        let mut summary = AgainstReport {
            source: src.display().to_string(),
            ..AgainstReport::default()
        };
        let chunk = usize::try_from(staging)
            .unwrap_or(MAX_CHUNK)
            .clamp(4096, MAX_CHUNK);
        let mut bufs = Buffers::new(chunk, validate.cancel).map_err(too_big_buffers)?;
        let sides = Sides {
            source: &source,
            src_reader: &src_reader,
            out: ck,
            out_reader: &out_reader,
        };
        if ck.format == format::Format::Gguf {
            // A GGUF output: the source converted again, byte for byte.
            super::against_gguf_out::compare(&sides, policy, &mut bufs, report, &mut summary)?;
        } else {
            super::against_gguf::compare(
                &sides,
                policy,
                dropped,
                validate.cancel,
                &mut bufs,
                report,
                &mut summary,
            )?;
        }
        validate
            .progress
            .advance(ck.tensors.iter().fold(0u64, |a, t| a.saturating_add(t.len)));
        report.against = Some(summary);
        return Ok(());
    }
    let chunk = usize::try_from(staging)
        .unwrap_or(MAX_CHUNK)
        .clamp(4096, MAX_CHUNK);
    let mut bufs = Buffers::new(chunk, validate.cancel);
    let committed = ledger.sample();
    if let Err(needed) = bufs {
        let budget = report.commit_budget;
        report.fail(Failure::OverBudget {
            shard: "(--against buffers)".into(),
            tensor: None,
            needed,
            committed,
            budget,
        });
    }
    let mut summary = AgainstReport {
        source: src.display().to_string(),
        ..AgainstReport::default()
    };
    let by_name: HashMap<&str, &Tensor> = source
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let quant = crate::quant::detect(&source)?;
    let defaults = PlanOptions::default();
    let written = options.unwrap_or(&defaults).written_dtype();
    let mut requant = match &quant {
        Some(_) => None,
        None => crate::quant::detect(ck)?
            .and_then(|q| Requantized::of(ck, &q, &source, options, &written)),
    };
    for failure in requant.iter().flat_map(|r| r.layout.clone()) {
        report.fail(failure);
    }
    for (tensor, reason) in requant.iter().flat_map(|r| &r.unknown) {
        let file = ck
            .tensors
            .iter()
            .find(|t| &t.name == tensor)
            .map(|t| ck.files[t.file].name())
            .unwrap_or_default();
        report.fail(Failure::AgainstMismatch {
            tensor: tensor.clone(),
            file,
            reason: reason.clone(),
        });
    }
    // Dense name -> (codes, scale, scheme), and what a dense output leaves out.
    let mut dense: HashMap<&str, (&Tensor, &Tensor, &Scheme)> = HashMap::new();
    let mut folded: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (w, scale, scheme) in quant.iter().flat_map(|q| q.scaled()) {
        let codes = &source.tensors[w.weight];
        dense.insert(w.name.as_str(), (codes, &source.tensors[scale], scheme));
        folded.insert(source.tensors[scale].name.as_str());
        folded.insert(codes.name.as_str());
    }
    for &i in quant.iter().flat_map(|q| &q.extras) {
        folded.insert(source.tensors[i].name.as_str());
    }
    // Weights written by a plain `--quantize fp8*`: their scheme (the last
    // seen; one output holds one) and error figures.
    let mut plain: Option<(QuantizeScheme, QualityReport)> = None;
    let names: Vec<&str> = ck.tensors.iter().map(|t| t.name.as_str()).collect();
    for i in sort_indices(&names, Order::Forward) {
        if validate.cancel.is_set() {
            return Err(interrupted());
        }
        let out = &ck.tensors[i];
        let file = ck.files[out.file].name();
        // Counted as it starts: the comparisons below `continue` early.
        validate.progress.advance(out.len);
        if let Some(&(codes, scale, scheme)) = dense.get(out.name.as_str()) {
            if codes.dtype != out.dtype || codes.name != out.name {
                let Ok(bufs) = bufs.as_mut() else {
                    continue;
                };
                let dq = Dequantized {
                    codes,
                    scale,
                    scheme,
                };
                if let Some(reason) =
                    dq.first_difference(&src_reader, &out_reader, out, bufs, policy)?
                {
                    report.fail(Failure::AgainstMismatch {
                        tensor: out.name.clone(),
                        file: file.clone(),
                        reason,
                    });
                }
                summary.tensors_compared += 1;
                summary.dequantized_compared += 1;
                continue;
            }
        }
        if let Some(expected) = requant.as_ref().and_then(|r| r.expected.get(&out.name)) {
            let Ok(bufs) = bufs.as_mut() else {
                continue;
            };
            let quality = requantized_difference(
                expected,
                &source,
                &src_reader,
                &out_reader,
                out,
                bufs,
                policy,
            )?;
            match quality {
                Err(reason) => report.fail(Failure::AgainstMismatch {
                    tensor: out.name.clone(),
                    file: file.clone(),
                    reason,
                }),
                Ok(Some(q)) => {
                    if let Some(r) = requant.as_mut() {
                        r.quality.add(&out.name, &q);
                    }
                }
                Ok(None) => {}
            }
            summary.tensors_compared += 1;
            summary.quantized_compared += 1;
            continue;
        }
        let Some(&theirs) = by_name.get(out.name.as_str()) else {
            report.fail(Failure::AgainstMissing {
                tensor: out.name.clone(),
                side: "the output".into(),
            });
            continue;
        };
        let Ok(bufs) = bufs.as_mut() else {
            continue;
        };
        let mismatch = |reason: String| Failure::AgainstMismatch {
            tensor: out.name.clone(),
            file: file.clone(),
            reason,
        };
        if theirs.shape != out.shape {
            report.fail(mismatch(format!(
                "shape {:?} but the source's is {:?}",
                out.shape, theirs.shape
            )));
            continue;
        }
        if let Some(scheme) = plain_scheme(theirs.dtype, out.dtype) {
            match plain_difference(&src_reader, theirs, &out_reader, out, bufs)? {
                Err(reason) => report.fail(mismatch(reason)),
                Ok(q) => {
                    let (s, quality) = plain.get_or_insert_with(|| (scheme, Default::default()));
                    *s = scheme;
                    quality.add(&out.name, &q);
                }
            }
            summary.tensors_compared += 1;
            summary.quantized_compared += 1;
            continue;
        }
        if theirs.dtype != out.dtype
            && !matches!(cast::target_for(theirs.dtype, out.dtype), Ok(Some(_)))
        {
            report.fail(mismatch(format!(
                "{} but the source's is {}, which reshard does not cast",
                out.dtype, theirs.dtype
            )));
            continue;
        }
        if let Some(at) = first_difference(&src_reader, theirs, &out_reader, out, bufs, policy)? {
            let how = if theirs.dtype == out.dtype {
                String::new()
            } else {
                format!(" cast from {}", theirs.dtype)
            };
            report.fail(mismatch(format!(
                "differs from the source's{how} at element {at}"
            )));
        }
        summary.tensors_compared += 1;
        summary.cast_compared += usize::from(theirs.dtype != out.dtype);
    }
    let ours: std::collections::HashSet<&str> = names.iter().copied().collect();
    for t in &source.tensors {
        let dense_output = summary.dequantized_compared > 0 && folded.contains(t.name.as_str());
        if !ours.contains(t.name.as_str()) && !dropped.contains(&t.name) && !dense_output {
            report.fail(Failure::AgainstMissing {
                tensor: t.name.clone(),
                side: "the source".into(),
            });
        }
    }
    if let Some(r) = requant {
        summary.quantize_scheme = Some(r.scheme);
        summary.quality = Some(r.quality);
    } else if let Some((scheme, quality)) = plain {
        summary.quantize_scheme = Some(scheme);
        summary.quality = Some(quality);
    }
    report.against = Some(summary);
    Ok(())
}

/// Why `out` is not `expected` (a quantized weight's codes, scale or
/// companion, recomputed from the source), or the codes' error figures
/// when it is.
fn requantized_difference(
    expected: &PlannedTensor,
    source: &Checkpoint,
    src_reader: &SourceReader,
    out_reader: &SourceReader,
    out: &Tensor,
    bufs: &mut Buffers,
    policy: OverflowPolicy,
) -> Result<Result<Option<crate::cast::quantize::QuantQuality>, String>, ValidateError> {
    if expected.dtype != out.dtype || expected.shape != out.shape {
        return Ok(Err(format!(
            "{} {:?}, but quantizing the source gives {} {:?}",
            out.dtype, out.shape, expected.dtype, expected.shape
        )));
    }
    let Some(mut stream) = crate::exec::computed::open(src_reader, source, expected, policy, None)?
    else {
        return Ok(Err("not a quantized tensor reshard computes".into()));
    };
    let what = format!(
        "quantizing the source's {}",
        source.tensors[expected.input.primary()].name
    );
    if let Some(reason) = stream_difference(stream.as_mut(), &what, out_reader, out, bufs)? {
        return Ok(Err(reason));
    }
    Ok(Ok(Requantized::is_codes(expected)
        .then(|| stream.quality())
        .flatten()))
}

/// The names a manifest says were dropped as tied that the source proves
/// tied: each shares its storage (file, data, dtype and shape) with the
/// tensor it was dropped for, as `convert --dedupe-tied` requires. The
/// manifest's word alone excuses no missing tensor.
fn proven_ties(source: &Checkpoint, dropped: &[(String, String)]) -> Vec<String> {
    let by_name: HashMap<&str, &Tensor> = source
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    let storage = |t: &Tensor| {
        (
            t.file,
            serde_json::to_string(&t.data).unwrap_or_default(),
            t.dtype,
            t.shape.clone(),
        )
    };
    dropped
        .iter()
        .filter(|(name, same_as)| {
            name != same_as
                && match (by_name.get(name.as_str()), by_name.get(same_as.as_str())) {
                    (Some(a), Some(b)) => storage(a) == storage(b),
                    _ => false,
                }
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// A quantized source tensor: its codes, its scale and how they combine.
struct Dequantized<'a> {
    codes: &'a Tensor,
    scale: &'a Tensor,
    scheme: &'a Scheme,
}

impl Dequantized<'_> {
    /// Why `out` is not the dequantization of the codes, or `None` when it
    /// is, bit for bit.
    fn first_difference(
        &self,
        src_reader: &SourceReader,
        out_reader: &SourceReader,
        out: &Tensor,
        bufs: &mut Buffers,
        policy: OverflowPolicy,
    ) -> Result<Option<String>, ValidateError> {
        let mut stream = DequantStream::open(
            src_reader,
            self.codes,
            self.scale,
            self.scheme,
            out.dtype,
            policy,
        )?;
        let what = format!(
            "the dequantized {} times {}",
            self.codes.name, self.scale.name
        );
        stream_difference(&mut stream, &what, out_reader, out, bufs)
    }
}
