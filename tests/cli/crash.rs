//! Crash consistency and I/O failures: SIGKILL at many write steps, a full
//! disk, a read-only DST, a source that changes mid-run. After each: the
//! source is untouched, nothing incomplete sits under a final name, and a
//! rerun produces exactly what an uninterrupted run does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::common::*;

/// Small chunks and one thread make many deterministic write steps.
const ARGS: [&str; 7] = [
    "--no-progress",
    "--threads",
    "1",
    "--window",
    "16KiB",
    "--max-shard-size",
    "120KB",
];

fn hashes(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_file() {
                let bytes = std::fs::read(e.path()).unwrap();
                out.insert(
                    e.file_name().to_string_lossy().into_owned(),
                    hex(&Sha256::digest(&bytes)),
                );
            }
        }
    }
    out
}

fn convert_cmd(src: &Path, dst: &Path) -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("reshard"));
    c.arg("convert").arg(src).arg(dst).args(ARGS);
    c
}

/// Starts a conversion that pauses at write step `step`; None if the run
/// finished before reaching it.
fn start_paused(
    src: &Path,
    dst: &Path,
    step: u64,
    release: Option<&Path>,
) -> Option<std::process::Child> {
    let mut cmd = convert_cmd(src, dst);
    cmd.env("RESHARD_PAUSE_AT", step.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(r) = release {
        cmd.env("RESHARD_PAUSE_UNTIL", r);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    while stderr.read_line(&mut line).unwrap() > 0 {
        if line.contains("paused at write step") {
            // Keep draining stderr in the background so the child never blocks.
            std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
            return Some(child);
        }
        line.clear();
    }
    assert!(
        child.wait().unwrap().success(),
        "run without a pause failed"
    );
    None
}

/// The invariants that must hold in DST at any moment.
fn assert_consistent(dst: &Path, clean: &BTreeMap<String, String>) {
    let now = hashes(dst);
    for (name, hash) in &now {
        if name.starts_with('.') {
            continue; // temp files and the partial manifest are not final names
        }
        assert_eq!(
            Some(hash),
            clean.get(name),
            "{name} under its final name differs from a clean run's"
        );
    }
    if now.contains_key("reshard.json") || now.keys().any(|n| n.ends_with(".index.json")) {
        // A commit point exists: every shard it promises must be there.
        for (name, hash) in clean {
            if name.ends_with(".safetensors") {
                assert_eq!(now.get(name), Some(hash), "index committed before {name}");
            }
        }
    }
}

#[test]
fn sigkill_at_every_write_step_then_rerun_matches_a_clean_run() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama-f32-sharded", tmp.path());
    let source_before = hashes(&src);
    let clean_dir = tmp.path().join("clean");
    assert!(convert_cmd(&src, &clean_dir).status().unwrap().success());
    let clean = hashes(&clean_dir);
    let shards = clean.keys().filter(|n| n.ends_with(".safetensors")).count();
    assert!(shards >= 4, "want several shards, got {shards}");

    let mut killed = 0;
    for step in 1.. {
        let dst = tmp.path().join(format!("run{step}"));
        let Some(mut child) = start_paused(&src, &dst, step, None) else {
            break;
        };
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        killed += 1;
        assert_eq!(hashes(&src), source_before, "source changed (step {step})");
        assert_consistent(&dst, &clean);
        let rerun = convert_cmd(&src, &dst).output().unwrap();
        assert!(
            rerun.status.success(),
            "rerun after step {step}: {}",
            String::from_utf8_lossy(&rerun.stderr)
        );
        let mut after = hashes(&dst);
        let mut want = clean.clone();
        after.remove("reshard.json");
        want.remove("reshard.json");
        assert_eq!(
            after, want,
            "rerun after a kill at step {step} differs from a clean run"
        );
        std::fs::remove_dir_all(&dst).unwrap();
    }
    assert!(killed >= 20, "only {killed} kill points");
}

/// Mounts a tmpfs of `size` at a new folder; None (with a printed reason)
/// when not root or mounting is not allowed here.
pub fn tmpfs(size: &str, read_only: bool) -> Option<(tempfile::TempDir, PathBuf)> {
    let holder = tempfile::tempdir().unwrap();
    let mnt = holder.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let opts = format!("size={size}{}", if read_only { ",ro" } else { "" });
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &opts, "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return None;
    }
    Some((holder, mnt))
}

pub struct Unmount(pub PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The disk fills during the run (after convert's free-space check passed:
/// another writer took the space): exit 2 naming the file, nothing partial.
/// (Too little space from the start is refused earlier: tests/cli/touch.rs.)
#[test]
fn full_disk_exits_2_naming_the_file_and_leaves_nothing_partial() {
    let Some((_holder, mnt)) = tmpfs("2m", false) else {
        return;
    };
    let _guard = Unmount(mnt.clone());
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama-f32-sharded", tmp.path());
    let clean_dir = tmp.path().join("clean");
    assert!(convert_cmd(&src, &clean_dir).status().unwrap().success());
    let dst = mnt.join("out");
    let release = tmp.path().join("go");
    let mut child = convert_cmd(&src, &dst)
        .env("RESHARD_PAUSE_AT", "2")
        .env("RESHARD_PAUSE_UNTIL", &release)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("paused at write step") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut stderr, &mut line).unwrap() > 0,
            "ended before its pause"
        );
    }
    // Another writer fills the file system while the run is paused.
    let mut filler = std::fs::File::create(mnt.join("filler")).unwrap();
    let block = vec![0u8; 4096];
    while std::io::Write::write_all(&mut filler, &block).is_ok() {}
    drop(filler);
    std::fs::write(&release, "").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(2), "{rest}");
    assert!(rest.contains("No space left on device"), "{rest}");
    assert!(
        rest.contains(&dst.display().to_string()),
        "names the file: {rest}"
    );
    assert_consistent(&dst, &hashes(&clean_dir));
    let temps: Vec<_> = hashes(&dst)
        .into_keys()
        .filter(|n| n.ends_with(".reshard-tmp"))
        .collect();
    assert!(temps.is_empty(), "temp files left: {temps:?}");
}

#[test]
fn read_only_dst_is_a_clear_error() {
    let Some((_holder, mnt)) = tmpfs("1m", true) else {
        return;
    };
    let _guard = Unmount(mnt.clone());
    let out = convert_cmd(&fixture("tiny-llama"), &mnt).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Read-only file system"), "{stderr}");
}

#[test]
fn source_changed_mid_run_is_refused_and_nothing_is_committed() {
    for truncate in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let src = copy_fixture("tiny-llama-f32-sharded", tmp.path());
        let dst = tmp.path().join("out");
        let release = tmp.path().join("go");
        let mut child = start_paused(&src, &dst, 3, Some(&release)).expect("pauses");
        let victim = src.join("model-00006-of-00006.safetensors");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&victim)
            .unwrap();
        if truncate {
            f.set_len(1000).unwrap();
        } else {
            f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
                .unwrap();
        }
        drop(f);
        std::fs::write(&release, "").unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(2), "truncate={truncate}");
        assert!(!dst.join("reshard.json").exists());
        assert!(!dst.join("model.safetensors.index.json").exists());
        let temps: Vec<_> = hashes(&dst)
            .into_keys()
            .filter(|n| n.ends_with(".reshard-tmp"))
            .collect();
        assert!(temps.is_empty(), "temp files left: {temps:?}");
    }
}

#[test]
fn ctrl_c_stops_between_chunks_and_leaves_no_temp_files() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama-f32-sharded", tmp.path());
    let dst = tmp.path().join("out");
    let release = tmp.path().join("go");
    let mut child = start_paused(&src, &dst, 20, Some(&release)).expect("pauses");
    // SIGINT, as Ctrl-C sends it, then let the paused write go on.
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    std::fs::write(&release, "").unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(2));
    let names: Vec<String> = hashes(&dst).into_keys().collect();
    assert!(
        !names.iter().any(|n| n.ends_with(".reshard-tmp")),
        "temp files left: {names:?}"
    );
    assert!(
        !names
            .iter()
            .any(|n| n == "reshard.json" || n.ends_with(".index.json")),
        "{names:?}"
    );
    // The run resumes from where Ctrl-C stopped it.
    let rerun = convert_cmd(&src, &dst).output().unwrap();
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    assert_matches_expected(&dst, "tiny-llama-f32-sharded");
}
