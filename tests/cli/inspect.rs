//! `reshard inspect` end to end.

use crate::common::*;

#[test]
fn summary_names_format_counts_and_largest_tensor() {
    let out = reshard().args(["inspect"]).arg(fixture("tiny-llama")).assert().success();
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
    let names: Vec<&str> = v["tensors"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names[0], "model.embed_tokens.weight");
    assert_eq!(names[names.len() - 1], "lm_head.weight");
    let l0 = names.iter().position(|n| n.starts_with("model.layers.0.")).unwrap();
    let l1 = names.iter().position(|n| n.starts_with("model.layers.1.")).unwrap();
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
