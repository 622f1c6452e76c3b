//! `--against SRC` on an output that `convert --quantize` wrote with
//! scales: each quantized weight is quantized again from the source, by
//! the planner's own [`Quantizer`] and the executor's own streams, and its
//! codes, its scale and its companion tensors (`comfy_quant`, the
//! `scaled_fp8` marker) must be byte-identical to what that gives; the
//! error figures of the codes make the quality report.
//!
//! The scheme, `--keep`, `--quantize-only` and `--block` are the ones the
//! manifest records, so the source is quantized again as convert
//! quantized it; without a manifest the scheme is read off the output's
//! scale names (legacy `scale_weight` first: a stray `comfy_quant` passed
//! through from a source does not make a legacy output `fp8-scaled`) and
//! the defaults apply. A wrong option can only make a comparison fail:
//! the codes, scales and companions are compared byte for byte. Every
//! companion the quantizer writes must be in the output.

use std::collections::HashMap;

use super::report::Failure;
use crate::cast::quantize::QualityReport;
use crate::format::{Checkpoint, Dtype, Tensor};
use crate::plan::quantize::{QuantizeScheme, DEFAULT_BLOCK};
use crate::plan::quantizer::{Quantized, Quantizer};
use crate::plan::{PlanOptions, PlannedTensor, TensorInput};
use crate::quant::{QuantFormat, Quantization, Scheme};

/// What the output's quantized weights should hold, by output name.
pub(super) struct Requantized {
    pub scheme: QuantizeScheme,
    pub expected: HashMap<String, PlannedTensor>,
    /// Output weights reshard cannot recompute, and why.
    pub unknown: Vec<(String, String)>,
    pub quality: QualityReport,
    /// What the output lacks or holds otherwise than the plan of the
    /// same options writes: companions, `quantization_config`,
    /// `_quantization_metadata`.
    pub layout: Vec<Failure>,
}

impl Requantized {
    /// The expected tensors of `out`'s quantized weights, from `source`,
    /// under the manifest's `options` (if any); `planned` is the dtype a
    /// source tensor would have been written in without `--quantize`.
    /// `None` when `out` holds no quantized weights.
    pub fn of(
        out: &Checkpoint,
        quant: &Quantization,
        source: &Checkpoint,
        options: Option<&PlanOptions>,
        planned: &dyn Fn(&Tensor) -> Dtype,
    ) -> Option<Requantized> {
        let recorded = options
            .and_then(|o| o.quantize)
            .filter(|s| s.recipe(DEFAULT_BLOCK).is_some());
        let scheme = recorded.or_else(|| scheme_of(out, quant))?;
        let (keep, only, block) = match (recorded, options) {
            (Some(_), Some(o)) => (
                o.quantize_keep.as_slice(),
                o.quantize_only.as_slice(),
                o.quantize_block,
            ),
            _ => (
                &[][..],
                &[][..],
                (scheme == QuantizeScheme::Fp8Block).then(|| block_of(quant)),
            ),
        };
        let mut quantizer = Quantizer::new(Some(scheme), keep, only, block).ok()??;
        let by_name: HashMap<&str, usize> = source
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let mut plan_options = options.cloned().unwrap_or_default();
        plan_options.quantize = Some(scheme);
        if recorded.is_none() {
            plan_options.quantize_block = block;
        }
        let mut r = Requantized {
            scheme,
            expected: HashMap::new(),
            unknown: Vec::new(),
            quality: QualityReport::default(),
            layout: layout_failures(out, quant, source, &plan_options),
        };
        for w in quant.weights.iter().filter(|w| w.scale.is_some()) {
            let codes = &out.tensors[w.weight];
            let Some(&i) = by_name.get(codes.name.as_str()) else {
                r.unknown
                    .push((codes.name.clone(), "no source tensor of this name".into()));
                continue;
            };
            let t = &source.tensors[i];
            match quantizer.quantize(i, t, planned(t)) {
                Quantized::Scaled(tensors) => {
                    for p in tensors {
                        r.expected.insert(p.name.clone(), p);
                    }
                }
                Quantized::As(_) => r.unknown.push((
                    codes.name.clone(),
                    format!(
                        "quantized, but reshard's {} rules keep the source's {} {:?}",
                        scheme.name(),
                        t.dtype,
                        t.shape
                    ),
                )),
            }
        }
        Some(r)
    }

    /// True when `planned` is the codes of a weight (whose error figures
    /// count in the report).
    pub fn is_codes(planned: &PlannedTensor) -> bool {
        matches!(
            planned.input,
            TensorInput::Quantized {
                part: crate::cast::quantize::Part::Codes,
                ..
            }
        )
    }
}

/// How `out` differs from what convert writes for `source` under
/// `options` beyond the tensors' bytes: a companion (scale, `comfy_quant`,
/// `scaled_fp8` marker) it lacks, a `quantization_config` or a
/// `_quantization_metadata` other than the plan's.
fn layout_failures(
    out: &Checkpoint,
    quant: &Quantization,
    source: &Checkpoint,
    options: &PlanOptions,
) -> Vec<Failure> {
    let scheme = options.quantize.map_or("", |s| s.name());
    let plan = match crate::write::format::plan(source, options) {
        Ok(plan) => plan,
        Err(e) => {
            return vec![Failure::FileChanged {
                file: source.dir.display().to_string(),
                reason: format!("cannot be planned with --quantize {scheme} again: {e}"),
            }]
        }
    };
    let mut failures = Vec::new();
    let ours: std::collections::HashSet<&str> =
        out.tensors.iter().map(|t| t.name.as_str()).collect();
    for t in plan.tensors().filter(|t| !t.input.is_source()) {
        if !ours.contains(t.name.as_str()) {
            failures.push(Failure::AgainstMissing {
                tensor: t.name.clone(),
                side: format!("the source quantized again (--quantize {scheme} writes it)"),
            });
        }
    }
    let config = plan.quantized.as_ref().and_then(|r| r.config());
    let has_config = out.dir.join("config.json").is_file();
    if has_config && config != quant.config {
        failures.push(Failure::FileChanged {
            file: "config.json".into(),
            reason: format!(
                "its quantization_config is not the one --quantize {scheme} writes for the source"
            ),
        });
    }
    let key = crate::plan::quantize::COMFY_LAYERS_KEY;
    let parsed = |v: Option<&String>| v.map(|v| serde_json::from_str::<serde_json::Value>(v).ok());
    if parsed(plan.metadata.get(key)) != parsed(out.metadata.get(key)) {
        failures.push(Failure::FileChanged {
            file: out.files.first().map(|f| f.name()).unwrap_or_default(),
            reason: format!(
                "its __metadata__ {key} is not the one --quantize {scheme} writes for the source"
            ),
        });
    }
    failures
}

/// The `--quantize` scheme whose layout `out` has, if reshard writes it.
fn scheme_of(out: &Checkpoint, quant: &Quantization) -> Option<QuantizeScheme> {
    let has = |suffix: &str| out.tensors.iter().any(|t| t.name.ends_with(suffix));
    match quant.format {
        QuantFormat::ScaledFp8 if has(".scale_weight") => Some(QuantizeScheme::Fp8ScaledLegacy),
        QuantFormat::ScaledFp8 if has(".comfy_quant") => Some(QuantizeScheme::Fp8Scaled),
        // fp8-channel written without a config.json (a one-file source):
        // per-row scales, `[out, 1]`.
        QuantFormat::ScaledFp8 if quant.weights.iter().any(per_row) => {
            Some(QuantizeScheme::Fp8Channel)
        }
        QuantFormat::CompressedTensorsFp8 => Some(QuantizeScheme::Fp8Channel),
        QuantFormat::Fp8 => Some(QuantizeScheme::Fp8Block),
        _ => None,
    }
}

/// A weight whose scale is one per row of a multi-row weight.
fn per_row(w: &crate::quant::QuantWeight) -> bool {
    matches!(
        w.scheme,
        Some(Scheme::Blocks {
            rows,
            block_rows: 1,
            ..
        }) if rows > 1
    )
}

/// `weight_block_size` of an `fp8-block` output's config, else the block
/// its first full-size weight shows, else the default.
fn block_of(quant: &Quantization) -> [u64; 2] {
    let from_config = quant
        .config
        .as_ref()
        .and_then(|c| c.get("weight_block_size"))
        .and_then(|b| b.as_array())
        .and_then(|b| match b.as_slice() {
            [r, c] => Some([r.as_u64()?, c.as_u64()?]),
            _ => None,
        });
    from_config
        .or_else(|| {
            quant.weights.iter().find_map(|w| match w.scheme {
                Some(Scheme::Blocks {
                    block_rows,
                    block_cols,
                    ..
                }) => Some([block_rows, block_cols]),
                _ => None,
            })
        })
        .unwrap_or(DEFAULT_BLOCK)
}
