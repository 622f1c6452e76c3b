//! Memory of dequantizing FP8 with very many scales (issue 30): a block
//! row of scales is held in segments, never whole, by convert and by
//! `validate --against` alike.

use std::ffi::OsStr;
use std::time::Duration;

use serde_json::json;

use crate::common::*;

/// A `[1, 2^24]` FP8 weight of 1x1 blocks: one block row of 2^24 F32
/// scales (64 MiB). Each stream once read that row whole, outside the
/// window: convert peaked at 147 MB and validate `--against` at 169 MB at
/// a 16 MiB window (271 MB and 293 MB for `[1, 2^25]`). validate has no
/// `--window`: it is held to the same bound.
#[test]
fn one_block_row_of_many_scales_stays_within_the_window() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let n = 1u64 << 24;
    let name = "model.layers.0.mlp.up_proj.weight";
    let header = json!({
        "__metadata__": {"format": "pt"},
        name: {"dtype": "F8_E4M3", "shape": [1, n], "data_offsets": [0, n]},
        format!("{name}_scale_inv"): {"dtype": "F32", "shape": [1, n], "data_offsets": [n, 5 * n]},
    });
    // Code 0x38 is 1.0; scale k is 2^(k % 4 - 2), so a scale read for the
    // wrong column shows in the output.
    let mut data = vec![0x38u8; n as usize];
    data.extend((0..n).flat_map(|k| (2f32.powi((k % 4) as i32 - 2)).to_le_bytes()));
    write_safetensors(&src.join("model.safetensors"), &header, &data);
    drop(data);
    let config =
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [1, 1]}});
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let dst = tmp.path().join("dst");
    let window = ["--window", "16MiB", "--no-progress"].map(OsStr::new);
    let convert: Vec<&OsStr> = [OsStr::new("convert"), src.as_os_str(), dst.as_os_str()]
        .into_iter()
        .chain(window)
        .chain(["--dtype", "bf16"].map(OsStr::new))
        .collect();
    let validate: Vec<&OsStr> = [OsStr::new("validate"), dst.as_os_str()]
        .into_iter()
        .chain([OsStr::new("--against"), src.as_os_str()])
        .collect();
    let bound = (16 + 64) * 1024;
    for args in [convert, validate] {
        let Some((out, peak_kib)) = run_measured(&args, Duration::from_secs(600)) else {
            return;
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(
            peak_kib < bound,
            "{:?}: peak RSS {peak_kib} KiB, over --window + 64 MiB ({bound} KiB)",
            args[0]
        );
        eprintln!("{:?}: peak RSS {peak_kib} KiB", args[0]);
    }
    // The values: 1.0 times each column's own scale, in bf16.
    let bytes = std::fs::read(dst.join("model.safetensors")).unwrap();
    let data = &bytes[bytes.len() - 2 * n as usize..];
    for k in [0u64, 1, 2, 3, 16383, 16384, 16385, n - 1] {
        let v = u16::from_le_bytes([data[2 * k as usize], data[2 * k as usize + 1]]);
        let want = 2f32.powi((k % 4) as i32 - 2);
        assert_eq!(f32::from_bits(u32::from(v) << 16), want, "column {k}");
    }
}

/// A block row wider than one segment, met by two weight rows (`[2, 1]`
/// blocks): each weight row reads the row's segments again from its
/// start, and every column gets its own scale.
#[test]
fn a_block_row_wider_than_a_segment_is_read_again_for_each_weight_row() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let cols = 40_000u64;
    let name = "model.layers.0.mlp.up_proj.weight";
    let header = json!({
        name: {"dtype": "F8_E4M3", "shape": [2, cols], "data_offsets": [0, 2 * cols]},
        format!("{name}_scale_inv"): {"dtype": "F32", "shape": [1, cols], "data_offsets": [2 * cols, 6 * cols]},
    });
    let scale = |k: u64| 2f32.powi((k % 7) as i32 - 3);
    let mut data = vec![0x38u8; 2 * cols as usize];
    data.extend((0..cols).flat_map(|k| scale(k).to_le_bytes()));
    write_safetensors(&src.join("model.safetensors"), &header, &data);
    let config =
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [2, 1]}});
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let dst = tmp.path().join("dst");
    convert(&src, &dst, &["--dtype", "f32"]).success();
    let bytes = std::fs::read(dst.join("model.safetensors")).unwrap();
    let data = &bytes[bytes.len() - 8 * cols as usize..];
    for (i, v) in data.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes(v.try_into().unwrap());
        assert_eq!(v, scale(i as u64 % cols), "element {i}");
    }
}
