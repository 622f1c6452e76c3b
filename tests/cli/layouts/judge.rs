//! `fit` and `validate` on a folder of several weight sets (a diffusers
//! pipeline as `convert` writes it): fit judges all sets together, as the
//! library holds them once loaded; validate checks each set on its own.

use std::path::Path;

use crate::common::{convert, copy_dir, fixture, reshard};

/// A pipeline of two components with weights and a scheduler without.
pub(crate) fn pipeline(root: &Path) -> std::path::PathBuf {
    let src = root.join("pipe");
    copy_dir(&fixture("tiny-llama"), &src.join("text_encoder"));
    copy_dir(&fixture("tiny-llama-f32-sharded"), &src.join("unet"));
    std::fs::create_dir_all(src.join("scheduler")).unwrap();
    std::fs::write(src.join("scheduler/scheduler_config.json"), b"{}").unwrap();
    std::fs::write(
        src.join("model_index.json"),
        r#"{"_class_name": "P", "text_encoder": ["transformers", "CLIPTextModel"], "unet": ["diffusers", "UNet2DConditionModel"], "scheduler": ["diffusers", "DDIMScheduler"]}"#,
    )
    .unwrap();
    src
}

fn json(args: &[&str], path: &Path) -> (i32, serde_json::Value) {
    let out = reshard()
        .args(args)
        .arg(path)
        .arg("--json")
        .output()
        .unwrap();
    let value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), value)
}

#[test]
fn fit_judges_a_pipeline_as_all_its_components_together() {
    let tmp = tempfile::tempdir().unwrap();
    let src = pipeline(tmp.path());
    let (code, whole) = json(&["fit"], &src);
    assert_eq!(code, 0, "{whole:#}");
    let (_, te) = json(&["fit"], &src.join("text_encoder"));
    let (_, unet) = json(&["fit"], &src.join("unet"));
    for key in ["tensor_sum", "shard_sum", "shard_count"] {
        let sum = te["today"][key].as_u64().unwrap() + unet["today"][key].as_u64().unwrap();
        assert_eq!(whole["today"][key], sum, "{key}");
    }
    let max = |key: &str| {
        te["today"][key]
            .as_u64()
            .unwrap()
            .max(unet["today"][key].as_u64().unwrap())
    };
    assert_eq!(whole["today"]["tensor_max"], max("tensor_max"));
    let text = reshard().arg("fit").arg(&src).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("its 2 weight sets together"), "{text}");
}

#[test]
fn validate_checks_each_component_of_a_converted_pipeline() {
    let tmp = tempfile::tempdir().unwrap();
    let src = pipeline(tmp.path());
    let dst = tmp.path().join("out");
    convert(&src, &dst, &["--max-shard-size", "200KB"]).success();
    let out = reshard()
        .arg("validate")
        .arg(&dst)
        .arg("--against")
        .arg(&src)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("[text_encoder]") && text.contains("[unet]"),
        "{text}"
    );
    assert!(text.contains("all 2 weight sets passed"), "{text}");
    let (code, report) = json(&["validate"], &dst);
    assert_eq!(code, 0);
    assert_eq!(report["passed"], true);
    let names: Vec<&str> = report["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["component"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["text_encoder", "unet"]);

    // One flipped byte in one component fails the whole, naming it.
    let shard = std::fs::read_dir(dst.join("unet"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&shard, bytes).unwrap();
    let out = reshard().arg("validate").arg(&dst).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("failed: unet"), "{text}");
}

/// The dry run of a pipeline shows the plans convert executes, from the
/// same per-component options: `--keep-dtype-preset vae` keeps the vae out
/// of a cast in both (the dry run once planned it cast), and a component
/// its library reads as one file is planned as one file.
#[test]
fn the_dry_run_of_a_pipeline_plans_what_convert_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = pipeline(tmp.path());
    copy_dir(&fixture("tiny-llama-f32-sharded"), &src.join("vae"));
    std::fs::write(
        src.join("model_index.json"),
        r#"{"_class_name": "P", "text_encoder": ["transformers", "CLIPTextModel"], "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"], "scheduler": ["diffusers", "DDIMScheduler"]}"#,
    )
    .unwrap();
    let dst = tmp.path().join("out");
    let flags = ["--dtype", "bf16", "--keep-dtype-preset", "vae"];
    let out = reshard()
        .args(["convert", "--dry-run", "--json"])
        .args(flags)
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plans: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = |path: &str| {
        plans
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["path"] == path)
            .unwrap_or_else(|| panic!("no plan for {path}: {plans}"))["plan"]
            .clone()
    };
    assert_eq!(plan("vae")["casts"].as_array().unwrap().len(), 0);
    assert!(!plan("unet")["casts"].as_array().unwrap().is_empty());
    assert!(!dst.exists(), "a dry run writes nothing");
    // What convert writes agrees, shard for shard.
    convert(&src, &dst, &flags).success();
    for component in ["vae", "unet", "text_encoder"] {
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dst.join(component).join("reshard.json")).unwrap(),
        )
        .unwrap();
        let written: Vec<&str> = manifest["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["file"].as_str().unwrap())
            .collect();
        let planned: Vec<String> = plan(component)["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["file"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(written, planned, "{component}");
    }
}
