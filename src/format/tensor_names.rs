//! Tensor names of a checkpoint: which names a source may hold.
//!
//! [`check`] runs once a checkpoint's tensors are read, for every format: a
//! name safetensors cannot hold (empty, or `__metadata__`, the key of its
//! metadata) and a name that appears twice are refused, naming the file and
//! the tensor, so no output shard can get a duplicate key. File and path
//! rules, and how names are shown, are [`crate::names`].

use std::path::PathBuf;

use super::{FormatError, Tensor};
use crate::names::METADATA_KEY;

/// Refuses names the output format cannot hold and names that appear twice.
/// `paths[t.file]` is the file a tensor came from. Costs one `u32` a tensor:
/// duplicates are found by sorting indices, without copying names.
pub fn check(paths: &[PathBuf], tensors: &[Tensor]) -> Result<(), FormatError> {
    let path_of = |t: &Tensor| paths.get(t.file).cloned().unwrap_or_default();
    for t in tensors {
        let reason = if t.name.is_empty() {
            "an empty name cannot be a safetensors key"
        } else if t.name == METADATA_KEY {
            "__metadata__ is the key safetensors keeps for metadata; a tensor cannot have it"
        } else {
            continue;
        };
        return Err(FormatError::BadTensorName {
            path: path_of(t),
            tensor: t.name.clone(),
            reason,
        });
    }
    let mut order: Vec<u32> = (0..tensors.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        let (a, b) = (&tensors[a as usize], &tensors[b as usize]);
        (a.name.as_str(), a.file).cmp(&(b.name.as_str(), b.file))
    });
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0] as usize], &tensors[w[1] as usize]);
        if a.name != b.name {
            continue;
        }
        return Err(if a.file == b.file {
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
        });
    }
    Ok(())
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
