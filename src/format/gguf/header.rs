//! Parsing one GGUF file's header: magic, version, key/value pairs, tensor
//! infos, then the checks that tie them to the file (alignment, offsets,
//! lengths).
//!
//! Layout (v2 and v3, little-endian): `"GGUF"`, `u32` version, `u64` tensor
//! count, `u64` key/value count; each pair is a string key, a `u32` value
//! type and the value; each tensor info is a string name, a `u32` number of
//! dimensions, that many `u64` dims (ggml order, innermost first), a `u32`
//! GGML type and a `u64` data offset. A string is a `u64` length and its
//! bytes; an array is a `u32` element type, a `u64` length and the
//! elements. The data section starts at the end of the infos rounded up to
//! `general.alignment` (a `u32` power of two, default 32); each tensor's
//! offset is relative to it and a multiple of the alignment.

use super::cursor::{Cursor, Source};
use super::error::GgufError;
use super::ggml::GgmlType;
use super::model::refuse_duplicate_tensors;
use super::model::{
    GgufFile, GgufTensor, Metadata, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_HEADER,
    MAX_KEYS, MAX_NAME, MAX_STRING,
};
use super::value::{ty, Array, Strings, Value};
use crate::format::read::open_regular;
use crate::format::{FormatError, MAX_TENSORS};
use std::path::Path;

/// Memory a tensor info costs beyond its file bytes (the struct, the
/// vectors' headers), charged to the budget.
const TENSOR_OVERHEAD: u64 = 96;
/// Memory a key/value pair costs beyond its file bytes (the pair, the key's
/// and the value's headers).
const KV_OVERHEAD: u64 = 64;
/// Memory a nested array costs beyond its 12 file bytes.
const NESTED_OVERHEAD: u64 = std::mem::size_of::<Array>() as u64;

/// Parses and checks the header of the GGUF bytes in `src`, charging at
/// most `budget` bytes of reads and memory.
pub fn parse<S: Source + ?Sized>(src: &S, budget: u64) -> Result<GgufFile, GgufError> {
    let file_len = src.size();
    let mut cur = Cursor::new(src, file_len, budget);
    let at_head = || "the file header".to_string();
    let magic: [u8; 4] = cur.array(&at_head)?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic {
            found: String::from_utf8_lossy(&magic).into_owned(),
        });
    }
    let version = cur.u32(&at_head)?;
    if version & 0xffff == 0 && version != 0 {
        // As gguf-py tells the byte order: a small version read backwards.
        return Err(GgufError::BigEndian);
    }
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors = cur.u64(&at_head)?;
    let n_keys = cur.u64(&at_head)?;
    if n_tensors > MAX_TENSORS as u64 {
        return Err(GgufError::TooManyTensors {
            count: n_tensors,
            max: MAX_TENSORS,
        });
    }
    if n_keys > MAX_KEYS {
        return Err(GgufError::TooManyKeys {
            count: n_keys,
            max: MAX_KEYS,
        });
    }
    let mut kvs = Vec::new();
    for i in 0..n_keys {
        let key = name(&mut cur, &|| format!("the name of key/value pair {i}"))?;
        let at = || format!("key {key:?}");
        cur.charge(KV_OVERHEAD, &at)?;
        let vty = cur.u32(&at)?;
        let value = value(&mut cur, vty, &key, 0)?;
        kvs.try_reserve(1)
            .map_err(|_| too_large(&cur, "the key/value pairs"))?;
        kvs.push((key, value));
    }
    let metadata = Metadata::new(kvs)?;
    let mut tensors = Vec::new();
    let mut rel_offsets = Vec::new();
    for i in 0..n_tensors {
        let (t, rel) = tensor_info(&mut cur, i)?;
        tensors
            .try_reserve(1)
            .and_then(|()| rel_offsets.try_reserve(1))
            .map_err(|_| too_large(&cur, "the tensor infos"))?;
        tensors.push(t);
        rel_offsets.push(rel);
    }
    refuse_duplicate_tensors(&tensors)?;
    let alignment = alignment(&metadata)?;
    let header_len = cur.pos();
    let data_start = align_up(header_len, alignment).ok_or(GgufError::Truncated {
        file_len,
        at: "the padding before the data".into(),
    })?;
    place_tensors(&mut tensors, &rel_offsets, data_start, alignment, file_len)?;
    Ok(GgufFile {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
        file_len,
    })
}

fn too_large<S: Source + ?Sized>(cur: &Cursor<'_, S>, at: &str) -> GgufError {
    GgufError::HeaderTooLarge {
        max: cur.budget(),
        at: at.into(),
    }
}

/// `x` rounded up to a multiple of `align` (a power of two).
pub(super) fn align_up(x: u64, align: u64) -> Option<u64> {
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// A key or tensor name: UTF-8, at most [`MAX_NAME`] bytes.
fn name<S: Source + ?Sized>(
    cur: &mut Cursor<'_, S>,
    at: &dyn Fn() -> String,
) -> Result<String, GgufError> {
    let len = cur.u64(at)?;
    if len > MAX_NAME {
        return Err(GgufError::StringTooLong {
            at: at(),
            len,
            max: MAX_NAME,
        });
    }
    let mut bytes = Vec::new();
    cur.bytes_into(len, &mut bytes, at)?;
    String::from_utf8(bytes).map_err(|_| GgufError::NotUtf8 { at: at() })
}

/// A string value's bytes, at most [`MAX_STRING`], appended to `out`.
fn string_into<S: Source + ?Sized>(
    cur: &mut Cursor<'_, S>,
    out: &mut Vec<u8>,
    at: &dyn Fn() -> String,
) -> Result<(), GgufError> {
    let len = cur.u64(at)?;
    if len > MAX_STRING {
        return Err(GgufError::StringTooLong {
            at: at(),
            len,
            max: MAX_STRING,
        });
    }
    cur.bytes_into(len, out, at)
}

fn value<S: Source + ?Sized>(
    cur: &mut Cursor<'_, S>,
    vty: u32,
    key: &str,
    depth: usize,
) -> Result<Value, GgufError> {
    let at = || format!("key {key:?}");
    Ok(match vty {
        ty::U8 => Value::U8(u8::from_le_bytes(cur.array(&at)?)),
        ty::I8 => Value::I8(i8::from_le_bytes(cur.array(&at)?)),
        ty::U16 => Value::U16(u16::from_le_bytes(cur.array(&at)?)),
        ty::I16 => Value::I16(i16::from_le_bytes(cur.array(&at)?)),
        ty::U32 => Value::U32(u32::from_le_bytes(cur.array(&at)?)),
        ty::I32 => Value::I32(i32::from_le_bytes(cur.array(&at)?)),
        ty::U64 => Value::U64(u64::from_le_bytes(cur.array(&at)?)),
        ty::I64 => Value::I64(i64::from_le_bytes(cur.array(&at)?)),
        ty::F32 => Value::F32(f32::from_le_bytes(cur.array(&at)?)),
        ty::F64 => Value::F64(f64::from_le_bytes(cur.array(&at)?)),
        ty::BOOL => Value::Bool(cur.array::<1>(&at)?[0] != 0),
        ty::STRING => {
            let mut s = Vec::new();
            string_into(cur, &mut s, &at)?;
            Value::String(s)
        }
        ty::ARRAY => Value::Array(array(cur, key, depth + 1)?),
        other => {
            return Err(GgufError::UnknownValueType {
                key: key.into(),
                ty: other,
            })
        }
    })
}

/// The fewest file bytes one element of type `ety` takes.
fn min_elem_bytes(ety: u32) -> Option<u64> {
    Some(match ety {
        ty::U8 | ty::I8 | ty::BOOL => 1,
        ty::U16 | ty::I16 => 2,
        ty::U32 | ty::I32 | ty::F32 => 4,
        ty::U64 | ty::I64 | ty::F64 | ty::STRING => 8,
        ty::ARRAY => 12,
        _ => return None,
    })
}

/// Reads `len` fixed-size elements in one bounded vector.
fn fixed<S: Source + ?Sized, T, const N: usize>(
    cur: &mut Cursor<'_, S>,
    len: u64,
    at: &dyn Fn() -> String,
    conv: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    // The caller checked len * N against the budget left.
    let mut out = Vec::new();
    out.try_reserve_exact(len as usize)
        .map_err(|_| too_large(cur, "an array"))?;
    for _ in 0..len {
        out.push(conv(cur.array(at)?));
    }
    Ok(out)
}

fn array<S: Source + ?Sized>(
    cur: &mut Cursor<'_, S>,
    key: &str,
    depth: usize,
) -> Result<Array, GgufError> {
    let at = || format!("key {key:?}");
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::ArrayTooDeep {
            key: key.into(),
            max: MAX_ARRAY_DEPTH,
        });
    }
    let ety = cur.u32(&at)?;
    let len = cur.u64(&at)?;
    let Some(min) = min_elem_bytes(ety) else {
        return Err(GgufError::UnknownValueType {
            key: key.into(),
            ty: ety,
        });
    };
    if len.checked_mul(min).is_none_or(|b| b > cur.left()) {
        return Err(GgufError::ArrayTooLong {
            key: key.into(),
            len,
            left: cur.left(),
        });
    }
    Ok(match ety {
        ty::U8 => {
            let mut v = Vec::new();
            cur.bytes_into(len, &mut v, &at)?;
            Array::U8(v)
        }
        ty::I8 => Array::I8(fixed(cur, len, &at, i8::from_le_bytes)?),
        ty::BOOL => Array::Bool(fixed(cur, len, &at, |b: [u8; 1]| b[0] != 0)?),
        ty::U16 => Array::U16(fixed(cur, len, &at, u16::from_le_bytes)?),
        ty::I16 => Array::I16(fixed(cur, len, &at, i16::from_le_bytes)?),
        ty::U32 => Array::U32(fixed(cur, len, &at, u32::from_le_bytes)?),
        ty::I32 => Array::I32(fixed(cur, len, &at, i32::from_le_bytes)?),
        ty::F32 => Array::F32(fixed(cur, len, &at, f32::from_le_bytes)?),
        ty::U64 => Array::U64(fixed(cur, len, &at, u64::from_le_bytes)?),
        ty::I64 => Array::I64(fixed(cur, len, &at, i64::from_le_bytes)?),
        ty::F64 => Array::F64(fixed(cur, len, &at, f64::from_le_bytes)?),
        ty::STRING => {
            let mut s = Strings::default();
            s.ends
                .try_reserve_exact(len as usize)
                .map_err(|_| too_large(cur, "a string array"))?;
            for _ in 0..len {
                string_into(cur, &mut s.bytes, &at)?;
                s.ends.push(s.bytes.len() as u64);
            }
            Array::String(s)
        }
        _ => {
            let mut v = Vec::new();
            for _ in 0..len {
                cur.charge(NESTED_OVERHEAD, &at)?;
                v.try_reserve(1)
                    .map_err(|_| too_large(cur, "a nested array"))?;
                v.push(array(cur, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

/// One tensor info, its offset still relative to the data section.
fn tensor_info<S: Source + ?Sized>(
    cur: &mut Cursor<'_, S>,
    i: u64,
) -> Result<(GgufTensor, u64), GgufError> {
    let name = name(cur, &|| format!("the name of tensor info {i}"))?;
    let at = || format!("tensor {name:?}");
    cur.charge(TENSOR_OVERHEAD, &at)?;
    if name.is_empty() {
        return Err(GgufError::BadName {
            tensor: name,
            reason: "the name is empty".into(),
        });
    }
    let n_dims = cur.u32(&at)?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            dims: n_dims,
            max: MAX_DIMS,
        });
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        ne.push(cur.u64(&at)?);
    }
    let ggml_type = GgmlType(cur.u32(&at)?);
    let rel = cur.u64(&at)?;
    let bad = |reason: &str| GgufError::BadShape {
        tensor: name.clone(),
        shape: ne.clone(),
        reason: reason.into(),
    };
    if ne.iter().any(|&d| d > i64::MAX as u64) {
        return Err(bad("has a dimension past 2^63 - 1"));
    }
    let numel = ne
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("has more elements than 2^64"))?;
    let len = match ggml_type.layout() {
        None => None,
        Some(layout) => {
            let row = ne.first().copied().unwrap_or(1);
            if !row.is_multiple_of(layout.block) {
                return Err(bad(&format!(
                    "has rows of {row} elements, not a multiple of the {}-element {ggml_type} block",
                    layout.block
                )));
            }
            Some(
                layout
                    .byte_len(numel)
                    .ok_or_else(|| bad(&format!("of {ggml_type} needs more than 2^64 bytes")))?,
            )
        }
    };
    let mut shape = ne;
    shape.reverse();
    let tensor = GgufTensor {
        name,
        ggml_type,
        shape,
        file: 0,
        offset: 0,
        len,
    };
    Ok((tensor, rel))
}

/// `general.alignment`: a `u32` power of two, 32 if absent.
fn alignment(metadata: &Metadata) -> Result<u64, GgufError> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(Value::U32(a)) => Err(GgufError::BadAlignment { value: (*a).into() }),
        Some(other) => Err(GgufError::WrongKeyType {
            key: "general.alignment".into(),
            expected: "uint32",
            found: other.type_name(),
        }),
    }
}

/// Turns relative offsets into absolute ones and checks them: each aligned,
/// each at or after the end of the one before it (info order, no overlap),
/// each ending inside the file.
fn place_tensors(
    tensors: &mut [GgufTensor],
    rel: &[u64],
    data_start: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let mut prev_end = data_start;
    for i in 0..tensors.len() {
        let (done, rest) = tensors.split_at_mut(i);
        let t = &mut rest[0];
        let offset = rel[i];
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::Misaligned {
                tensor: t.name.clone(),
                offset,
                alignment,
            });
        }
        let past = |end: u64| GgufError::PastEnd {
            tensor: t.name.clone(),
            end,
            file_len,
        };
        let abs = data_start
            .checked_add(offset)
            .ok_or_else(|| past(u64::MAX))?;
        if abs < prev_end {
            let other = &done[i - 1];
            return Err(GgufError::Overlap {
                tensor: t.name.clone(),
                offset,
                other: other.name.clone(),
                end: prev_end - data_start,
            });
        }
        let end = abs
            .checked_add(t.len.unwrap_or(0))
            .ok_or_else(|| past(u64::MAX))?;
        if end > file_len || (t.len.is_none() && abs > file_len) {
            return Err(past(end));
        }
        t.offset = abs;
        prev_end = end;
    }
    Ok(())
}

/// Parses a GGUF header from bytes (fuzzing, tests), under [`MAX_HEADER`].
pub fn parse_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    parse(bytes, MAX_HEADER)
}

/// Reads and checks the header of the GGUF file at `path` through bounded
/// positioned reads.
pub fn read_header(path: &Path) -> Result<GgufFile, FormatError> {
    let wrap = |source| FormatError::Gguf {
        path: path.to_path_buf(),
        source,
    };
    let file = open_regular(path, u64::MAX)?;
    // Surface a failing stat here; `Source::size` of a file would read it as 0.
    file.metadata().map_err(|e| FormatError::io(path, e))?;
    parse(&file, MAX_HEADER).map_err(wrap)
}
