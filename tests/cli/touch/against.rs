//! `validate --against SRC` takes the source as the evidence: a source
//! tensor missing from the output is excused only when the source proves
//! it tied to one the output holds, never on the output manifest's word.

use serde_json::json;

use crate::common::*;

fn two_tensors(path: &std::path::Path, names: &[&str]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let start = data.len();
        data.extend((0..64u32).flat_map(|v| ((v + 100 * i as u32) as f32).to_le_bytes()));
        header.insert(
            name.to_string(),
            json!({"dtype": "F32", "shape": [64], "data_offsets": [start, data.len()]}),
        );
    }
    write_safetensors(path, &serde_json::Value::Object(header), &data);
}

#[test]
fn a_dropped_tensor_the_source_does_not_prove_tied_fails_validate_against() {
    let tmp = tempfile::tempdir().unwrap();
    let full = tmp.path().join("full.safetensors");
    two_tensors(&full, &["a.weight", "b.weight"]);
    let partial = tmp.path().join("partial.safetensors");
    two_tensors(&partial, &["a.weight"]);
    let dst = tmp.path().join("out");
    convert(&partial, &dst, &[]).success();
    // The output's manifest claims b.weight was dropped as a's twin.
    let manifest_path = dst.join("reshard.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    manifest["dropped"] = json!([{"tensor": "b.weight", "same_as": "a.weight"}]);
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let out = reshard()
        .arg("validate")
        .arg(&dst)
        .arg("--against")
        .arg(&full)
        .assert()
        .code(1);
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        stdout.contains("tensor \"b.weight\" is only in the source"),
        "{stdout}"
    );
}

#[test]
fn a_tie_the_source_proves_still_passes() {
    // GPT-2's lm_head shares wte's storage in the .bin.
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let src = fixture("tiny-gpt2-bin");
    convert(&src, &dst, &["--dedupe-tied"]).success();
    reshard()
        .arg("validate")
        .arg(&dst)
        .arg("--against")
        .arg(&src)
        .assert()
        .success();
}
