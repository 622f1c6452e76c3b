//! Tensor names: which names a source may hold, and how names are shown.
//!
//! [`check`] runs once a checkpoint's tensors are read, for every format: a
//! name safetensors cannot hold (empty, or `__metadata__`, the key of its
//! metadata) and a name that appears twice are refused, naming the file and
//! the tensor, so no output shard can get a duplicate key. [`escape`] is for
//! every place a name reaches a terminal: control characters (and the
//! Unicode controls that reorder text) are shown escaped, not interpreted.
//! [`windows_reserved`] is for every file or folder name reshard makes from
//! data (a component name, a path a layout file lists, a mirrored file): a
//! name Windows reads as a device would write outside the output there.

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

/// Why Windows cannot hold `name` as a file or folder name, or `None`:
/// CON, PRN, AUX, NUL, COM0-COM9, LPT0-LPT9 (also COM¹²³ and LPT¹²³) and
/// CONIN$, CONOUT$ are devices, in any case and with any extension
/// (`nul.safetensors`, `Con .txt`), so `DST/CON/CON.safetensors` writes to
/// the console; a trailing dot or space is dropped by Windows, so the name
/// would be another file's. Refused on every platform: the output must be
/// portable to Windows. COM0 and LPT0 are refused because Microsoft's
/// naming rules list them, though not every Windows opens them as devices.
pub fn windows_reserved(name: &str) -> Option<&'static str> {
    if name.ends_with(['.', ' ']) && name != "." && name != ".." {
        return Some("Windows drops a trailing dot or space, so it would name another file there");
    }
    // The device is the part before the first dot, trailing spaces ignored.
    let stem = name.split('.').next().unwrap_or(name).trim_end_matches(' ');
    let upper = stem.to_ascii_uppercase();
    let device = match upper.as_str() {
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$" => true,
        _ => ["COM", "LPT"].iter().any(|p| {
            upper.strip_prefix(p).is_some_and(|n| {
                matches!(
                    n,
                    "0" | "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" | "¹" | "²" | "³"
                )
            })
        }),
    };
    device.then_some(
        "Windows reserves it for a device (CON, PRN, AUX, NUL, COM0-9, LPT0-9, with any extension), so writing it there would write to the device, outside the output",
    )
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
    fn windows_device_names_are_refused_in_any_case_and_with_any_extension() {
        for bad in [
            "con",
            "CON",
            "Con.txt",
            "nul.safetensors",
            "NUL.tar.gz",
            "aux",
            "prn.json",
            "com1",
            "COM9",
            "com0",
            "lpt9.x",
            "LPT1",
            "lpt0",
            "com¹",
            "conin$",
            "CONOUT$.log",
            "nul .txt",
            "con ",
            "nul ",
            "aux.",
            "model.",
            "x ",
            "config.json.",
        ] {
            assert!(windows_reserved(bad).is_some(), "{bad:?} must be refused");
        }
        for ok in [
            "console",
            "con_",
            "conx.txt",
            "com10",
            "lpt",
            "com",
            "comA",
            "nullable",
            "auxiliary.json",
            "x.con",
            "my.nul",
            "unet",
            "text_encoder",
            "1_Pooling",
            "config.json",
            ".gitattributes",
            "a b",
            "_con",
        ] {
            assert_eq!(windows_reserved(ok), None, "{ok:?} must be allowed");
        }
        // The reason says why, for the error to show.
        assert!(windows_reserved("CON").unwrap().contains("device"));
        assert!(windows_reserved("aux.").unwrap().contains("trailing dot"));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape("model.w"), Cow::Borrowed("model.w")));
        assert_eq!(escape("a\x1b[31mb\n"), "a\\u{1b}[31mb\\n");
        assert_eq!(escape("w\u{202e}txt"), "w\\u{202e}txt");
        assert_eq!(escape("poids.é"), "poids.é");
    }
}
