//! `convert --dtype`: casts inside the streaming pipeline, the overflow
//! policy end to end, --keep-dtype, the config.json rewrite, the report.

use std::path::Path;

use serde_json::json;

use crate::common::*;

#[test]
fn f32_to_bf16_equals_torch_cast_of_the_same_model() {
    // tiny-llama holds torch's bf16 cast of the weights tiny-llama-f32-sharded holds.
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("bf16");
    convert(
        &fixture("tiny-llama-f32-sharded"),
        &dst,
        &["--dtype", "bf16", "--max-shard-size", "200KB"],
    )
    .success();
    assert_matches_expected(&dst, "tiny-llama");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dst.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["dtype"], "bfloat16");
    // Other keys keep their order.
    let src_cfg =
        std::fs::read_to_string(fixture("tiny-llama-f32-sharded").join("config.json")).unwrap();
    let keys = |s: &str| {
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(s)
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keys(&src_cfg),
        keys(&std::fs::read_to_string(dst.join("config.json")).unwrap())
    );
}

#[test]
fn widening_then_narrowing_round_trips_bit_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let wide = tmp.path().join("f32");
    let back = tmp.path().join("bf16");
    convert(&fixture("tiny-llama"), &wide, &["--dtype", "f32"]).success();
    convert(&wide, &back, &["--dtype", "bf16"]).success();
    assert_matches_expected(&back, "tiny-llama");
}

/// A bf16 checkpoint with one tensor holding values past f16's range.
fn overflowing(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    // bf16 bits: 1.0 = 0x3f80, 1e5 ~ 0x47c3, -7e4 ~ 0xc789, ids as I64.
    let big: Vec<u8> = [0x3f80u16, 0x47c3, 0xc789, 0x3f80]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let norm: Vec<u8> = [0x3f80u16, 0x3f80]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let ids: Vec<u8> = [1i64, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut data = big.clone();
    data.extend(&norm);
    data.extend(&ids);
    let header = json!({
        "__metadata__": {"format": "pt"},
        "model.layers.0.mlp.w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
        "model.norm.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [8, 12]},
        "position_ids": {"dtype": "I64", "shape": [2], "data_offsets": [16, 32]},
        "pad": {"dtype": "U8", "shape": [4], "data_offsets": [12, 16]},
    });
    data.splice(12..12, [0u8; 4]);
    write_safetensors(&src.join("model.safetensors"), &header, &data);
    std::fs::write(
        src.join("config.json"),
        r#"{"torch_dtype": "bfloat16", "hidden_size": 2}"#,
    )
    .unwrap();
    src
}

#[test]
fn overflow_is_an_error_naming_the_tensor_and_nothing_is_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = overflowing(tmp.path());
    let dst = tmp.path().join("out");
    convert(&src, &dst, &["--dtype", "f16"]).code(2).stderr(
        predicates::str::contains("model.layers.0.mlp.w")
            .and(predicates::str::contains("2 BF16 values overflow F16")),
    );
    assert!(!dst.join("model.safetensors").exists());
    assert!(!dst.join("reshard.json").exists());
}

use predicates::prelude::PredicateBooleanExt;

#[test]
fn saturate_and_inf_policies_are_applied_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let src = overflowing(tmp.path());
    for (policy, want_big, want_neg) in
        [("saturate", 0x7bffu16, 0xfbffu16), ("inf", 0x7c00, 0xfc00)]
    {
        let dst = tmp.path().join(policy);
        let out = convert(
            &src,
            &dst,
            &["--dtype", "f16", "--on-overflow", policy, "--json"],
        )
        .success();
        let summary: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
        let bytes = std::fs::read(dst.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let w = st.tensor("model.layers.0.mlp.w").unwrap();
        assert_eq!(w.dtype(), safetensors::Dtype::F16);
        let vals: Vec<u16> = w
            .data()
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(vals, [0x3c00, want_big, want_neg, 0x3c00], "{policy}");
        // Integers are never cast.
        assert_eq!(
            st.tensor("position_ids").unwrap().dtype(),
            safetensors::Dtype::I64
        );
        assert_eq!(st.tensor("pad").unwrap().dtype(), safetensors::Dtype::U8);
        let records: Vec<&serde_json::Value> = summary["manifest"]["shards"][0]["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .collect();
        let w_rec = records
            .iter()
            .find(|t| t["name"] == "model.layers.0.mlp.w")
            .unwrap();
        assert_eq!(w_rec["cast"]["overflow"], 2, "{policy}");
        assert_eq!(w_rec["cast"]["from"], "BF16");
        let cfg = std::fs::read_to_string(dst.join("config.json")).unwrap();
        assert!(cfg.contains("\"torch_dtype\": \"float16\""), "{cfg}");
        assert!(!cfg.contains("\"dtype\": \"bfloat16\""), "{cfg}");
    }
}

#[test]
fn keep_dtype_globs_keep_matching_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(
        &fixture("tiny-llama-f32-sharded"),
        &dst,
        &["--dtype", "bf16", "--keep-dtype", "*norm*"],
    )
    .success();
    let ck = reshard::format::open(&dst).unwrap();
    for t in &ck.tensors {
        let want = if t.name.contains("norm") {
            "F32"
        } else {
            "BF16"
        };
        assert_eq!(t.dtype.name(), want, "{}", t.name);
    }
}

#[test]
fn casting_to_f8_is_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(&fixture("tiny-llama"), &dst, &["--dtype", "F8_E4M3"])
        .code(2)
        .stderr(predicates::str::contains("needs scales"))
        .stderr(predicates::str::contains("--quantize fp8"));
    convert(&fixture("tiny-llama"), &dst, &["--dtype", "int8"])
        .code(2)
        .stderr(predicates::str::contains("bf16, f16, f32 or f64"));
    assert!(!dst.exists());
}

#[test]
fn dry_run_shows_bytes_before_and_after_per_pair() {
    let tmp = tempfile::tempdir().unwrap();
    let out = convert(
        &fixture("tiny-llama-f32-sharded"),
        &tmp.path().join("x"),
        &["--dtype", "f16", "--dry-run"],
    )
    .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(
        text.contains("cast F32 -> F16: 21 tensors, 855.25 KiB -> 427.62 KiB"),
        "{text}"
    );
}

/// A cast reads its input from mappings of the source unless
/// `--no-mmap` asks for plain reads: both give the same files, the
/// manifest's hashes included, and (the fixture) torch's bits. The window
/// makes the 2.4 MB tensor take several mappings; the fixture's tensors are
/// all small, which a mapped shard reads.
#[test]
fn mapped_input_and_forced_read_write_give_identical_casts() {
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big");
    std::fs::create_dir_all(&big).unwrap();
    let n = 600_001u32;
    let mut data: Vec<u8> = (0..n)
        .flat_map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) >> 2).to_le_bytes())
        .collect();
    let a_end = data.len();
    data.extend((0..1000u32).flat_map(|i| (i as f32 * 0.37).to_le_bytes()));
    let header = json!({
        "model.embed.weight": {"dtype": "F32", "shape": [n], "data_offsets": [0, a_end]},
        "model.norm.weight": {"dtype": "F32", "shape": [1000], "data_offsets": [a_end, data.len()]},
    });
    write_safetensors(&big.join("model.safetensors"), &header, &data);
    for (name, src, shard) in [
        ("fixture", fixture("tiny-llama-f32-sharded"), "100KiB"),
        ("big", big.clone(), "4MB"),
    ] {
        // "keep": no cast, the mapped-copy path.
        for dtype in ["bf16", "f16", "keep"] {
            let fast = tmp.path().join(format!("{name}-{dtype}-mapped"));
            let slow = tmp.path().join(format!("{name}-{dtype}-read"));
            let mut args = vec![
                "--max-shard-size",
                shard,
                "--window",
                "1MiB",
                "--threads",
                "2",
            ];
            if dtype != "keep" {
                args.extend(["--dtype", dtype, "--on-overflow", "inf"]);
            }
            let files = assert_same_without_mmap(&src, &fast, &slow, &args);
            // A shard and the manifest at least (the lock file, which
            // this count once included, is removed as the run ends).
            assert!(files >= 2, "{name} {dtype}: {files} files");
            if name == "fixture" && dtype == "bf16" {
                assert_matches_expected(&fast, "tiny-llama");
            }
        }
    }
}
