//! File-system semantics where Windows differs from Unix: folder names
//! outside ASCII, paths past Windows' old 260-character limit, an output
//! another process holds open, names that differ only in case, and the
//! read-only attribute. Every test runs on every platform; where the
//! expected outcome differs, the test says which platform does what.

use std::path::{Path, PathBuf};

use crate::common::*;

/// A folder name no code page but UTF-16/UTF-8 holds, as in
/// `C:\Users\Jürgen\...`.
const JURGEN: &str = "Jürgen ü 模型";

#[test]
fn non_ascii_folders_convert_and_are_named_in_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join(JURGEN);
    let src = copy_fixture("tiny-llama", &home);
    let dst = home.join("résultat");
    convert(&src, &dst, &["--max-shard-size", "100KB"]).success();
    assert_matches_expected(&dst, "tiny-llama");
    reshard()
        .arg("validate")
        .arg(&dst)
        .arg("--against")
        .arg(&src)
        .assert()
        .success();
    // Up to date on a rerun: the manifest's recorded paths compare equal.
    let again = convert(&src, &dst, &["--max-shard-size", "100KB"]).success();
    let text = String::from_utf8_lossy(&again.get_output().stderr).into_owned()
        + &String::from_utf8_lossy(&again.get_output().stdout);
    assert!(text.contains("up to date"), "{text}");

    // An error names the folder intact (UTF-8 on stderr, not a code page).
    let missing = home.join("fehlt");
    let out = reshard().arg("inspect").arg(&missing).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).expect("stderr is UTF-8");
    assert!(stderr.contains(JURGEN), "{stderr}");
}

/// `dir` extended by nested folders until the path is over `len` characters.
fn deep(dir: &Path, len: usize) -> PathBuf {
    let mut p = dir.to_path_buf();
    let mut i = 0;
    while p.as_os_str().len() <= len {
        p.push(format!(
            "nested-folder-{i:02}-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
        ));
        i += 1;
    }
    p
}

#[test]
fn paths_longer_than_260_characters_convert_validate_and_rerun() {
    // MAX_PATH is 260; Rust's std reaches past it on Windows through `\\?\`
    // paths, which every call reshard makes must accept.
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama-f32-sharded", &deep(tmp.path(), 200));
    let dst = deep(tmp.path(), 300).join("out");
    assert!(dst.as_os_str().len() > 300);
    convert(&src, &dst, &["--max-shard-size", "200KB"]).success();
    assert_matches_expected(&dst, "tiny-llama-f32-sharded");
    reshard()
        .arg("validate")
        .arg(&dst)
        .args(["--commit-budget", "256MiB"])
        .assert()
        .success();
    let again = convert(&src, &dst, &["--max-shard-size", "200KB"]).success();
    let out = again.get_output();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("up to date"), "{text}");
}

/// Opens `path` for reading the way most programs do: Python's `open` and
/// C's `fopen` on Windows share read and write, not delete, so the file
/// cannot be renamed over or deleted while it is open. On Unix any open
/// file can be.
fn open_like_python(path: &Path) -> std::fs::File {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(windows)]
    std::os::windows::fs::OpenOptionsExt::share_mode(&mut options, 0x1 | 0x2);
    options.open(path).unwrap()
}

#[test]
fn an_output_held_open_by_another_program_fails_cleanly_then_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let src = fixture("tiny-llama-f32-sharded");
    convert(&src, &dst, &["--max-shard-size", "200KB"]).success();
    let index = dst.join("model.safetensors.index.json");
    let held = open_like_python(&index);
    let out = reshard()
        .args([
            "convert",
            "--no-progress",
            "--max-shard-size",
            "300KB",
            "--overwrite",
        ])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(windows) {
        // The open index cannot be replaced: exit 2, naming it; nothing is
        // left half-committed.
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("model.safetensors.index.json"), "{stderr}");
        let temps: Vec<_> = std::fs::read_dir(&dst)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".reshard-tmp"))
            .collect();
        assert!(temps.is_empty(), "temp files left: {temps:?}");
    } else {
        assert_eq!(out.status.code(), Some(0), "{stderr}");
    }
    // Once the other program lets go, a rerun finishes the job.
    drop(held);
    convert(&src, &dst, &["--max-shard-size", "300KB", "--overwrite"]).success();
    assert_matches_expected(&dst, "tiny-llama-f32-sharded");
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dst.join("reshard.json")).unwrap()).unwrap();
    assert_eq!(m["options"]["max_shard_size"], 300_000);
}

#[test]
fn a_foreign_file_differing_only_in_case_is_never_overwritten() {
    // On Windows (and macOS) `Model.safetensors` and `model.safetensors` are
    // one file: writing reshard's output must not replace the user's.
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    let mine = dst.join("Model.safetensors");
    std::fs::write(&mine, b"the user's own file").unwrap();
    convert(&fixture("tiny-llama"), &dst, &[])
        .code(2)
        .stderr(predicates::str::contains("--overwrite"));
    let names: Vec<String> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".reshard.lock")
        .collect();
    assert_eq!(names, ["Model.safetensors"]);
    assert_eq!(std::fs::read(&mine).unwrap(), b"the user's own file");
}

#[test]
fn read_only_output_files_are_a_clear_error_or_replaced() {
    // The read-only attribute (Unix: no write bit). Windows refuses to
    // replace or delete a read-only file; Unix renames over it (the folder
    // is writable). Either way nothing is half-written.
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let src = fixture("tiny-llama-f32-sharded");
    convert(&src, &dst, &["--max-shard-size", "200KB"]).success();
    let index = dst.join("model.safetensors.index.json");
    let mut perms = std::fs::metadata(&index).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&index, perms.clone()).unwrap();
    let out = reshard()
        .args([
            "convert",
            "--no-progress",
            "--max-shard-size",
            "300KB",
            "--overwrite",
        ])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            if cfg!(windows) && !under_wine() {
                panic!("Windows replaced a read-only file: {stderr}");
            }
            if cfg!(windows) {
                eprintln!(
                    "note: Wine (running as root) replaces a read-only file; Windows refuses"
                );
            }
            assert_matches_expected(&dst, "tiny-llama-f32-sharded");
        }
        Some(2) => {
            assert!(stderr.contains("model.safetensors.index.json"), "{stderr}");
            assert!(!dst.join("reshard.json.reshard-tmp").exists());
        }
        other => panic!("exit {other:?}: {stderr}"),
    }
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&index, perms).unwrap();
}

#[test]
fn validate_says_whether_the_system_enforced_the_commit_budget() {
    // The budget child probes its own limit: Linux's RLIMIT_DATA and a real
    // Windows Job Object refuse the probe; Wine accepts the limit and then
    // ignores it, and validate must not call that budget "enforced".
    let run = |json: bool| {
        let mut cmd = reshard();
        cmd.arg("validate")
            .arg(fixture("tiny-llama"))
            .args(["--commit-budget", "64MiB"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let report: serde_json::Value = serde_json::from_str(&run(true)).unwrap();
    let expected = commit_limit_enforced();
    assert_eq!(report["commit_budget_enforced"], expected, "{report:#}");
    let text = run(false);
    if expected {
        assert!(text.contains("budget 64.00 MiB (enforced)"), "{text}");
    } else {
        assert!(text.contains("(not enforced: "), "{text}");
    }
    // Without a budget there is nothing to enforce, and nothing is claimed.
    let out = reshard()
        .arg("validate")
        .arg(fixture("tiny-llama"))
        .arg("--json")
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["commit_budget_enforced"].is_null(), "{report:#}");
}
