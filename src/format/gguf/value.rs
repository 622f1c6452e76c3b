//! GGUF metadata values, kept typed: scalars as themselves, arrays as one
//! vector of their element type (a 256k-token vocabulary's scores are one
//! `Vec<f32>`, not 256k enum values), string arrays as one byte buffer plus
//! end offsets. What a value costs in memory is therefore about what it
//! took in the file, and the header budget bounds both.
//!
//! Display summarizes: a scalar or short string prints as itself, an array
//! as `[string; 32000]`. The full values stay available to later stages
//! (config.json and tokenizer.json are built from them).

use std::fmt;

use serde::{Serialize, Serializer};

/// The GGUF value type ids (`gguf_type` in ggml).
pub mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    /// The bytes as stored; GGUF says UTF-8, [`Value::as_str`] checks.
    String(Vec<u8>),
    Array(Array),
}

/// A typed array; nested arrays are arrays of [`Array`].
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Strings),
    Array(Vec<Array>),
}

/// An array of strings in one buffer: string `i` is
/// `bytes[ends[i - 1]..ends[i]]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Strings {
    pub(super) bytes: Vec<u8>,
    pub(super) ends: Vec<u64>,
}

impl Strings {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The bytes of string `i`.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let end = usize::try_from(*self.ends.get(i)?).ok()?;
        let start = match i {
            0 => 0,
            _ => usize::try_from(self.ends[i - 1]).ok()?,
        };
        self.bytes.get(start..end)
    }

    /// String `i` as text, `None` if it is missing or not UTF-8.
    pub fn get_str(&self, i: usize) -> Option<&str> {
        std::str::from_utf8(self.get(i)?).ok()
    }

    /// Every string's bytes, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    pub fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len() as u64);
    }
}

impl Array {
    /// Number of elements (of the outer array, for a nested one).
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type's name, as gguf-py names value types.
    pub fn elem_type(&self) -> &'static str {
        match self {
            Array::U8(_) => "uint8",
            Array::I8(_) => "int8",
            Array::U16(_) => "uint16",
            Array::I16(_) => "int16",
            Array::U32(_) => "uint32",
            Array::I32(_) => "int32",
            Array::U64(_) => "uint64",
            Array::I64(_) => "int64",
            Array::F32(_) => "float32",
            Array::F64(_) => "float64",
            Array::Bool(_) => "bool",
            Array::String(_) => "string",
            Array::Array(_) => "array",
        }
    }
}

impl Value {
    /// The type's name as gguf-py names it (`uint32`, `string`, `array`).
    pub fn type_name(&self) -> String {
        match self {
            Value::U8(_) => "uint8".into(),
            Value::I8(_) => "int8".into(),
            Value::U16(_) => "uint16".into(),
            Value::I16(_) => "int16".into(),
            Value::U32(_) => "uint32".into(),
            Value::I32(_) => "int32".into(),
            Value::U64(_) => "uint64".into(),
            Value::I64(_) => "int64".into(),
            Value::F32(_) => "float32".into(),
            Value::F64(_) => "float64".into(),
            Value::Bool(_) => "bool".into(),
            Value::String(_) => "string".into(),
            Value::Array(a) => format!("an array of {}", a.elem_type()),
        }
    }

    /// The value of any integer type, widened, if it is one.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The text of a string value, `None` for other types or bad UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => std::str::from_utf8(s).ok(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Strings longer than this print shortened.
const SHOW_STRING: usize = 120;
/// Arrays longer than this print as `[type; len]`.
const SHOW_ARRAY: usize = 8;

fn show_bytes(f: &mut fmt::Formatter<'_>, s: &[u8]) -> fmt::Result {
    let text = String::from_utf8_lossy(s);
    if text.chars().count() > SHOW_STRING {
        let short: String = text.chars().take(SHOW_STRING).collect();
        write!(f, "{short:?}... ({} bytes)", s.len())
    } else {
        write!(f, "{text:?}")
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => show_bytes(f, s),
            Value::Array(a) => write!(f, "{a}"),
        }
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, v: &[T]) -> fmt::Result {
            f.write_str("[")?;
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{x}")?;
            }
            f.write_str("]")
        }
        if self.len() > SHOW_ARRAY {
            return write!(f, "[{}; {}]", self.elem_type(), self.len());
        }
        match self {
            Array::U8(v) => list(f, v),
            Array::I8(v) => list(f, v),
            Array::U16(v) => list(f, v),
            Array::I16(v) => list(f, v),
            Array::U32(v) => list(f, v),
            Array::I32(v) => list(f, v),
            Array::U64(v) => list(f, v),
            Array::I64(v) => list(f, v),
            Array::F32(v) => list(f, v),
            Array::F64(v) => list(f, v),
            Array::Bool(v) => list(f, v),
            Array::Array(v) => list(f, v),
            Array::String(v) => {
                f.write_str("[")?;
                for (i, s) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    show_bytes(f, s)?;
                }
                f.write_str("]")
            }
        }
    }
}

/// JSON shows the summary text, as display does: the metadata of a real
/// model is megabytes of tokenizer arrays.
impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::String(v) => s.serialize_str(&String::from_utf8_lossy(v)),
            Value::Array(_) => s.collect_str(self),
            Value::Bool(v) => s.serialize_bool(*v),
            Value::F32(v) => s.serialize_f32(*v),
            Value::F64(v) => s.serialize_f64(*v),
            other => match other.as_int() {
                Some(i) => match i64::try_from(i) {
                    Ok(i) => s.serialize_i64(i),
                    Err(_) => s.serialize_u64(u64::try_from(i).unwrap_or(u64::MAX)),
                },
                None => s.collect_str(other),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_summarize_and_strings_index() {
        let mut s = Strings::default();
        for t in ["<s>", "", "a\u{e9}"] {
            s.push(t.as_bytes());
        }
        assert_eq!(s.get_str(0), Some("<s>"));
        assert_eq!(s.get_str(1), Some(""));
        assert_eq!(s.get_str(2), Some("a\u{e9}"));
        assert_eq!(s.get(3), None);
        let small = Value::Array(Array::String(s));
        assert_eq!(small.to_string(), r#"["<s>", "", "aé"]"#);
        let big = Value::Array(Array::F32(vec![0.0; 32000]));
        assert_eq!(big.to_string(), "[float32; 32000]");
        let long = Value::String(vec![b'x'; 500]);
        assert!(long.to_string().ends_with("... (500 bytes)"));
        assert_eq!(Value::U16(3).as_int(), Some(3));
        assert_eq!(Value::F32(3.0).as_int(), None);
    }
}
