//! What `reshard inspect` says about a GGUF file or split set: plain data
//! computed from a [`GgufModel`], printed by the CLI as text or JSON.
//!
//! Tokenizer arrays are summarized (`[string; 32000]`), never dumped.
//! Findings are what does not stop the file from being read: a missing
//! split member, a type reshard cannot dequantize, data placed where
//! llama.cpp would refuse it.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::cast::gguf::supports;
use crate::format::gguf::ggml::GgmlType;
use crate::format::gguf::split::{GgufModel, SplitSet};
use crate::names;

/// Everything `inspect` says about a GGUF model. Field names are stable.
#[derive(Debug, Clone, Serialize)]
pub struct GgufSummary {
    pub path: String,
    pub format: &'static str,
    pub version: u32,
    pub architecture: Option<String>,
    pub name: Option<String>,
    pub files: Vec<GgufFileSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitSet>,
    pub tensor_count: usize,
    pub parameter_count: u64,
    pub total_bytes: u64,
    /// By GGML type name (`Q4_K`, or `type 99` for an unknown id).
    pub types: BTreeMap<String, TypeStats>,
    pub largest_tensor: Option<super::NamedSize>,
    pub metadata: Vec<MetaLine>,
    pub findings: Vec<GgufFinding>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GgufFileSummary {
    pub name: String,
    pub path: String,
    pub size: u64,
    pub split_no: u64,
    pub tensors: usize,
    pub alignment: u64,
    pub data_start: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TypeStats {
    pub tensors: usize,
    pub parameters: u64,
    pub bytes: u64,
    pub dequantizable: bool,
}

/// One key/value pair, its value summarized.
#[derive(Debug, Clone, Serialize)]
pub struct MetaLine {
    pub key: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub value: String,
}

/// Something worth telling the user that does not stop the model being read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum GgufFinding {
    /// A member of the split set is not in the folder.
    MissingSplitMember { file: String },
    /// Tensors of a type reshard cannot dequantize (it can still copy them).
    NotDequantizable {
        ggml_type: String,
        tensors: usize,
        first: String,
    },
    /// A tensor's data is not where llama.cpp expects it (right after the
    /// one before, padded to the alignment): llama.cpp refuses the file.
    UnexpectedOffset {
        tensor: String,
        file: String,
        offset: u64,
        expected: u64,
    },
}

impl fmt::Display for GgufFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufFinding::MissingSplitMember { file } => write!(
                f,
                "split member {} is missing; the model cannot be read without it",
                names::escape(file)
            ),
            GgufFinding::NotDequantizable {
                ggml_type,
                tensors,
                first,
            } => write!(
                f,
                "{tensors} tensor{} of {ggml_type} (first {first:?}) cannot be dequantized by reshard",
                if *tensors == 1 { "" } else { "s" }
            ),
            GgufFinding::UnexpectedOffset {
                tensor,
                file,
                offset,
                expected,
            } => write!(
                f,
                "tensor {tensor:?} in {} is at data offset {offset}, where llama.cpp expects {expected} (it refuses the file)",
                names::escape(file)
            ),
        }
    }
}

impl GgufSummary {
    pub fn of(path: &str, model: &GgufModel) -> GgufSummary {
        let mut types: BTreeMap<String, TypeStats> = BTreeMap::new();
        for t in &model.tensors {
            let s = types.entry(t.ggml_type.to_string()).or_default();
            s.tensors += 1;
            // An unknown type's element count is not bounded by the file.
            s.parameters = s.parameters.saturating_add(t.numel());
            s.bytes += t.len.unwrap_or(0);
            s.dequantizable = supports(t.ggml_type);
        }
        let largest_tensor = model
            .tensors
            .iter()
            .max_by_key(|t| t.len.unwrap_or(0))
            .map(|t| super::NamedSize {
                name: t.name.clone(),
                bytes: t.len.unwrap_or(0),
            });
        let metadata = model
            .metadata
            .iter()
            .map(|(k, v)| MetaLine {
                key: k.to_string(),
                ty: v.type_name(),
                value: v.to_string(),
            })
            .collect();
        GgufSummary {
            path: path.to_string(),
            format: "gguf",
            version: model.parts.first().map_or(0, |p| p.version),
            architecture: model
                .metadata
                .get_str("general.architecture")
                .map(String::from),
            name: model.metadata.get_str("general.name").map(String::from),
            files: files(model),
            split: model.split.clone(),
            tensor_count: model.tensors.len(),
            parameter_count: model
                .tensors
                .iter()
                .fold(0u64, |a, t| a.saturating_add(t.numel())),
            total_bytes: model.tensors.iter().filter_map(|t| t.len).sum(),
            types,
            largest_tensor,
            metadata,
            findings: findings(model),
        }
    }
}

fn files(model: &GgufModel) -> Vec<GgufFileSummary> {
    model
        .files
        .iter()
        .zip(&model.parts)
        .map(|(f, p)| GgufFileSummary {
            name: f.name(),
            path: f.path.display().to_string(),
            size: f.size,
            split_no: p.split_no,
            tensors: p.tensors,
            alignment: p.alignment,
            data_start: p.data_start,
        })
        .collect()
}

fn findings(model: &GgufModel) -> Vec<GgufFinding> {
    let mut out = Vec::new();
    if let Some(set) = &model.split {
        for m in &set.missing {
            out.push(GgufFinding::MissingSplitMember {
                file: m
                    .file_name()
                    .map_or_else(|| m.display().to_string(), |n| n.to_string_lossy().into()),
            });
        }
    }
    let mut bad: BTreeMap<GgmlType, (usize, &str)> = BTreeMap::new();
    for t in model.tensors.iter().filter(|t| !supports(t.ggml_type)) {
        bad.entry(t.ggml_type).or_insert((0, &t.name)).0 += 1;
    }
    for (ty, (tensors, first)) in bad {
        out.push(GgufFinding::NotDequantizable {
            ggml_type: ty.to_string(),
            tensors,
            first: first.to_string(),
        });
    }
    // llama.cpp wants each tensor right after the one before, padded
    // (after a tensor of unknown length, the next offset is not checked).
    let mut expected: Vec<Option<u64>> = vec![Some(0); model.files.len()];
    for t in &model.tensors {
        let part = &model.parts[t.file];
        let rel = t.offset - part.data_start;
        let want = &mut expected[t.file];
        if let Some(w) = *want {
            if rel != w {
                out.push(GgufFinding::UnexpectedOffset {
                    tensor: t.name.clone(),
                    file: model.files[t.file].name(),
                    offset: rel,
                    expected: w,
                });
            }
        }
        let align = part.alignment;
        *want = t
            .len
            .and_then(|l| rel.checked_add(l))
            .and_then(|end| end.checked_add(align - 1))
            .map(|v| v & !(align - 1));
    }
    out
}

/// One line of `inspect --tensors` for a GGUF model, in file order.
#[derive(Debug, Clone, Serialize)]
pub struct GgufTensorLine {
    pub name: String,
    pub ggml_type: String,
    pub shape: Vec<u64>,
    pub bytes: Option<u64>,
    pub file: String,
    pub offset: u64,
}

/// Every tensor of `model`, as the files list them.
pub fn tensor_lines(model: &GgufModel) -> Vec<GgufTensorLine> {
    model
        .tensors
        .iter()
        .map(|t| GgufTensorLine {
            name: t.name.clone(),
            ggml_type: t.ggml_type.to_string(),
            shape: t.shape.clone(),
            bytes: t.len,
            file: model.files[t.file].name(),
            offset: t.offset,
        })
        .collect()
}
