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
