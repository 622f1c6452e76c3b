//! Index files (`model.safetensors.index.json`, `pytorch_model.bin.index.json`):
//! `{"metadata": {"total_size": N}, "weight_map": {tensor: file}}`.
//!
//! This module parses an index and cross-checks it against the tensors the
//! shards really hold. Reading the shards themselves is the caller's job.

use std::collections::HashMap;
use std::path::Path;

use super::{Finding, FormatError, Tensor};

/// A parsed index: the weight map in file order and the declared total size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    pub total_size: Option<u64>,
    pub weight_map: Vec<(String, String)>,
}

impl Index {
    /// The shard file names in order of first appearance.
    pub fn files(&self) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        self.weight_map
            .iter()
            .filter(|(_, f)| seen.insert(f.as_str()))
            .map(|(_, f)| f.clone())
            .collect()
    }
}

/// Largest index file we read. Real indexes are a few MB even for MoE
/// models with tens of thousands of tensors.
pub const MAX_INDEX: u64 = 256 * 1024 * 1024;

/// Reads and parses the index at `path`.
pub fn read_index(path: &Path) -> Result<Index, FormatError> {
    let len = std::fs::metadata(path)
        .map_err(|e| FormatError::io(path, e))?
        .len();
    if len > MAX_INDEX {
        return Err(FormatError::IndexNotJson {
            path: path.to_path_buf(),
            reason: format!("{len} bytes is larger than the {MAX_INDEX}-byte limit for an index"),
        });
    }
    let bytes = std::fs::read(path).map_err(|e| FormatError::io(path, e))?;
    parse_index(path, &bytes)
}

/// Parses index JSON bytes. Public for fuzzing and tests.
pub fn parse_index(path: &Path, bytes: &[u8]) -> Result<Index, FormatError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| FormatError::IndexNotJson {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let Some(map) = value.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(FormatError::IndexMissingWeightMap {
            path: path.to_path_buf(),
        });
    };
    let weight_map = map
        .iter()
        .map(|(tensor, file)| match file.as_str() {
            Some(f) if is_plain_file_name(f) => Ok((tensor.clone(), f.to_string())),
            _ => Err(FormatError::IndexNotJson {
                path: path.to_path_buf(),
                reason: format!("tensor {tensor:?} maps to {file}, which is not a plain file name"),
            }),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let total_size = value
        .get("metadata")
        .and_then(|m| m.get("total_size"))
        .and_then(|t| t.as_u64().or_else(|| t.as_f64().map(|f| f as u64)));
    Ok(Index {
        total_size,
        weight_map,
    })
}

/// A shard name must stay inside the checkpoint folder: no separators, no
/// `..`, nothing absolute. A hostile index must not make us read elsewhere.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\\')
        && !name.contains('\0')
}

/// Checks an index against the tensors read from its shards.
///
/// `tensors` are all tensors of all shards; `file_names[t.file]` is the shard
/// name a tensor came from. Errors for index entries that point nowhere;
/// findings for tensors the index misses and for a wrong total size.
pub fn cross_check(
    index_path: &Path,
    index: &Index,
    tensors: &[Tensor],
    file_names: &[String],
) -> Result<Vec<Finding>, FormatError> {
    let by_name: HashMap<&str, &Tensor> = tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut listed = std::collections::HashSet::with_capacity(index.weight_map.len());
    for (tensor, file) in &index.weight_map {
        listed.insert(tensor.as_str());
        let holds = by_name
            .get(tensor.as_str())
            .is_some_and(|t| file_names[t.file] == *file);
        if !holds {
            return Err(FormatError::IndexTensorMissing {
                path: index_path.to_path_buf(),
                tensor: tensor.clone(),
                file: file.clone(),
            });
        }
    }
    let mut findings: Vec<Finding> = tensors
        .iter()
        .filter(|t| !listed.contains(t.name.as_str()))
        .map(|t| Finding::TensorNotInIndex {
            tensor: t.name.clone(),
            file: file_names[t.file].clone(),
        })
        .collect();
    let actual: u64 = tensors.iter().map(|t| t.len).sum();
    if let Some(declared) = index.total_size {
        if declared != actual {
            findings.push(Finding::TotalSizeMismatch { declared, actual });
        }
    }
    Ok(findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_weight_map_in_file_order() {
        let idx = parse_index(
            Path::new("i.json"),
            br#"{"metadata":{"total_size":10},"weight_map":{"b":"2.safetensors","a":"1.safetensors","c":"2.safetensors"}}"#,
        )
        .unwrap();
        assert_eq!(idx.total_size, Some(10));
        assert_eq!(idx.files(), vec!["2.safetensors", "1.safetensors"]);
    }

    #[test]
    fn refuses_malformed_indexes() {
        let p = Path::new("i.json");
        assert!(matches!(
            parse_index(p, b"{"),
            Err(FormatError::IndexNotJson { .. })
        ));
        assert!(matches!(
            parse_index(p, br#"{"metadata":{}}"#),
            Err(FormatError::IndexMissingWeightMap { .. })
        ));
        assert!(matches!(
            parse_index(p, br#"{"weight_map":{"a":"../../etc/passwd"}}"#),
            Err(FormatError::IndexNotJson { .. })
        ));
        assert!(matches!(
            parse_index(p, br#"{"weight_map":{"a":3}}"#),
            Err(FormatError::IndexNotJson { .. })
        ));
    }
}
