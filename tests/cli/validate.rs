//! `reshard validate` end to end: integrity, the CPU load path, commit
//! budgets enforced in a child process, corrupted outputs, `--against`, the
//! CUDA path without a driver, and loader emulation on a generated
//! multi-shard checkpoint.

use std::path::Path;

use crate::common::*;

const SAFETENSORS_FIXTURES: [&str; 5] = [
    "tiny-llama",
    "tiny-llama-f32-sharded",
    "tiny-gpt2",
    "tiny-moe-sharded",
    "tiny-t5",
];

fn convert(src: &Path, dst: &Path, extra: &[&str]) {
    crate::common::convert(src, dst, extra).success();
}

/// Runs `reshard validate PATH ARGS --json`; returns the exit code and the
/// parsed report.
fn validate_json(path: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    let out = reshard()
        .arg("validate")
        .arg(path)
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, report)
}

/// Runs `reshard validate PATH ARGS`; returns the exit code and stdout+stderr.
fn validate_text(path: &Path, args: &[&str]) -> (i32, String) {
    let out = reshard()
        .arg("validate")
        .arg(path)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn every_fixture_validates_raw_and_converted_and_against_its_source() {
    let tmp = tempfile::tempdir().unwrap();
    for name in SAFETENSORS_FIXTURES {
        let src = fixture(name);
        let (code, raw) = validate_json(&src, &[]);
        assert_eq!(code, 0, "{name} raw: {raw:#}");
        assert_eq!(raw["passed"], true);
        assert_eq!(raw["manifest"], false);
        assert_eq!(raw["device"]["device"], "cpu");
        let dst = tmp.path().join(name);
        convert(&src, &dst, &["--max-shard-size", "100KB"]);
        let against = src.to_str().unwrap();
        let (code, out) = validate_json(&dst, &["--against", against]);
        assert_eq!(code, 0, "{name} converted: {out:#}");
        assert_eq!(out["manifest"], true);
        let expected = reshard::format::open(&src).unwrap();
        assert_eq!(out["tensors"], expected.tensors.len());
        assert_eq!(out["bytes_loaded"], expected.total_bytes());
        assert_eq!(out["against"]["tensors_compared"], expected.tensors.len());
        assert!(out["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["seconds"].as_f64().unwrap() >= 0.0));
    }
}

#[test]
fn a_budget_below_one_shard_fails_and_a_generous_one_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(
        &fixture("tiny-llama-f32-sharded"),
        &dst,
        &["--max-shard-size", "200KiB"],
    );
    // The largest shard holds a 250 KiB tensor: 192 KiB cannot hold it.
    let (code, text) = validate_text(&dst, &["--commit-budget", "192KiB", "--staging", "16KiB"]);
    assert_eq!(code, 1, "{text}");
    if commit_limit_enforced() {
        assert!(
            text.contains("over budget at shard model-00001-of-00004.safetensors"),
            "{text}"
        );
        assert!(text.contains("model.embed_tokens.weight"), "{text}");
    } else {
        assert!(text.contains("over the 192.00 KiB budget"), "{text}");
    }

    let (code, report) = validate_json(&dst, &["--commit-budget", "64MiB"]);
    assert_eq!(code, 0, "{report:#}");
    let commit = &report["commit"];
    assert_eq!(commit["source"], COMMIT_SOURCE);
    let peak = commit["peak_above_baseline"].as_u64().unwrap();
    assert!(peak > 0 && peak <= 64 << 20, "{commit}");
    // The CPU device holds one shard at a time plus the staging buffer.
    assert!(peak >= 250 * 1024, "{commit}");
}

/// Rewrites the safetensors file at `path` without tensor `drop`.
fn drop_tensor(path: &Path, drop: &str) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut entries: Vec<(String, serde_json::Value)> = header.into_iter().collect();
    entries.retain(|(k, _)| k != drop);
    entries.sort_by_key(|(k, v)| {
        if k == "__metadata__" {
            0
        } else {
            v["data_offsets"][0].as_u64().unwrap() + 1
        }
    });
    let mut new_header = serde_json::Map::new();
    let mut new_data = Vec::new();
    for (k, mut v) in entries {
        if k != "__metadata__" {
            let (a, b) = (
                v["data_offsets"][0].as_u64().unwrap() as usize,
                v["data_offsets"][1].as_u64().unwrap() as usize,
            );
            let start = new_data.len();
            new_data.extend_from_slice(&data[a..b]);
            v["data_offsets"] = serde_json::json!([start, new_data.len()]);
        }
        new_header.insert(k, v);
    }
    write_safetensors(path, &serde_json::Value::Object(new_header), &new_data);
}

#[test]
fn corrupted_outputs_fail_naming_the_file_and_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good");
    convert(
        &fixture("tiny-llama-f32-sharded"),
        &good,
        &["--max-shard-size", "200KiB"],
    );
    let ck = reshard::format::open(&good).unwrap();
    let victim = ck
        .tensors
        .iter()
        .find(|t| t.name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    let file = ck.files[victim.file].name();

    // A flipped byte in a shard's data.
    let flipped = tmp.path().join("flipped");
    copy_dir(&good, &flipped);
    let path = flipped.join(&file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[victim.offset() as usize + 5] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let (code, text) = validate_text(&flipped, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("{file}: tensor \"{}\": xxh3", victim.name)),
        "{text}"
    );
    assert!(
        text.contains(&format!("{file}: its digest is blake3")),
        "{text}"
    );

    // A wrong checksum in the manifest.
    let wrong = tmp.path().join("wrong-manifest");
    copy_dir(&good, &wrong);
    let manifest_path = wrong.join("reshard.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    for shard in manifest["shards"].as_array_mut().unwrap() {
        for t in shard["tensors"].as_array_mut().unwrap() {
            if t["name"] == victim.name.as_str() {
                t["xxh3"] = "0123456789abcdef".into();
            }
        }
    }
    manifest["shards"][0]["blake3"] = "00".repeat(32).into();
    std::fs::write(
        &manifest_path,
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    let (code, text) = validate_text(&wrong, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("tensor \"{}\": xxh3 is", victim.name)),
        "{text}"
    );
    assert!(
        text.contains("reshard.json says 0123456789abcdef"),
        "{text}"
    );
    assert!(
        text.contains("model-00001-of-00004.safetensors: its digest is blake3"),
        "{text}"
    );

    // A tensor missing from a shard that the index still lists.
    let missing = tmp.path().join("missing");
    copy_dir(&good, &missing);
    drop_tensor(&missing.join(&file), &victim.name);
    let (code, text) = validate_text(&missing, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains(&format!("{file}: tensor \"{}\" is missing", victim.name)),
        "{text}"
    );

    // The same in a single-file output: only the manifest knows it.
    let single = tmp.path().join("single");
    convert(&fixture("tiny-llama"), &single, &[]);
    drop_tensor(&single.join("model.safetensors"), "model.norm.weight");
    let (code, text) = validate_text(&single, &[]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("tensor \"model.norm.weight\" is missing: reshard.json lists it"),
        "{text}"
    );
}

#[test]
fn against_another_model_names_what_differs() {
    let (code, text) = validate_text(
        &fixture("tiny-llama"),
        &["--against", fixture("tiny-gpt2").to_str().unwrap()],
    );
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("is only in the output") && text.contains("is only in the source"),
        "{text}"
    );
}

#[test]
fn vram_budget_reports_how_many_leading_blocks_fit() {
    let (code, report) = validate_json(
        &fixture("tiny-llama-f32-sharded"),
        &["--vram-budget", "600KiB"],
    );
    assert_eq!(code, 1, "{report:#}");
    let vram = &report["vram"];
    assert_eq!(vram["blocks_total"], 2, "{vram}");
    assert_eq!(vram["blocks_fit"], 1, "{vram}");
    let (code, report) = validate_json(
        &fixture("tiny-llama-f32-sharded"),
        &["--vram-budget", "1MiB"],
    );
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["vram"]["blocks_fit"], 2);
}

#[test]
fn cuda_without_a_driver_exits_2_without_panicking() {
    if reshard::validate::device::cuda::driver_present() {
        eprintln!("skipped: a CUDA driver is present here");
        return;
    }
    for args in [
        &["--device", "cuda"][..],
        &["--device", "cuda:1", "--commit-budget", "1GiB"],
    ] {
        let (code, text) = validate_text(&fixture("tiny-llama"), args);
        assert_eq!(code, 2, "{text}");
        assert!(text.contains("no CUDA driver found"), "{text}");
        assert!(!text.contains("panicked"), "{text}");
    }
}

const MIB: u64 = 1 << 20;

/// Writes a 4-shard checkpoint of 64 MiB f32 shards (4 tensors of 16 MiB,
/// one per layer) with its index.
fn write_four_shards(dir: &Path) -> u64 {
    std::fs::create_dir_all(dir).unwrap();
    let tensor_len = 16 * MIB as usize;
    let mut weight_map = serde_json::Map::new();
    let mut total = 0;
    for shard in 0..4 {
        let file = format!("model-{:05}-of-00004.safetensors", shard + 1);
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut data = Vec::with_capacity(4 * tensor_len);
        for k in 0..4 {
            let name = format!("model.layers.{}.mlp.weight", shard * 4 + k);
            let start = data.len();
            let value = (shard * 4 + k) as f32;
            data.extend(std::iter::repeat_n(value.to_le_bytes(), tensor_len / 4).flatten());
            header.insert(name.clone(), serde_json::json!({"dtype": "F32", "shape": [tensor_len / 4], "data_offsets": [start, data.len()]}));
            weight_map.insert(name, file.clone().into());
        }
        total += data.len() as u64;
        write_safetensors(&dir.join(&file), &serde_json::Value::Object(header), &data);
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    total
}

fn assert_near(measured: u64, predicted: u64, what: &str) {
    let tolerance = (predicted / 10).max(16 * MIB);
    assert!(
        measured.abs_diff(predicted) <= tolerance,
        "{what}: measured {measured}, predicted {predicted}"
    );
}

/// fit's `peak_commit` for `loader` on `path`, on this machine's OS.
fn fit_peak(path: &Path, loader: &str) -> u64 {
    let out = reshard()
        .args([
            "fit",
            "--json",
            "--ram",
            "1TiB",
            "--commit-limit",
            "1TiB",
            "--loader",
            loader,
        ])
        .arg(path)
        .output()
        .unwrap();
    let fit: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    fit["today"]["loaders"][0]["peak_commit"].as_u64().unwrap()
}

#[test]
fn emulate_and_fit_agree_for_every_loader() {
    if under_wine() {
        eprintln!("skipped: Wine charges a copy-on-write file view to no counter");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let original = tmp.path().join("original");
    write_four_shards(&original);
    for loader in [
        "transformers-v5-mmap",
        "transformers-v5-pread",
        "per-shard-mmap",
        "full-read",
        "diffusers",
    ] {
        let (code, report) = validate_json(&original, &["--emulate", loader]);
        assert_eq!(code, 0, "{loader}: {report:#}");
        let predicted = report["emulation"]["predicted_peak"].as_u64().unwrap();
        // One model: the emulation's prediction is fit's.
        assert_eq!(predicted, fit_peak(&original, loader), "{loader}");
        // And the emulation commits what the model adds up, term by term.
        let measured = report["commit"]["peak_above_baseline"].as_u64().unwrap();
        assert!(
            measured.abs_diff(predicted) <= 2 * MIB,
            "{loader}: measured {measured}, predicted {predicted}"
        );
    }
    let (code, text) = validate_text(&original, &["--emulate", "reshard"]);
    assert_eq!(code, 2, "{text}");
}

#[test]
fn per_shard_mmap_of_the_original_fails_a_budget_that_the_reshard_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let original = tmp.path().join("original");
    let sum_t = write_four_shards(&original);
    let resharded = tmp.path().join("resharded");
    convert(&original, &resharded, &["--max-shard-size", "32MiB"]);
    if under_wine() {
        eprintln!("skipped the mapping assertions: Wine charges a copy-on-write file view to no counter (Windows charges the whole view when mapped)");
        let (code, report) = validate_json(&resharded, &["--emulate", "full-read"]);
        assert_eq!(code, 0, "{report:#}");
        assert_near(
            report["commit"]["peak_above_baseline"].as_u64().unwrap(),
            report["emulation"]["predicted_peak"].as_u64().unwrap(),
            "full-read peak",
        );
        return;
    }
    // The model's storage (256 MiB) is held whatever the shards; per-shard
    // adds one shard: 64 MiB on the original, 32 MiB resharded.
    let budget = "312MiB";
    let (code, text) = validate_text(
        &original,
        &["--emulate", "per-shard-mmap", "--commit-budget", budget],
    );
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("over budget at shard"), "{text}");
    let (code, report) = validate_json(
        &resharded,
        &["--emulate", "per-shard-mmap", "--commit-budget", budget],
    );
    assert_eq!(code, 0, "{report:#}");
    let e = &report["emulation"];
    assert_eq!(e["shards"], 8);
    let max_s = e["max_shard"].as_u64().unwrap();
    assert_eq!(
        e["predicted_peak"].as_u64().unwrap(),
        sum_t + max_s + 8 * MIB
    );
    assert_near(
        report["commit"]["peak_above_baseline"].as_u64().unwrap(),
        sum_t + max_s,
        "per-shard-mmap peak",
    );

    // All-mapped peaks at sum(S) on both layouts: resharding cannot help it.
    let peaks: Vec<u64> = [&original, &resharded]
        .iter()
        .map(|p| {
            let (code, report) = validate_json(p, &["--emulate", "transformers-v5-mmap"]);
            assert_eq!(code, 0, "{report:#}");
            report["commit"]["peak_above_baseline"].as_u64().unwrap()
        })
        .collect();
    assert!(peaks[0] > 256 * MIB);
    assert_near(
        peaks[1],
        peaks[0],
        "transformers-v5-mmap, resharded vs original",
    );
}

#[test]
fn a_budget_too_small_for_anything_fails_cleanly() {
    // Whether the staging allocation fails (reported) or an infallible one
    // aborts the child (reported by the parent), it is exit 1, never 2.
    let (code, text) = validate_text(&fixture("tiny-llama"), &["--commit-budget", "1"]);
    assert_eq!(code, 1, "{text}");
    if commit_limit_enforced() {
        assert!(text.contains("over budget"), "{text}");
    } else {
        assert!(text.contains("over the 1 B budget"), "{text}");
    }
}

/// Whether the cast kernels are in (the cast stage was a stub for a while).
fn casts_available() -> bool {
    let probe = std::panic::catch_unwind(|| {
        use reshard::format::Dtype;
        let mut out = [0u8; 2];
        reshard::cast::cast_parallel(
            Dtype::F32,
            Dtype::BF16,
            &1f32.to_le_bytes(),
            &mut out,
            Default::default(),
        );
    });
    probe.is_ok()
}

#[test]
fn against_passes_through_a_cast() {
    if !casts_available() {
        eprintln!("skipped: the cast kernels are not merged yet");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama-f32-sharded");
    let dst = tmp.path().join("bf16");
    convert(&src, &dst, &["--dtype", "bf16"]);
    let (code, report) = validate_json(&dst, &["--against", src.to_str().unwrap()]);
    assert_eq!(code, 0, "{report:#}");
    let against = &report["against"];
    assert_eq!(
        against["cast_compared"], against["tensors_compared"],
        "{against}"
    );
}

/// Without reshard.json there is nothing to check bytes against: the
/// report says what was checked and that nothing was compared, and does
/// not talk of a GPU on the CPU device.
#[test]
fn a_model_without_a_manifest_says_nothing_was_compared() {
    let out = reshard()
        .args(["validate", "--device", "cpu"])
        .arg(fixture("tiny-llama"))
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    let first = text.lines().next().unwrap();
    assert!(
        first.contains("every byte read") && first.contains("nothing compared"),
        "{first}"
    );
    assert!(!first.contains("GPU"), "{first}");
    let out = reshard()
        .args(["validate", "--device", "cpu"])
        .arg(fixture("tiny-llama"))
        .arg("--against")
        .arg(fixture("tiny-llama"))
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.lines()
            .next()
            .unwrap()
            .contains("compared with --against"),
        "{text}"
    );
}
