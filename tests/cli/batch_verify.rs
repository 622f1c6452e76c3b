//! `batch --verify-source`, which hashes a Hugging Face cache model beside
//! its conversion: a blob that fails leaves no committed output, removes
//! only what the run wrote, never touches the source, and a rerun after the
//! blob is fixed converts the model properly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::batch::{batch, hf_repo, statuses};
use crate::common::*;

const MODEL: &str = "org--tiny";
/// Several shards, so a run writes more than one file it may take back.
const SHARDS: [&str; 2] = ["--max-shard-size", "200KB"];

/// An HF cache of tiny-llama under `tmp/root`, or None where the platform
/// makes no symlinks (no sha256 names to check: nothing to test).
fn cache(tmp: &Path) -> Option<(PathBuf, PathBuf)> {
    let root = tmp.join("root");
    let (repo, linked) = hf_repo(&root.join("hub"), "tiny-llama");
    if !linked {
        eprintln!("skipped: no symlinks on this platform");
        return None;
    }
    let blob = std::fs::canonicalize(repo.join("snapshots/0123abcd/model.safetensors")).unwrap();
    Some((root, blob))
}

/// Flips the last byte of `blob` (tensor data: the header still reads, so
/// the conversion itself goes through) and returns the original bytes.
fn corrupt(blob: &Path) -> Vec<u8> {
    let good = std::fs::read(blob).unwrap();
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 0xff;
    std::fs::write(blob, bad).unwrap();
    good
}

fn set_mtime(path: &Path, mtime: SystemTime) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_modified(mtime).unwrap();
}

/// Every file in `dir` (not recursive) with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            let name = e.file_name().into_string().unwrap();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect()
}

fn weight_files(dir: &Path) -> Vec<String> {
    files(dir)
        .into_keys()
        .filter(|n| n.ends_with(".safetensors") || n.ends_with(".index.json"))
        .collect()
}

/// Runs a `--verify-source --json` batch and returns the model's line.
fn run(root: &Path, out: &Path, extra: &[&str], code: i32) -> serde_json::Value {
    let mut args = vec!["--json", "--verify-source"];
    args.extend_from_slice(extra);
    let a = batch(root, out, &args).code(code);
    let (report, _) = statuses(&a);
    report["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == MODEL)
        .unwrap()
        .clone()
}

fn assert_mismatch(line: &serde_json::Value) {
    assert_eq!(line["status"], "failed", "{line}");
    let reason = line["reason"].as_str().unwrap();
    assert!(
        reason.contains("model.safetensors") && reason.contains("corrupted or truncated download"),
        "{line}"
    );
}

#[test]
fn a_bad_blob_commits_nothing_removes_only_what_the_run_wrote_and_a_fixed_rerun_converts() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((root, blob)) = cache(tmp.path()) else {
        return;
    };
    let out = tmp.path().join("out");
    let dst = out.join(MODEL);
    // A file of the user's in DST (allowed in with --overwrite): never removed.
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::write(dst.join("notes.txt"), "mine").unwrap();
    let mut args = SHARDS.to_vec();
    args.push("--overwrite");

    let good = corrupt(&blob);
    let blobs_before = files(blob.parent().unwrap());
    assert_mismatch(&run(&root, &out, &args, 1));
    assert!(!dst.join("reshard.json").exists());
    assert_eq!(
        weight_files(&dst),
        Vec::<String>::new(),
        "shards taken back"
    );
    assert_eq!(std::fs::read(dst.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(
        files(blob.parent().unwrap()),
        blobs_before,
        "the source is never touched"
    );
    // Not up to date on a rerun either, whatever the mode.
    assert_mismatch(&run(&root, &out, &args, 1));
    for mode in ["fit", "validate"] {
        let mut with_mode = args.clone();
        with_mode.extend(["--mode", mode]);
        assert_mismatch(&run(&root, &out, &with_mode, 1));
    }

    std::fs::write(&blob, &good).unwrap();
    let line = run(&root, &out, &args, 0);
    assert_eq!(line["status"], "converted", "{line}");
    assert_eq!(line["verified_files"], 2, "{line}");
    assert_matches_expected(&dst, "tiny-llama");
    assert!(weight_files(&dst).len() > 2, "{:?}", weight_files(&dst));
    assert_eq!(std::fs::read(dst.join("notes.txt")).unwrap(), b"mine");
    let line = run(&root, &out, &args, 0);
    assert_eq!(line["status"], "up_to_date", "{line}");
    assert_eq!(line["verified_files"], 2, "{line}");
}

#[test]
fn a_bad_blob_leaves_an_earlier_conversion_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((root, blob)) = cache(tmp.path()) else {
        return;
    };
    let out = tmp.path().join("out");
    let dst = out.join(MODEL);
    assert_eq!(run(&root, &out, &SHARDS, 0)["status"], "converted");
    let before = files(&dst);

    // The changed blob is another source (size and time are in the plan
    // id): batch would replace the output, but not before the hash passed.
    let good = corrupt(&blob);
    assert_mismatch(&run(&root, &out, &SHARDS, 1));
    assert_eq!(files(&dst), before, "the earlier output is untouched");

    std::fs::write(&blob, &good).unwrap();
    assert_eq!(run(&root, &out, &SHARDS, 0)["status"], "converted");
    assert_matches_expected(&dst, "tiny-llama");
}

#[test]
fn a_bad_blob_during_a_resume_takes_back_the_shard_it_rewrote() {
    // The blob changes but keeps its size and time, so the plan is the same
    // and a missing shard is resumed from the bad blob: without taking it
    // back, the next run would find every shard and call it up to date.
    let tmp = tempfile::tempdir().unwrap();
    let Some((root, blob)) = cache(tmp.path()) else {
        return;
    };
    let out = tmp.path().join("out");
    let dst = out.join(MODEL);
    assert_eq!(run(&root, &out, &SHARDS, 0)["status"], "converted");
    let shards: Vec<String> = weight_files(&dst)
        .into_iter()
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert!(shards.len() >= 2, "{shards:?}");
    let gone = dst.join(&shards[0]);
    std::fs::remove_file(&gone).unwrap();

    let mtime = std::fs::metadata(&blob).unwrap().modified().unwrap();
    let good = corrupt(&blob);
    set_mtime(&blob, mtime);
    for _ in 0..2 {
        assert_mismatch(&run(&root, &out, &SHARDS, 1));
        assert!(!gone.exists(), "the shard this run wrote was taken back");
        for kept in &shards[1..] {
            assert!(dst.join(kept).exists(), "{kept}: not this run's to remove");
        }
    }

    std::fs::write(&blob, &good).unwrap();
    set_mtime(&blob, mtime);
    let line = run(&root, &out, &SHARDS, 0);
    assert_eq!(line["status"], "converted", "{line}");
    assert_matches_expected(&dst, "tiny-llama");
}

#[test]
fn a_good_cache_reports_the_hash_ran_beside_the_conversion() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((root, _)) = cache(tmp.path()) else {
        return;
    };
    let out = tmp.path().join("out");
    let line = run(&root, &out, &[], 0);
    assert_eq!(line["status"], "converted", "{line}");
    assert_eq!(line["verified_files"], 2, "{line}");
    assert!(line["verify_seconds"].as_f64().unwrap() >= 0.0, "{line}");
    assert!(
        line["verify_waited_seconds"].as_f64().unwrap() >= 0.0,
        "{line}"
    );
    assert_matches_expected(&out.join(MODEL), "tiny-llama");

    let text = batch(&root, &tmp.path().join("text"), &["--verify-source"]).success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(
        text.contains("verified 2 source files by sha256 in ")
            && text.contains("alongside the job, which waited "),
        "{text}"
    );
}
