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
//! failures, except tied names the manifest says were dropped on purpose.

use super::options::ValidateOptions;
use std::collections::HashMap;

use super::compare::{first_difference, stream_difference, too_big_buffers, Buffers, Sides};
use super::ledger::CommitLedger;
use super::report::{AgainstReport, Failure, ValidateReport};
use super::ValidateError;
use crate::cast::dequant::DequantStream;
use crate::cast::{self, OverflowPolicy};
use crate::format::read::SourceReader;
use crate::format::{self, Checkpoint, Tensor};
use crate::plan::order::{sort_indices, Order};
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
    policy: Option<OverflowPolicy>,
    dropped: &[String],
    options: &ValidateOptions,
    ledger: &mut CommitLedger,
    report: &mut ValidateReport,
) -> Result<(), ValidateError> {
    let staging = super::device::staging_len(options.staging, ck) as u64;
    let interrupted = || ValidateError::Interrupted {
        path: ck.dir.clone(),
    };
    let source = format::open(src)?;
    let src_reader = SourceReader::open(&source)?;
    let out_reader = SourceReader::open(ck)?;
    let policy = policy.unwrap_or(OverflowPolicy::Inf);
    if source.format == format::Format::Gguf {
        let mut summary = AgainstReport {
            source: src.display().to_string(),
            ..AgainstReport::default()
        };
        let chunk = usize::try_from(staging)
            .unwrap_or(MAX_CHUNK)
            .clamp(4096, MAX_CHUNK);
        let mut bufs = Buffers::new(chunk).map_err(too_big_buffers)?;
        let sides = Sides {
            source: &source,
            src_reader: &src_reader,
            out: ck,
            out_reader: &out_reader,
        };
        super::against_gguf::compare(
            &sides,
            policy,
            dropped,
            options.cancel,
            &mut bufs,
            report,
            &mut summary,
        )?;
        report.against = Some(summary);
        return Ok(());
    }
    let chunk = usize::try_from(staging)
        .unwrap_or(MAX_CHUNK)
        .clamp(4096, MAX_CHUNK);
    let mut bufs = Buffers::new(chunk);
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
    let names: Vec<&str> = ck.tensors.iter().map(|t| t.name.as_str()).collect();
    for i in sort_indices(&names, Order::Forward) {
        if options.cancel.is_set() {
            return Err(interrupted());
        }
        let out = &ck.tensors[i];
        let file = ck.files[out.file].name();
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
    report.against = Some(summary);
    Ok(())
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
