//! Planning a quantized checkpoint: what each tensor becomes.
//!
//! With `--dtype`, each quantized weight becomes one dense tensor (under its
//! dense name and shape; gpt-oss's `*_blocks` lose the suffix) that reads
//! its scale while it is written, and the scales and activation/KV scales
//! are not written. Without `--dtype` the checkpoint stays quantized and
//! every scale is glued to its weight, so the packer puts both in one shard.
//! A quantized weight without a usable scale is refused unless
//! `allow_unscaled` (it is then cast or copied as plain codes).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::PlanError;
use crate::format::Checkpoint;
use crate::quant::Scheme;
use crate::quant::{self, QuantFormat, Quantization};

/// What the plan does with one source tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Plain,
    /// Not written (a scale folded into its weight, an activation scale).
    Drop,
    /// Written dequantized as `name` of `shape`.
    Dequant {
        name: String,
        shape: Vec<u64>,
        scale: usize,
        scheme: Scheme,
    },
    /// Written unchanged, in the same shard as, and right after, this tensor.
    GluedTo(usize),
}

/// The manifest's record of a quantized source (provenance).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantRecord {
    pub format: QuantFormat,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_file: Option<String>,
    /// The source's quantization config, as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// True when the output is dense (`--dtype`); false when it was
    /// resharded as is.
    pub dequantized: bool,
    /// Each dense tensor and the codes and scale it was made from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<DequantRecord>,
    /// Source tensors not written (scales folded in, activation scales).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DequantRecord {
    pub tensor: String,
    pub weight: String,
    pub scale: String,
}

/// Every source tensor's role, and the record.
pub struct QuantPlan {
    pub roles: Vec<Role>,
    pub record: Option<QuantRecord>,
}

impl QuantPlan {
    /// Decides every tensor's role. `keep` tells whether `--keep-dtype`
    /// keeps a name; `dequantize` is whether `--dtype` was given.
    pub fn new(
        ck: &Checkpoint,
        dequantize: bool,
        allow_unscaled: bool,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<QuantPlan, PlanError> {
        let mut roles = vec![Role::Plain; ck.tensors.len()];
        let Some(q) = quant::detect(ck)? else {
            return Ok(QuantPlan {
                roles,
                record: None,
            });
        };
        refuse_unscaled(ck, &q, allow_unscaled)?;
        let mut record = QuantRecord {
            format: q.format,
            config_file: q.config_file.clone(),
            config: q.config.clone(),
            dequantized: dequantize,
            tensors: Vec::new(),
            dropped: Vec::new(),
        };
        for (w, scale, scheme) in q.scaled() {
            let weight = &ck.tensors[w.weight];
            if !dequantize {
                roles[scale] = Role::GluedTo(w.weight);
                continue;
            }
            if keep(&weight.name) {
                return Err(PlanError::KeepQuantized {
                    tensor: weight.name.clone(),
                });
            }
            let clash = w.name != weight.name && ck.tensors.iter().any(|t| t.name == w.name);
            if clash {
                return Err(PlanError::DenseNameTaken {
                    tensor: weight.name.clone(),
                    name: w.name.clone(),
                });
            }
            roles[w.weight] = Role::Dequant {
                name: w.name.clone(),
                shape: w.shape.clone(),
                scale,
                scheme: scheme.clone(),
            };
            roles[scale] = Role::Drop;
            record.tensors.push(DequantRecord {
                tensor: w.name.clone(),
                weight: weight.name.clone(),
                scale: ck.tensors[scale].name.clone(),
            });
        }
        if dequantize {
            for &i in &q.extras {
                roles[i] = Role::Drop;
            }
        }
        record.dropped = (0..ck.tensors.len())
            .filter(|&i| roles[i] == Role::Drop)
            .map(|i| ck.tensors[i].name.clone())
            .collect();
        Ok(QuantPlan {
            roles,
            record: Some(record),
        })
    }

    /// `ordered` (source indices in layer order) without dropped tensors,
    /// each glued tensor moved right after the one it is glued to.
    pub fn regroup(&self, ordered: Vec<usize>) -> Vec<usize> {
        if self.record.is_none() {
            return ordered;
        }
        let mut glued: Vec<Vec<usize>> = vec![Vec::new(); self.roles.len()];
        for &i in &ordered {
            if let Role::GluedTo(w) = self.roles[i] {
                glued[w].push(i);
            }
        }
        let mut out = Vec::with_capacity(ordered.len());
        for i in ordered {
            match self.roles[i] {
                Role::Drop | Role::GluedTo(_) => {}
                _ => {
                    out.push(i);
                    out.append(&mut glued[i]);
                }
            }
        }
        out
    }
}

/// A quantized weight without its scale, or a scale whose shape does not
/// fit: refused (the first one named) unless `allow` and only missing.
fn refuse_unscaled(ck: &Checkpoint, q: &Quantization, allow: bool) -> Result<(), PlanError> {
    for w in &q.weights {
        let t = &ck.tensors[w.weight];
        let file = ck.file_of(t).name();
        match (w.scale, &w.scheme) {
            (None, _) if !allow => {
                return Err(PlanError::MissingScale {
                    file,
                    tensor: t.name.clone(),
                })
            }
            (Some(s), None) => {
                if let Some((dtype, expected)) = codes_dtype(q, &t.name) {
                    return Err(PlanError::CodesDtype {
                        file,
                        tensor: t.name.clone(),
                        dtype,
                        expected,
                    });
                }
                return Err(PlanError::BadScale {
                    file: ck.file_of(&ck.tensors[s]).name(),
                    tensor: ck.tensors[s].name.clone(),
                    weight: t.name.clone(),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// The dtype of weight `name`'s codes and the one its scheme reads, when the
/// detector found them to differ.
fn codes_dtype(q: &Quantization, name: &str) -> Option<(String, String)> {
    q.findings.iter().find_map(|f| match f {
        crate::format::Finding::QuantCodesDtype {
            tensor,
            dtype,
            expected,
            ..
        } if tensor == name => Some((dtype.clone(), expected.clone())),
        _ => None,
    })
}
