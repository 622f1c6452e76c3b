//! Typed reads of GGUF metadata, each failing with the key it read.

use crate::format::gguf::value::{Array, Strings, Value};
use crate::format::gguf::Metadata;

use super::error::GgufHfError;

fn wrong(key: &str, expected: &'static str, v: &Value) -> GgufHfError {
    GgufHfError::WrongType {
        key: key.into(),
        expected,
        found: v.type_name(),
    }
}

pub(super) fn missing(key: &str) -> GgufHfError {
    GgufHfError::MissingKey { key: key.into() }
}

/// A non-negative integer of any width.
pub(super) fn uint(md: &Metadata, key: &str) -> Result<Option<u64>, GgufHfError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    v.as_int()
        .and_then(|i| u64::try_from(i).ok())
        .map(Some)
        .ok_or_else(|| wrong(key, "a non-negative integer", v))
}

pub(super) fn require_uint(md: &Metadata, key: &str) -> Result<u64, GgufHfError> {
    uint(md, key)?.ok_or_else(|| missing(key))
}

/// A number. An f32 is read as the shortest decimal that round-trips it,
/// so `1e-5` stored as f32 comes back as `1e-05`, not
/// `9.999999747378752e-06`.
pub(super) fn float(md: &Metadata, key: &str) -> Result<Option<f64>, GgufHfError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let x = match *v {
        Value::F32(x) => f32_to_f64(x),
        Value::F64(x) => x,
        _ => match v.as_int() {
            Some(i) => i as f64,
            None => return Err(wrong(key, "a number", v)),
        },
    };
    if x.is_finite() {
        Ok(Some(x))
    } else {
        Err(GgufHfError::BadValue {
            key: key.into(),
            why: format!("{x} is not a finite number"),
        })
    }
}

/// The f64 whose shortest decimal is the f32's.
pub(super) fn f32_to_f64(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

pub(super) fn string<'a>(md: &'a Metadata, key: &str) -> Result<Option<&'a str>, GgufHfError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| wrong(key, "a UTF-8 string", v)),
    }
}

pub(super) fn boolean(md: &Metadata, key: &str) -> Result<Option<bool>, GgufHfError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong(key, "a bool", v)),
    }
}

pub(super) fn strings<'a>(md: &'a Metadata, key: &str) -> Result<Option<&'a Strings>, GgufHfError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Array(Array::String(s))) => Ok(Some(s)),
        Some(v) => Err(wrong(key, "an array of string", v)),
    }
}

/// An integer array of any element type, widened.
pub(super) fn ints(md: &Metadata, key: &str) -> Result<Option<Vec<i64>>, GgufHfError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    fn widen<T: Copy + Into<i64>>(v: &[T]) -> Vec<i64> {
        v.iter().map(|&x| x.into()).collect()
    }
    Ok(Some(match v {
        Value::Array(Array::I32(a)) => widen(a),
        Value::Array(Array::U32(a)) => widen(a),
        Value::Array(Array::I8(a)) => widen(a),
        Value::Array(Array::U8(a)) => widen(a),
        Value::Array(Array::I16(a)) => widen(a),
        Value::Array(Array::U16(a)) => widen(a),
        Value::Array(Array::I64(a)) => a.clone(),
        _ => return Err(wrong(key, "an array of integers", v)),
    }))
}
