//! The safetensors header: read it with bounded memory and check everything
//! the safetensors crate checks, plus what it does not (duplicate names, the
//! exact file length, every dtype of safetensors 0.8, checked arithmetic).
//!
//! Layout of a file: `u64` little-endian header length `n`, `n` bytes of JSON,
//! then the data section. Only the first `8 + n` bytes are ever read here.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{DataRef, Dtype, Finding, FormatError, SourceFile, Tensor};

/// The largest header we accept, as the safetensors crate does (100 MB).
pub const MAX_HEADER: u64 = 100_000_000;

/// One parsed safetensors file: its tensors (in data-offset order), its
/// `__metadata__`, and where the data section starts.
#[derive(Debug, Clone)]
pub struct Header {
    pub tensors: Vec<HeaderTensor>,
    pub metadata: Option<BTreeMap<String, String>>,
    /// Absolute file offset of the data section: `8 + n`.
    pub data_start: u64,
    /// Length of the data section the header describes.
    pub data_len: u64,
}

/// One tensor entry of a header, offsets relative to the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub begin: u64,
    pub end: u64,
}

/// Reads and checks the header of the safetensors file at `path`.
pub fn read_header(path: &Path) -> Result<Header, FormatError> {
    let mut file = File::open(path).map_err(|e| FormatError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    if file_len < 8 {
        return Err(FormatError::FileTooSmall {
            path: path.to_path_buf(),
            len: file_len,
        });
    }
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(|e| FormatError::io(path, e))?;
    let n = u64::from_le_bytes(len_bytes);
    if n > MAX_HEADER {
        return Err(FormatError::HeaderTooLarge {
            path: path.to_path_buf(),
            len: n,
            max: MAX_HEADER,
        });
    }
    if n > file_len - 8 {
        return Err(FormatError::HeaderPastEnd {
            path: path.to_path_buf(),
            len: n,
            file_len,
        });
    }
    // n <= MAX_HEADER, so this allocation is bounded.
    let mut json = vec![0u8; n as usize];
    file.read_exact(&mut json)
        .map_err(|e| FormatError::io(path, e))?;
    let header = parse_header(path, &json)?;
    check_file_length(path, &header, file_len)?;
    Ok(header)
}

/// Parses and checks header JSON bytes (everything but the file length).
///
/// Public so that fuzzing and tests can drive it with byte literals.
pub fn parse_header(path: &Path, json: &[u8]) -> Result<Header, FormatError> {
    let text = std::str::from_utf8(json).map_err(|_| FormatError::HeaderNotUtf8 {
        path: path.to_path_buf(),
    })?;
    let entries: Entries = match serde_json::from_str(text) {
        Ok(e) => e,
        Err(e) if e.is_data() => {
            return Err(FormatError::HeaderNotObject {
                path: path.to_path_buf(),
            })
        }
        Err(e) => {
            return Err(FormatError::HeaderNotJson {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
        }
    };
    let mut metadata = None;
    let mut tensors = Vec::with_capacity(entries.0.len());
    let mut seen = std::collections::HashSet::with_capacity(entries.0.len());
    for (name, raw) in entries.0 {
        if !seen.insert(name.clone()) {
            let dup = FormatError::DuplicateTensor {
                path: path.to_path_buf(),
                tensor: name,
            };
            return Err(dup);
        }
        if name == "__metadata__" {
            metadata = Some(parse_metadata(path, &raw)?);
        } else {
            tensors.push(parse_tensor(path, name, &raw)?);
        }
    }
    let data_len = check_offsets(path, &mut tensors)?;
    Ok(Header {
        tensors,
        metadata,
        data_start: 8 + json.len() as u64,
        data_len,
    })
}

/// Header entries in file order, duplicates kept so we can refuse them
/// (serde_json's maps keep only the last value of a repeated key).
struct Entries(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                    out.push((k, v));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

fn parse_metadata(path: &Path, raw: &RawValue) -> Result<BTreeMap<String, String>, FormatError> {
    let bad = |key: &str, reason: &str| FormatError::BadMetadata {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason: reason.to_string(),
    };
    let value: serde_json::Value =
        serde_json::from_str(raw.get()).map_err(|e| bad("__metadata__", &e.to_string()))?;
    let serde_json::Value::Object(map) = value else {
        return Err(bad("__metadata__", "is not an object of strings"));
    };
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, s)),
            other => Err(bad(&k, &format!("value {other} is not a string"))),
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    dtype: String,
    shape: serde_json::Value,
    data_offsets: (serde_json::Value, serde_json::Value),
}

fn parse_tensor(path: &Path, name: String, raw: &RawValue) -> Result<HeaderTensor, FormatError> {
    let entry: RawTensor =
        serde_json::from_str(raw.get()).map_err(|e| FormatError::BadTensorEntry {
            path: path.to_path_buf(),
            tensor: name.clone(),
            reason: format!("not a {{dtype, shape, data_offsets}} entry: {e}"),
        })?;
    let dtype = entry
        .dtype
        .parse::<Dtype>()
        .ok()
        .filter(|d| d.name() == entry.dtype);
    let Some(dtype) = dtype else {
        return Err(FormatError::UnknownDtype {
            path: path.to_path_buf(),
            tensor: name,
            dtype: entry.dtype,
        });
    };
    let shape = entry.shape.as_array().and_then(|dims| {
        dims.iter()
            .map(serde_json::Value::as_u64)
            .collect::<Option<Vec<u64>>>()
    });
    let Some(shape) = shape else {
        return Err(FormatError::BadShape {
            path: path.to_path_buf(),
            tensor: name,
            shape: entry.shape.to_string(),
        });
    };
    let offset = |v: &serde_json::Value| {
        v.as_u64().ok_or_else(|| FormatError::BadTensorEntry {
            path: path.to_path_buf(),
            tensor: name.clone(),
            reason: format!("data offset {v} is not a non-negative integer"),
        })
    };
    let (begin, end) = (
        offset(&entry.data_offsets.0)?,
        offset(&entry.data_offsets.1)?,
    );
    if end < begin {
        return Err(FormatError::OffsetsOutOfOrder {
            path: path.to_path_buf(),
            tensor: name,
            begin,
            end,
        });
    }
    let expected = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|numel| dtype.byte_len(numel));
    if expected != Some(end - begin) {
        return Err(FormatError::ByteLenMismatch {
            path: path.to_path_buf(),
            tensor: name,
            dtype,
            shape,
            expected: expected.map_or_else(|| "an impossible number of".into(), |e| e.to_string()),
            actual: end - begin,
        });
    }
    Ok(HeaderTensor {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

/// Sorts tensors by offset and checks they tile the data section exactly.
/// Returns the data section's length.
fn check_offsets(path: &Path, tensors: &mut [HeaderTensor]) -> Result<u64, FormatError> {
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut cursor = 0u64;
    for i in 0..tensors.len() {
        let t = &tensors[i];
        if t.begin < cursor {
            return Err(FormatError::OffsetsOverlap {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                other: tensors[i - 1].name.clone(),
            });
        }
        if t.begin > cursor {
            return Err(FormatError::OffsetsHole {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                at: cursor,
                len: t.begin - cursor,
            });
        }
        cursor = t.end;
    }
    Ok(cursor)
}

fn check_file_length(path: &Path, header: &Header, file_len: u64) -> Result<(), FormatError> {
    let expected = header
        .data_start
        .checked_add(header.data_len)
        .ok_or_else(|| FormatError::Truncated {
            path: path.to_path_buf(),
            expected: u64::MAX,
            actual: file_len,
            tensor: None,
        })?;
    if file_len < expected {
        let have = file_len - header.data_start;
        let cut = header
            .tensors
            .iter()
            .find(|t| t.end > have)
            .map(|t| t.name.clone());
        return Err(FormatError::Truncated {
            path: path.to_path_buf(),
            expected,
            actual: file_len,
            tensor: cut,
        });
    }
    if file_len > expected {
        return Err(FormatError::TrailingBytes {
            path: path.to_path_buf(),
            extra: file_len - expected,
        });
    }
    Ok(())
}

/// Reads one safetensors file into tensors with absolute offsets, plus the
/// findings about it (missing `format: pt`, misaligned tensors).
pub fn read_file(
    file: &SourceFile,
    file_index: usize,
) -> Result<(Vec<Tensor>, Header, Vec<Finding>), FormatError> {
    let header = read_header(&file.path)?;
    let mut findings = Vec::new();
    let name = file.name();
    if header
        .metadata
        .as_ref()
        .and_then(|m| m.get("format"))
        .map(String::as_str)
        != Some("pt")
    {
        findings.push(Finding::MissingFormatPt { file: name.clone() });
    }
    let tensors = header
        .tensors
        .iter()
        .map(|t| {
            let offset = header.data_start + t.begin;
            let alignment = t.dtype.alignment();
            if offset % alignment != 0 {
                findings.push(Finding::Misaligned {
                    tensor: t.name.clone(),
                    file: name.clone(),
                    offset,
                    alignment,
                });
            }
            Tensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                len: t.end - t.begin,
                file: file_index,
                data: DataRef::Contiguous { offset },
            }
        })
        .collect();
    Ok((tensors, header, findings))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Header, FormatError> {
        parse_header(Path::new("x.safetensors"), json.as_bytes())
    }

    #[test]
    fn parses_a_valid_header_in_offset_order() {
        let h = parse(r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"format":"pt"}}"#).unwrap();
        assert_eq!(h.tensors[0].name, "a");
        assert_eq!(h.tensors[1].name, "b");
        assert_eq!(h.data_len, 12);
        assert_eq!(h.metadata.unwrap()["format"], "pt");
    }

    #[test]
    fn refuses_duplicates_holes_overlaps_and_bad_lengths() {
        let dup = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(
            matches!(parse(dup), Err(FormatError::DuplicateTensor { tensor, .. }) if tensor == "a")
        );
        let hole = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(matches!(parse(hole), Err(FormatError::OffsetsHole { .. })));
        let overlap = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
        assert!(matches!(
            parse(overlap),
            Err(FormatError::OffsetsOverlap { .. })
        ));
        let len = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#;
        assert!(matches!(
            parse(len),
            Err(FormatError::ByteLenMismatch { .. })
        ));
        let reversed = r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#;
        assert!(matches!(
            parse(reversed),
            Err(FormatError::OffsetsOutOfOrder { .. })
        ));
    }

    #[test]
    fn refuses_bad_shapes_dtypes_and_metadata() {
        let neg = r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#;
        assert!(matches!(parse(neg), Err(FormatError::BadShape { .. })));
        let frac = r#"{"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}"#;
        assert!(matches!(parse(frac), Err(FormatError::BadShape { .. })));
        let dtype = r#"{"a":{"dtype":"F12","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(matches!(
            parse(dtype),
            Err(FormatError::UnknownDtype { .. })
        ));
        let lower = r#"{"a":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}}"#;
        assert!(matches!(
            parse(lower),
            Err(FormatError::UnknownDtype { .. })
        ));
        let meta = r#"{"__metadata__":{"format":1}}"#;
        assert!(
            matches!(parse(meta), Err(FormatError::BadMetadata { key, .. }) if key == "format")
        );
        assert!(matches!(
            parse("[1,2]"),
            Err(FormatError::HeaderNotObject { .. })
        ));
        assert!(matches!(parse("{"), Err(FormatError::HeaderNotJson { .. })));
        assert!(matches!(
            parse_header(Path::new("x"), &[0xff, 0xfe]),
            Err(FormatError::HeaderNotUtf8 { .. })
        ));
    }

    #[test]
    fn huge_shapes_do_not_overflow() {
        let huge = r#"{"a":{"dtype":"F64","shape":[18446744073709551615,2],"data_offsets":[0,8]}}"#;
        assert!(matches!(
            parse(huge),
            Err(FormatError::ByteLenMismatch { .. })
        ));
    }
}
