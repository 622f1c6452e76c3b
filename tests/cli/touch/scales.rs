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

/// FP8 scales stored as a strided view in a PyTorch `.bin` (a transposed
/// scale tensor: its storage holds the columns) dequantize like
/// contiguous ones. The view is a block row wider than one segment, met by
/// two weight rows (`[2, 1]` blocks): each segment is entered where it
/// starts, where the stream was once read again from the tensor's start
/// each time a block row was met again (reads growing with the square of
/// the rows), and `validate --against` agrees.
#[test]
fn transposed_scales_in_a_bin_dequantize_like_contiguous_ones() {
    // Scales [2, 32770]: wider than a segment, and a span (256 KiB) read
    // one scale at a time; then a small view gathered in one read.
    dequantize_transposed_scales(4, 2 * 16_385, [2, 1]);
    dequantize_transposed_scales(8, 12, [2, 3]);
}

/// A weight `[rows, cols]` of 1.0 codes whose `block` scales are stored
/// transposed, converted to F32: each value is its block's scale.
fn dequantize_transposed_scales(rows: i64, cols: i64, block: [i64; 2]) {
    use crate::pytorch::{archive, write_bin, Pickle};
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let (scale_rows, scale_cols) = (rows / block[0], cols / block[1]);
    let scale = |i: i64, j: i64| 2f32.powi(((i * 7 + j) % 9) as i32 - 4);
    // Storage of the scales: the transpose, row-major.
    let storage: Vec<u8> = (0..scale_cols)
        .flat_map(|j| (0..scale_rows).map(move |i| (i, j)))
        .flat_map(|(i, j)| scale(i, j).to_le_bytes())
        .collect();
    let name = "model.layers.0.mlp.up_proj.weight";
    let pkl = Pickle::state_dict(|p| {
        p.tensor_of(
            name,
            "Float8_e4m3fnStorage",
            "0",
            rows * cols,
            0,
            &[rows, cols],
            &[cols, 1],
        );
        p.tensor(
            &format!("{name}_scale_inv"),
            "1",
            scale_rows * scale_cols,
            0,
            &[scale_rows, scale_cols],
            &[1, scale_rows],
        );
    });
    let codes = vec![0x38u8; (rows * cols) as usize];
    write_bin(&src, &archive(&pkl, &[("0", &codes), ("1", &storage)]));
    let config =
        json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": block}});
    std::fs::write(src.join("config.json"), config.to_string()).unwrap();
    let dst = tmp.path().join("dst");
    convert(&src, &dst, &["--dtype", "f32", "--window", "1MiB"]).success();
    let bytes = std::fs::read(dst.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let w = st.tensor(name).unwrap();
    assert_eq!(w.shape(), [rows as usize, cols as usize]);
    let got: Vec<f32> = w
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(
                got[(r * cols + c) as usize],
                scale(r / block[0], c / block[1]),
                "row {r} column {c}"
            );
        }
    }
    reshard()
        .arg("validate")
        .arg(&dst)
        .arg("--against")
        .arg(&src)
        .assert()
        .success();
}
