//! The safetensors header: read it with bounded memory and check everything
//! the safetensors crate checks, plus what it does not (duplicate names, the
//! exact file length, every dtype of safetensors 0.8, checked arithmetic,
//! the number of tensors and of dimensions).
//!
//! Layout of a file: `u64` little-endian header length `n`, `n` bytes of JSON,
//! then the data section. Only the first `8 + n` bytes are ever read here.
//! The JSON is parsed in one pass that borrows from those bytes: each entry
//! becomes a [`HeaderTensor`] as it is met, nothing else is kept, so the
//! memory a header costs is its `n` bytes plus about 100 bytes a tensor,
//! whatever it holds (a 10,000,000-dimension shape is counted, not stored).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::json::{excerpt, Failure, Ints};
use super::read::open_regular;
use super::{DataRef, Dtype, Finding, FormatError, SourceFile, Tensor, MAX_TENSORS};

/// The largest header we accept. The safetensors crate allows 100 MB; real
/// headers take about 150 bytes a tensor, so even the largest real checkpoint
/// (about 100,000 tensors, from its ~10 MB index) merged into one file would
/// need ~15 MB. 32 MiB leaves twice that.
pub const MAX_HEADER: u64 = 32 << 20;

/// Most dimensions a shape may have. No real checkpoint has a tensor of more
/// than 8 (torch itself caps many kernels at 25; models use 1 to 5).
pub const MAX_DIMS: usize = 8;

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
    let file = open_regular(path, u64::MAX)?;
    let file_len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    if file_len < 8 {
        return Err(FormatError::FileTooSmall {
            path: path.to_path_buf(),
            len: file_len,
        });
    }
    let mut len_bytes = [0u8; 8];
    let mut file = file;
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
    let mut json = Vec::new();
    json.try_reserve_exact(n as usize)
        .map_err(|_| FormatError::OutOfMemory {
            path: path.to_path_buf(),
            bytes: n,
        })?;
    json.resize(n as usize, 0);
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
    let seed = HeaderSeed {
        path,
        failure: Failure::default(),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = (&seed)
        .deserialize(&mut de)
        .and_then(|p| de.end().map(|()| p));
    let (mut tensors, metadata) = match parsed {
        Ok(p) => p,
        Err(e) => {
            if let Some(failure) = seed.failure.take() {
                return Err(failure);
            }
            return Err(if e.is_data() {
                FormatError::HeaderNotObject {
                    path: path.to_path_buf(),
                }
            } else {
                FormatError::HeaderNotJson {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                }
            });
        }
    };
    refuse_duplicates(path, &tensors)?;
    let data_len = check_offsets(path, &mut tensors)?;
    Ok(Header {
        tensors,
        metadata,
        data_start: 8 + json.len() as u64,
        data_len,
    })
}

type Parsed = (Vec<HeaderTensor>, Option<BTreeMap<String, String>>);

/// Parses the header object entry by entry, each entry borrowed from the
/// header bytes and turned into a [`HeaderTensor`] at once.
struct HeaderSeed<'p> {
    path: &'p Path,
    failure: Failure,
}

impl<'de> DeserializeSeed<'de> for &HeaderSeed<'_> {
    type Value = Parsed;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for &HeaderSeed<'_> {
    type Value = Parsed;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Parsed, A::Error> {
        let HeaderSeed { path, failure } = self;
        let mut tensors: Vec<HeaderTensor> = Vec::new();
        let mut metadata = None;
        while let Some(name) = map.next_key::<String>()? {
            let raw: &'de RawValue = map.next_value()?;
            if name == "__metadata__" {
                if metadata.is_some() {
                    return Err(failure.fail(FormatError::DuplicateTensor {
                        path: path.to_path_buf(),
                        tensor: name,
                    }));
                }
                metadata = Some(parse_metadata(path, raw).map_err(|e| failure.fail(e))?);
                continue;
            }
            if tensors.len() >= MAX_TENSORS {
                return Err(failure.fail(FormatError::TooManyTensors {
                    path: path.to_path_buf(),
                    max: MAX_TENSORS,
                }));
            }
            let tensor = parse_tensor(path, name, raw).map_err(|e| failure.fail(e))?;
            tensors.try_reserve(1).map_err(|_| {
                failure.fail(FormatError::OutOfMemory {
                    path: path.to_path_buf(),
                    bytes: std::mem::size_of::<HeaderTensor>() as u64,
                })
            })?;
            tensors.push(tensor);
        }
        Ok((tensors, metadata))
    }
}

/// Refuses a name that appears twice, without a second copy of the names:
/// sorts indices by name and compares neighbours.
fn refuse_duplicates(path: &Path, tensors: &[HeaderTensor]) -> Result<(), FormatError> {
    let mut order: Vec<u32> = (0..tensors.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| tensors[a as usize].name.cmp(&tensors[b as usize].name));
    match order
        .windows(2)
        .find(|w| tensors[w[0] as usize].name == tensors[w[1] as usize].name)
    {
        Some(w) => Err(FormatError::DuplicateTensor {
            path: path.to_path_buf(),
            tensor: tensors[w[0] as usize].name.clone(),
        }),
        None => Ok(()),
    }
}

fn parse_metadata(path: &Path, raw: &RawValue) -> Result<BTreeMap<String, String>, FormatError> {
    let bad = |key: &str, reason: &str| FormatError::BadMetadata {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason: reason.to_string(),
    };
    let map: BTreeMap<String, &RawValue> = serde_json::from_str(raw.get()).map_err(|e| {
        if e.is_data() {
            bad("__metadata__", "is not an object of strings")
        } else {
            bad("__metadata__", &e.to_string())
        }
    })?;
    map.into_iter()
        .map(|(k, v)| match serde_json::from_str::<String>(v.get()) {
            Ok(s) => Ok((k, s)),
            Err(_) => Err(bad(
                &k,
                &format!("value {} is not a string", excerpt(v.get())),
            )),
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor<'a> {
    #[serde(borrow)]
    dtype: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    shape: &'a RawValue,
    #[serde(borrow)]
    data_offsets: (&'a RawValue, &'a RawValue),
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
            dtype: excerpt(&entry.dtype),
        });
    };
    let shape = match Ints::parse(entry.shape.get(), MAX_DIMS) {
        Ints::Values(dims) => dims,
        Ints::TooMany(dims) => {
            return Err(FormatError::TooManyDims {
                path: path.to_path_buf(),
                tensor: name,
                dims,
                max: MAX_DIMS,
            })
        }
        Ints::Bad => {
            return Err(FormatError::BadShape {
                path: path.to_path_buf(),
                tensor: name,
                shape: excerpt(entry.shape.get()),
            })
        }
    };
    let offset = |v: &RawValue| {
        serde_json::from_str::<u64>(v.get()).map_err(|_| FormatError::BadTensorEntry {
            path: path.to_path_buf(),
            tensor: name.clone(),
            reason: format!(
                "data offset {} is not a non-negative integer",
                excerpt(v.get())
            ),
        })
    };
    let (begin, end) = (offset(entry.data_offsets.0)?, offset(entry.data_offsets.1)?);
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

/// One file's tensors with absolute offsets, its `__metadata__`, and the
/// findings about it.
pub type FileContents = (Vec<Tensor>, Option<BTreeMap<String, String>>, Vec<Finding>);

/// Reads one safetensors file into tensors with absolute offsets, plus its
/// metadata and the findings about it (missing `format: pt`, misaligned
/// tensors). The header's entries are moved, not copied.
pub fn read_file(file: &SourceFile, file_index: usize) -> Result<FileContents, FormatError> {
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
        findings.push(Finding::MissingFormatPt {
            file: name.clone(),
            has_metadata: header.metadata.is_some(),
        });
    }
    let data_start = header.data_start;
    let tensors = header
        .tensors
        .into_iter()
        .map(|t| {
            let offset = data_start + t.begin;
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
                len: t.end - t.begin,
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                file: file_index,
                data: DataRef::Contiguous { offset },
            }
        })
        .collect();
    Ok((tensors, header.metadata, findings))
}

/// Test fixture: writes a safetensors file of `header` (tensor entries,
/// and `__metadata__` if wanted) padded to 8 bytes, followed by `data`.
#[cfg(test)]
pub(crate) fn write_test_file(path: &std::path::Path, header: &serde_json::Value, data: &[&[u8]]) {
    let mut json = serde_json::to_vec(header).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend(json);
    for d in data {
        bytes.extend_from_slice(d);
    }
    std::fs::write(path, bytes).unwrap();
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
    fn more_than_eight_dimensions_are_refused_naming_the_tensor() {
        let nine = r#"{"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}"#;
        let err = parse(nine).unwrap_err();
        assert!(
            matches!(err, FormatError::TooManyDims { ref tensor, dims: 9, .. } if tensor == "w"),
            "{err}"
        );
        let eight = r#"{"w":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1],"data_offsets":[0,1]}}"#;
        assert_eq!(parse(eight).unwrap().tensors[0].shape, vec![1; 8]);
    }

    #[test]
    fn long_bad_values_are_quoted_short() {
        let shape = format!("[{}-1]", "1,".repeat(10_000));
        let json = format!(r#"{{"w":{{"dtype":"U8","shape":{shape},"data_offsets":[0,1]}}}}"#);
        let err = parse(&json).unwrap_err().to_string();
        assert!(err.contains("\"w\"") && err.len() < 300, "{err}");
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
