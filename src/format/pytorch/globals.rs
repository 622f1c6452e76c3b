//! The whitelist of pickle globals, each turned into data instead of code.
//!
//! A torch.save pickle names a handful of Python callables (`OrderedDict`,
//! `torch._utils._rebuild_tensor_v2`, storage classes, dtypes). This module
//! maps exactly those names to [`Global`] tags and gives each a pure Rust
//! meaning ([`call`]): `_rebuild_tensor_v2(...)` becomes a [`TensorSpec`],
//! `OrderedDict()` an empty dict, and so on. Any other name is refused with
//! [`PytorchError::ForbiddenGlobal`]: nothing is ever imported or run.

use std::rc::Rc;

use super::value::{Global, Storage, TensorSpec, Value};
use super::PytorchError;
use crate::format::Dtype;

/// torch's storage class names and dtype names, with reshard's dtypes.
const STORAGES: &[(&str, Dtype)] = &[
    ("FloatStorage", Dtype::F32),
    ("HalfStorage", Dtype::F16),
    ("BFloat16Storage", Dtype::BF16),
    ("DoubleStorage", Dtype::F64),
    ("LongStorage", Dtype::I64),
    ("IntStorage", Dtype::I32),
    ("ShortStorage", Dtype::I16),
    ("CharStorage", Dtype::I8),
    ("ByteStorage", Dtype::U8),
    ("BoolStorage", Dtype::BOOL),
    ("ComplexFloatStorage", Dtype::C64),
    ("Float8_e4m3fnStorage", Dtype::F8_E4M3),
    ("Float8_e5m2Storage", Dtype::F8_E5M2),
];

const DTYPES: &[(&str, Dtype)] = &[
    ("float32", Dtype::F32),
    ("float", Dtype::F32),
    ("float16", Dtype::F16),
    ("half", Dtype::F16),
    ("bfloat16", Dtype::BF16),
    ("float64", Dtype::F64),
    ("double", Dtype::F64),
    ("int64", Dtype::I64),
    ("long", Dtype::I64),
    ("int32", Dtype::I32),
    ("int", Dtype::I32),
    ("int16", Dtype::I16),
    ("short", Dtype::I16),
    ("int8", Dtype::I8),
    ("uint8", Dtype::U8),
    ("uint16", Dtype::U16),
    ("uint32", Dtype::U32),
    ("uint64", Dtype::U64),
    ("bool", Dtype::BOOL),
    ("complex64", Dtype::C64),
    ("float8_e4m3fn", Dtype::F8_E4M3),
    ("float8_e5m2", Dtype::F8_E5M2),
    ("float8_e4m3fnuz", Dtype::F8_E4M3FNUZ),
    ("float8_e5m2fnuz", Dtype::F8_E5M2FNUZ),
    ("float8_e8m0fnu", Dtype::F8_E8M0),
];

/// Resolves `module.name` against the whitelist.
pub fn resolve(module: &str, name: &str) -> Result<Global, PytorchError> {
    let found = match (module, name) {
        ("collections", "OrderedDict") => Some(Global::OrderedDict),
        ("torch._utils", "_rebuild_tensor_v2") => Some(Global::RebuildTensorV2),
        ("torch._utils", "_rebuild_tensor_v3") => Some(Global::RebuildTensorV3),
        ("torch._utils", "_rebuild_parameter") => Some(Global::RebuildParameter),
        ("torch._utils", "_rebuild_parameter_with_state") => {
            Some(Global::RebuildParameterWithState)
        }
        ("torch" | "torch.storage", "UntypedStorage") => Some(Global::UntypedStorage),
        ("torch", "Size") => Some(Global::Size),
        ("torch", "device") => Some(Global::Device),
        ("torch", "strided") => Some(Global::Strided),
        ("torch.serialization", "_get_layout") => Some(Global::GetLayout),
        ("_codecs", "encode") => Some(Global::CodecsEncode),
        ("torch", n) => STORAGES
            .iter()
            .find(|(s, _)| *s == n)
            .map(|&(_, d)| Global::StorageType(d))
            .or_else(|| {
                DTYPES
                    .iter()
                    .find(|(s, _)| *s == n)
                    .map(|&(_, d)| Global::Dtype(d))
            }),
        _ => None,
    };
    found.ok_or_else(|| PytorchError::ForbiddenGlobal {
        global: format!("{module}.{name}"),
    })
}

/// Reads a persistent id (the argument of `BINPERSID`).
pub fn storage(pid: &Value) -> Result<Storage, String> {
    let bad = || "persistent id is not ('storage', type, key, location, numel)".to_string();
    let Value::Tuple(items) = pid else {
        return Err(bad());
    };
    let [Value::Str(tag), ty, Value::Str(key), _location, Value::Int(numel)] = items.as_slice()
    else {
        return Err(bad());
    };
    if &**tag != "storage" {
        return Err(bad());
    }
    let dtype = match ty {
        Value::Global(Global::StorageType(d)) => *d,
        Value::Global(Global::UntypedStorage) => Dtype::U8,
        other => {
            return Err(format!(
                "persistent id names a {} as its storage type",
                other.kind()
            ))
        }
    };
    let numel =
        u64::try_from(*numel).map_err(|_| format!("storage {key:?} has negative size {numel}"))?;
    Ok(Storage {
        key: key.to_string(),
        dtype,
        numel,
    })
}

/// Bytes the result of [`call`] holds beyond its own [`Value`]: a tensor's
/// spec with its shape and strides, a byte string, a new dict. The pickle
/// machine charges this to its budget.
pub fn cost(v: &Value) -> u64 {
    match v {
        Value::Tensor(t) => {
            let dims = t
                .as_ref()
                .as_ref()
                .map_or(0, |s| s.shape.len() + s.strides.len());
            (std::mem::size_of::<TensorSpec>() + 32 + 8 * dims) as u64
        }
        Value::Bytes(b) => b.len() as u64 + 16,
        Value::Dict(_) | Value::List(_) | Value::Tuple(_) => 64,
        _ => 0,
    }
}

/// The meaning of `callable(*args)` for a whitelisted callable.
pub fn call(g: Global, args: &[Value]) -> Result<Value, String> {
    match (g, args) {
        (Global::OrderedDict, []) => Ok(Value::Dict(Rc::default())),
        (
            Global::RebuildTensorV2,
            [storage, offset, size, stride, _, _] | [storage, offset, size, stride, _, _, _],
        ) => Ok(tensor(storage, offset, size, stride, None)),
        (
            Global::RebuildTensorV3,
            [storage, offset, size, stride, _, _, dtype]
            | [storage, offset, size, stride, _, _, dtype, _],
        ) => Ok(tensor(storage, offset, size, stride, Some(dtype))),
        (Global::RebuildParameter, [data @ Value::Tensor(_), _, _])
        | (Global::RebuildParameterWithState, [data @ Value::Tensor(_), _, _, _]) => {
            Ok(data.clone())
        }
        (Global::Size, [size @ Value::Tuple(_)]) => Ok(size.clone()),
        (Global::Device, [Value::Str(s)] | [Value::Str(s), _]) => Ok(Value::Str(Rc::clone(s))),
        (Global::GetLayout, [Value::Str(_)]) => Ok(Value::Global(Global::Strided)),
        (Global::CodecsEncode, [Value::Str(s), Value::Str(enc)])
            if matches!(&**enc, "latin1" | "latin-1") =>
        {
            let bytes: Option<Vec<u8>> =
                s.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect();
            bytes
                .map(|b| Value::Bytes(b.into()))
                .ok_or_else(|| "_codecs.encode of a non-latin-1 string".to_string())
        }
        _ => Err(format!(
            "{} called with arguments torch.save never writes",
            name(g)
        )),
    }
}

fn name(g: Global) -> &'static str {
    match g {
        Global::OrderedDict => "collections.OrderedDict",
        Global::RebuildTensorV2 => "torch._utils._rebuild_tensor_v2",
        Global::RebuildTensorV3 => "torch._utils._rebuild_tensor_v3",
        Global::RebuildParameter => "torch._utils._rebuild_parameter",
        Global::RebuildParameterWithState => "torch._utils._rebuild_parameter_with_state",
        Global::StorageType(_) => "a torch storage type",
        Global::UntypedStorage => "torch.UntypedStorage",
        Global::Dtype(_) => "a torch dtype",
        Global::Size => "torch.Size",
        Global::Device => "torch.device",
        Global::CodecsEncode => "_codecs.encode",
        Global::GetLayout => "torch.serialization._get_layout",
        Global::Strided => "torch.strided",
    }
}

/// Builds a tensor value; bad arguments are kept as the error, to be
/// reported with the tensor's name.
fn tensor(
    storage: &Value,
    offset: &Value,
    size: &Value,
    stride: &Value,
    dtype: Option<&Value>,
) -> Value {
    Value::Tensor(Rc::new(tensor_spec(storage, offset, size, stride, dtype)))
}

fn tensor_spec(
    storage: &Value,
    offset: &Value,
    size: &Value,
    stride: &Value,
    dtype: Option<&Value>,
) -> Result<TensorSpec, String> {
    let Value::Storage(storage) = storage else {
        return Err(format!(
            "its storage is a {}, not a storage",
            storage.kind()
        ));
    };
    let offset = match offset {
        Value::Int(o) => u64::try_from(*o).map_err(|_| format!("negative storage offset {o}"))?,
        other => return Err(format!("its storage offset is a {}", other.kind())),
    };
    let shape = ints(size).ok_or("its size is not a tuple of non-negative integers")?;
    let strides = ints(stride).ok_or("its stride is not a tuple of non-negative integers")?;
    if shape.len() != strides.len() {
        return Err(format!(
            "size has {} dimensions but stride has {}",
            shape.len(),
            strides.len()
        ));
    }
    let dtype = match dtype {
        None => storage.dtype,
        Some(Value::Global(Global::Dtype(d))) => *d,
        Some(other) => return Err(format!("its dtype is a {}", other.kind())),
    };
    Ok(TensorSpec {
        storage: Rc::clone(storage),
        dtype,
        offset,
        shape,
        strides,
    })
}

/// A tuple (or torch.Size) of non-negative integers.
fn ints(v: &Value) -> Option<Vec<u64>> {
    let Value::Tuple(items) = v else { return None };
    items
        .iter()
        .map(|i| match i {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_names_resolve_and_others_are_refused() {
        assert_eq!(
            resolve("torch", "BFloat16Storage").unwrap(),
            Global::StorageType(Dtype::BF16)
        );
        assert_eq!(
            resolve("torch", "float8_e4m3fn").unwrap(),
            Global::Dtype(Dtype::F8_E4M3)
        );
        assert_eq!(
            resolve("collections", "OrderedDict").unwrap(),
            Global::OrderedDict
        );
        for (m, n) in [
            ("builtins", "eval"),
            ("posix", "system"),
            ("torch", "load"),
            ("os", "system"),
            ("torch._utils", "_rebuild_from_type_v2"),
        ] {
            let err = resolve(m, n).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{m}.{n}")) && err.contains("run code"),
                "{err}"
            );
        }
    }

    #[test]
    fn codecs_encode_is_latin1_only() {
        let s = |t: &str| Value::Str(t.into());
        let Ok(Value::Bytes(ref b)) = call(Global::CodecsEncode, &[s("a\u{ff}"), s("latin1")])
        else {
            panic!()
        };
        assert_eq!(&b[..], &[b'a', 0xff]);
        assert!(call(Global::CodecsEncode, &[s("\u{100}"), s("latin1")]).is_err());
        assert!(call(Global::CodecsEncode, &[s("a"), s("utf-8")]).is_err());
    }

    #[test]
    fn non_callables_are_refused() {
        assert!(call(Global::StorageType(Dtype::F32), &[]).is_err());
        assert!(call(Global::Dtype(Dtype::F32), &[]).is_err());
        assert!(call(Global::OrderedDict, &[Value::Int(1)]).is_err());
    }
}
