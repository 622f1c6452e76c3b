//! Quantized checkpoints: which scheme a checkpoint uses, which tensors are
//! quantized weights, which scale belongs to which weight, and what is wrong.
//!
//! This module reads `config.json` (`quantization_config`, or
//! `compression_config`) and `hf_quant_config.json` (NVIDIA ModelOpt) from
//! the checkpoint's folder, both small regular files of bounded size, and
//! otherwise looks only at tensor names, dtypes and shapes. It decides
//! nothing about the output and does no arithmetic (that is
//! [`crate::cast::dequant`]). Anything it cannot tell apart for sure (two
//! schemes, a config that disagrees with the names) is refused rather than
//! guessed.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use super::error::QuantError;
use super::Scheme;
use crate::format::{Checkpoint, Dtype, Finding, FormatError, Tensor};

/// The quantization schemes reshard dequantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuantFormat {
    /// `quant_method: "fp8"` (DeepSeek, Kimi, Qwen3-FP8): `weight_scale_inv`
    /// per `weight_block_size` block.
    Fp8,
    /// compressed-tensors `float-quantized` / `naive-quantized` FP8.
    CompressedTensorsFp8,
    /// NVIDIA ModelOpt FP8 (`hf_quant_config.json`, `quant_algo: FP8`).
    ModeloptFp8,
    /// `quant_method: "mxfp4"` (gpt-oss): `*_blocks` and `*_scales`.
    Mxfp4,
    /// Single files with F8 weights and a `scale_weight` (ComfyUI) or
    /// `weight_scale` per weight, no config.
    ScaledFp8,
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuantFormat::Fp8 => "fp8 (block scales, weight_scale_inv)",
            QuantFormat::CompressedTensorsFp8 => "compressed-tensors fp8",
            QuantFormat::ModeloptFp8 => "modelopt fp8",
            QuantFormat::Mxfp4 => "mxfp4",
            QuantFormat::ScaledFp8 => "scaled fp8",
        })
    }
}

/// One quantized weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantWeight {
    /// Index of the codes in [`Checkpoint::tensors`].
    pub weight: usize,
    /// Index of its scale, `None` when there is none.
    pub scale: Option<usize>,
    /// Name and shape of the dense tensor it becomes.
    pub name: String,
    pub shape: Vec<u64>,
    /// `None` when the scale is missing or its shape does not fit.
    pub scheme: Option<Scheme>,
}

/// What a quantized checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quantization {
    pub format: QuantFormat,
    /// The source's quantization config as it was read, for provenance.
    pub config: Option<Value>,
    /// The file it came from (`config.json`, `hf_quant_config.json`).
    pub config_file: Option<String>,
    pub weights: Vec<QuantWeight>,
    /// Tensors that serve only the quantization (activation and KV scales,
    /// zero points, ComfyUI's `scaled_fp8` marker): not written when
    /// dequantizing.
    pub extras: Vec<usize>,
    /// Scale tensors whose weight is missing.
    pub orphan_scales: Vec<usize>,
    pub findings: Vec<Finding>,
}

impl Quantization {
    /// Weights with a usable scale.
    pub fn scaled(&self) -> impl Iterator<Item = (&QuantWeight, usize, &Scheme)> {
        self.weights
            .iter()
            .filter_map(|w| Some((w, w.scale?, w.scheme.as_ref()?)))
    }
}

/// Largest quantization config file read (they are a few KiB).
const MAX_QUANT_CONFIG: u64 = crate::format::config::MAX_CONFIG;

/// Tensor-name endings that serve only the quantization.
const EXTRA_SUFFIXES: [&str; 7] = [
    ".comfy_quant",
    ".input_scale",
    ".k_scale",
    ".v_scale",
    ".weight_zero_point",
    ".input_zero_point",
    ".output_scale",
];

/// Detects the quantization of `ck`: `Ok(None)` for a checkpoint that is not
/// quantized with a scheme reshard dequantizes.
pub fn detect(ck: &Checkpoint) -> Result<Option<Quantization>, QuantError> {
    let config = read_json(&ck.dir.join("config.json"))?;
    let modelopt = read_json(&ck.dir.join("hf_quant_config.json"))?;
    let qc = config.as_ref().and_then(|c| {
        c.get("quantization_config")
            .or_else(|| c.get("compression_config"))
            .cloned()
    });
    let method = qc
        .as_ref()
        .and_then(|q| q.get("quant_method"))
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase);
    let modelopt_algo = modelopt
        .as_ref()
        .and_then(|m| m.get("quantization").unwrap_or(m).get("quant_algo"))
        .and_then(Value::as_str)
        .map(str::to_ascii_uppercase);
    let ambiguous = |reason: String| QuantError::Ambiguous {
        path: ck.dir.clone(),
        reason,
    };
    let names: HashMap<&str, usize> = ck
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let has_suffix = |s: &str| ck.tensors.iter().any(|t| t.name.ends_with(s));

    let (format, config, config_file) = match (method.as_deref(), modelopt_algo.as_deref()) {
        (Some(m), Some(_)) if m != "modelopt" => {
            return Err(ambiguous(format!(
                "config.json says quant_method {m:?} and hf_quant_config.json is a modelopt config"
            )))
        }
        (_, Some("FP8")) => (
            QuantFormat::ModeloptFp8,
            modelopt.clone(),
            "hf_quant_config.json",
        ),
        (_, Some(_)) => return Ok(None),
        (Some("fp8"), None) => (QuantFormat::Fp8, qc.clone(), "config.json"),
        (Some("compressed-tensors"), None) => {
            if !qc.as_ref().is_some_and(super::config::is_compressed_fp8) {
                return Ok(None);
            }
            (QuantFormat::CompressedTensorsFp8, qc.clone(), "config.json")
        }
        (Some("modelopt"), None) => {
            let algo = qc
                .as_ref()
                .and_then(|q| q.get("quant_algo"))
                .and_then(Value::as_str);
            if !algo.is_some_and(|a| a.eq_ignore_ascii_case("fp8")) {
                return Ok(None);
            }
            (QuantFormat::ModeloptFp8, qc.clone(), "config.json")
        }
        (Some("mxfp4"), None) => (QuantFormat::Mxfp4, qc.clone(), "config.json"),
        (Some(_), None) => return Ok(None),
        (None, None) => {
            let comfy = has_suffix(".scale_weight");
            let plain = has_suffix(".weight_scale");
            if has_suffix(".weight_scale_inv") {
                return Err(ambiguous(
                    "tensors named *.weight_scale_inv but config.json has no quantization_config to give their block size".into(),
                ));
            }
            if comfy && plain {
                return Err(ambiguous(
                    "both *.scale_weight and *.weight_scale tensors".into(),
                ));
            }
            if !(comfy || plain) {
                return Ok(None);
            }
            (QuantFormat::ScaledFp8, None, "")
        }
    };
    // The names must be those of the scheme the config names.
    let suffix = match format {
        QuantFormat::Fp8 => "weight_scale_inv",
        QuantFormat::ScaledFp8 if has_suffix(".scale_weight") => "scale_weight",
        QuantFormat::Mxfp4 => "_scales",
        _ => "weight_scale",
    };
    if format == QuantFormat::Fp8 && has_suffix(".weight_scale") {
        return Err(ambiguous(
            "quant_method \"fp8\" names weight_scale_inv scales, but there are *.weight_scale tensors".into(),
        ));
    }
    if format != QuantFormat::Fp8 && has_suffix(".weight_scale_inv") {
        return Err(ambiguous(format!(
            "{format} names weight_scale scales, but there are *.weight_scale_inv tensors"
        )));
    }
    let block = match format {
        QuantFormat::Fp8 => block_size(ck, qc.as_ref(), "weight_block_size")?,
        QuantFormat::CompressedTensorsFp8 => compressed_block(qc.as_ref()),
        _ => None,
    };
    let ignore = ignore_list(config.as_ref(), format);
    let mut q = Quantization {
        format,
        config,
        config_file: (!config_file.is_empty()).then(|| config_file.to_string()),
        weights: Vec::new(),
        extras: Vec::new(),
        orphan_scales: Vec::new(),
        findings: Vec::new(),
    };
    if format == QuantFormat::Mxfp4 {
        mxfp4_weights(ck, &names, &mut q);
    } else {
        fp8_weights(ck, &names, suffix, block, &ignore, &mut q);
    }
    Ok(Some(q))
}

/// Reads a small JSON file, `None` when it is not there.
fn read_json(path: &Path) -> Result<Option<Value>, QuantError> {
    let text = match crate::format::read::read_regular_string(path, MAX_QUANT_CONFIG) {
        Ok(t) => t,
        Err(FormatError::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    crate::format::config::parse_config(&text)
        .map(Some)
        .map_err(|e| QuantError::BadConfig {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

fn compressed_block(qc: Option<&Value>) -> Option<(u64, u64)> {
    let groups = qc?.get("config_groups")?.as_object()?;
    groups.values().find_map(|g| {
        let w = g.get("weights")?;
        if w.get("strategy").and_then(Value::as_str) != Some("block") {
            return None;
        }
        pair(w.get("block_structure")?)
    })
}

fn pair(v: &Value) -> Option<(u64, u64)> {
    let a = v.as_array()?;
    match a.as_slice() {
        [r, c] => Some((r.as_u64()?, c.as_u64()?)).filter(|&(r, c)| r > 0 && c > 0),
        _ => None,
    }
}

fn block_size(
    ck: &Checkpoint,
    qc: Option<&Value>,
    key: &str,
) -> Result<Option<(u64, u64)>, QuantError> {
    match qc.and_then(|q| q.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => pair(v).map(Some).ok_or_else(|| QuantError::BadConfig {
            path: ck.dir.join("config.json"),
            reason: format!("quantization_config.{key} is {v}, not two positive integers"),
        }),
    }
}

/// Module names compressed-tensors (and ModelOpt's `exclude_modules`) leave
/// dense. Exact names only; `re:` patterns are kept as written and never
/// match, so such a weight is reported if it is F8 without a scale.
fn ignore_list(qc: Option<&Value>, format: QuantFormat) -> Vec<String> {
    let key = match format {
        QuantFormat::CompressedTensorsFp8 => "ignore",
        QuantFormat::ModeloptFp8 => "exclude_modules",
        _ => return Vec::new(),
    };
    let list = qc.and_then(|q| q.get(key).or_else(|| q.get("quantization")?.get(key)));
    list.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn is_f8(t: &Tensor) -> bool {
    matches!(t.dtype, Dtype::F8_E4M3 | Dtype::F8_E5M2)
}

fn file_of(ck: &Checkpoint, i: usize) -> String {
    ck.file_of(&ck.tensors[i]).name()
}

/// Weight `i`, to be written as `name`, with the scale called
/// `scale_name` if there is one; a finding when there is not.
fn with_scale(
    ck: &Checkpoint,
    names: &HashMap<&str, usize>,
    i: usize,
    name: &str,
    scale_name: &str,
    q: &mut Quantization,
) -> QuantWeight {
    let t = &ck.tensors[i];
    let scale = names.get(scale_name).copied();
    if scale.is_none() {
        q.findings.push(Finding::QuantWeightWithoutScale {
            tensor: t.name.clone(),
            file: file_of(ck, i),
            scale: scale_name.to_string(),
        });
    }
    QuantWeight {
        weight: i,
        scale,
        name: name.to_string(),
        shape: t.shape.clone(),
        scheme: None,
    }
}

fn fp8_weights(
    ck: &Checkpoint,
    names: &HashMap<&str, usize>,
    suffix: &str,
    block: Option<(u64, u64)>,
    ignore: &[String],
    q: &mut Quantization,
) {
    let mut claimed = vec![false; ck.tensors.len()];
    for (i, t) in ck.tensors.iter().enumerate() {
        if !is_f8(t) || !t.name.ends_with(".weight") {
            continue;
        }
        let module = &t.name[..t.name.len() - ".weight".len()];
        let scale_name = format!("{module}.{suffix}");
        if !names.contains_key(scale_name.as_str()) && ignore.iter().any(|m| m == module) {
            continue;
        }
        let mut w = with_scale(ck, names, i, &t.name, &scale_name, q);
        if let Some(s) = w.scale {
            claimed[s] = true;
            let st = &ck.tensors[s];
            match fp8_scheme(&t.shape, &st.shape, block) {
                Ok(scheme) => w.scheme = Some(scheme),
                Err(expected) => q.findings.push(Finding::QuantScaleShape {
                    tensor: st.name.clone(),
                    file: file_of(ck, s),
                    shape: st.shape.clone(),
                    expected,
                }),
            }
        }
        q.weights.push(w);
    }
    let dotted = format!(".{suffix}");
    for (i, t) in ck.tensors.iter().enumerate() {
        let is_scale = t.name.ends_with(&dotted);
        if is_scale && !claimed[i] {
            q.orphan_scales.push(i);
            q.findings.push(Finding::QuantScaleWithoutWeight {
                tensor: t.name.clone(),
                file: file_of(ck, i),
            });
        } else if !is_scale
            && (EXTRA_SUFFIXES.iter().any(|s| t.name.ends_with(s)) || is_marker(&t.name))
        {
            q.extras.push(i);
        }
    }
}

/// ComfyUI's `scaled_fp8` marker, at the top or under a model prefix
/// (`model.diffusion_model.scaled_fp8`).
fn is_marker(name: &str) -> bool {
    name == "scaled_fp8" || name.ends_with(".scaled_fp8")
}

/// The scheme of an F8 weight of `shape` with a scale of `scale` shape, or
/// a description of the shapes that would have fitted.
fn fp8_scheme(shape: &[u64], scale: &[u64], block: Option<(u64, u64)>) -> Result<Scheme, String> {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = shape
        .iter()
        .rev()
        .skip(1)
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .unwrap_or(u64::MAX);
    let numel: u64 = scale.iter().product();
    let blocks = |block_rows, block_cols| Scheme::Blocks {
        rows,
        cols,
        block_rows,
        block_cols,
    };
    if numel == 1 {
        return Ok(blocks(rows.max(1), cols.max(1)));
    }
    if shape.len() == 2 && (scale == [rows, 1] || scale == [rows]) {
        return Ok(blocks(1, cols.max(1)));
    }
    if let (Some((br, bc)), 2) = (block, shape.len()) {
        let want = [rows.div_ceil(br), cols.div_ceil(bc)];
        if scale == want {
            return Ok(blocks(br, bc));
        }
        return Err(format!("{want:?} ({br}x{bc} blocks), [{rows}, 1] or [1]"));
    }
    Err(format!("[1] (per tensor) or [{rows}, 1] (per channel)"))
}

fn mxfp4_weights(ck: &Checkpoint, names: &HashMap<&str, usize>, q: &mut Quantization) {
    let mut claimed = vec![false; ck.tensors.len()];
    for (i, t) in ck.tensors.iter().enumerate() {
        let Some(stem) = t.name.strip_suffix("_blocks") else {
            continue;
        };
        let scale_name = format!("{stem}_scales");
        let mut w = with_scale(ck, names, i, stem, &scale_name, q);
        if let Some(s) = w.scale {
            claimed[s] = true;
            let st = &ck.tensors[s];
            match (t.dtype, t.shape.as_slice()) {
                (Dtype::U8, &[e, r, g, 16]) if st.shape == [e, r, g] => {
                    w.shape = vec![e, g.saturating_mul(32), r];
                    w.scheme = Some(Scheme::Mxfp4 {
                        experts: e,
                        rows: r,
                        groups: g,
                    });
                }
                (dtype, &[e, r, g, 16]) if st.shape == [e, r, g] => {
                    // The shapes fit: the dtype is what is wrong, say so.
                    q.findings.push(Finding::QuantCodesDtype {
                        tensor: t.name.clone(),
                        file: file_of(ck, i),
                        dtype: dtype.to_string(),
                        expected: "U8 (two FP4 codes a byte)".into(),
                    });
                }
                _ => {
                    let want = match t.shape.as_slice() {
                        [a, b, c, _] => {
                            format!("[{a}, {b}, {c}] for U8 blocks [{a}, {b}, {c}, 16]")
                        }
                        _ => "U8 blocks of shape [experts, rows, groups, 16]".into(),
                    };
                    q.findings.push(Finding::QuantScaleShape {
                        tensor: st.name.clone(),
                        file: file_of(ck, s),
                        shape: st.shape.clone(),
                        expected: want,
                    });
                }
            }
        }
        q.weights.push(w);
    }
    for (i, t) in ck.tensors.iter().enumerate() {
        if t.name.ends_with("_scales") && !claimed[i] {
            q.orphan_scales.push(i);
            q.findings.push(Finding::QuantScaleWithoutWeight {
                tensor: t.name.clone(),
                file: file_of(ck, i),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(rows: u64, cols: u64, br: u64, bc: u64) -> Scheme {
        Scheme::Blocks {
            rows,
            cols,
            block_rows: br,
            block_cols: bc,
        }
    }

    #[test]
    fn block_scales_with_partial_edges() {
        let s = fp8_scheme(&[300, 200], &[3, 2], Some((128, 128)));
        assert_eq!(s, Ok(blocks(300, 200, 128, 128)));
        assert!(fp8_scheme(&[300, 200], &[2, 2], Some((128, 128))).is_err());
    }

    #[test]
    fn per_tensor_and_per_channel_scales() {
        assert_eq!(fp8_scheme(&[4, 6], &[1], None), Ok(blocks(4, 6, 4, 6)));
        assert_eq!(fp8_scheme(&[4, 6], &[], None), Ok(blocks(4, 6, 4, 6)));
        assert_eq!(
            fp8_scheme(&[4, 6], &[1, 1], Some((2, 2))),
            Ok(blocks(4, 6, 4, 6))
        );
        assert_eq!(fp8_scheme(&[4, 6], &[4, 1], None), Ok(blocks(4, 6, 1, 6)));
        assert_eq!(fp8_scheme(&[2, 3, 4], &[1], None), Ok(blocks(6, 4, 6, 4)));
        let err = fp8_scheme(&[4, 6], &[6, 1], None).unwrap_err();
        assert!(err.contains("[4, 1]"), "{err}");
    }

    #[test]
    fn block_size_must_be_two_positive_integers() {
        assert_eq!(pair(&serde_json::json!([128, 64])), Some((128, 64)));
        assert_eq!(pair(&serde_json::json!([0, 64])), None);
        assert_eq!(pair(&serde_json::json!([1, 2, 3])), None);
    }
}
