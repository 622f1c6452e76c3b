//! `fit` against `validate`: what fit predicts for reshard's own loader must
//! match what validate measures on the same checkpoint, and the emulated
//! loaders must match their formulas.

use crate::common::*;

/// A checkpoint of `shards` files, each holding `per_shard` f32 tensors of
/// `elems` elements, named as Llama layers.
fn generated(dir: &std::path::Path, shards: usize, per_shard: usize, elems: u64) {
    let mut weight_map = serde_json::Map::new();
    let bytes = elems * 4;
    for s in 0..shards {
        let name = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        for t in 0..per_shard {
            let tensor = format!("model.layers.{s}.mlp.w{t}.weight");
            let begin = t as u64 * bytes;
            header.insert(tensor.clone(), serde_json::json!({"dtype": "F32", "shape": [elems], "data_offsets": [begin, begin + bytes]}));
            weight_map.insert(tensor, serde_json::Value::String(name.clone()));
        }
        let data: Vec<u8> = (0..bytes * per_shard as u64)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        write_safetensors(&dir.join(&name), &serde_json::Value::Object(header), &data);
    }
    let index = serde_json::json!({"metadata": {"total_size": bytes * (shards * per_shard) as u64}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn within(measured: u64, predicted: u64) -> bool {
    let diff = measured.abs_diff(predicted);
    diff <= 16 << 20 || diff as f64 <= 0.10 * predicted as f64
}

#[test]
fn fit_prediction_for_reshard_matches_what_validate_measures() {
    let tmp = tempfile::tempdir().unwrap();
    // 3 shards x 4 tensors x 8 MiB: max(S) 32 MiB, max(T) 8 MiB.
    generated(tmp.path(), 3, 4, 2 << 20);
    let fit = reshard()
        .args([
            "fit",
            "--json",
            "--os",
            "linux",
            "--ram",
            "4GiB",
            "--pagefile",
            "0",
            "--loader",
            "reshard",
        ])
        .arg(tmp.path())
        .assert()
        .success();
    let fit: serde_json::Value = serde_json::from_slice(&fit.get_output().stdout).unwrap();
    let predicted = fit["today"]["loaders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["loader"] == "reshard")
        .unwrap()["peak_commit"]
        .as_u64()
        .unwrap();
    let val = reshard()
        .args([
            "validate",
            "--json",
            "--device",
            "cpu",
            "--commit-budget",
            "1GiB",
        ])
        .arg(tmp.path())
        .assert()
        .success();
    let val: serde_json::Value = serde_json::from_slice(&val.get_output().stdout).unwrap();
    let measured = val["commit"]["peak_above_baseline"].as_u64().unwrap();
    assert!(
        within(measured, predicted),
        "validate measured {measured}, fit predicted {predicted}"
    );
}
