//! The GGUF output format: one `<prefix>.gguf`, or a gguf-split set
//! `<prefix>-00001-of-0000N.gguf` (no index file: llama.cpp finds the set
//! from the first file's `split.count`).
//!
//! A file is GGUF v3, little-endian: the magic, the version, the tensor
//! and key/value counts; the key/value pairs (the plan's
//! `gguf_out.kv` in the first file only; with more than one file, every
//! file then gets `split.no` and `split.count` as u16 and
//! `split.tensors.count` as i32, as llama.cpp's gguf-split writes them);
//! the tensor infos (name, dims innermost first, GGML type, offset); zero
//! padding to [`ALIGNMENT`]; then the data in info order, each tensor
//! starting on an aligned offset and followed by zeros to the next one
//! (the executor writes the gaps), as gguf-py's `GGUFWriter` lays it out.
//! Value types are exactly those the plan holds: `to_gguf` types them as
//! gguf-py does.

use std::collections::BTreeMap;
use std::path::Path;

use super::shard_format::ShardFormat;
use super::WriteError;
use crate::format::gguf::ggml::GgmlType;
use crate::format::gguf::value::{ty, Array, Value};
use crate::plan::gguf_out::ALIGNMENT;
use crate::plan::{Plan, PlannedTensor, ShardLayout, ShardPlan};

/// GGUF files, single or gguf-split.
pub struct Gguf;

/// `x` rounded up to a multiple of [`ALIGNMENT`].
fn align(x: u64) -> u64 {
    x.div_ceil(ALIGNMENT).saturating_mul(ALIGNMENT)
}

impl ShardLayout for Gguf {
    fn shard_name(&self, prefix: &str, n: usize, count: usize) -> String {
        if count <= 1 {
            format!("{prefix}.gguf")
        } else {
            format!("{prefix}-{:05}-of-{count:05}.gguf", n + 1)
        }
    }

    fn index_name(&self, _prefix: &str, _count: usize) -> Option<String> {
        None
    }

    /// Layer order kept; each tensor at the next aligned offset, and the
    /// section padded to the alignment after the last one.
    fn lay_out(&self, tensors: &mut [PlannedTensor]) -> u64 {
        let mut offset = 0u64;
        for t in tensors.iter_mut() {
            t.offset = offset;
            offset = align(offset.saturating_add(t.len));
        }
        offset
    }

    fn shard_metadata(&self, _source: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
}

impl ShardFormat for Gguf {
    fn layout(&self) -> &dyn ShardLayout {
        self
    }

    fn header_bytes(
        &self,
        path: &Path,
        plan: &Plan,
        shard: &ShardPlan,
    ) -> Result<Vec<u8>, WriteError> {
        let bad = |reason: String| WriteError::Header {
            path: path.to_path_buf(),
            reason,
        };
        let out = plan
            .gguf_out
            .as_ref()
            .ok_or_else(|| bad("the plan has no GGUF metadata".into()))?;
        let n = plan
            .shards
            .iter()
            .position(|s| s.file == shard.file)
            .unwrap_or(0);
        let count = plan.shards.len();
        let mut kv: Vec<(&str, Value)> = Vec::new();
        if n == 0 {
            kv.extend(out.kv.0.iter().map(|(k, v)| (k.as_str(), v.clone())));
        }
        if count > 1 {
            let tensors: usize = plan.shards.iter().map(|s| s.tensors.len()).sum();
            let as_u16 = |x: usize| {
                u16::try_from(x).map_err(|_| {
                    bad(format!(
                        "{x} files or more: gguf-split counts files in a u16"
                    ))
                })
            };
            kv.push(("split.no", Value::U16(as_u16(n)?)));
            kv.push(("split.count", Value::U16(as_u16(count)?)));
            let tensors = i32::try_from(tensors).map_err(|_| {
                bad(format!(
                    "{tensors} tensors: gguf-split counts them in an i32"
                ))
            })?;
            kv.push(("split.tensors.count", Value::I32(tensors)));
        }
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&(shard.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
        for (k, v) in &kv {
            string(&mut b, k.as_bytes());
            b.extend_from_slice(&type_id(v).to_le_bytes());
            value(&mut b, v);
        }
        for t in &shard.tensors {
            string(&mut b, t.name.as_bytes());
            let dims: Vec<u64> = match t.shape.is_empty() {
                true => vec![1],
                false => t.shape.iter().rev().copied().collect(),
            };
            b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                b.extend_from_slice(&d.to_le_bytes());
            }
            let ggml = ggml_type(t).ok_or_else(|| {
                bad(format!(
                    "tensor {:?} is {}, which GGUF does not store",
                    t.name, t.dtype
                ))
            })?;
            b.extend_from_slice(&ggml.0.to_le_bytes());
            b.extend_from_slice(&t.offset.to_le_bytes());
        }
        b.resize(align(b.len() as u64) as usize, 0);
        let max = crate::format::gguf::MAX_HEADER;
        if b.len() as u64 > max {
            return Err(WriteError::HeaderTooLarge {
                path: path.to_path_buf(),
                len: b.len() as u64,
                max,
                what: format!(
                    "{} tensor infos and {} metadata keys",
                    shard.tensors.len(),
                    kv.len()
                ),
            });
        }
        Ok(b)
    }

    fn index_bytes(&self, _plan: &Plan) -> Vec<u8> {
        Vec::new()
    }
}

/// The GGML type a planned tensor is stored as.
pub fn ggml_type(t: &PlannedTensor) -> Option<GgmlType> {
    t.input.ggml().or(match t.dtype {
        crate::format::Dtype::F32 => Some(GgmlType::F32),
        crate::format::Dtype::F16 => Some(GgmlType::F16),
        crate::format::Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    })
}

fn string(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => ty::U8,
        Value::I8(_) => ty::I8,
        Value::U16(_) => ty::U16,
        Value::I16(_) => ty::I16,
        Value::U32(_) => ty::U32,
        Value::I32(_) => ty::I32,
        Value::U64(_) => ty::U64,
        Value::I64(_) => ty::I64,
        Value::F32(_) => ty::F32,
        Value::F64(_) => ty::F64,
        Value::Bool(_) => ty::BOOL,
        Value::String(_) => ty::STRING,
        Value::Array(_) => ty::ARRAY,
    }
}

fn array_type(a: &Array) -> u32 {
    match a {
        Array::U8(_) => ty::U8,
        Array::I8(_) => ty::I8,
        Array::U16(_) => ty::U16,
        Array::I16(_) => ty::I16,
        Array::U32(_) => ty::U32,
        Array::I32(_) => ty::I32,
        Array::U64(_) => ty::U64,
        Array::I64(_) => ty::I64,
        Array::F32(_) => ty::F32,
        Array::F64(_) => ty::F64,
        Array::Bool(_) => ty::BOOL,
        Array::String(_) => ty::STRING,
        Array::Array(_) => ty::ARRAY,
    }
}

fn value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => string(b, s),
        Value::Array(a) => array(b, a),
    }
}

/// An array's element type, length and elements.
fn array(b: &mut Vec<u8>, a: &Array) {
    b.extend_from_slice(&array_type(a).to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(b: &mut Vec<u8>, v: &[T], le: fn(T) -> [u8; N]) {
        for &x in v {
            b.extend_from_slice(&le(x));
        }
    }
    match a {
        Array::U8(v) => b.extend_from_slice(v),
        Array::I8(v) => each(b, v, i8::to_le_bytes),
        Array::U16(v) => each(b, v, u16::to_le_bytes),
        Array::I16(v) => each(b, v, i16::to_le_bytes),
        Array::U32(v) => each(b, v, u32::to_le_bytes),
        Array::I32(v) => each(b, v, i32::to_le_bytes),
        Array::U64(v) => each(b, v, u64::to_le_bytes),
        Array::I64(v) => each(b, v, i64::to_le_bytes),
        Array::F32(v) => each(b, v, f32::to_le_bytes),
        Array::F64(v) => each(b, v, f64::to_le_bytes),
        Array::Bool(v) => b.extend(v.iter().map(|&x| u8::from(x))),
        Array::String(v) => {
            for s in v.iter() {
                string(b, s);
            }
        }
        Array::Array(v) => {
            for inner in v {
                array(b, inner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::gguf::value::Strings;

    #[test]
    fn values_parse_back_with_their_types() {
        let mut s = Strings::default();
        s.push(b"a");
        s.push(b"bc");
        let kv = vec![
            ("u16", Value::U16(3)),
            ("i32", Value::I32(-7)),
            ("s", Value::String(b"flux".to_vec())),
            ("arr", Value::Array(Array::String(s))),
            ("f", Value::Array(Array::F32(vec![1.5, -2.0]))),
        ];
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&(kv.len() as u64).to_le_bytes());
        for (k, v) in &kv {
            string(&mut b, k.as_bytes());
            b.extend_from_slice(&type_id(v).to_le_bytes());
            value(&mut b, v);
        }
        let file = crate::format::gguf::parse_bytes(&b).unwrap();
        for (k, v) in &kv {
            assert_eq!(file.metadata.get(k), Some(v), "{k}");
        }
    }

    #[test]
    fn tensors_start_aligned_with_padding_after_each() {
        let t = |len: u64| PlannedTensor {
            name: "t".into(),
            input: crate::plan::TensorInput::Source { tensor: 0 },
            source_dtype: crate::format::Dtype::F32,
            dtype: crate::format::Dtype::F32,
            shape: vec![len / 4],
            len,
            offset: 0,
            after: None,
        };
        let mut ts = vec![t(8), t(40), t(32)];
        assert_eq!(Gguf.lay_out(&mut ts), 128);
        let offsets: Vec<u64> = ts.iter().map(|t| t.offset).collect();
        assert_eq!(offsets, [0, 32, 96]);
    }
}
