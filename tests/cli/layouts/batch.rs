//! `batch` converts a sentence-transformers model and a diffusers pipeline
//! as `convert` does (one code path): the same files at the same paths,
//! byte for byte, and (with the Python venv) outputs their libraries load.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::{loader_python, script};
use crate::batch::{batch, statuses};
use crate::common::{convert, copy_dir, fixture, run_python, tree_hashes, Program};

/// Every file under `dir` by its path under it, with its sha256.
fn files(dir: &Path) -> BTreeMap<PathBuf, String> {
    tree_hashes(dir)
        .into_iter()
        .map(|(p, h)| (p.strip_prefix(dir).unwrap().to_path_buf(), h))
        .collect()
}

/// A sentence-transformers model made of fixtures: the Transformer at the
/// root, a Pooling module without weights, a Dense module with one file.
fn sentence_transformers(dir: &Path) {
    copy_dir(&fixture("tiny-llama"), dir);
    std::fs::write(
        dir.join("modules.json"),
        r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        b"{\"max_seq_length\": 8}",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        b"{\"pooling_mode_mean_tokens\": true}",
    )
    .unwrap();
    copy_dir(&fixture("tiny-gpt2"), &dir.join("2_Dense"));
}

/// A pipeline made of fixtures: a transformers text encoder, a "unet"
/// under diffusers' names, a scheduler and a tokenizer without weights.
fn pipeline(dir: &Path) {
    copy_dir(&fixture("tiny-llama"), &dir.join("text_encoder"));
    let unet = dir.join("unet");
    std::fs::create_dir_all(&unet).unwrap();
    let gpt2 = fixture("tiny-gpt2");
    std::fs::copy(gpt2.join("config.json"), unet.join("config.json")).unwrap();
    std::fs::copy(
        gpt2.join("model.safetensors"),
        unet.join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("scheduler")).unwrap();
    std::fs::write(dir.join("scheduler/scheduler_config.json"), b"{\"x\": 1}").unwrap();
    std::fs::create_dir_all(dir.join("tokenizer")).unwrap();
    std::fs::write(dir.join("tokenizer/vocab.json"), b"{\"a\": 0}").unwrap();
    std::fs::write(
        dir.join("model_index.json"),
        r#"{"_class_name": "P", "text_encoder": ["transformers", "CLIPTextModel"],
            "unet": ["diffusers", "UNet2DConditionModel"], "scheduler": ["diffusers", "DDIMScheduler"],
            "tokenizer": ["transformers", "CLIPTokenizer"], "safety_checker": [null, null]}"#,
    )
    .unwrap();
}

#[test]
fn batch_writes_layouts_exactly_as_convert_does() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    sentence_transformers(&root.join("st"));
    pipeline(&root.join("sd"));
    let out = tmp.path().join("out");
    let opts = ["--max-shard-size", "20KiB"];
    let run = batch(&root, &out, &[&opts[..], &["--json"]].concat()).success();
    let (_, status) = statuses(&run);
    // Each layout is one model, not one per component.
    let names: Vec<&str> = status.keys().map(String::as_str).collect();
    assert_eq!(names, ["sd", "st"], "{status:?}");
    assert!(status.values().all(|(s, _)| s == "converted"), "{status:?}");

    for name in ["st", "sd"] {
        let by_convert = tmp.path().join("convert").join(name);
        convert(&root.join(name), &by_convert, &opts).success();
        let (a, b) = (files(&out.join(name)), files(&by_convert));
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "{name}: the same files"
        );
        assert_eq!(a, b, "{name}: the same bytes");
    }
    let st = out.join("st");
    for f in [
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
        "2_Dense/model.safetensors",
        "model.safetensors.index.json",
    ] {
        assert!(st.join(f).is_file(), "st/{f}");
    }
    let sd = out.join("sd");
    for f in [
        "model_index.json",
        "scheduler/scheduler_config.json",
        "tokenizer/vocab.json",
        "text_encoder/model.safetensors.index.json",
        "unet/diffusion_pytorch_model.safetensors.index.json",
    ] {
        assert!(sd.join(f).is_file(), "sd/{f}");
    }

    // A rerun is up to date; --mode validate checks every weight set.
    let again = batch(&root, &out, &[&opts[..], &["--json"]].concat()).success();
    let (_, status) = statuses(&again);
    assert!(
        status.values().all(|(s, _)| s == "up_to_date"),
        "{status:?}"
    );
    let checked = batch(&root, &out, &["--mode", "validate", "--json"]).success();
    let (_, status) = statuses(&checked);
    assert!(status.values().all(|(s, _)| s == "passed"), "{status:?}");
    // A component changed behind batch's back fails validation, naming it.
    let dense = st.join("2_Dense/model.safetensors");
    let mut bytes = std::fs::read(&dense).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&dense, bytes).unwrap();
    let checked = batch(&root, &out, &["--mode", "validate", "--json"]).code(1);
    let (_, status) = statuses(&checked);
    assert_eq!(status["st"].0, "failed", "{status:?}");
    assert!(status["st"].1.contains("2_Dense"), "{status:?}");
    // --mode fit judges the pipeline as a whole (it has no root weights).
    let fit = batch(
        &root,
        &out,
        &[
            "--json",
            "--mode",
            "fit",
            "--os",
            "linux",
            "--ram",
            "8GiB",
            "--pagefile",
            "0",
        ],
    );
    let (_, status) = statuses(&fit.success());
    assert!(status.values().all(|(s, _)| s == "passed"), "{status:?}");
}

#[test]
fn batch_outputs_load_in_their_libraries_as_converts_do() {
    let Some(py) = loader_python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    run_python(
        &py,
        Program::Script(&script()),
        &[OsStr::new("build"), tmp.path().as_os_str()],
    );
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    for name in ["st", "sd"] {
        std::fs::rename(tmp.path().join(name), root.join(name)).unwrap();
    }
    let out = tmp.path().join("out");
    let run = batch(&root, &out, &["--max-shard-size", "50KB", "--json"]).success();
    let (_, status) = statuses(&run);
    assert_eq!(status.len(), 2, "{status:?}");
    assert!(status.values().all(|(s, _)| s == "converted"), "{status:?}");
    assert!(out.join("st/1_Pooling/config.json").exists());
    assert!(out.join("st/2_Dense/model.safetensors").exists());
    assert!(out.join("sd/model_index.json").exists());
    let checks = serde_json::json!([
        {"kind": "st", "src": root.join("st"), "dst": out.join("st"), "exact": true},
        {"kind": "sd", "src": root.join("sd"), "dst": out.join("sd"), "exact": true},
    ]);
    let report = run_python(
        &py,
        Program::Script(&script()),
        &["compare", &checks.to_string()],
    );
    assert_eq!(report.matches("ok: ").count(), 2, "{report}");
}
