//! `reshard batch` end to end on a generated folder of models: fixtures,
//! a truncated model, a folder without weights, a Hugging Face cache repo
//! with sha256-named blobs, and symlink loops.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::common::*;

const GOOD: [&str; 4] = [
    "org--tiny",
    "org/tiny-llama-f32-sharded",
    "tiny-gpt2",
    "tiny-t5",
];

/// Builds ROOT in `dir` and returns it, with whether the platform made its
/// symlinks (the HF snapshot links and the loops; see `common::symlink`).
fn build_root(dir: &Path) -> (PathBuf, bool) {
    let root = dir.join("root");
    copy_fixture("tiny-llama-f32-sharded", &root.join("org"));
    copy_fixture("tiny-gpt2", &root);
    copy_fixture("tiny-t5", &root);
    // A model whose only weight file was cut short.
    let corrupt = root.join("corrupt");
    copy_dir(&fixture("tiny-llama"), &corrupt);
    let weights = corrupt.join("model.safetensors");
    let len = std::fs::metadata(&weights).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    // No weights, and a symlink back to ROOT.
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(root.join("docs/README.md"), "# notes\n").unwrap();
    let linked = symlink("..", root.join("docs/up"));
    let (_, hf_linked) = hf_repo(&root.join("hub"), "tiny-llama");
    (root, linked && hf_linked)
}

/// An HF cache repo `models--org--tiny` holding `fixture_name`'s files as
/// sha256-named blobs, with a second, stale snapshot and a loop link.
/// Where the platform makes no symlinks, the repo is laid out as
/// huggingface_hub does on Windows without them: each snapshot file is a
/// real copy and `blobs/` does not hold it. Returns the repo and whether
/// it is linked.
pub(crate) fn hf_repo(hub: &Path, fixture_name: &str) -> (PathBuf, bool) {
    let repo = hub.join("models--org--tiny");
    let snapshot = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("snapshots/stale99/")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
    let mut linked = true;
    for name in ["model.safetensors", "config.json"] {
        let bytes = std::fs::read(fixture(fixture_name).join(name)).unwrap();
        let blob = hex(&Sha256::digest(&bytes));
        std::fs::write(repo.join("blobs").join(&blob), &bytes).unwrap();
        for snap in [snapshot.clone(), repo.join("snapshots/stale99")] {
            linked &= symlink(Path::new("../../blobs").join(&blob), snap.join(name));
        }
        if !linked {
            for snap in [snapshot.clone(), repo.join("snapshots/stale99")] {
                std::fs::write(snap.join(name), &bytes).unwrap();
            }
            std::fs::remove_file(repo.join("blobs").join(&blob)).unwrap();
        }
    }
    linked &= symlink("..", snapshot.join("loop"));
    (repo, linked)
}

pub(crate) fn batch(root: &Path, out: &Path, extra: &[&str]) -> assert_cmd::assert::Assert {
    reshard()
        .arg("batch")
        .arg(root)
        .arg("--out")
        .arg(out)
        .args(["--no-progress"])
        .args(extra)
        .assert()
}

/// Runs a batch with `--json` and returns name -> (status, reason).
pub(crate) fn statuses(
    assert: &assert_cmd::assert::Assert,
) -> (serde_json::Value, BTreeMap<String, (String, String)>) {
    let report: serde_json::Value = serde_json::from_slice(&assert.get_output().stdout).unwrap();
    let map = report["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let reason = m["reason"].as_str().unwrap_or_default().to_string();
            (
                m["name"].as_str().unwrap().to_string(),
                (m["status"].as_str().unwrap().to_string(), reason),
            )
        })
        .collect();
    (report, map)
}

fn manifest_mtimes(out: &Path) -> BTreeMap<&'static str, SystemTime> {
    GOOD.iter()
        .map(|n| {
            (
                *n,
                std::fs::metadata(out.join(n).join("reshard.json"))
                    .unwrap()
                    .modified()
                    .unwrap(),
            )
        })
        .collect()
}

#[test]
fn converts_every_model_reports_failures_and_reruns_only_what_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, linked) = build_root(tmp.path());
    let out = tmp.path().join("out");
    let report_path = tmp.path().join("reports/batch.json");

    let first = batch(
        &root,
        &out,
        &["--json", "--jobs", "2", "--max-shard-size", "100KB"],
    )
    .code(1);
    let (report, status) = statuses(&first);
    for name in GOOD {
        assert_eq!(status[name].0, "converted", "{name}: {:?}", status[name]);
    }
    assert_eq!(status["corrupt"].0, "failed");
    assert!(
        status["corrupt"].1.contains("model.safetensors"),
        "{:?}",
        status["corrupt"]
    );
    if linked {
        assert_eq!(status["docs/up"].0, "skipped");
        assert!(
            status["docs/up"].1.contains("symlink loop"),
            "{:?}",
            status["docs/up"]
        );
        assert_eq!(status.len(), 6, "{status:?}");
    } else {
        eprintln!("skipped the symlink-loop assertions: no symlinks on this platform");
        assert_eq!(status.len(), 5, "{status:?}");
    }
    assert_eq!(report["totals"]["converted"], 4);
    assert!(!out.join("corrupt").exists());
    assert_matches_expected(
        &out.join("org/tiny-llama-f32-sharded"),
        "tiny-llama-f32-sharded",
    );
    assert_matches_expected(&out.join("tiny-t5"), "tiny-t5");
    assert_matches_expected(&out.join("org--tiny"), "tiny-llama");
    assert!(out.join("org--tiny/config.json").is_file());
    let before = manifest_mtimes(&out);

    // Nothing changed: every good model is up to date, nothing rewritten.
    let second = batch(
        &root,
        &out,
        &[
            "--report",
            report_path.to_str().unwrap(),
            "--max-shard-size",
            "100KB",
        ],
    )
    .code(1);
    let text = String::from_utf8_lossy(&second.get_output().stdout).into_owned();
    let skipped = if linked { 1 } else { 0 };
    assert!(
        text.contains(&format!(
            "0 converted, 4 up to date, 1 failed, {skipped} skipped"
        )),
        "{text}"
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    let up_to_date = saved["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["status"] == "up_to_date")
        .count();
    assert_eq!(up_to_date, 4);
    assert_eq!(manifest_mtimes(&out), before);

    // Same bytes, new mtime: only that model converts again.
    let touched = root.join("tiny-t5/model.safetensors");
    let later = std::fs::metadata(&touched).unwrap().modified().unwrap() + Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&touched)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let third = batch(&root, &out, &["--json", "--max-shard-size", "100KB"]).code(1);
    let (_, status) = statuses(&third);
    let after = manifest_mtimes(&out);
    for name in GOOD {
        let want = if name == "tiny-t5" {
            "converted"
        } else {
            "up_to_date"
        };
        assert_eq!(status[name].0, want, "{name}");
        assert_eq!(
            after[name] == before[name],
            name != "tiny-t5",
            "{name} manifest mtime"
        );
    }
}

#[test]
fn changed_options_reconvert_but_foreign_folders_are_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    copy_fixture("tiny-t5", &root);
    copy_fixture("tiny-gpt2", &root);
    let out = tmp.path().join("out");
    std::fs::create_dir_all(out.join("tiny-gpt2")).unwrap();
    std::fs::write(out.join("tiny-gpt2/notes.txt"), "mine").unwrap();

    let (_, status) =
        statuses(&batch(&root, &out, &["--json", "--max-shard-size", "50KB"]).code(1));
    assert_eq!(status["tiny-t5"].0, "converted");
    assert_eq!(status["tiny-gpt2"].0, "failed");
    assert!(
        status["tiny-gpt2"].1.contains("not written by reshard"),
        "{:?}",
        status["tiny-gpt2"]
    );
    assert_eq!(
        std::fs::read_to_string(out.join("tiny-gpt2/notes.txt")).unwrap(),
        "mine"
    );

    let (_, status) = statuses(
        &batch(
            &root,
            &out,
            &[
                "--json",
                "--max-shard-size",
                "60KB",
                "--fail-fast",
                "--jobs",
                "1",
            ],
        )
        .code(1),
    );
    assert_eq!(status["tiny-gpt2"].0, "failed");
    assert_eq!(
        status["tiny-t5"].0, "skipped",
        "--fail-fast: tiny-gpt2 sorts first and fails"
    );

    let (_, status) =
        statuses(&batch(&root, &out, &["--json", "--max-shard-size", "60KB"]).code(1));
    assert_eq!(
        status["tiny-t5"].0, "converted",
        "changed options replace reshard's own output"
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("tiny-t5/reshard.json")).unwrap()).unwrap();
    assert_eq!(m["options"]["max_shard_size"], 60_000);
    assert_matches_expected(&out.join("tiny-t5"), "tiny-t5");
}

#[test]
fn parts_split_the_list_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, _) = build_root(tmp.path());
    for i in 0..6 {
        copy_dir(&fixture("tiny-gpt2"), &root.join(format!("more/m{i}")));
    }
    let out = tmp.path().join("out");
    let list = |extra: &[&str]| -> Vec<String> {
        let a = batch(&root, &out, &[&["--dry-run", "--json"], extra].concat()).success();
        let v: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
        v["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_string())
            .collect()
    };
    let all = list(&[]);
    assert_eq!(all.len(), 11, "{all:?}");
    assert!(
        all.contains(&"org--tiny".to_string()) && !all.iter().any(|n| n.contains("snapshots")),
        "{all:?}"
    );
    let mut union = Vec::new();
    for i in 0..3 {
        let part = list(&["--part", &format!("{i}/3")]);
        assert!(
            !part.is_empty() && part.len() < all.len(),
            "part {i}/3: {part:?}"
        );
        union.extend(part);
    }
    union.sort();
    assert_eq!(union, all, "every model in exactly one part");
    assert!(!out.exists(), "--dry-run writes nothing");

    let text = batch(&root, &out, &["--dry-run", "--part", "1/3"]).success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(
        text.contains("MODEL") && text.contains("in part 1/3"),
        "{text}"
    );
}

#[test]
fn verify_source_catches_a_blob_that_no_longer_matches_its_name() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let (repo, linked) = hf_repo(&root.join("hub"), "tiny-llama");
    copy_fixture("tiny-gpt2", &root);
    let out = tmp.path().join("out");

    let listed = batch(&root, &out, &["--verify-source", "--dry-run"]).success();
    assert!(String::from_utf8_lossy(&listed.get_output().stdout).contains("org--tiny"));
    assert!(!out.exists(), "a dry run lists, it does not run");
    let a = batch(&root, &out, &["--json", "--verify-source"]).success();
    let (report, _) = statuses(&a);
    let tiny = report["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "org--tiny")
        .unwrap()
        .clone();
    if !linked {
        // Real copies carry no sha256 name: there is nothing to check them by.
        assert_eq!(tiny["verified_files"], 0, "{tiny}");
        eprintln!("skipped the corrupted-blob assertions: no symlinks on this platform");
        return;
    }
    assert_eq!(tiny["verified_files"], 2, "{tiny}");

    // Flip the last byte of the weights blob (tensor data, so the header still reads).
    let blob = std::fs::canonicalize(repo.join("snapshots/0123abcd/model.safetensors")).unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    *bytes.last_mut().unwrap() ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let fresh = tmp.path().join("fresh");
    let (_, status) = statuses(&batch(&root, &fresh, &["--json", "--verify-source"]).code(1));
    assert_eq!(status["org--tiny"].0, "failed");
    assert!(
        status["org--tiny"]
            .1
            .contains("corrupted or truncated download"),
        "{:?}",
        status["org--tiny"]
    );
    assert_eq!(
        status["tiny-gpt2"].0, "converted",
        "one bad model does not stop the others"
    );
    // The conversion ran beside the hash but never committed.
    assert!(!fresh.join("org--tiny/reshard.json").exists());
    assert!(!fresh.join("org--tiny/model.safetensors").exists());
}

#[test]
fn jobs_share_one_window() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    for name in [
        "tiny-llama-f32-sharded",
        "tiny-llama",
        "tiny-gpt2",
        "tiny-t5",
    ] {
        copy_fixture(name, &root);
    }
    let out = tmp.path().join("out");
    let window = 1u64 << 20;
    let args = [
        "--json",
        "--jobs",
        "2",
        "--threads",
        "4",
        "--window",
        "1MiB",
        "--max-shard-size",
        "200KB",
    ];
    let (report, status) = statuses(&batch(&root, &out, &args).success());
    assert!(status.values().all(|(s, _)| s == "converted"), "{status:?}");
    let peak = report["peak_buffer_bytes"].as_u64().unwrap();
    assert!(
        peak > 0 && peak <= window,
        "peak {peak} of a {window}-byte window"
    );
    assert_eq!(report["window"], window);
    assert_eq!(report["jobs"], 2);
    assert_matches_expected(
        &out.join("tiny-llama-f32-sharded"),
        "tiny-llama-f32-sharded",
    );
}

#[test]
fn usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    batch(&tmp.path().join("missing"), &tmp.path().join("out"), &[])
        .code(2)
        .stderr(predicates::str::contains("cannot search"));
    batch(tmp.path(), tmp.path(), &[])
        .code(2)
        .stderr(predicates::str::contains("must not be ROOT"));
    batch(tmp.path(), &tmp.path().join("out"), &["--part", "3/3"]).code(2);

    // An empty folder is not an error.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let a = batch(&empty, &tmp.path().join("out2"), &[]).success();
    assert!(String::from_utf8_lossy(&a.get_output().stdout).contains("0 converted"));
}

#[test]
fn killed_batch_resumes_its_model() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    copy_fixture("tiny-t5", &root);
    copy_fixture("tiny-gpt2", &root);
    // Kill the batch (SIGKILL) at write steps spread over both models; each
    // rerun must finish the job and convert every model exactly once.
    for step in [3u64, 12, 25, 40, 60] {
        let out = tmp.path().join(format!("out-{step}"));
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("reshard"))
            .args([
                "batch",
                "--no-progress",
                "--threads",
                "1",
                "--max-shard-size",
                "30KB",
                "--out",
            ])
            .arg(&out)
            .arg(&root)
            .env("RESHARD_PAUSE_AT", step.to_string())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        crate::convert::wait_for_pause(&mut child);
        child.kill().unwrap();
        child.wait().unwrap();

        let a = batch(&root, &out, &["--json", "--max-shard-size", "30KB"]).success();
        let (report, status) = statuses(&a);
        for name in ["tiny-t5", "tiny-gpt2"] {
            assert!(
                ["converted", "up_to_date"].contains(&status[name].0.as_str()),
                "step {step}: {status:?}"
            );
            assert_matches_expected(&out.join(name), name);
        }
        if step == 12 {
            assert!(
                report["models"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["resumed_shards"].as_u64().unwrap() >= 1),
                "{report}"
            );
        }
        let (_, again) =
            statuses(&batch(&root, &out, &["--json", "--max-shard-size", "30KB"]).success());
        assert!(
            again.values().all(|(s, _)| s == "up_to_date"),
            "step {step}: {again:?}"
        );
    }
}

#[test]
fn fit_and_validate_modes_judge_every_model() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    copy_fixture("tiny-gpt2", &root);
    copy_fixture("tiny-t5", &root);
    let out = tmp.path().join("out");
    // Validating before converting fails: there is no output yet.
    let (_, status) = statuses(&batch(&root, &out, &["--json", "--mode", "validate"]).code(1));
    assert_eq!(status["tiny-gpt2"].0, "failed", "{status:?}");

    batch(&root, &out, &["--max-shard-size", "40KB"]).success();
    let (_, status) = statuses(&batch(&root, &out, &["--json", "--mode", "validate"]).success());
    assert_eq!(status["tiny-gpt2"].0, "passed", "{status:?}");
    assert_eq!(status["tiny-t5"].0, "passed", "{status:?}");

    // A flipped byte in one output fails that model only, naming the tensor.
    let mut shards: Vec<_> = std::fs::read_dir(out.join("tiny-t5"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    let shard = &shards[0];
    let mut bytes = std::fs::read(shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(shard, bytes).unwrap();
    let (_, status) = statuses(&batch(&root, &out, &["--json", "--mode", "validate"]).code(1));
    assert_eq!(status["tiny-gpt2"].0, "passed", "{status:?}");
    assert_eq!(status["tiny-t5"].0, "failed", "{status:?}");
    assert!(status["tiny-t5"].1.contains("tensor"), "{status:?}");

    // Fit: a roomy machine passes every model; a tiny one fails them, naming
    // the loader and the shortfall.
    let roomy = [
        "--json",
        "--mode",
        "fit",
        "--os",
        "linux",
        "--ram",
        "8GiB",
        "--pagefile",
        "0",
    ];
    let (_, status) = statuses(&batch(&root, &out, &roomy).success());
    assert!(status.values().all(|(s, _)| s == "passed"), "{status:?}");
    let tiny = [
        "--json",
        "--mode",
        "fit",
        "--os",
        "windows",
        "--ram",
        "64KiB",
        "--pagefile",
        "0",
        "--loader",
        "full-read",
    ];
    let (_, status) = statuses(&batch(&root, &out, &tiny).code(1));
    assert!(
        status["tiny-gpt2"].1.contains("full-read short by"),
        "{status:?}"
    );
}

/// A folder of GGUF files: each file and each split set is one model.
fn gguf_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    let llm = root.join("llm");
    std::fs::create_dir_all(&llm).unwrap();
    for f in [
        "types.gguf",
        "kinds.gguf",
        "split-00001-of-00002.gguf",
        "split-00002-of-00002.gguf",
    ] {
        std::fs::copy(fixture(&format!("gguf/{f}")), llm.join(f)).unwrap();
    }
    // A safetensors model folder holding a GGUF as well: both are models.
    let st = root.join("st");
    copy_dir(&fixture("tiny-gpt2"), &st);
    std::fs::copy(fixture("gguf/kinds.gguf"), st.join("st-q.gguf")).unwrap();
    root
}

#[test]
fn dry_run_lists_each_gguf_and_each_split_set_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = gguf_root(tmp.path());
    let out = tmp.path().join("out");
    let a = batch(&root, &out, &["--dry-run", "--json"]).success();
    let report: serde_json::Value = serde_json::from_slice(&a.get_output().stdout).unwrap();
    let models = report["models"].as_array().unwrap();
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["llm/kinds", "llm/split", "llm/types", "st", "st/st-q"]
    );
    let split = &models[1];
    assert!(split["source"]
        .as_str()
        .unwrap()
        .ends_with("split-00001-of-00002.gguf"));
    // The set's bytes are both members'.
    let members: u64 = ["split-00001-of-00002.gguf", "split-00002-of-00002.gguf"]
        .iter()
        .map(|f| std::fs::metadata(root.join("llm").join(f)).unwrap().len())
        .sum();
    assert_eq!(split["bytes"], members);
    assert!(!out.exists(), "a dry run writes nothing");
}

#[test]
fn converts_every_gguf_to_its_own_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let root = gguf_root(tmp.path());
    let out = tmp.path().join("out");
    // types.gguf holds types reshard cannot dequantize: that model fails,
    // the others convert (exit 1: a model failed). The fixtures say
    // "llama" but hold no llama's tensors: their names are kept.
    let a = batch(
        &root,
        &out,
        &["--dtype", "f32", "--keep-gguf-names", "--json"],
    )
    .code(1);
    let (_, st) = statuses(&a);
    for name in ["llm/kinds", "llm/split", "st", "st/st-q"] {
        assert_eq!(st[name].0, "converted", "{name}: {:?}", st[name]);
        assert!(out.join(name).join("reshard.json").is_file(), "{name}");
    }
    assert_eq!(st["llm/types"].0, "failed");
    // A GGUF's output holds its own weights only: no sibling GGUF copied.
    let listed: Vec<String> = std::fs::read_dir(out.join("llm/split"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(listed.iter().all(|f| !f.ends_with(".gguf")), "{listed:?}");
    assert!(
        listed.iter().any(|f| f.ends_with(".safetensors")),
        "{listed:?}"
    );
}
