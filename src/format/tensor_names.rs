//! Tensor names of a checkpoint: which names a source may hold.
//!
//! [`check`] runs once a checkpoint's tensors are read, for every format: a
//! name safetensors cannot hold ([`unholdable`]: empty, or `__metadata__`,
//! the key of its metadata) and a name that appears twice
//! ([`first_repeat`]) are refused, naming the file and the tensor, so no
//! output shard can get a duplicate key. The planner applies the same two
//! rules to every name it derives (a stripped prefix, a scheme's suffix, a
//! GGUF name mapped to Hugging Face's). File and path rules, and how names
//! are shown, are [`crate::names`].

use std::path::PathBuf;

use super::{FormatError, Tensor};
use crate::names::METADATA_KEY;

/// Why a tensor cannot be named `name` in a safetensors header, or `None`.
pub fn unholdable(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("an empty name cannot be a safetensors key")
    } else if name == METADATA_KEY {
        Some("__metadata__ is the key safetensors keeps for metadata; a tensor cannot have it")
    } else {
        None
    }
}

/// The first two of `n` items whose names are equal, smallest name first,
/// or `None`. `key(i)` is item `i`'s name and a tie-break (which of the two
/// comes first). Costs one `u32` an item: indices are sorted, names are
/// not copied.
pub fn first_repeat<'a>(
    n: usize,
    key: impl Fn(usize) -> (&'a str, usize),
) -> Option<(usize, usize)> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_unstable_by(|&a, &b| key(a as usize).cmp(&key(b as usize)));
    order
        .windows(2)
        .map(|w| (w[0] as usize, w[1] as usize))
        .find(|&(a, b)| key(a).0 == key(b).0)
}

/// Refuses names the output format cannot hold and names that appear twice.
/// `paths[t.file]` is the file a tensor came from.
pub fn check(paths: &[PathBuf], tensors: &[Tensor]) -> Result<(), FormatError> {
    let path_of = |t: &Tensor| paths.get(t.file).cloned().unwrap_or_default();
    if let Some((t, reason)) = tensors
        .iter()
        .find_map(|t| unholdable(&t.name).map(|r| (t, r)))
    {
        return Err(FormatError::BadTensorName {
            path: path_of(t),
            tensor: t.name.clone(),
            reason,
        });
    }
    let key = |i: usize| (tensors[i].name.as_str(), tensors[i].file);
    let Some((a, b)) = first_repeat(tensors.len(), key) else {
        return Ok(());
    };
    let (a, b) = (&tensors[a], &tensors[b]);
    Err(if a.file == b.file {
        FormatError::DuplicateTensor {
            path: path_of(a),
            tensor: a.name.clone(),
        }
    } else {
        FormatError::TensorInTwoFiles {
            tensor: a.name.clone(),
            first: path_of(a),
            second: path_of(b),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DataRef, Dtype};

    fn t(name: &str, file: usize) -> Tensor {
        Tensor {
            name: name.into(),
            dtype: Dtype::U8,
            shape: vec![1],
            len: 1,
            file,
            data: DataRef::Contiguous { offset: 0 },
        }
    }

    #[test]
    fn unholdable_and_repeated_names_are_refused_naming_the_file() {
        let paths = [PathBuf::from("a.bin"), PathBuf::from("b.bin")];
        let err = check(&paths, &[t("w", 0), t("__metadata__", 1)]).unwrap_err();
        assert!(
            matches!(&err, FormatError::BadTensorName { path, tensor, .. } if tensor == "__metadata__" && path.ends_with("b.bin")),
            "{err}"
        );
        assert!(matches!(
            check(&paths, &[t("", 0)]),
            Err(FormatError::BadTensorName { .. })
        ));
        assert!(matches!(
            check(&paths, &[t("w", 0), t("x", 0), t("w", 0)]),
            Err(FormatError::DuplicateTensor { tensor, .. }) if tensor == "w"
        ));
        assert!(matches!(
            check(&paths, &[t("w", 1), t("w", 0)]),
            Err(FormatError::TensorInTwoFiles { first, .. }) if first.ends_with("a.bin")
        ));
        check(&paths, &[t("w", 0), t("x", 1)]).unwrap();
    }
}
