//! `--against model.gguf`: every tensor of a converted GGUF equals what
//! `convert` computes from its GGUF tensor (the same plan roles: name,
//! shape, rows put back, dequantized exactly as gguf-py and rounded to the
//! output's dtype), bit for bit, through the executor's own streams.

use super::options::Cancel;
use std::collections::HashMap;

use super::compare::{first_difference, stream_difference, Buffers, Sides};
use super::report::{AgainstReport, Failure, ValidateReport};
use super::ValidateError;
use crate::cast::{OverflowPolicy, TARGETS};
use crate::format::{self, Dtype};
use crate::plan::from_gguf::GgufPlan;
use crate::plan::order::{sort_indices, Order};
use crate::plan::{PlannedTensor, TensorInput};

/// Compares every output tensor with the GGUF tensor it was made from.
pub(super) fn compare(
    sides: &Sides<'_>,
    policy: OverflowPolicy,
    dropped: &[String],
    cancel: Cancel,
    bufs: &mut Buffers,
    report: &mut ValidateReport,
    summary: &mut AgainstReport,
) -> Result<(), ValidateError> {
    let source = sides.source;
    let model = format::gguf::open(&source.files[0].path)?;
    // The output's names say which naming convert used: GGUF names kept
    // (--keep-gguf-names, or a file of no LLM family) or transformers'.
    let gguf_names: std::collections::HashSet<&str> =
        source.tensors.iter().map(|t| t.name.as_str()).collect();
    let kept = sides
        .out
        .tensors
        .iter()
        .any(|t| gguf_names.contains(t.name.as_str()));
    let gguf = GgufPlan::new(source, &model, Some(Dtype::F32), kept, &|_| false)?;
    let by_name: HashMap<&str, usize> = gguf
        .roles
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().map(|r| (r.name.as_str(), i)))
        .collect();
    let out = sides.out;
    let names: Vec<&str> = out.tensors.iter().map(|t| t.name.as_str()).collect();
    for i in sort_indices(&names, Order::Forward) {
        if cancel.is_set() {
            return Err(ValidateError::Interrupted {
                path: out.dir.clone(),
            });
        }
        let t = &out.tensors[i];
        let file = out.files[t.file].name();
        let mismatch = |reason: String| Failure::AgainstMismatch {
            tensor: t.name.clone(),
            file: file.clone(),
            reason,
        };
        let Some(role) = by_name
            .get(t.name.as_str())
            .and_then(|&s| gguf.roles[s].as_ref())
        else {
            report.fail(Failure::AgainstMissing {
                tensor: t.name.clone(),
                side: "the output".into(),
            });
            continue;
        };
        if role.shape != t.shape {
            report.fail(mismatch(format!(
                "shape {:?} but the GGUF tensor's is {:?}",
                t.shape, role.shape
            )));
            continue;
        }
        if let TensorInput::Source { tensor } = role.input {
            // Copied, or cast like any plain tensor (integers, F64 too).
            let theirs = &source.tensors[tensor];
            let castable = theirs.dtype == t.dtype
                || matches!(crate::cast::target_for(theirs.dtype, t.dtype), Ok(Some(_)));
            if !castable {
                report.fail(mismatch(format!(
                    "{} but the GGUF tensor's is {}, which reshard does not cast",
                    t.dtype, theirs.dtype
                )));
                continue;
            }
            let at = first_difference(sides.src_reader, theirs, sides.out_reader, t, bufs, policy)?;
            if let Some(at) = at {
                report.fail(mismatch(format!(
                    "differs from GGUF tensor {:?} ({}) at element {at}",
                    theirs.name, theirs.dtype
                )));
            }
            summary.tensors_compared += 1;
            summary.cast_compared += usize::from(theirs.dtype != t.dtype);
            continue;
        }
        if !TARGETS.contains(&t.dtype) {
            report.fail(mismatch(format!(
                "{}, which is not a dtype a GGUF tensor is dequantized to",
                t.dtype
            )));
            continue;
        }
        let source_index = role.input.primary();
        let unpermute_heads = match role.input {
            TensorInput::Gguf {
                unpermute_heads, ..
            } => unpermute_heads,
            _ => None,
        };
        let planned = PlannedTensor {
            name: t.name.clone(),
            input: TensorInput::Gguf {
                tensor: source_index,
                unpermute_heads,
            },
            source_dtype: source.tensors[source_index].dtype,
            dtype: t.dtype,
            shape: t.shape.clone(),
            len: t.len,
            offset: 0,
            after: None,
        };
        let Some(mut stream) =
            crate::exec::computed::open(sides.src_reader, source, &planned, policy, None)?
        else {
            continue;
        };
        let gguf_tensor = &source.tensors[source_index];
        let what = format!(
            "GGUF tensor {:?} ({}) dequantized",
            gguf_tensor.name,
            crate::cast::gguf::ggml_type_of(gguf_tensor)
                .map_or_else(|| gguf_tensor.dtype.to_string(), |ty| ty.to_string())
        );
        if let Some(reason) = stream_difference(&mut *stream, &what, sides.out_reader, t, bufs)? {
            report.fail(mismatch(reason));
        }
        summary.tensors_compared += 1;
        summary.dequantized_compared += usize::from(gguf_tensor.ggml_type().is_some());
        summary.cast_compared +=
            usize::from(gguf_tensor.ggml_type().is_none() && gguf_tensor.dtype != t.dtype);
    }
    let ours: std::collections::HashSet<&str> = names.iter().copied().collect();
    let mut theirs: Vec<&str> = by_name.keys().copied().collect();
    theirs.sort_unstable();
    for name in theirs {
        if !ours.contains(name) && !dropped.iter().any(|d| d == name) {
            report.fail(Failure::AgainstMissing {
                tensor: name.to_string(),
                side: "the source".into(),
            });
        }
    }
    Ok(())
}
