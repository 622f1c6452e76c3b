//! Planning a GGUF source: what each GGUF tensor becomes in safetensors.
//!
//! Every tensor keeps its GGUF name unless the file is an LLM of a family
//! [`super::gguf`] knows, whose tensors get their Hugging Face names (and
//! whose q/k rows llama.cpp interleaved are put back). A diffusion model
//! keeps its names, and `comfy.gguf.orig_shape.NAME` (ComfyUI-GGUF's record
//! of a shape it flattened to quantize) restores the tensor's shape.
//! Quantized tensors need `--dtype` (their values are dequantized and
//! rounded to it); plain F32/F16/BF16 tensors are copied or cast like any
//! other. Each output tensor's GGUF name and type go into the record, and
//! into every shard's `__metadata__` as [`DEQUANTIZED_FROM_KEY`].

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::gguf::{hf_name, permuted_heads, skip_reason, Family};
use super::input::TensorInput;
use super::PlanError;
use crate::cast;
use crate::cast::gguf::ggml_type_of;
use crate::format::gguf::ggml::GgmlType;
use crate::format::gguf::value::{Array, Value};
use crate::format::gguf::{GgufModel, GgufTensor, Metadata};
use crate::format::{Checkpoint, Dtype, Format};

/// The `__metadata__` key holding, as a JSON object, the GGML type each
/// output tensor was dequantized (or copied) from.
pub const DEQUANTIZED_FROM_KEY: &str = "reshard.gguf.dequantized_from";

/// The `__metadata__` key naming the GGUF file the shards came from.
pub const SOURCE_KEY: &str = "reshard.gguf.source";

/// The manifest's record of a GGUF source (provenance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GgufRecord {
    /// The first (or only) file's name.
    pub file: String,
    /// `general.architecture`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// True when tensors were given Hugging Face names.
    pub hf_names: bool,
    pub tensors: Vec<GgufTensorRecord>,
    /// GGUF tensors not written (llama.cpp's own, which transformers has no
    /// place for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// One output tensor and the GGUF tensor it was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GgufTensorRecord {
    pub tensor: String,
    /// Its GGUF name (left out when the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gguf_name: Option<String>,
    /// The GGML type it was dequantized (or copied) from.
    pub from: GgmlType,
    /// Heads whose rows were put back in Hugging Face order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unpermuted_heads: Option<u64>,
}

/// What one GGUF tensor becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufRole {
    pub name: String,
    pub shape: Vec<u64>,
    pub input: TensorInput,
    /// The output dtype.
    pub dtype: Dtype,
}

/// Every tensor's role (`None`: not written) and the record.
pub struct GgufPlan {
    pub roles: Vec<Option<GgufRole>>,
    pub record: GgufRecord,
}

/// How an LLM's tensors are named in Hugging Face terms: the output name and
/// the heads to unpermute of a GGUF tensor, `Ok(None)` to leave it out.
pub trait Naming {
    fn name(&self, gguf_name: &str) -> Result<Option<(String, Option<u64>)>, PlanError>;
}

impl GgufPlan {
    /// Plans `ck` (a [`Format::Gguf`] checkpoint read from `model`).
    /// `dtype` is `--dtype`, `keep_names` `--keep-gguf-names`; `keep` tells whether `--keep-dtype` keeps a
    /// (GGUF) name.
    pub fn new(
        ck: &Checkpoint,
        model: &GgufModel,
        dtype: Option<Dtype>,
        keep_names: bool,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<GgufPlan, PlanError> {
        debug_assert_eq!(ck.format, Format::Gguf);
        let naming = match keep_names {
            true => None,
            false => naming(&model.metadata, &model.tensors)?,
        };
        let file = ck.files.first().map(|f| f.name()).unwrap_or_default();
        let mut record = GgufRecord {
            file: file.clone(),
            architecture: model
                .metadata
                .get_str("general.architecture")
                .map(str::to_string),
            hf_names: naming.is_some(),
            tensors: Vec::with_capacity(ck.tensors.len()),
            skipped: Vec::new(),
        };
        let mut roles = Vec::with_capacity(ck.tensors.len());
        for (i, t) in ck.tensors.iter().enumerate() {
            let named = match &naming {
                Some(n) => n.name(&t.name)?,
                None => Some((t.name.clone(), None)),
            };
            let Some((name, heads)) = named else {
                record.skipped.push(t.name.clone());
                roles.push(None);
                continue;
            };
            let from = ggml_type_of(t).unwrap_or(GgmlType::F32);
            let quantized = t.ggml_type().is_some();
            if quantized && !crate::cast::gguf::supports(from) {
                return Err(PlanError::GgufUnsupported {
                    file: ck.file_of(t).name(),
                    tensor: t.name.clone(),
                    ty: from,
                });
            }
            // --keep-dtype may name the tensor as it is written or as the
            // GGUF has it.
            let kept = keep(&name) || keep(&t.name);
            let out = match dtype {
                _ if quantized && kept => {
                    return Err(PlanError::KeepQuantized {
                        tensor: t.name.clone(),
                    })
                }
                Some(to) if quantized => to,
                None if quantized => {
                    return Err(PlanError::GgufNeedsDtype {
                        file: ck.file_of(t).name(),
                        tensor: t.name.clone(),
                        ty: from,
                    })
                }
                Some(to) if !kept => cast::target_for(t.dtype, to)?.unwrap_or(t.dtype),
                _ => t.dtype,
            };
            let shape = orig_shape(&model.metadata, &t.name, t.numel())
                .map_err(|reason| PlanError::GgufShape {
                    file: file.clone(),
                    tensor: t.name.clone(),
                    reason,
                })?
                .unwrap_or_else(|| t.shape.clone());
            let input = if quantized || heads.is_some() {
                TensorInput::Gguf {
                    tensor: i,
                    unpermute_heads: heads,
                }
            } else {
                TensorInput::Source { tensor: i }
            };
            record.tensors.push(GgufTensorRecord {
                tensor: name.clone(),
                gguf_name: (name != t.name).then(|| t.name.clone()),
                from,
                unpermuted_heads: heads,
            });
            roles.push(Some(GgufRole {
                name,
                shape,
                input,
                dtype: out,
            }));
        }
        Ok(GgufPlan { roles, record })
    }

    /// The `__metadata__` entries every shard gets: the source file and each
    /// tensor's GGML type.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let from: BTreeMap<&str, String> = self
            .record
            .tensors
            .iter()
            .map(|t| (t.tensor.as_str(), t.from.to_string()))
            .collect();
        BTreeMap::from([
            (SOURCE_KEY.to_string(), self.record.file.clone()),
            (
                DEQUANTIZED_FROM_KEY.to_string(),
                serde_json::to_string(&from).unwrap_or_default(),
            ),
        ])
    }
}

/// The shape `comfy.gguf.orig_shape.NAME` gives `name` (torch order), if
/// the key is there; an error when it is not a list of dimensions holding
/// exactly the tensor's `numel` elements.
fn orig_shape(md: &Metadata, name: &str, numel: u64) -> Result<Option<Vec<u64>>, String> {
    let key = format!("comfy.gguf.orig_shape.{name}");
    let Some(value) = md.get(&key) else {
        return Ok(None);
    };
    let dims: Option<Vec<u64>> = match value {
        Value::Array(a) => match a {
            Array::I32(v) => v.iter().map(|&d| u64::try_from(d).ok()).collect(),
            Array::I64(v) => v.iter().map(|&d| u64::try_from(d).ok()).collect(),
            Array::U32(v) => Some(v.iter().map(|&d| u64::from(d)).collect()),
            Array::U64(v) => Some(v.clone()),
            _ => None,
        },
        _ => None,
    };
    let Some(dims) = dims else {
        return Err(format!(
            "{key} is {}, not a list of dimensions",
            value.type_name()
        ));
    };
    if dims.len() > crate::format::gguf::MAX_DIMS
        || dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) != Some(numel)
    {
        return Err(format!(
            "{key} is {dims:?}, which does not hold the tensor's {numel} elements"
        ));
    }
    Ok(Some(dims))
}

/// The Hugging Face naming of an LLM GGUF of a family [`super::gguf`]
/// knows, `None` for any other (its names are kept).
fn naming<'a>(
    md: &'a Metadata,
    tensors: &'a [GgufTensor],
) -> Result<Option<Box<dyn Naming + 'a>>, PlanError> {
    Ok(Family::of(md).map(|family| {
        Box::new(HfNaming {
            family,
            md,
            tensors: tensors.iter().map(|t| (t.name.as_str(), t)).collect(),
        }) as Box<dyn Naming>
    }))
}

/// transformers' names for a llama.cpp LLM.
struct HfNaming<'a> {
    family: Family,
    md: &'a Metadata,
    tensors: HashMap<&'a str, &'a GgufTensor>,
}

impl Naming for HfNaming<'_> {
    fn name(&self, gguf_name: &str) -> Result<Option<(String, Option<u64>)>, PlanError> {
        if skip_reason(self.family, gguf_name).is_some() {
            return Ok(None);
        }
        let Some(hf) = hf_name(self.family, gguf_name) else {
            return Err(PlanError::GgufUnknownTensor {
                tensor: gguf_name.to_string(),
                architecture: self.family.architecture(),
            });
        };
        let heads = match self.tensors.get(gguf_name) {
            Some(t) => permuted_heads(self.family, self.md, t)?,
            None => None,
        };
        Ok(Some((hf, heads)))
    }
}
