//! From the unpickled object to tensors with byte locations.
//!
//! This module owns two steps: reading the top-level object as a state dict
//! (name -> tensor, [`state_dict`]), and placing each tensor in the archive
//! ([`place`]): finding its storage entry, checking every byte the tensor
//! can reach lies inside that storage, and choosing the [`DataRef`] kind
//! (contiguous, strided view, or inside a deflated entry).

use std::collections::HashSet;

use super::value::{TensorSpec, Value};
use super::zip::{Entry, Method};
use super::PytorchError;
use crate::format::{DataRef, Dtype};

/// The keys under which training scripts nest a state dict.
const NESTED_KEYS: &[&str] = &["state_dict", "model"];

/// Reads the top-level object as a state dict: a dict (or OrderedDict) of
/// name -> tensor, or a dict whose `state_dict` / `model` entry is one.
/// Returns the tensors in insertion order. A name set twice (which no dict
/// torch saved can hold; a Python reader would keep the last value) is
/// refused: which of the two tensors the user meant is not ours to guess.
pub fn state_dict(root: &Value) -> Result<Vec<(String, TensorSpec)>, PytorchError> {
    let Value::Dict(pairs) = root else {
        return Err(PytorchError::NotStateDict {
            found: root.kind().to_string(),
        });
    };
    let pairs = pairs.try_borrow().map_err(|_| PytorchError::NotStateDict {
        found: "dict that is still being built".into(),
    })?;
    let all_tensors = pairs.iter().all(|(_, v)| matches!(v, Value::Tensor(_)));
    if !all_tensors {
        let nested = pairs.iter().rev().find_map(|(k, v)| match (k, v) {
            (Value::Str(k), Value::Dict(d)) if NESTED_KEYS.contains(&&**k) => Some((v, d)),
            _ => None,
        });
        if let Some((inner, d)) = nested {
            if d.try_borrow()
                .is_ok_and(|p| p.iter().all(|(_, v)| matches!(v, Value::Tensor(_))))
            {
                return tensors_of(inner);
            }
        }
    }
    tensors_of(root)
}

fn tensors_of(dict: &Value) -> Result<Vec<(String, TensorSpec)>, PytorchError> {
    let Value::Dict(pairs) = dict else {
        return Err(PytorchError::NotStateDict {
            found: dict.kind().to_string(),
        });
    };
    let pairs = pairs.try_borrow().map_err(|_| PytorchError::NotStateDict {
        found: "dict that is still being built".into(),
    })?;
    let mut out: Vec<(String, TensorSpec)> = Vec::with_capacity(pairs.len());
    let mut seen: HashSet<&str> = HashSet::with_capacity(pairs.len());
    for (k, v) in pairs.iter() {
        let Value::Str(name) = k else {
            return Err(PytorchError::NotStateDict {
                found: format!("dict with a {} key", k.kind()),
            });
        };
        let spec = match v {
            Value::Tensor(t) => match &**t {
                Ok(spec) => spec.clone(),
                Err(reason) => {
                    return Err(PytorchError::BadTensor {
                        tensor: name.to_string(),
                        reason: reason.clone(),
                    })
                }
            },
            other => {
                return Err(PytorchError::NotATensor {
                    name: name.to_string(),
                    found: other.kind().to_string(),
                })
            }
        };
        if !seen.insert(name) {
            return Err(PytorchError::DuplicateName {
                tensor: name.to_string(),
            });
        }
        out.push((name.to_string(), spec));
    }
    Ok(out)
}

/// A tensor placed in the archive: everything of [`crate::format::Tensor`]
/// except the file index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub len: u64,
    pub data: DataRef,
}

/// Places `spec` (tensor `name`) inside its storage's zip `entry`.
pub fn place(name: &str, spec: &TensorSpec, entry: &Entry) -> Result<Placed, PytorchError> {
    let bad = |reason: String| PytorchError::BadTensor {
        tensor: name.to_string(),
        reason,
    };
    let elem = whole_bytes(spec.dtype)
        .ok_or_else(|| bad(format!("dtype {} is not whole bytes", spec.dtype)))?;
    let storage_elem = whole_bytes(spec.storage.dtype).ok_or_else(|| {
        bad(format!(
            "storage dtype {} is not whole bytes",
            spec.storage.dtype
        ))
    })?;
    let storage_len = spec
        .storage
        .numel
        .checked_mul(storage_elem)
        .ok_or_else(|| {
            bad(format!(
                "storage of {} elements overflows",
                spec.storage.numel
            ))
        })?;
    if entry.size < storage_len {
        return Err(PytorchError::StorageTooSmall {
            tensor: name.to_string(),
            entry: entry.name.clone(),
            declared: storage_len,
            actual: entry.size,
        });
    }
    let numel = spec
        .shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| {
            bad(format!(
                "shape {:?} has more elements than fit in 64 bits",
                spec.shape
            ))
        })?;
    let len = spec.dtype.byte_len(numel).ok_or_else(|| {
        bad(format!(
            "shape {:?} of {} overflows in bytes",
            spec.shape, spec.dtype
        ))
    })?;
    let placed = |data| Placed {
        dtype: spec.dtype,
        shape: spec.shape.clone(),
        len,
        data,
    };
    if numel == 0 {
        return Ok(placed(DataRef::Contiguous {
            offset: entry.data_start,
        }));
    }
    let start = spec
        .offset
        .checked_mul(elem)
        .ok_or_else(|| bad(format!("storage offset {} overflows", spec.offset)))?;
    // The last element any index can reach, plus one.
    let reach = spec
        .shape
        .iter()
        .zip(&spec.strides)
        .try_fold(spec.offset, |acc, (&d, &s)| {
            acc.checked_add(d.checked_sub(1)?.checked_mul(s)?)
        })
        .and_then(|last| last.checked_add(1)?.checked_mul(elem));
    let contiguous = is_row_major(&spec.shape, &spec.strides);
    let end = if contiguous {
        start.checked_add(len)
    } else {
        reach
    };
    match end {
        Some(end) if end <= storage_len => {}
        _ => {
            return Err(PytorchError::OutOfStorage {
                tensor: name.to_string(),
                entry: entry.name.clone(),
                end: end.map_or_else(|| "more than 2^64".to_string(), |e| e.to_string()),
                storage_len,
            })
        }
    }
    let data = match (entry.method, contiguous) {
        (Method::Stored, true) => DataRef::Contiguous {
            // Inside the entry, which lies inside the file: no overflow.
            offset: entry.data_start.saturating_add(start),
        },
        (Method::Stored, false) => DataRef::Strided {
            storage: entry.data_start,
            storage_len,
            elem_offset: spec.offset,
            strides: spec.strides.clone(),
        },
        (Method::Deflated, true) => DataRef::Deflated {
            entry: entry.data_start,
            compressed_len: entry.compressed_size,
            entry_len: entry.size,
            skip: start,
        },
        (Method::Deflated, false) => {
            return Err(bad(format!(
                "is a strided view inside the compressed entry {}; re-save without compression",
                entry.name
            )))
        }
    };
    Ok(placed(data))
}

fn whole_bytes(d: Dtype) -> Option<u64> {
    d.bits().is_multiple_of(8).then_some(d.bits() / 8)
}

/// True when `strides` are the row-major strides of `shape` (dimensions of
/// size 1 may have any stride, as in torch's `is_contiguous`).
pub fn is_row_major(shape: &[u64], strides: &[u64]) -> bool {
    let mut expected = 1u64;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        match expected.checked_mul(d) {
            Some(e) => expected = e,
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::format::pytorch::value::Storage;

    fn spec(numel: u64, offset: u64, shape: &[u64], strides: &[u64]) -> TensorSpec {
        TensorSpec {
            storage: Rc::new(Storage {
                key: "0".into(),
                dtype: Dtype::F32,
                numel,
            }),
            dtype: Dtype::F32,
            offset,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        }
    }

    fn entry(size: u64, method: Method) -> Entry {
        Entry {
            name: "a/data/0".into(),
            method,
            crc32: 0,
            compressed_size: size,
            size,
            data_start: 1000,
        }
    }

    #[test]
    fn row_major_ignores_unit_dimensions() {
        assert!(is_row_major(&[2, 3], &[3, 1]));
        assert!(is_row_major(&[1, 3], &[99, 1]));
        assert!(is_row_major(&[], &[]));
        assert!(!is_row_major(&[2, 3], &[1, 2]));
    }

    #[test]
    fn contiguous_tensors_map_to_absolute_offsets() {
        let p = place(
            "w",
            &spec(12, 2, &[2, 5], &[5, 1]),
            &entry(48, Method::Stored),
        )
        .unwrap();
        assert_eq!(p.data, DataRef::Contiguous { offset: 1008 });
        assert_eq!(p.len, 40);
    }

    #[test]
    fn a_transposed_view_is_strided_and_bounds_checked() {
        let p = place(
            "t",
            &spec(6, 0, &[3, 2], &[1, 3]),
            &entry(24, Method::Stored),
        )
        .unwrap();
        assert!(matches!(
            p.data,
            DataRef::Strided {
                storage: 1000,
                storage_len: 24,
                ..
            }
        ));
        let err = place(
            "t",
            &spec(6, 1, &[3, 2], &[1, 3]),
            &entry(24, Method::Stored),
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"t\""), "{err}");
    }

    #[test]
    fn past_the_storage_end_is_an_error_naming_the_tensor() {
        let err = place("w", &spec(10, 1, &[10], &[1]), &entry(40, Method::Stored)).unwrap_err();
        assert!(
            matches!(err, PytorchError::OutOfStorage { ref tensor, .. } if tensor == "w"),
            "{err}"
        );
        let err = place(
            "w",
            &spec(u64::MAX, 0, &[1], &[1]),
            &entry(40, Method::Stored),
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"w\""), "{err}");
        let err = place(
            "w",
            &spec(10, 0, &[u64::MAX, 4], &[4, 1]),
            &entry(40, Method::Stored),
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"w\""), "{err}");
        let err = place(
            "w",
            &spec(10, u64::MAX, &[1], &[1]),
            &entry(40, Method::Stored),
        )
        .unwrap_err();
        assert!(err.to_string().contains("\"w\""), "{err}");
    }

    #[test]
    fn deflated_storages_skip_to_the_offset() {
        let p = place("w", &spec(10, 4, &[6], &[1]), &entry(40, Method::Deflated)).unwrap();
        assert_eq!(
            p.data,
            DataRef::Deflated {
                entry: 1000,
                compressed_len: 40,
                entry_len: 40,
                skip: 16
            }
        );
        assert!(place(
            "w",
            &spec(6, 0, &[3, 2], &[1, 3]),
            &entry(24, Method::Deflated)
        )
        .is_err());
    }
}
