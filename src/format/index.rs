//! Index files (`model.safetensors.index.json`, `pytorch_model.bin.index.json`):
//! `{"metadata": {"total_size": N}, "weight_map": {tensor: file}}`.
//!
//! This module parses an index and cross-checks it against the tensors the
//! shards really hold. Reading the shards themselves is the caller's job.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

use super::json::{skip_map, skip_scalars, skip_seq, Failure};
use super::read::read_regular;
use super::{Finding, FormatError, Tensor, MAX_TENSORS};

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

/// Largest index file we read. The largest real index is about 10 MB (a
/// 100,000-tensor MoE checkpoint, ~100 bytes an entry); 32 MiB is three
/// times that.
pub const MAX_INDEX: u64 = 32 << 20;

/// Reads and parses the index at `path` (a regular file of at most
/// [`MAX_INDEX`] bytes).
pub fn read_index(path: &Path) -> Result<Index, FormatError> {
    let bytes = read_regular(path, MAX_INDEX)?;
    parse_index(path, &bytes)
}

/// Parses index JSON bytes. Public for fuzzing and tests.
///
/// One pass, keeping only the weight map and `metadata.total_size`: other
/// keys are skipped without being built, so an index costs its bytes plus
/// about 100 bytes an entry. A tensor listed twice is refused (a JSON
/// reader would keep one of the two silently).
pub fn parse_index(path: &Path, bytes: &[u8]) -> Result<Index, FormatError> {
    let seed = IndexSeed {
        path,
        failure: Failure::default(),
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = (&seed)
        .deserialize(&mut de)
        .and_then(|p| de.end().map(|()| p));
    let parsed = match parsed {
        Ok(p) => p,
        Err(e) => {
            return Err(seed.failure.take().unwrap_or(FormatError::IndexNotJson {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }))
        }
    };
    let Some(weight_map) = parsed.weight_map else {
        return Err(FormatError::IndexMissingWeightMap {
            path: path.to_path_buf(),
        });
    };
    refuse_duplicates(path, &weight_map)?;
    Ok(Index {
        total_size: parsed.total_size,
        weight_map,
    })
}

#[derive(Default)]
struct Parsed {
    total_size: Option<u64>,
    weight_map: Option<Vec<(String, String)>>,
}

/// The index object, read key by key. Anything but an object, and a
/// `weight_map` that is not an object, parse as "no weight map".
struct IndexSeed<'p> {
    path: &'p Path,
    failure: Failure,
}

impl<'de> DeserializeSeed<'de> for &IndexSeed<'_> {
    type Value = Parsed;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for &IndexSeed<'_> {
    type Value = Parsed;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parsed, A::Error> {
        let mut parsed = Parsed::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match &*key {
                "weight_map" => parsed.weight_map = map.next_value_seed(WeightMapSeed(self))?,
                "metadata" => parsed.total_size = map.next_value::<Metadata>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(parsed)
    }
    skip_scalars!(Parsed::default());
    skip_seq!(Parsed::default());
}

/// `"weight_map": {tensor: file}`; `None` when it is not an object.
struct WeightMapSeed<'s, 'p>(&'s IndexSeed<'p>);

impl<'de> DeserializeSeed<'de> for WeightMapSeed<'_, '_> {
    type Value = Option<Vec<(String, String)>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for WeightMapSeed<'_, '_> {
    type Value = Option<Vec<(String, String)>>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object of tensor name to file name")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let IndexSeed { path, failure } = self.0;
        let mut out: Vec<(String, String)> = Vec::new();
        while let Some(tensor) = map.next_key::<String>()? {
            let file = match map.next_value::<FileName>()? {
                FileName(Ok(f)) if is_plain_file_name(&f) => f,
                FileName(other) => {
                    let what = other.map_or_else(str::to_string, |f| format!("{f:?}"));
                    return Err(failure.fail(FormatError::IndexNotJson {
                        path: path.to_path_buf(),
                        reason: format!(
                            "tensor {tensor:?} maps to {what}, which is not a plain file name"
                        ),
                    }));
                }
            };
            if out.len() >= MAX_TENSORS {
                return Err(failure.fail(FormatError::TooManyTensors {
                    path: path.to_path_buf(),
                    max: MAX_TENSORS,
                }));
            }
            out.try_reserve(1).map_err(|_| {
                failure.fail(FormatError::OutOfMemory {
                    path: path.to_path_buf(),
                    bytes: std::mem::size_of::<(String, String)>() as u64,
                })
            })?;
            out.push((tensor, file));
        }
        Ok(Some(out))
    }
    skip_scalars!(None);
    skip_seq!(None);
}

/// A weight map value: a file name, or the kind of JSON it is instead.
struct FileName(Result<String, &'static str>);

impl<'de> Deserialize<'de> for FileName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FileName;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a file name")
            }
            fn visit_str<E>(self, v: &str) -> Result<FileName, E> {
                Ok(FileName(Ok(v.to_string())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<FileName, E> {
                Ok(FileName(Err("a boolean")))
            }
            fn visit_i64<E>(self, _: i64) -> Result<FileName, E> {
                Ok(FileName(Err("a number")))
            }
            fn visit_u64<E>(self, _: u64) -> Result<FileName, E> {
                Ok(FileName(Err("a number")))
            }
            fn visit_f64<E>(self, _: f64) -> Result<FileName, E> {
                Ok(FileName(Err("a number")))
            }
            fn visit_unit<E>(self) -> Result<FileName, E> {
                Ok(FileName(Err("null")))
            }
            skip_seq!(FileName(Err("a list")));
            skip_map!(FileName(Err("an object")));
        }
        d.deserialize_any(V)
    }
}

/// `"metadata"`: only `total_size` is kept (an integer, or a float as some
/// writers emit); anything else in it, or a `metadata` that is not an
/// object, is skipped.
struct Metadata(Option<u64>);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Metadata;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
                let mut total = None;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == "total_size" {
                        total = map.next_value::<TotalSize>()?.0;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Metadata(total))
            }
            skip_scalars!(Metadata(None));
            skip_seq!(Metadata(None));
        }
        d.deserialize_any(V)
    }
}

struct TotalSize(Option<u64>);

impl<'de> Deserialize<'de> for TotalSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TotalSize;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte count")
            }
            fn visit_u64<E>(self, v: u64) -> Result<TotalSize, E> {
                Ok(TotalSize(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<TotalSize, E> {
                Ok(TotalSize(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<TotalSize, E> {
                Ok(TotalSize((v >= 0.0).then_some(v as u64)))
            }
            fn visit_bool<E>(self, _: bool) -> Result<TotalSize, E> {
                Ok(TotalSize(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<TotalSize, E> {
                Ok(TotalSize(None))
            }
            fn visit_unit<E>(self) -> Result<TotalSize, E> {
                Ok(TotalSize(None))
            }
            skip_seq!(TotalSize(None));
            skip_map!(TotalSize(None));
        }
        d.deserialize_any(V)
    }
}

/// Refuses a tensor the weight map lists twice, without copying names.
fn refuse_duplicates(path: &Path, weight_map: &[(String, String)]) -> Result<(), FormatError> {
    let mut order: Vec<u32> = (0..weight_map.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| weight_map[a as usize].0.cmp(&weight_map[b as usize].0));
    match order
        .windows(2)
        .find(|w| weight_map[w[0] as usize].0 == weight_map[w[1] as usize].0)
    {
        Some(w) => Err(FormatError::IndexNotJson {
            path: path.to_path_buf(),
            reason: format!(
                "tensor {:?} is listed twice in the weight map",
                weight_map[w[0] as usize].0
            ),
        }),
        None => Ok(()),
    }
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
