//! Name and path rules, one home for all of them: which file and folder
//! names reshard may make or follow (plain, portable to Windows), which
//! file names are weights, and how a name is shown on a terminal.
//!
//! This is a leaf module at the bottom of the stage order: every stage
//! (format reading a layout file, convert mirroring a folder, batch naming
//! outputs) asks it, and it asks no one. It knows strings and paths only;
//! refusing a name is the caller's error to raise, with the file it came
//! from. Tensor-name rules of a checkpoint (duplicates, `__metadata__`)
//! are [`crate::format::tensor_names`], which uses [`METADATA_KEY`].

use std::borrow::Cow;
use std::path::{Component, Path};

/// The header key safetensors keeps for string metadata.
pub const METADATA_KEY: &str = "__metadata__";

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

/// Text made to be printed (a rendered report, an error chain) as it may
/// reach a terminal: [`escape`] on everything but its own line breaks, so
/// an escape sequence or carriage return from a name cannot drive the
/// terminal. A newline inside a name is not told apart from the text's own
/// here: renderers escape names themselves with [`escape`].
pub fn escape_text(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c != '\n' && needs_escape(c)) {
        return Cow::Borrowed(text);
    }
    let lines: Vec<Cow<'_, str>> = text.split('\n').map(escape).collect();
    Cow::Owned(lines.join("\n"))
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

/// The first `/`-separated part of `rel` that Windows reserves
/// ([`windows_reserved`]), with the reason.
pub fn reserved_part(rel: &str) -> Option<(&str, &'static str)> {
    rel.split('/')
        .find_map(|p| windows_reserved(p).map(|why| (p, why)))
}

/// True if `name` is one plain path component: not empty, not `.` or `..`,
/// no `/`, `\` or NUL, and nothing the platform reads as a prefix or root.
/// Model names taken from folder names and file names read back from a
/// manifest must pass before they are joined to an output path.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && matches!(
            Path::new(name).components().collect::<Vec<_>>().as_slice(),
            [Component::Normal(n)] if *n == std::ffi::OsStr::new(name)
        )
}

/// Deepest relative path [`is_plain_relative`] accepts (`a/b/c` is 3).
pub const MAX_REL_DEPTH: usize = 10;

/// True if `rel` is a `/`-separated path of plain names ([`is_plain_name`]
/// each), at most [`MAX_REL_DEPTH`] deep; `""` is not. The names of files
/// copied into DST's subfolders (`1_Pooling/config.json`) must pass.
pub fn is_plain_relative(rel: &str) -> bool {
    rel.split('/').count() <= MAX_REL_DEPTH && rel.split('/').all(is_plain_name)
}

/// Suffixes of the weight files reshard reads as a checkpoint (discovery).
pub const SAFETENSORS_SUFFIX: &str = ".safetensors";
/// PyTorch's zip checkpoints.
pub const PYTORCH_SUFFIXES: [&str; 3] = [".bin", ".pt", ".pth"];

/// Names a loader or reshard itself would take for weights: never mirrored
/// as an "other" file, never left in an output reshard owns.
pub fn is_weight_name(name: &str) -> bool {
    const EXTENSIONS: [&str; 8] = [
        ".safetensors",
        ".index.json",
        ".bin",
        ".pt",
        ".pth",
        ".ckpt",
        ".pkl",
        ".gguf",
    ];
    EXTENSIONS.iter().any(|e| name.ends_with(e))
}

/// File names that look like weights to reshard or to another runtime
/// (ONNX, TF, Flax, GGUF, a variant's index): a model folder's "other"
/// files of this kind are left out, not copied.
pub fn is_weight_like(name: &str) -> bool {
    // A variant's index: `diffusion_pytorch_model.safetensors.index.fp16.json`.
    let variant_index = [".safetensors.index.", ".bin.index."]
        .iter()
        .any(|i| name.contains(i));
    is_weight_name(name)
        || variant_index
        || [".onnx", ".onnx_data", ".h5", ".msgpack", ".ot", ".gguf"]
            .iter()
            .any(|e| name.ends_with(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_must_be_plain() {
        assert!(is_plain_relative("2_Dense"));
        assert!(is_plain_relative("a/b"));
        for bad in ["", "../x", "a/../b", "/etc", "a//b", "a\\b", ".", "a/"] {
            assert!(!is_plain_relative(bad), "{bad:?}");
        }
        assert!(!is_plain_relative(&["a"; 11].join("/")));
    }

    #[test]
    fn plain_names_are_one_normal_component() {
        for ok in ["org--tiny", "a b", "model.v2", "..x", "x.."] {
            assert!(is_plain_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a\\b", "/abs", "a\0b", "./a", "a/"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
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

    #[test]
    fn text_keeps_its_line_breaks_and_escapes_the_rest() {
        assert!(matches!(escape_text("a\nb\n"), Cow::Borrowed("a\nb\n")));
        assert_eq!(escape_text("a\x1b[2J\nb\r\n"), "a\\u{1b}[2J\nb\\r\n");
        assert_eq!(escape_text("x\u{9b}31m\t"), "x\\u{9b}31m\\t");
    }
}
