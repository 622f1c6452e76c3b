//! `--against SRC` on an output that `convert --quantize` wrote with
//! scales: each quantized weight is quantized again from the source, by
//! the planner's own [`Quantizer`] and the executor's own streams, and its
//! codes, its scale and its companion tensors (`comfy_quant`, the
//! `scaled_fp8` marker) must be byte-identical to what that gives; the
//! error figures of the codes make the quality report.
//!
//! The scheme is read off the output (its tensor names, shapes and
//! `config.json`), not taken from its manifest: the source and the
//! output's own structure are the evidence. Only the working dtype (the
//! dtype a weight would have been written in without `--quantize`) comes
//! from the options the manifest records, and a wrong one can only make a
//! comparison fail.

use std::collections::HashMap;

use crate::cast::quantize::QualityReport;
use crate::format::{Checkpoint, Dtype, Tensor};
use crate::plan::quantize::{QuantizeScheme, DEFAULT_BLOCK};
use crate::plan::quantizer::{Quantized, Quantizer};
use crate::plan::{PlannedTensor, TensorInput};
use crate::quant::{QuantFormat, Quantization, Scheme};

/// What the output's quantized weights should hold, by output name.
pub(super) struct Requantized {
    pub scheme: QuantizeScheme,
    pub expected: HashMap<String, PlannedTensor>,
    /// Output weights reshard cannot recompute, and why.
    pub unknown: Vec<(String, String)>,
    pub quality: QualityReport,
}

impl Requantized {
    /// The expected tensors of `out`'s quantized weights, from `source`;
    /// `planned` is the dtype a source tensor would have been written in
    /// without `--quantize`. `None` when `out` holds no quantized weights.
    pub fn of(
        out: &Checkpoint,
        quant: &Quantization,
        source: &Checkpoint,
        planned: &dyn Fn(&Tensor) -> Dtype,
    ) -> Option<Requantized> {
        let scheme = scheme_of(out, quant)?;
        let block = (scheme == QuantizeScheme::Fp8Block).then(|| block_of(quant));
        let mut quantizer = Quantizer::new(Some(scheme), &[], &[], block).ok()??;
        let by_name: HashMap<&str, usize> = source
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let mut r = Requantized {
            scheme,
            expected: HashMap::new(),
            unknown: Vec::new(),
            quality: QualityReport::default(),
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

/// The `--quantize` scheme whose layout `out` has, if reshard writes it.
fn scheme_of(out: &Checkpoint, quant: &Quantization) -> Option<QuantizeScheme> {
    let has = |suffix: &str| out.tensors.iter().any(|t| t.name.ends_with(suffix));
    match quant.format {
        QuantFormat::ScaledFp8 if has(".comfy_quant") => Some(QuantizeScheme::Fp8Scaled),
        QuantFormat::ScaledFp8 if has(".scale_weight") => Some(QuantizeScheme::Fp8ScaledLegacy),
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
