//! Tensor names: which names a source may hold, and how names are shown.
//!
//! [`check`] runs once a checkpoint's tensors are read, for every format: a
//! name safetensors cannot hold (empty, or `__metadata__`, the key of its
//! metadata) and a name that appears twice are refused, naming the file and
//! the tensor, so no output shard can get a duplicate key. [`escape`] is for
//! every place a name reaches a terminal: control characters (and the
//! Unicode controls that reorder text) are shown escaped, not interpreted.

use std::borrow::Cow;
use std::path::PathBuf;

use super::{FormatError, Tensor};

/// The header key safetensors keeps for string metadata.
pub const METADATA_KEY: &str = "__metadata__";

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

/// `name` as it may be printed: control characters and bidirectional
/// controls escaped Rust-style (`\n`, `\u{1b}`, `\u{202e}`), everything else
/// as it is. Borrowed when nothing needs escaping.
pub fn escape(name: &str) -> Cow<'_, str> {
    if !name.chars().any(needs_escape) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        if needs_escape(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
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

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape("model.w"), Cow::Borrowed("model.w")));
        assert_eq!(escape("a\x1b[31mb\n"), "a\\u{1b}[31mb\\n");
        assert_eq!(escape("w\u{202e}txt"), "w\\u{202e}txt");
        assert_eq!(escape("poids.é"), "poids.é");
    }
}
