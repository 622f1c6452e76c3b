//! Ctrl-C (issue 30): every long loop polls the cancel flag, so a run
//! stopped while it copies a model's other files or validates its output
//! exits 2 saying so, and neither commits nor says "passed".

use std::path::Path;
use std::process::Command;

use crate::common::*;
use crate::crash::{send_ctrl_c, spawn_paused_at};

fn convert_cmd(src: &Path, dst: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("reshard"));
    c.arg("convert")
        .arg(src)
        .arg(dst)
        .arg("--no-progress")
        .args(extra);
    // Ctrl-C reaches the processes of a console: give the child its own.
    #[cfg(windows)]
    std::os::windows::process::CommandExt::creation_flags(&mut c, crate::crash::CREATE_NEW_CONSOLE);
    c
}

/// Pauses the run at `at`, sends Ctrl-C, lets it go on; returns its exit
/// status.
fn interrupt_at(cmd: Command, at: &str, release: &Path) -> Option<i32> {
    let mut child = spawn_paused_at(cmd, at, Some(release)).expect("pauses");
    send_ctrl_c(child.id());
    std::fs::write(release, "").unwrap();
    child.wait().unwrap().code()
}

/// 5,000 small files took 8-17 s to copy, and Ctrl-C in the middle was
/// ignored: the run committed and exited 0.
#[test]
fn ctrl_c_while_copying_other_files_stops_before_the_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    let docs = src.join("docs");
    std::fs::create_dir(&docs).unwrap();
    for i in 0..5000 {
        std::fs::write(docs.join(format!("note-{i:04}.txt")), i.to_string()).unwrap();
    }
    let dst = tmp.path().join("out");
    // Step 1000 is a copy: the shard takes a handful of steps.
    let status = interrupt_at(convert_cmd(&src, &dst, &[]), "1000", &tmp.path().join("go"));
    assert_eq!(status, Some(2));
    assert!(!dst.join("reshard.json").exists(), "committed");
    let copied = std::fs::read_dir(dst.join("docs")).map_or(0, |d| d.count());
    assert!(copied < 5000, "every file was copied after Ctrl-C");
    // A rerun finishes the job.
    convert(&src, &dst, &[]).success();
    assert_eq!(std::fs::read_dir(dst.join("docs")).unwrap().count(), 5000);
    assert_matches_expected(&dst, "tiny-llama");
}

/// `convert --validate`'s validation went on after Ctrl-C and said
/// "passed" (exit 0).
#[test]
fn ctrl_c_during_convert_validate_stops_the_validation() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let cmd = convert_cmd(&fixture("tiny-llama-f32-sharded"), &dst, &["--validate"]);
    let status = interrupt_at(cmd, "validate", &tmp.path().join("go"));
    assert_eq!(status, Some(2));
    // The conversion itself had committed; the validation did not pass.
    assert!(dst.join("reshard.json").exists());
    // And the same for plain validate.
    let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("reshard"));
    cmd.arg("validate")
        .arg(&dst)
        .args(["--against"])
        .arg(fixture("tiny-llama-f32-sharded"));
    #[cfg(windows)]
    std::os::windows::process::CommandExt::creation_flags(
        &mut cmd,
        crate::crash::CREATE_NEW_CONSOLE,
    );
    let status = interrupt_at(cmd, "validate", &tmp.path().join("go2"));
    assert_eq!(status, Some(2));
}

/// One large mirrored file (a data set sample, training logs) was copied
/// whole after Ctrl-C: the flag was looked at between files only. It is
/// now looked at between chunks of one file, whose temp file goes.
#[test]
fn ctrl_c_while_copying_one_large_other_file_stops_within_it() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    // Two and a bit copy chunks (16 MiB each), sparse where it can be.
    let big = std::fs::File::create(src.join("training_notes.txt")).unwrap();
    big.set_len(2 * (16 << 20) + 1).unwrap();
    drop(big);
    let dst = tmp.path().join("out");
    let status = interrupt_at(
        convert_cmd(&src, &dst, &[]),
        "copy-chunk",
        &tmp.path().join("go"),
    );
    assert_eq!(status, Some(2));
    assert!(!dst.join("reshard.json").exists(), "committed");
    assert!(
        !dst.join("training_notes.txt").exists(),
        "copied whole after Ctrl-C"
    );
    let temps: Vec<_> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".reshard-tmp"))
        .collect();
    assert!(temps.is_empty(), "temp files left: {temps:?}");
    convert(&src, &dst, &[]).success();
    assert_eq!(
        std::fs::metadata(dst.join("training_notes.txt"))
            .unwrap()
            .len(),
        2 * (16 << 20) + 1
    );
}

/// `validate --emulate` looked at the flag between tensors only, so one
/// multi-GiB tensor was copied, read and hashed whole after Ctrl-C. It now
/// looks after every 16 MiB step: the run below is paused after the first
/// step of a 40 MiB tensor (the only one), and stops there.
#[test]
fn ctrl_c_during_an_emulated_load_stops_within_a_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let len: u64 = 40 << 20;
    let header = serde_json::json!({
        "big.weight": {"dtype": "F32", "shape": [len / 4], "data_offsets": [0, len]}
    });
    let file = model.join("model.safetensors");
    write_safetensors(&file, &header, &[]);
    // Zeros, sparse where the file system allows.
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    let header_len = f.metadata().unwrap().len();
    f.set_len(header_len + len).unwrap();
    drop(f);
    for (i, loader) in ["per-shard-mmap", "transformers-v5-pread", "full-read"]
        .iter()
        .enumerate()
    {
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("reshard"));
        cmd.args(["validate", "--no-progress", "--emulate", loader])
            .arg(&model);
        #[cfg(windows)]
        std::os::windows::process::CommandExt::creation_flags(
            &mut cmd,
            crate::crash::CREATE_NEW_CONSOLE,
        );
        let status = interrupt_at(cmd, "emulate-step", &tmp.path().join(format!("go-{i}")));
        assert_eq!(status, Some(2), "{loader}");
    }
}
