//! Names reshard makes from data stay portable to Windows, and mirrored
//! files follow their source into an output that is otherwise up to date.

use std::path::Path;

use super::stderr;
use crate::common::{convert, copy_fixture, reshard, write_safetensors};

fn stdout(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stdout).into_owned()
}

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

    // A mirrored file, at the top or in a folder on the way. Windows cannot
    // hold such a name in a source at all, so there the cases that need one
    // in SRC are skipped; the names reshard makes from data are checked
    // everywhere.
    let source_can_hold_device_names = !cfg!(windows);
    for (i, rel) in ["aux.json", "extra/CON/notes.txt", "notes."]
        .into_iter()
        .enumerate()
        .filter(|_| source_can_hold_device_names)
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
    let dst = tmp.path().join("pipe1");
    if source_can_hold_device_names {
        std::fs::write(root.join("text_encoder/lpt9.txt"), b"x").unwrap();
        let err = stderr(&convert(&root, &dst, &[]).code(2));
        assert!(
            err.contains("\"lpt9.txt\"") && err.contains("device"),
            "{err}"
        );
        gone(&dst);
        std::fs::remove_file(root.join("text_encoder/lpt9.txt")).unwrap();
    }
    // Names that only look alike are fine.
    std::fs::write(root.join("text_encoder/console.txt"), b"x").unwrap();
    convert(&root, &dst, &[]).success();
    assert!(dst.join("text_encoder/console.txt").is_file());
}

fn mtime(path: &Path) -> std::time::SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

/// A rerun into a finished output said "up to date" from the manifest and
/// kept a stale config.json after the source's was edited. Now the copy is
/// refreshed, and only it: the shards are not rewritten.
#[test]
fn a_rerun_refreshes_a_mirrored_file_edited_in_the_source_without_rewriting_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    let dst = tmp.path().join("out");
    convert(&src, &dst, &[]).success();
    let shard = dst.join("model.safetensors");
    let shard_mtime = mtime(&shard);
    let generation = mtime(&dst.join("generation_config.json"));

    let edited = b"{\"model_type\": \"llama\", \"edited\": true}\n";
    std::fs::write(src.join("config.json"), edited).unwrap();
    let run = convert(&src, &dst, &[]).success();
    let out = stdout(&run);
    assert!(
        out.contains("up to date")
            && out.contains("refreshed 1 file changed in the source: config.json"),
        "{out}"
    );
    assert_eq!(std::fs::read(dst.join("config.json")).unwrap(), edited);
    assert_eq!(mtime(&shard), shard_mtime, "the shard was rewritten");
    assert_eq!(
        mtime(&dst.join("generation_config.json")),
        generation,
        "an unchanged file was recopied"
    );
    // Recorded now: the next rerun writes nothing.
    let out = stdout(&convert(&src, &dst, &[]).success());
    assert!(out.contains("nothing written"), "{out}");

    // A copy removed from DST is put back.
    std::fs::remove_file(dst.join("generation_config.json")).unwrap();
    let out = stdout(&convert(&src, &dst, &[]).success());
    assert!(
        out.contains("refreshed 1 file") && out.contains("generation_config.json"),
        "{out}"
    );

    // A manifest from before the records: every mirrored file is recopied
    // once, the shards kept.
    let manifest_path = dst.join("reshard.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    assert!(
        m["copied_sources"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "{m:#}"
    );
    m.as_object_mut().unwrap().remove("copied_sources");
    std::fs::write(&manifest_path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let run = convert(&src, &dst, &["--json"]).success();
    let s: serde_json::Value = serde_json::from_slice(&run.get_output().stdout).unwrap();
    assert_eq!(s["up_to_date"], true, "{s:#}");
    let refreshed: Vec<&str> = s["refreshed_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        refreshed,
        ["config.json", "expected.json", "generation_config.json"]
    );
    assert_eq!(mtime(&shard), shard_mtime, "the shard was rewritten");

    // A new source file whose name DST holds as the user's own file is
    // not replaced.
    std::fs::write(dst.join("notes.txt"), b"mine").unwrap();
    std::fs::write(src.join("notes.txt"), b"theirs").unwrap();
    let run = convert(&src, &dst, &[]).success();
    assert!(stderr(&run).contains("notes.txt"), "{}", stderr(&run));
    assert_eq!(std::fs::read(dst.join("notes.txt")).unwrap(), b"mine");
}
