//! The summary `reshard inspect` reports: plain data computed from a
//! [`Checkpoint`], printed by the CLI as text or JSON; for a folder made of
//! several weight sets ([`ModelLayout`]), one summary per set and a total.

pub mod gguf;
mod sizes;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::format::layout::{LayoutKind, Library, ModelLayout};
use crate::format::{Checkpoint, Dtype, Finding, Format, FormatError, Layout};
use crate::plan::order::{block_of, sort_indices, Order};
use crate::quant::{self, QuantFormat};

pub use self::sizes::NamedSize;

/// Everything `inspect` says about a checkpoint. Field names are stable.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub path: String,
    pub format: Format,
    pub layout: Layout,
    pub prefix: String,
    pub files: Vec<FileSummary>,
    pub tensor_count: usize,
    pub parameter_count: u64,
    pub total_bytes: u64,
    pub bytes_per_dtype: BTreeMap<Dtype, u64>,
    pub largest_tensor: Option<NamedSize>,
    pub largest_file: Option<NamedSize>,
    pub blocks: BlockStats,
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<QuantSummary>,
    pub findings: Vec<Finding>,
}

/// A quantized checkpoint's scheme and counts.
#[derive(Debug, Clone, Serialize)]
pub struct QuantSummary {
    pub format: QuantFormat,
    /// Quantized weights (F8 or MXFP4 codes).
    pub weights: usize,
    /// Those with a scale of a fitting shape.
    pub scaled: usize,
    /// Scale tensors, with or without a weight.
    pub scales: usize,
    /// Activation and KV scales, zero points: dropped when dequantizing.
    pub extras: usize,
}

/// The quantization summary and its findings (an unclear one is a finding).
fn quant_summary(ck: &Checkpoint) -> (Option<QuantSummary>, Vec<Finding>) {
    match quant::detect(ck) {
        Ok(None) => (None, Vec::new()),
        Ok(Some(q)) => {
            let summary = QuantSummary {
                format: q.format,
                weights: q.weights.len(),
                scaled: q.scaled().count(),
                scales: q.weights.iter().filter(|w| w.scale.is_some()).count()
                    + q.orphan_scales.len(),
                extras: q.extras.len(),
            };
            (Some(summary), q.findings)
        }
        Err(e) => (
            None,
            vec![Finding::QuantUnclear {
                reason: e.to_string(),
            }],
        ),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FileSummary {
    pub name: String,
    pub path: String,
    pub size: u64,
}

/// Numbered blocks (layers) and their sizes: a block is the unit that
/// `convert` keeps in one shard, so the largest one matters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BlockStats {
    pub count: usize,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub largest: Option<String>,
}

/// One line of `inspect --tensors`, in layer order.
#[derive(Debug, Clone, Serialize)]
pub struct TensorLine {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub bytes: u64,
    pub file: String,
    pub offset: u64,
    pub block: Option<String>,
}

/// `inspect` of a folder with several weight sets: each, and the total.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutSummary {
    pub path: String,
    pub kind: LayoutKind,
    pub components: Vec<ComponentSummary>,
    pub total: Total,
    /// Entries of modules.json or model_index.json left out, and why.
    pub notes: Vec<String>,
}

/// One weight set of a [`LayoutSummary`].
#[derive(Debug, Clone, Serialize)]
pub struct ComponentSummary {
    /// Its folder under the model, `/` separators; `.` for the root.
    pub path: String,
    pub library: Library,
    pub summary: Summary,
}

/// The sum over every weight set; the largest file and tensor of any.
#[derive(Debug, Clone, Serialize)]
pub struct Total {
    pub weight_sets: usize,
    pub tensor_count: usize,
    pub parameter_count: u64,
    pub total_bytes: u64,
    pub largest_tensor: Option<NamedSize>,
    pub largest_file: Option<NamedSize>,
    pub findings: usize,
}

impl LayoutSummary {
    /// Opens every weight set of `layout` and sums them up.
    pub fn of(path: &str, layout: &ModelLayout) -> Result<LayoutSummary, FormatError> {
        let mut components = Vec::with_capacity(layout.sets.len());
        for set in &layout.sets {
            let dir = layout.dir_of(set);
            let ck = crate::format::open(&dir)?;
            components.push(ComponentSummary {
                path: set.label().to_string(),
                library: set.library,
                summary: Summary::of(&dir.display().to_string(), &ck),
            });
        }
        let sums = components.iter().map(|c| &c.summary);
        let with_path = |n: &NamedSize, c: &ComponentSummary| NamedSize {
            name: format!("{}/{}", c.path, n.name),
            bytes: n.bytes,
        };
        let largest = |pick: fn(&Summary) -> Option<&NamedSize>| {
            components
                .iter()
                .filter_map(|c| pick(&c.summary).map(|n| with_path(n, c)))
                .max_by_key(|n| n.bytes)
        };
        let total = Total {
            weight_sets: components.len(),
            tensor_count: sums.clone().map(|s| s.tensor_count).sum(),
            parameter_count: sums.clone().map(|s| s.parameter_count).sum(),
            total_bytes: sums.clone().map(|s| s.total_bytes).sum(),
            largest_tensor: largest(|s| s.largest_tensor.as_ref()),
            largest_file: largest(|s| s.largest_file.as_ref()),
            findings: sums.map(|s| s.findings.len()).sum(),
        };
        Ok(LayoutSummary {
            path: path.to_string(),
            kind: layout.kind,
            components,
            total,
            notes: layout.notes.clone(),
        })
    }
}

impl Summary {
    pub fn of(path: &str, ck: &Checkpoint) -> Summary {
        let mut bytes_per_dtype = BTreeMap::new();
        for t in &ck.tensors {
            *bytes_per_dtype.entry(t.dtype).or_insert(0) += t.len;
        }
        let largest_tensor = ck.tensors.iter().max_by_key(|t| t.len).map(|t| NamedSize {
            name: t.name.clone(),
            bytes: t.len,
        });
        let largest_file = ck.files.iter().max_by_key(|f| f.size).map(|f| NamedSize {
            name: f.name(),
            bytes: f.size,
        });
        let (quantization, quant_findings) = quant_summary(ck);
        let mut findings = ck.findings.clone();
        findings.extend(quant_findings);
        Summary {
            path: path.to_string(),
            format: ck.format,
            layout: ck.layout.clone(),
            prefix: ck.prefix.clone(),
            files: ck
                .files
                .iter()
                .map(|f| FileSummary {
                    name: f.name(),
                    path: f.path.display().to_string(),
                    size: f.size,
                })
                .collect(),
            tensor_count: ck.tensors.len(),
            parameter_count: ck.parameter_count(),
            total_bytes: ck.total_bytes(),
            bytes_per_dtype,
            largest_tensor,
            largest_file,
            blocks: block_stats(ck),
            metadata: ck.metadata.clone(),
            quantization,
            findings,
        }
    }
}

fn block_stats(ck: &Checkpoint) -> BlockStats {
    let mut sizes: BTreeMap<String, u64> = BTreeMap::new();
    for t in &ck.tensors {
        if let Some(b) = block_of(&t.name) {
            *sizes.entry(b.name()).or_insert(0) += t.len;
        }
    }
    let largest = sizes.iter().max_by_key(|(_, &s)| s).map(|(n, _)| n.clone());
    BlockStats {
        count: sizes.len(),
        min_bytes: sizes.values().copied().min().unwrap_or(0),
        max_bytes: sizes.values().copied().max().unwrap_or(0),
        largest,
    }
}

/// Every tensor of `ck` in `order`, for `inspect --tensors`.
pub fn tensor_lines(ck: &Checkpoint, order: Order) -> Vec<TensorLine> {
    let names: Vec<&str> = ck.tensors.iter().map(|t| t.name.as_str()).collect();
    sort_indices(&names, order)
        .into_iter()
        .map(|i| {
            let t = &ck.tensors[i];
            TensorLine {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                bytes: t.len,
                file: ck.files[t.file].name(),
                offset: t.offset(),
                block: block_of(&t.name).map(|b| b.name()),
            }
        })
        .collect()
}
