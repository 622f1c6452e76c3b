//! `reshard inspect` end to end.

use crate::common::*;

#[test]
fn summary_names_format_counts_and_largest_tensor() {
    let out = reshard()
        .args(["inspect"])
        .arg(fixture("tiny-llama"))
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(text.contains("safetensors (single file)"), "{text}");
    assert!(text.contains("tensors       21"), "{text}");
    assert!(text.contains("model.embed_tokens.weight"), "{text}");
}

#[test]
fn json_has_exact_bytes_and_tensor_list_in_layer_order() {
    let out = reshard()
        .args(["inspect", "--json", "--tensors"])
        .arg(fixture("tiny-llama-f32-sharded"))
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(v["tensor_count"], 21);
    assert_eq!(v["total_bytes"], 875776);
    assert_eq!(v["files"].as_array().unwrap().len(), 6);
    let names: Vec<&str> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "model.embed_tokens.weight");
    assert_eq!(names[names.len() - 1], "lm_head.weight");
    let l0 = names
        .iter()
        .position(|n| n.starts_with("model.layers.0."))
        .unwrap();
    let l1 = names
        .iter()
        .position(|n| n.starts_with("model.layers.1."))
        .unwrap();
    assert!(l0 < l1);
}

#[test]
fn missing_path_exits_2_naming_it() {
    reshard()
        .args(["inspect", "/no/such/checkpoint"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("/no/such/checkpoint"));
}

#[test]
fn findings_are_reported_and_strict_exits_1() {
    use serde_json::json;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let t = |dtype: &str, n: u64, b: u64, e: u64| json!({"dtype": dtype, "shape": [n], "data_offsets": [b, e]});
    // No format: pt, and "b" misaligned at 3 bytes into the data.
    write_safetensors(
        &d.join("model-00001-of-00003.safetensors"),
        &json!({"a": t("U8", 3, 0, 3), "b": t("F32", 2, 3, 11)}),
        &[0; 11],
    );
    // In a shard the index lists, but not in the index itself.
    write_safetensors(
        &d.join("model-00002-of-00003.safetensors"),
        &json!({"c": t("U8", 1, 0, 1), "extra": t("U8", 1, 1, 2), "__metadata__": {"format": "pt"}}),
        &[0; 2],
    );
    // A shard the index never mentions.
    write_safetensors(
        &d.join("model-00003-of-00003.safetensors"),
        &json!({"z": t("U8", 1, 0, 1), "__metadata__": {"format": "pt"}}),
        &[0],
    );
    let index = json!({"metadata": {"total_size": 99}, "weight_map": {"a": "model-00001-of-00003.safetensors", "b": "model-00001-of-00003.safetensors", "c": "model-00002-of-00003.safetensors"}});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let out = reshard()
        .arg("inspect")
        .arg("--json")
        .arg(d)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let kinds: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    for want in [
        "missing_format_pt",
        "misaligned",
        "tensor_not_in_index",
        "file_not_in_index",
        "total_size_mismatch",
    ] {
        assert!(kinds.contains(&want), "{want} missing from {kinds:?}");
    }
    reshard()
        .args(["inspect", "--strict"])
        .arg(d)
        .assert()
        .code(1)
        .stdout(predicates::str::contains(
            "\"extra\" is in model-00002-of-00003.safetensors but not in the index",
        ));
}
