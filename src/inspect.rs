//! The summary `reshard inspect` reports: plain data computed from a
//! [`Checkpoint`], printed by the CLI as text or JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::format::quant::{self, QuantFormat};
use crate::format::{Checkpoint, Dtype, Finding, Format, Layout};
use crate::plan::order::{block_of, sort_indices, Order};

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

#[derive(Debug, Clone, Serialize)]
pub struct NamedSize {
    pub name: String,
    pub bytes: u64,
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
