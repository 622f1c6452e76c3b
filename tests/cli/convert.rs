//! `reshard convert` end to end: every fixture at several shard sizes, read
//! back by us, by the safetensors crate and by Python; DST safety; resume.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;

const SAFETENSORS_FIXTURES: [&str; 5] = [
    "tiny-llama",
    "tiny-llama-f32-sharded",
    "tiny-gpt2",
    "tiny-moe-sharded",
    "tiny-t5",
];

/// Reads an output folder's index (or single file) into tensor -> file.
fn weight_map(dir: &Path) -> Vec<(String, String)> {
    let index = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".safetensors.index.json"));
    match index {
        Some(p) => {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
            assert!(
                v["metadata"]["total_size"].is_u64(),
                "index needs metadata.total_size"
            );
            v["weight_map"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, f)| (k.clone(), f.as_str().unwrap().to_string()))
                .collect()
        }
        None => {
            let ck = reshard::format::open(dir).unwrap();
            ck.tensors
                .iter()
                .map(|t| (t.name.clone(), ck.files[t.file].name()))
                .collect()
        }
    }
}

/// Checks the structure of an output against the plan's promises.
fn assert_well_formed(dir: &Path, limit: u64) {
    let map = weight_map(dir);
    let ck = reshard::format::open(dir).unwrap();
    assert!(
        ck.findings.is_empty(),
        "findings in output: {:?}",
        ck.findings
    );
    // Every tensor exactly once in the index, and the index matches the files.
    let mut names: Vec<&str> = map.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), map.len(), "duplicate index entries");
    assert_eq!(map.len(), ck.tensors.len());
    // Shards within the limit unless they hold one oversized tensor.
    let mut per_file: BTreeMap<usize, (u64, usize)> = BTreeMap::new();
    for t in &ck.tensors {
        let e = per_file.entry(t.file).or_default();
        e.0 += t.len;
        e.1 += 1;
    }
    for (file, (bytes, count)) in per_file {
        assert!(
            bytes <= limit || count == 1,
            "{} holds {bytes} > {limit} in {count} tensors",
            ck.files[file].name()
        );
    }
    // Shards follow layer order: the index lists tensors in forward order and
    // shard numbers never go down along it.
    let listed: Vec<&str> = map.iter().map(|(n, _)| n.as_str()).collect();
    let order = reshard::plan::order::sort_indices(&listed, reshard::plan::order::Order::Forward);
    assert_eq!(
        order,
        (0..listed.len()).collect::<Vec<_>>(),
        "index not in layer order"
    );
    let files: Vec<&str> = map.iter().map(|(_, f)| f.as_str()).collect();
    assert!(
        files.windows(2).all(|w| w[0] <= w[1]),
        "shards out of layer order: {files:?}"
    );
    // Every tensor offset aligned to its element size, format pt present.
    for t in &ck.tensors {
        assert_eq!(t.offset() % t.dtype.alignment(), 0, "{} misaligned", t.name);
    }
    assert_eq!(ck.metadata.get("format").map(String::as_str), Some("pt"));
}

#[test]
fn every_fixture_converts_bit_exact_at_several_shard_sizes() {
    let tmp = tempfile::tempdir().unwrap();
    for name in SAFETENSORS_FIXTURES {
        let largest = reshard::format::open(&fixture(name))
            .unwrap()
            .tensors
            .iter()
            .map(|t| t.len)
            .max()
            .unwrap();
        for limit in [largest / 2, largest, 100_000, 1 << 30] {
            let dst = tmp.path().join(format!("{name}-{limit}"));
            convert(
                &fixture(name),
                &dst,
                &["--max-shard-size", &format!("{limit}B")],
            )
            .success();
            assert_matches_expected(&dst, name);
            assert_well_formed(&dst, limit);
            assert!(dst.join("config.json").exists(), "config.json copied");
            assert!(dst.join("reshard.json").exists());
        }
    }
}

#[test]
fn one_shard_is_written_as_prefix_safetensors_without_index() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(
        &fixture("tiny-llama-f32-sharded"),
        &dst,
        &["--max-shard-size", "1GiB"],
    )
    .success();
    assert!(dst.join("model.safetensors").exists());
    assert!(!dst.join("model.safetensors.index.json").exists());
    assert!(
        !dst.join("model-00001-of-00006.safetensors").exists(),
        "old shards are not copied"
    );
}

#[test]
fn output_is_read_by_the_safetensors_crate() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(
        &fixture("tiny-moe-sharded"),
        &dst,
        &["--max-shard-size", "20KiB"],
    )
    .success();
    let ours = read_all(&dst);
    let mut seen = 0;
    let files: std::collections::BTreeSet<String> =
        weight_map(&dst).into_iter().map(|(_, f)| f).collect();
    assert!(files.len() > 1);
    for file in files {
        let bytes = std::fs::read(dst.join(file)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, view) in st.tensors() {
            use sha2::Digest;
            assert_eq!(
                hex(&sha2::Sha256::digest(view.data())),
                ours[&name].2,
                "{name}"
            );
            seen += 1;
        }
    }
    assert_eq!(seen, ours.len());
}

#[test]
fn output_is_read_by_python_safetensors() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // numpy has no bfloat16, so the f32 and f16 fixtures.
    for name in ["tiny-llama-f32-sharded", "tiny-gpt2"] {
        let dst = tmp.path().join(name);
        convert(&fixture(name), &dst, &["--max-shard-size", "100KB"]).success();
        assert_python_reads(&python, &dst, name);
    }
}

fn assert_python_reads(python: &Path, dst: &Path, name: &str) {
    let script = r#"
import sys, json, hashlib, os
from safetensors import safe_open
d = sys.argv[1]
idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
out = {}
for name, f in idx["weight_map"].items():
    with safe_open(os.path.join(d, f), framework="numpy") as st:
        assert st.metadata().get("format") == "pt"
        a = st.get_tensor(name)
        out[name] = hashlib.sha256(a.tobytes()).hexdigest()
print(json.dumps(out))
"#;
    let stdout = run_python(python, Program::Code(script), &[dst]);
    let got: BTreeMap<String, String> = serde_json::from_str(&stdout).unwrap();
    let expected = expected(name);
    assert_eq!(got.len(), expected.tensors.len());
    for (name, e) in expected.tensors {
        assert_eq!(got[&name], e.sha256, "{name}");
    }
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let out = convert(
        &fixture("tiny-llama"),
        &dst,
        &["--dry-run", "--max-shard-size", "100KiB"],
    )
    .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(text.contains("model-00001-of-"), "{text}");
    assert!(
        text.contains("oversized: model.embed_tokens.weight"),
        "{text}"
    );
    assert!(text.contains("peak memory"), "{text}");
    assert!(!dst.exists());
    let out = convert(&fixture("tiny-llama"), &dst, &["--dry-run", "--json"]).success();
    let plan: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(plan["shards"].as_array().unwrap().len(), 1);
}

#[test]
fn refuses_dst_inside_source_and_foreign_dst() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    let before = std::fs::read(src.join("model.safetensors")).unwrap();
    convert(&src, &src, &[])
        .code(2)
        .stderr(predicates::str::contains("inside it"));
    convert(&src, &src.join("sub"), &[]).code(2);
    assert!(!src.join("sub").exists());
    assert_eq!(
        std::fs::read(src.join("model.safetensors")).unwrap(),
        before
    );

    let foreign = tmp.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    convert(&src, &foreign, &[])
        .code(2)
        .stderr(predicates::str::contains("--overwrite"));
    convert(&src, &foreign, &["--overwrite"]).success();
    assert_matches_expected(&foreign, "tiny-llama");
}

#[test]
fn rerun_is_up_to_date_and_changed_options_need_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(&fixture("tiny-t5"), &dst, &["--max-shard-size", "50KB"]).success();
    let out = convert(&fixture("tiny-t5"), &dst, &["--max-shard-size", "50KB"]).success();
    assert!(String::from_utf8_lossy(&out.get_output().stdout).contains("up to date"));
    convert(&fixture("tiny-t5"), &dst, &["--max-shard-size", "60KB"])
        .code(2)
        .stderr(predicates::str::contains("different conversion"));
    convert(
        &fixture("tiny-t5"),
        &dst,
        &["--max-shard-size", "60KB", "--overwrite"],
    )
    .success();
    assert_well_formed(&dst, 60_000);
    // No shard of the old layout survives the overwrite.
    let shards = std::fs::read_dir(&dst)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".safetensors")
        })
        .count();
    assert_eq!(
        shards,
        weight_map(&dst)
            .iter()
            .map(|(_, f)| f)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
}

#[test]
fn manifest_records_blake3_of_each_shard_and_checksums_of_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(
        &fixture("tiny-gpt2"),
        &dst,
        &["--max-shard-size", "40KB", "--json"],
    )
    .success();
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dst.join("reshard.json")).unwrap()).unwrap();
    let shards = m["shards"].as_array().unwrap();
    assert!(shards.len() > 1);
    let mut tensors = 0;
    for s in shards {
        let bytes = std::fs::read(dst.join(s["file"].as_str().unwrap())).unwrap();
        assert_eq!(
            s["blake3"].as_str().unwrap(),
            blake3::hash(&bytes).to_hex().as_str()
        );
        assert!(s.get("sha256").is_none(), "{s}");
        assert_eq!(s["size"].as_u64().unwrap(), bytes.len() as u64);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for t in s["tensors"].as_array().unwrap() {
            let view = st.tensor(t["name"].as_str().unwrap()).unwrap();
            let want = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(view.data()));
            assert_eq!(t["xxh3"].as_str().unwrap(), want);
            tensors += 1;
        }
    }
    assert_eq!(tensors, 40);
    assert!(m["source"]["files"][0]["size"].as_u64().unwrap() > 0);
}

#[test]
fn killed_run_resumes_to_the_same_output() {
    let tmp = tempfile::tempdir().unwrap();
    let clean = tmp.path().join("clean");
    convert(
        &fixture("tiny-t5"),
        &clean,
        &["--max-shard-size", "30KB", "--threads", "1"],
    )
    .success();
    let dst = tmp.path().join("killed");
    // Pause at a write step in the middle of the run, then SIGKILL.
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("reshard"))
        .args([
            "convert",
            "--no-progress",
            "--threads",
            "1",
            "--max-shard-size",
            "30KB",
        ])
        .arg(fixture("tiny-t5"))
        .arg(&dst)
        .env("RESHARD_PAUSE_AT", "12")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_pause(&mut child);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!dst.join("reshard.json").exists());
    assert!(dst.join(".reshard-partial.json").exists());
    let out = convert(
        &fixture("tiny-t5"),
        &dst,
        &["--max-shard-size", "30KB", "--json"],
    )
    .success();
    let summary: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert!(
        summary["resumed_shards"].as_u64().unwrap() >= 1,
        "{summary}"
    );
    for file in std::fs::read_dir(&clean).unwrap() {
        let name = file.unwrap().file_name();
        if name != "reshard.json" {
            assert_eq!(
                std::fs::read(clean.join(&name)).unwrap(),
                std::fs::read(dst.join(&name)).unwrap(),
                "{name:?}"
            );
        }
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.') && n != ".reshard.lock")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Blocks until the child prints that it paused at its failpoint.
pub fn wait_for_pause(child: &mut std::process::Child) {
    use std::io::BufRead;
    let stderr = child.stderr.take().unwrap();
    for line in std::io::BufReader::new(stderr).lines() {
        if line.unwrap().contains("paused at write step") {
            return;
        }
    }
    panic!("the child ended before reaching its failpoint");
}

#[test]
fn convert_validate_proves_the_output_against_the_source() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let out = convert(
        &fixture("tiny-llama-f32-sharded"),
        &dst,
        &[
            "--max-shard-size",
            "200KB",
            "--dtype",
            "bf16",
            "--validate",
            "--json",
        ],
    )
    .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(v["validate"]["passed"], true, "{v}");
    assert!(v["validate"]["manifest"].as_bool().unwrap());
    assert_eq!(v["convert"]["shards"], v["validate"]["files"]);
}
