//! Names DST did not hold when the run checked it are published only while
//! they are free (issue 30): a file someone puts at one of them during the
//! run is kept, byte for byte, and the run fails naming it, instead of
//! being replaced by a run that then says it succeeded. And names that
//! only look like reshard's bookkeeping (a `.reshard-partial.json` that is
//! no manifest, a `.notes.reshard-tmp`) are the user's: never removed.

use std::path::Path;
use std::process::Command;

use super::shrink::paused;
use super::{assert_refused, convert_out, stderr_of, validate_passes};
use crate::common::*;

fn convert_cmd(dst: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("reshard"));
    cmd.arg("convert")
        .arg(fixture("tiny-llama"))
        .arg(dst)
        .arg("--no-progress")
        .args(extra);
    cmd
}

/// Runs `cmd` paused at its first write, puts `bytes` at `planted` while it
/// waits, lets it go on; returns its exit code and stderr.
fn plant_mid_run(cmd: Command, planted: &Path, bytes: &[u8]) -> (Option<i32>, String) {
    let release = planted.with_extension("go");
    let (mut child, stderr) = paused(cmd, "1", &release);
    std::fs::write(planted, bytes).unwrap();
    std::fs::write(&release, "").unwrap();
    let status = child.wait().unwrap();
    (status.code(), stderr.join().unwrap())
}

#[test]
fn a_file_that_appears_at_a_file_dst_during_the_run_is_kept_and_the_run_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("out.safetensors");
    let (code, err) = plant_mid_run(convert_cmd(&file, &[]), &file, b"the user's file");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("out.safetensors") && err.contains("appeared while reshard was writing it"),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"the user's file");
    // The rerun says the file is there; --overwrite replaces it with the
    // output the first run left staged.
    assert_refused(
        &convert_out(&fixture("tiny-llama"), &file, &[]),
        "--overwrite",
    );
    let out = convert_out(&fixture("tiny-llama"), &file, &["--overwrite"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(validate_passes(&file));
    assert!(!tmp.path().join(".out.safetensors.reshard").exists());
}

#[test]
fn a_file_that_appears_in_a_folder_dst_during_the_run_is_kept_and_the_run_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let config = dst.join("config.json");
    let (code, err) = plant_mid_run(convert_cmd(&dst, &[]), &config, b"{\"mine\": 1}");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("config.json") && err.contains("appeared"),
        "{err}"
    );
    assert_eq!(std::fs::read(&config).unwrap(), b"{\"mine\": 1}");
    assert!(
        !dst.join("reshard.json").exists(),
        "no output was committed"
    );
    // A rerun refuses to replace it; once it is moved away, the run
    // resumes and finishes.
    assert_refused(
        &convert_out(&fixture("tiny-llama"), &dst, &[]),
        "config.json",
    );
    std::fs::rename(&config, tmp.path().join("mine.json")).unwrap();
    let out = convert_out(&fixture("tiny-llama"), &dst, &[]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(validate_passes(&dst));
}

#[test]
fn a_users_file_named_like_the_partial_manifest_is_refused_never_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    let partial = dst.join(".reshard-partial.json");
    std::fs::write(&partial, b"my notes, not JSON").unwrap();
    for extra in [&[][..], &["--overwrite"][..]] {
        let out = convert_out(&fixture("tiny-llama"), &dst, extra);
        assert_refused(&out, ".reshard-partial.json");
        assert!(stderr_of(&out).contains("not a reshard manifest"));
        assert_eq!(std::fs::read(&partial).unwrap(), b"my notes, not JSON");
    }
    let left: Vec<_> = std::fs::read_dir(&dst).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}

#[test]
fn a_users_file_with_the_temp_suffix_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    let notes = dst.join(".notes.reshard-tmp");
    std::fs::write(&notes, b"mine").unwrap();
    // A folder holding someone's file is refused without --overwrite, as
    // for any other name; with it, the file is kept beside the output.
    assert_refused(&convert_out(&fixture("tiny-llama"), &dst, &[]), "not empty");
    assert_eq!(std::fs::read(&notes).unwrap(), b"mine");
    let out = convert_out(&fixture("tiny-llama"), &dst, &["--overwrite"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(&notes).unwrap(), b"mine");
    assert!(validate_passes(&dst));
}

/// The shard names a 100 KB-shard conversion of tiny-llama writes.
fn shard_names(dst: &Path) -> Vec<std::path::PathBuf> {
    (1..=4)
        .map(|i| dst.join(format!("model-0000{i}-of-00004.safetensors")))
        .collect()
}

fn small_shards() -> [&'static str; 4] {
    ["--max-shard-size", "100KB", "--threads", "1"]
}

#[test]
fn a_file_that_appears_at_a_shard_name_during_the_run_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let release = tmp.path().join("go");
    let (mut child, stderr) = paused(convert_cmd(&dst, &small_shards()), "1", &release);
    for (i, shard) in shard_names(&dst).iter().enumerate() {
        std::fs::write(shard, format!("mine {i}")).unwrap();
    }
    std::fs::write(&release, "").unwrap();
    let status = child.wait().unwrap();
    let err = stderr.join().unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("appeared"), "{err}");
    for (i, shard) in shard_names(&dst).iter().enumerate() {
        assert_eq!(
            std::fs::read(shard).unwrap(),
            format!("mine {i}").as_bytes()
        );
    }
}

#[test]
fn a_rerun_after_a_kill_moves_files_at_unverified_shard_names_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let release = tmp.path().join("never");
    let (mut child, _stderr) = paused(convert_cmd(&dst, &small_shards()), "8", &release);
    child.kill().unwrap();
    child.wait().unwrap();
    let mut planted = Vec::new();
    for (i, shard) in shard_names(&dst).iter().enumerate() {
        if !shard.exists() {
            std::fs::write(shard, format!("mine {i}")).unwrap();
            planted.push(format!("mine {i}"));
        }
    }
    assert!(!planted.is_empty(), "the kill came after every shard");
    let out = convert_out(&fixture("tiny-llama"), &dst, &small_shards());
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(validate_passes(&dst));
    // Each planted file is still in DST, under an aside name.
    let mut kept = Vec::new();
    for e in std::fs::read_dir(&dst).unwrap() {
        let p = e.unwrap().path();
        if p.to_string_lossy().ends_with(".reshard-aside") {
            kept.push(String::from_utf8(std::fs::read(&p).unwrap()).unwrap());
        }
    }
    kept.sort();
    planted.sort();
    assert_eq!(kept, planted);
}

#[test]
fn a_split_gguf_member_that_appears_during_the_run_is_kept_even_with_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("m.gguf");
    let member = tmp.path().join("m-00002-of-00003.gguf");
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("reshard"));
    cmd.arg("convert")
        .arg(fixture("gguf/llm/llama"))
        .arg(&first)
        .args([
            "--dtype",
            "f16",
            "--max-shard-size",
            "100KB",
            "--threads",
            "1",
        ])
        .args(["--overwrite", "--no-progress"]);
    let (code, err) = plant_mid_run(cmd, &member, b"mine");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("appeared"), "{err}");
    assert_eq!(std::fs::read(&member).unwrap(), b"mine");
}

#[cfg(unix)]
#[test]
fn a_symlink_at_a_manifest_name_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for name in [".reshard-partial.json", "reshard.json"] {
        let dst = tmp.path().join(format!("out{}", name.len()));
        std::fs::create_dir(&dst).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("nowhere.json"), dst.join(name)).unwrap();
        let out = convert_out(&fixture("tiny-llama"), &dst, &[]);
        assert_refused(&out, "a symlink");
        assert!(
            std::fs::symlink_metadata(dst.join(name)).is_ok(),
            "{name} removed"
        );
        assert!(!tmp.path().join("nowhere.json").exists());
    }
}

#[test]
fn batch_out_that_is_a_file_is_one_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("afile");
    std::fs::write(&out, b"x").unwrap();
    let run = reshard()
        .arg("batch")
        .arg(fixture("tiny-llama").parent().unwrap())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_refused(&run, "is a file, not a folder");
    assert_eq!(std::fs::read(&out).unwrap(), b"x");
}
