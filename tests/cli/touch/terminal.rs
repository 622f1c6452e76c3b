//! Names read from disk reach the terminal escaped (issue 30): a model
//! folder whose name holds a terminal escape or a newline was printed raw
//! by batch's listing, report and reasons, by convert's summary and by
//! every error chain, so a name could recolour, clear or forge lines of the
//! output.

use std::process::Output;

use super::*;
use crate::common::*;

/// What a run printed on both streams, checked to hold no raw escape and to
/// show the folder's name escaped.
fn assert_escaped(what: &str, out: &Output) {
    let both = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
    let text = String::from_utf8_lossy(&both);
    assert!(!both.contains(&0x1b), "{what} printed a raw ESC:\n{text}");
    assert!(
        text.contains("evil\\u{1b}[31mred\\nline"),
        "{what} does not show the name escaped:\n{text}"
    );
    assert!(
        !text.lines().any(|l| l.starts_with("line")),
        "{what} printed the name's newline raw:\n{text}"
    );
}

#[test]
fn folder_names_with_terminal_escapes_are_printed_escaped() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let name = "evil\x1b[31mred\nline";
    copy_dir(&fixture("tiny-llama"), &root.join(name));
    // A second such model whose weights are broken: its reason names it.
    let broken = root.join(format!("{name}-broken"));
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("model.safetensors"), b"\x08\0\0\0\0\0\0\0{}").unwrap();
    let out = tmp.path().join("out");
    let batch = |extra: &[&str]| {
        reshard()
            .arg("batch")
            .arg(&root)
            .arg("--out")
            .arg(&out)
            .arg("--no-progress")
            .args(extra)
            .output()
            .unwrap()
    };
    assert_escaped("batch --dry-run", &batch(&["--dry-run"]));
    let ran = batch(&[]);
    assert_eq!(ran.status.code(), Some(1), "{}", stderr_of(&ran));
    assert_escaped("batch", &ran);
    let dst = out.join(name).join("again");
    assert_escaped("convert", &convert_out(&root.join(name), &dst, &[]));
    let missing = root.join(name).join("missing.safetensors");
    let failed = run(&["inspect".as_ref(), missing.as_os_str()]);
    assert_eq!(failed.status.code(), Some(2));
    assert_escaped("an error", &failed);
    // JSON keeps its own escaping: the name reads back as it is.
    let json = batch(&["--json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let names: Vec<_> = report["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    assert!(names.iter().any(|n| n == name), "{names:?}");
}

/// A newline in a file or tensor name broke validate's and fit's lines:
/// a shard named `model\nfake passed.safetensors` printed a line reading
/// `fake passed.safetensors ...` of its own. Names are escaped in every
/// line those renderers print.
#[test]
fn a_newline_in_a_name_never_starts_a_line() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model\nfake");
    std::fs::create_dir(&model).unwrap();
    let header = serde_json::json!({
        "layers.0\nfake.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    });
    write_safetensors(&model.join("w\nfake.safetensors"), &header, &[0u8; 16]);
    let runs: [&[&str]; 3] = [
        &["validate"],
        &["fit", "--os", "linux", "--ram", "8GiB"],
        &[
            "fit",
            "--for",
            "transformers",
            "--os",
            "linux",
            "--ram",
            "8GiB",
        ],
    ];
    for args in runs {
        let out = reshard().args(args).arg(&model).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            !text.lines().any(|l| l.starts_with("fake")),
            "{args:?}: a name started a line:\n{text}"
        );
        assert!(
            text.contains("\\nfake"),
            "{args:?}: the name is shown escaped:\n{text}"
        );
    }
}
