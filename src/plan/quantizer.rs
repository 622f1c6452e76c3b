//! `--quantize` applied to one plan: which tensors [`super::quantize`]'s
//! rules quantize, the planned tensors (codes, scale, companions) that
//! take a quantized weight's place, and the record of what was done.
//! `validate --against` runs the same quantizer to recompute an output.

use super::globs::glob_set;
use super::input::TensorInput;
use super::quantize::{
    decide, KeptBecause, KeptTensor, QuantizeRecord, QuantizeScheme, COMFY_LAYERS_KEY,
    DEFAULT_BLOCK,
};
use super::types::PlannedTensor;
use super::PlanError;
use crate::cast::quantize::{working_dtype, Part};
use crate::format::{Checkpoint, Dtype, Tensor};

/// The `--quantize` decisions of one plan, and their record.
pub struct Quantizer {
    keep: globset::GlobSet,
    only: Option<globset::GlobSet>,
    block: [u64; 2],
    pub record: QuantizeRecord,
}

/// How one source tensor is written under `--quantize`.
pub enum Quantized {
    /// Not quantized, or plain FP8: written in this dtype, as a cast.
    As(Dtype),
    /// Scaled FP8: these tensors (codes, scale, and any constant the
    /// layout needs) take its place.
    Scaled(Vec<PlannedTensor>),
}

/// The bytes of `<layer>.comfy_quant`: Python's `json.dumps` of the layer
/// config, as ComfyUI writes them.
pub const COMFY_QUANT: &[u8] = br#"{"format": "float8_e4m3fn"}"#;

/// The name of the legacy layout's marker tensor (after the model prefix).
pub const SCALED_FP8_MARKER: &str = "scaled_fp8";

/// Name endings of the tensors quantized layouts add beside a weight: a
/// source holding one beside no quantized weight carries a stray companion
/// that loaders would read as this output's.
const COMPANION_SUFFIXES: [&str; 4] = [
    ".comfy_quant",
    ".scale_weight",
    ".weight_scale",
    ".weight_scale_inv",
];

impl Quantizer {
    /// `None` without `--quantize` (`scheme`); `keep` and `only` are the
    /// globs of `--keep` and `--quantize-only`, `block` is `--block`.
    pub fn new(
        scheme: Option<QuantizeScheme>,
        keep: &[String],
        only: &[String],
        block: Option<[u64; 2]>,
    ) -> Result<Option<Quantizer>, PlanError> {
        let Some(scheme) = scheme else {
            return Ok(None);
        };
        if block.is_some() && scheme != QuantizeScheme::Fp8Block {
            return Err(PlanError::BlockWithoutBlockScheme {
                scheme: scheme.name(),
            });
        }
        let block = block.unwrap_or(DEFAULT_BLOCK);
        if block.contains(&0) {
            return Err(PlanError::ZeroBlock);
        }
        let only = match only.is_empty() {
            true => None,
            false => Some(globs(only)?),
        };
        Ok(Some(Quantizer {
            keep: globs(keep)?,
            only,
            block,
            record: QuantizeRecord {
                scheme,
                dtype: scheme.dtype(),
                block: (scheme == QuantizeScheme::Fp8Block).then_some(block),
                layers: Vec::new(),
                tensors: 0,
                bytes_before: 0,
                bytes_after: 0,
                kept: Vec::new(),
                not_linear: 0,
                unquantized_linear: Vec::new(),
            },
        }))
    }

    /// Refuses a source `--quantize` cannot start from: one already
    /// quantized (`quantized` names how, from the dequantize stage's
    /// detection, which found weights paired with scales), one that holds
    /// a quantization companion beside no quantized weight (a stray scale,
    /// `comfy_quant` or `scaled_fp8` marker), and, for the scaled schemes,
    /// an FP8 weight without a scale (compressed-tensors and FineGrainedFP8
    /// expect a scale for it; ComfyUI would take it for one of its own).
    pub fn check_source(
        &self,
        ck: &Checkpoint,
        quantized: Option<String>,
    ) -> Result<(), PlanError> {
        let scheme = self.record.scheme.name();
        if let Some(what) = quantized {
            return Err(PlanError::QuantizeQuantized { scheme, what });
        }
        let scaled = self.record.scheme.recipe(self.block).is_some();
        for t in &ck.tensors {
            let companion = COMPANION_SUFFIXES.iter().any(|s| t.name.ends_with(s))
                || t.name == SCALED_FP8_MARKER
                || t.name.ends_with(&format!(".{SCALED_FP8_MARKER}"));
            let fp8 = matches!(t.dtype, Dtype::F8_E4M3 | Dtype::F8_E5M2)
                && t.shape.len() == 2
                && t.name.ends_with(".weight");
            if companion || (scaled && fp8) {
                let file = ck.file_of(t).name();
                let tensor = t.name.clone();
                return Err(match companion {
                    true => PlanError::QuantizeStrayCompanion {
                        scheme,
                        file,
                        tensor,
                    },
                    false => PlanError::QuantizeUnscaledFp8 {
                        scheme,
                        file,
                        tensor,
                        dtype: t.dtype,
                    },
                });
            }
        }
        Ok(())
    }

    /// How source tensor `index` (`t`) is written: quantized, or in
    /// `planned` (its own dtype or `--dtype`'s). Records which. `prefix`
    /// is the model prefix the legacy marker is named under.
    pub fn quantize(&mut self, index: usize, t: &Tensor, planned: Dtype) -> Quantized {
        let keep = |n: &str| self.keep.is_match(n);
        let only = self.only.as_ref().map(|g| move |n: &str| g.is_match(n));
        let only_ref = only.as_ref().map(|f| f as &dyn Fn(&str) -> bool);
        let decision = decide(t, &keep, only_ref).and_then(|()| self.tileable(t));
        let r = &mut self.record;
        match decision {
            Ok(()) => {}
            Err(KeptBecause::NotALinearWeight) => {
                r.not_linear += 1;
                if is_linear_shaped(t) {
                    r.unquantized_linear.push(stem_of(&t.name));
                }
                return Quantized::As(planned);
            }
            Err(because) => {
                if is_linear_shaped(t) {
                    r.unquantized_linear.push(stem_of(&t.name));
                }
                r.kept.push(KeptTensor {
                    tensor: t.name.clone(),
                    because,
                });
                return Quantized::As(planned);
            }
        }
        r.tensors += 1;
        r.bytes_before += t.len;
        let stem = stem_of(&t.name);
        let Some(recipe) = r.scheme.recipe(self.block) else {
            // One byte an element.
            r.bytes_after += t.numel();
            r.layers.push(stem);
            return Quantized::As(r.dtype);
        };
        let work = working_dtype(planned);
        let (rows, cols) = (t.shape[0], t.shape[1]);
        let input = |part| TensorInput::Quantized {
            tensor: index,
            recipe,
            work,
            part,
        };
        let codes = derived(
            &t.name,
            t.dtype,
            input(Part::Codes),
            Dtype::F8_E4M3,
            t.shape.clone(),
            None,
        );
        let scale_dtype = recipe.scale_dtype(work);
        let scale = derived(
            &format!("{stem}.{}", r.scheme.scale_suffix()),
            t.dtype,
            input(Part::Scales),
            scale_dtype,
            recipe.scale_shape(rows, cols),
            Some(&t.name),
        );
        let mut tensors = vec![codes, scale];
        match r.scheme {
            QuantizeScheme::Fp8Scaled => tensors.push(derived(
                &format!("{stem}.comfy_quant"),
                Dtype::U8,
                TensorInput::Constant {
                    of: index,
                    bytes: COMFY_QUANT.to_vec(),
                },
                Dtype::U8,
                vec![COMFY_QUANT.len() as u64],
                Some(&t.name),
            )),
            QuantizeScheme::Fp8ScaledLegacy if r.layers.is_empty() => {
                let prefix = model_prefix(&t.name);
                tensors.push(derived(
                    &format!("{prefix}{SCALED_FP8_MARKER}"),
                    Dtype::F8_E4M3,
                    TensorInput::Constant {
                        of: index,
                        bytes: Vec::new(),
                    },
                    Dtype::F8_E4M3,
                    vec![0],
                    Some(&t.name),
                ))
            }
            _ => {}
        }
        r.bytes_after += tensors.iter().map(|p| p.len).sum::<u64>();
        r.layers.push(stem);
        Quantized::Scaled(tensors)
    }

    /// `fp8-block`: whether the weight's block grid is one its loaders
    /// read back. transformers' `Fp8Dequantize` (5.24) derives the block
    /// from the scale grid (`rows // scale_rows`), so a dimension that is
    /// neither a multiple of the block nor within one block is misread
    /// (`[172, 64]` in 128-row blocks reads as two 86-row blocks), and its
    /// quantizer leaves such weights unquantized too.
    fn tileable(&self, t: &Tensor) -> Result<(), KeptBecause> {
        if self.record.scheme != QuantizeScheme::Fp8Block || t.shape.len() != 2 {
            return Ok(());
        }
        let fits = |dim: u64, block: u64| dim <= block || dim.is_multiple_of(block);
        if fits(t.shape[0], self.block[0]) && fits(t.shape[1], self.block[1]) {
            Ok(())
        } else {
            Err(KeptBecause::NotTileable)
        }
    }

    /// The `__metadata__` entries the layout needs: ComfyUI's
    /// `_quantization_metadata` for `fp8-scaled`.
    pub fn metadata(&self) -> Option<(String, String)> {
        if self.record.scheme != QuantizeScheme::Fp8Scaled || self.record.layers.is_empty() {
            return None;
        }
        let layers: serde_json::Map<String, serde_json::Value> = self
            .record
            .layers
            .iter()
            .map(|l| (l.clone(), serde_json::json!({"format": "float8_e4m3fn"})))
            .collect();
        let value = serde_json::json!({"format_version": "1.0", "layers": layers});
        Some((COMFY_LAYERS_KEY.into(), value.to_string()))
    }
}

/// A weight's layer name: its name before `.weight`.
fn stem_of(name: &str) -> String {
    name.strip_suffix(".weight").unwrap_or(name).to_string()
}

/// A 2-D floating-point `.weight` that is not an embedding table: what
/// a loader builds a Linear for.
fn is_linear_shaped(t: &Tensor) -> bool {
    let float = matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64);
    let embedding = t.name.split('.').any(|p| {
        (p.contains("embed") && !p.starts_with("embedder"))
            || matches!(p, "wte" | "wpe" | "token_embd")
    });
    float && t.shape.len() == 2 && t.name.ends_with(".weight") && !embedding
}

/// The wrapper ComfyUI names a one-file checkpoint's denoiser under
/// (`model.diffusion_model.`), or nothing.
fn model_prefix(name: &str) -> &'static str {
    if name.starts_with("model.diffusion_model.") {
        "model.diffusion_model."
    } else {
        ""
    }
}

/// A planned tensor computed from a source tensor, laid out after `after`.
fn derived(
    name: &str,
    source_dtype: Dtype,
    input: TensorInput,
    dtype: Dtype,
    shape: Vec<u64>,
    after: Option<&str>,
) -> PlannedTensor {
    let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let len = numel.and_then(|n| dtype.byte_len(n)).unwrap_or(u64::MAX);
    PlannedTensor {
        name: name.to_string(),
        input,
        source_dtype,
        dtype,
        shape,
        len,
        offset: 0,
        after: after.map(str::to_string),
    }
}

fn globs(globs: &[String]) -> Result<globset::GlobSet, PlanError> {
    glob_set(globs).map_err(|(glob, source)| PlanError::BadQuantizeGlob { glob, source })
}
