//! `--single-file` and `--split-components`: one streamed file per weight
//! set, and an all-in-one checkpoint split into components whose union is
//! the input.

use std::collections::BTreeMap;
use std::path::Path;

use super::{names_in, stderr};
use crate::common::{convert, reshard};

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
    // The dry run shows the plans convert executes: no cast for the kept
    // vae (it once showed the vae cast to bf16, which convert does not write).
    let dry = reshard()
        .args([
            "convert",
            "--split-components",
            "--dtype",
            "bf16",
            "--dry-run",
            "--json",
        ])
        .args(["--keep-dtype-preset", "vae", "--keep-dtype-preset", "norms"])
        .arg(&src)
        .arg(tmp.path().join("dry"))
        .output()
        .unwrap();
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let plans: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    let casts_of = |c: &str| {
        plans
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["component"]["name"] == c)
            .unwrap_or_else(|| panic!("no plan for {c}: {plans}"))["plan"]["casts"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(casts_of("vae"), 0, "the kept vae is planned without a cast");
    assert!(casts_of("unet") > 0);
    assert!(!tmp.path().join("dry").exists(), "a dry run writes nothing");
    let dtype_of = |c: &str, t: &str| {
        read_st(&cast.join(c).join(format!("{c}.safetensors"))).entries[t]
            .0
            .clone()
    };
    assert_eq!(dtype_of("vae", "encoder.conv_in.weight"), "\"F32\"");
    // A scheduler's table is not a weight: `other` keeps its dtype.
    assert_eq!(dtype_of("other", "alphas_cumprod"), "\"F32\"");
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

/// Two prefixes naming one component (`model.diffusion_model.` and
/// `text_encoders.unet.` are both `unet`), or names equal but for case (one
/// folder on Windows), are refused with exit 2 naming the tensor: they once
/// stripped two tensors to one name and panicked writing the header.
#[test]
fn split_components_refuses_two_prefixes_for_one_folder() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, (a, b)) in [
        ("model.diffusion_model.a", "text_encoders.unet.a"),
        ("text_encoders.Clip.a", "text_encoders.clip.b"),
    ]
    .into_iter()
    .enumerate()
    {
        let src = tmp.path().join(format!("s{i}.safetensors"));
        crate::common::write_safetensors(
            &src,
            &serde_json::json!({
                a: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                b: {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]},
            }),
            &[1, 2],
        );
        let out = reshard()
            .args(["convert", "--no-progress", "--split-components"])
            .arg(&src)
            .arg(tmp.path().join(format!("o{i}")))
            .assert()
            .code(2);
        let err = stderr(&out);
        assert!(
            err.contains(&format!("s{i}.safetensors")) && err.contains(b),
            "{err}"
        );
    }
}
