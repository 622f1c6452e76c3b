//! Names reshard makes from data stay portable to Windows.

use std::path::Path;

use super::stderr;
use crate::common::{convert, copy_fixture, reshard, write_safetensors};

/// On Windows `DST/CON/CON.safetensors` is the console and `aux.json` a
/// device: a component, a layout path or a mirrored file under such a name
/// wrote outside the output. Each is refused with exit 2 naming it, on
/// every platform, before anything is written.
#[test]
fn windows_device_names_from_the_data_are_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let gone = |dst: &Path| assert!(!dst.exists(), "{} was written", dst.display());

    // --split-components: `text_encoders.NAME.` names the folder.
    let all_in_one = tmp.path().join("all.safetensors");
    write_safetensors(
        &all_in_one,
        &serde_json::json!({
            "model.diffusion_model.a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
            "text_encoders.con.b": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]},
        }),
        &[1, 2],
    );
    let dst = tmp.path().join("split");
    let err = stderr(
        &reshard()
            .args(["convert", "--no-progress", "--split-components"])
            .arg(&all_in_one)
            .arg(&dst)
            .assert()
            .code(2),
    );
    assert!(
        err.contains("\"con\"")
            && err.contains("text_encoders.con.b")
            && err.contains("portable to Windows"),
        "{err}"
    );
    gone(&dst);
    // ... and through --component-prefix, which also fixes it.
    let err = stderr(
        &reshard()
            .args([
                "convert",
                "--no-progress",
                "--split-components",
                "--component-prefix",
                "NUL=text_encoders.con.",
            ])
            .arg(&all_in_one)
            .arg(&dst)
            .assert()
            .code(2),
    );
    assert!(
        err.contains("NUL=text_encoders.con.") && err.contains("portable to Windows"),
        "{err}"
    );
    gone(&dst);
    reshard()
        .args([
            "convert",
            "--no-progress",
            "--split-components",
            "--component-prefix",
            "clip=text_encoders.con.",
        ])
        .arg(&all_in_one)
        .arg(&dst)
        .assert()
        .success();
    assert!(dst.join("clip/clip.safetensors").is_file());

    // A mirrored file, at the top or in a folder on the way.
    for (i, rel) in ["aux.json", "extra/CON/notes.txt", "notes."]
        .into_iter()
        .enumerate()
    {
        let src = copy_fixture("tiny-llama", &tmp.path().join(format!("m{i}")));
        let path = src.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"x").unwrap();
        let dst = tmp.path().join(format!("out{i}"));
        let err = stderr(&convert(&src, &dst, &[]).code(2));
        let part = rel
            .split('/')
            .find(|p| *p == "aux.json" || *p == "CON" || *p == "notes.")
            .unwrap();
        assert!(
            err.contains(&format!("{part:?}")) && err.contains("portable to Windows"),
            "{rel}: {err}"
        );
        gone(&dst);
    }

    // A pipeline component named after a device in model_index.json.
    let src = copy_fixture("tiny-llama", &tmp.path().join("p0"));
    std::fs::write(
        src.join("model_index.json"),
        r#"{"_class_name": "P", "Com1": ["transformers", "T"]}"#,
    )
    .unwrap();
    let dst = tmp.path().join("pipe0");
    let err = stderr(&convert(&src, &dst, &[]).code(2));
    assert!(
        err.contains("model_index.json") && err.contains("\"Com1\""),
        "{err}"
    );
    gone(&dst);

    // A device name deep in a component's folder: found before the root
    // job writes, not after.
    let root = tmp.path().join("p1");
    std::fs::create_dir(&root).unwrap();
    copy_fixture("tiny-llama", &root);
    std::fs::rename(root.join("tiny-llama"), root.join("text_encoder")).unwrap();
    std::fs::write(
        root.join("model_index.json"),
        r#"{"_class_name": "P", "text_encoder": ["transformers", "T"]}"#,
    )
    .unwrap();
    std::fs::write(root.join("text_encoder/lpt9.txt"), b"x").unwrap();
    let dst = tmp.path().join("pipe1");
    let err = stderr(&convert(&root, &dst, &[]).code(2));
    assert!(
        err.contains("\"lpt9.txt\"") && err.contains("device"),
        "{err}"
    );
    gone(&dst);
    // Names that only look alike are fine.
    std::fs::rename(
        root.join("text_encoder/lpt9.txt"),
        root.join("text_encoder/console.txt"),
    )
    .unwrap();
    convert(&root, &dst, &[]).success();
    assert!(dst.join("text_encoder/console.txt").is_file());
}
