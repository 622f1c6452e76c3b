//! Shard digests and the mapped-copy path: BLAKE3 by default, `--sha256`
//! on request (what `sha256sum` prints), manifests from before BLAKE3 still
//! validate, a flipped byte fails under either digest, and writing from
//! mappings of the source gives the same bytes as the forced read/write
//! path.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::common::*;

fn manifest(dst: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dst.join("reshard.json")).unwrap()).unwrap()
}

/// What `sha256sum FILE` prints for `path` (sha2 where the tool is absent).
fn sha256sum(path: &Path) -> String {
    match std::process::Command::new("sha256sum").arg(path).output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string(),
        _ => hex(&Sha256::digest(std::fs::read(path).unwrap())),
    }
}

fn validate_text(path: &Path) -> (i32, String) {
    let out = reshard().arg("validate").arg(path).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

const SMALL: [&str; 2] = ["--max-shard-size", "200KiB"];

#[test]
fn blake3_is_the_default_and_sha256_is_what_sha256sum_prints() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama-f32-sharded");
    let b3 = tmp.path().join("b3");
    convert(&src, &b3, &SMALL).success();
    let sha = tmp.path().join("sha");
    convert(&src, &sha, &[SMALL[0], SMALL[1], "--sha256"]).success();
    let (m3, ms) = (manifest(&b3), manifest(&sha));
    let shards = m3["shards"].as_array().unwrap();
    assert!(shards.len() > 1);
    for (a, b) in shards.iter().zip(ms["shards"].as_array().unwrap()) {
        let file = a["file"].as_str().unwrap();
        let bytes = std::fs::read(b3.join(file)).unwrap();
        assert_eq!(
            a["blake3"].as_str().unwrap(),
            blake3::hash(&bytes).to_hex().as_str()
        );
        assert!(a.get("sha256").is_none(), "{a}");
        assert_eq!(b["sha256"].as_str().unwrap(), sha256sum(&sha.join(file)));
        assert!(b.get("blake3").is_none(), "{b}");
        // The digest changes the manifest only, never the shard.
        assert_eq!(bytes, std::fs::read(sha.join(file)).unwrap());
    }
    for dst in [&b3, &sha] {
        let (code, text) = validate_text(dst);
        assert_eq!(code, 0, "{text}");
    }
}

#[test]
fn a_manifest_from_before_blake3_still_validates_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama-f32-sharded");
    let dst = tmp.path().join("out");
    convert(&src, &dst, &SMALL).success();
    // Rewrite it as reshard wrote it before BLAKE3: "sha256" in each shard.
    let mut m = manifest(&dst);
    for s in m["shards"].as_array_mut().unwrap() {
        let file = s["file"].as_str().unwrap().to_string();
        let obj = s.as_object_mut().unwrap();
        obj.remove("blake3");
        obj.insert("sha256".into(), sha256sum(&dst.join(&file)).into());
    }
    std::fs::write(
        dst.join("reshard.json"),
        serde_json::to_vec_pretty(&m).unwrap(),
    )
    .unwrap();
    let (code, text) = validate_text(&dst);
    assert_eq!(code, 0, "{text}");
    // A rerun finds the old manifest up to date instead of failing to read it.
    let out = reshard()
        .arg("convert")
        .arg(&src)
        .arg(&dst)
        .args(["--no-progress", SMALL[0], SMALL[1]])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("up to date"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // And the old digest is still checked: a flipped byte fails.
    let victim = dst.join(m["shards"][0]["file"].as_str().unwrap());
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&victim, bytes).unwrap();
    let (code, text) = validate_text(&dst);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("its digest is sha256"), "{text}");
}

#[test]
fn validate_detects_a_flipped_byte_under_each_digest() {
    for (name, extra) in [("blake3", None), ("sha256", Some("--sha256"))] {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("out");
        let mut args = SMALL.to_vec();
        args.extend(extra);
        convert(&fixture("tiny-llama-f32-sharded"), &dst, &args).success();
        let m = manifest(&dst);
        let file = m["shards"][1]["file"].as_str().unwrap();
        let path = dst.join(file);
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x10;
        std::fs::write(&path, bytes).unwrap();
        let (code, text) = validate_text(&dst);
        assert_eq!(code, 1, "{name}: {text}");
        assert!(
            text.contains(&format!("{file}: its digest is {name} ")),
            "{name}: {text}"
        );
    }
}

/// A 64 KiB window is too small to map (the buffered path takes every
/// shard); 1 MiB maps several tensors at once and reads short runs.
#[test]
fn the_mapped_copy_and_forced_read_write_give_identical_shards() {
    let tmp = tempfile::tempdir().unwrap();
    for fixture_name in [
        "tiny-llama-f32-sharded",
        "tiny-moe-sharded",
        "tiny-llama-bin",
    ] {
        for window in ["64KiB", "1MiB"] {
            let src = fixture(fixture_name);
            let fast = tmp.path().join(format!("{fixture_name}-{window}-fast"));
            let slow = tmp.path().join(format!("{fixture_name}-{window}-slow"));
            let args = [
                "--max-shard-size",
                "100KiB",
                "--window",
                window,
                "--threads",
                "2",
            ];
            let files = assert_same_without_mmap(&src, &fast, &slow, &args);
            assert!(files > 3, "{fixture_name} {window}: {files} files");
            let (code, text) = validate_text(&fast);
            assert_eq!(code, 0, "{fixture_name} {window}: {text}");
        }
    }
}

/// A run killed after some shards: a rerun keeps them (their BLAKE3 checks
/// out), and a rerun with `--sha256` rewrites them, so one manifest never
/// mixes digests.
#[test]
fn resume_after_a_kill_checks_the_recorded_digest() {
    let src = fixture("tiny-llama-f32-sharded");
    let args = [
        "--no-progress",
        "--threads",
        "1",
        "--window",
        "16KiB",
        "--max-shard-size",
        "120KB",
    ];
    let cmd = |dst: &Path, extra: &[&str]| {
        let mut c = std::process::Command::new(assert_cmd::cargo::cargo_bin("reshard"));
        c.arg("convert").arg(&src).arg(dst).args(args).args(extra);
        c
    };
    // Kill at a write step after at least one shard is recorded.
    let killed = |dst: &Path| {
        for step in [40, 80, 160] {
            let _ = std::fs::remove_dir_all(dst);
            let Some(mut child) = crate::crash::spawn_paused(cmd(dst, &[]), step, None) else {
                break;
            };
            child.kill().unwrap();
            child.wait().unwrap();
            let partial = dst.join(".reshard-partial.json");
            let Ok(text) = std::fs::read(&partial) else {
                continue;
            };
            let m: serde_json::Value = serde_json::from_slice(&text).unwrap();
            if m["shards"].as_array().is_some_and(|s| !s.is_empty()) {
                assert!(m["shards"][0].get("blake3").is_some(), "{m}");
                return;
            }
        }
        panic!("no write step left a finished shard");
    };
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    killed(&dst);
    let out = cmd(&dst, &[]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("resumed: kept"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(validate_text(&dst).0, 0);

    killed(&dst);
    let out = cmd(&dst, &["--sha256"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("resumed: kept"));
    for s in manifest(&dst)["shards"].as_array().unwrap() {
        let file = s["file"].as_str().unwrap();
        assert_eq!(
            s["sha256"].as_str().unwrap(),
            sha256sum(&dst.join(file)),
            "{file}"
        );
    }
    assert_eq!(validate_text(&dst).0, 0);
}

/// A finished output whose shard was truncated (or removed) since is not
/// "up to date": a rerun rewrites that shard alone, and the output
/// validates again.
#[test]
fn a_truncated_or_missing_shard_is_rewritten_not_called_up_to_date() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama-f32-sharded");
    let dst = tmp.path().join("dst");
    convert(&src, &dst, &SMALL).success();
    let shards: Vec<String> = manifest(&dst)["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["file"].as_str().unwrap().to_string())
        .collect();
    assert!(shards.len() > 2, "{shards:?}");
    let intact = std::fs::read(dst.join(&shards[0])).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dst.join(&shards[1]))
        .unwrap();
    f.set_len(1000).unwrap();
    drop(f);
    std::fs::remove_file(dst.join(&shards[2])).unwrap();
    let out = convert(&src, &dst, &SMALL).success();
    let o = out.get_output();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!said.contains("up to date"), "{said}");
    assert_eq!(validate_text(&dst).0, 0, "{}", validate_text(&dst).1);
    assert_eq!(std::fs::read(dst.join(&shards[0])).unwrap(), intact);
    assert!(!dst.join(".reshard-partial.json").exists());
}
