//! Crash consistency and I/O failures: SIGKILL at many write steps, a full
//! disk, a read-only DST, a source that changes mid-run. After each: the
//! source is untouched, nothing incomplete sits under a final name, and a
//! rerun produces exactly what an uninterrupted run does.

use std::collections::BTreeMap;
use std::path::Path;
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
    spawn_paused(convert_cmd(src, dst), step, release)
}

/// [`start_paused`] for a prepared command.
pub fn spawn_paused(
    cmd: Command,
    step: u64,
    release: Option<&Path>,
) -> Option<std::process::Child> {
    spawn_paused_at(cmd, &step.to_string(), release)
}

/// [`spawn_paused`] at a numbered or a named step (`validate`).
pub fn spawn_paused_at(
    mut cmd: Command,
    at: &str,
    release: Option<&Path>,
) -> Option<std::process::Child> {
    cmd.env("RESHARD_PAUSE_AT", at)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(r) = release {
        cmd.env("RESHARD_PAUSE_UNTIL", r);
    }
    // Wine 8 under load now and then fails a CreateProcess with "Internal
    // error" (1359); the sigkill test starts ~60 children. Try again then.
    let mut tries = 0;
    let mut child = loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(1359) && under_wine() && tries < 3 => tries += 1,
            other => break other.unwrap(),
        }
    };
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
#[cfg(unix)]
pub fn tmpfs(size: &str, read_only: bool) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
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

#[cfg(unix)]
pub struct Unmount(pub std::path::PathBuf);
#[cfg(unix)]
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A small volume (2 MB, or 1 MB read-only) to write into, and what holds
/// it. Unix mounts a tmpfs (needs root). Windows cannot make one without
/// admin tools (a VHD): it takes a folder on one from the environment
/// (`RESHARD_TEST_FULL_DIR`, `RESHARD_TEST_READONLY_DIR`; under Wine,
/// scripts/windows-test.sh maps drives to tmpfs mounts), held by one test
/// at a time. None, with a printed reason, where there is none.
pub fn small_volume(read_only: bool) -> Option<(Box<dyn std::any::Any>, std::path::PathBuf)> {
    #[cfg(unix)]
    {
        let (holder, mnt) = tmpfs(if read_only { "1m" } else { "2m" }, read_only)?;
        let guard = Unmount(mnt.clone());
        Some((Box::new((guard, holder)), mnt))
    }
    #[cfg(windows)]
    {
        let var = if read_only {
            "RESHARD_TEST_READONLY_DIR"
        } else {
            "RESHARD_TEST_FULL_DIR"
        };
        let Some(dir) = std::env::var_os(var) else {
            eprintln!("skipped: {var} names no small volume (see scripts/windows-test.sh)");
            return None;
        };
        static SHARED: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let held = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        Some((Box::new(held), std::path::PathBuf::from(dir)))
    }
}

/// A writable volume with at most `free` bytes available: a tmpfs of that
/// size on Unix; on Windows the small volume, filled up to `free` by a file
/// removed when the holder drops.
pub fn volume_with_free(free: u64) -> Option<(Box<dyn std::any::Any>, std::path::PathBuf)> {
    #[cfg(unix)]
    {
        let (holder, mnt) = tmpfs(&format!("{}k", free / 1024), false)?;
        let guard = Unmount(mnt.clone());
        Some((Box::new((guard, holder)), mnt))
    }
    #[cfg(windows)]
    {
        struct Remove(std::path::PathBuf);
        impl Drop for Remove {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let (held, dir) = small_volume(false)?;
        let filler = Remove(dir.join(format!("filler-{}", std::process::id())));
        let mut f = std::fs::File::create(&filler.0).unwrap();
        let block = vec![0u8; 4096];
        while fs4::available_space(&dir).unwrap() > free {
            std::io::Write::write_all(&mut f, &block).unwrap();
            f.sync_all().unwrap();
        }
        // Dropped in order: the filler goes before the volume is let go.
        Some((Box::new((filler, held)), dir))
    }
}

/// How the OS words a full disk: ENOSPC; ERROR_DISK_FULL (112).
const DISK_FULL: &str = if cfg!(windows) {
    "(os error 112)"
} else {
    "No space left on device"
};

/// The disk fills during the run (after convert's free-space check passed:
/// another writer took the space): exit 2 naming the file, nothing partial.
/// (Too little space from the start is refused earlier: tests/cli/touch.rs.)
#[test]
fn full_disk_exits_2_naming_the_file_and_leaves_nothing_partial() {
    let Some((_volume, mnt)) = small_volume(false) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama-f32-sharded", tmp.path());
    let clean_dir = tmp.path().join("clean");
    assert!(convert_cmd(&src, &clean_dir).status().unwrap().success());
    // Unique names: on Windows the volume is shared by the run.
    let dst = mnt.join(format!("out-{}", std::process::id()));
    let filler_path = mnt.join(format!("filler-{}", std::process::id()));
    let release = tmp.path().join("go");
    let mut child = convert_cmd(&src, &dst)
        .env("RESHARD_PAUSE_AT", "2")
        .env("RESHARD_PAUSE_UNTIL", &release)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("paused at write step") {
        assert!(
            std::io::BufRead::read_line(&mut stderr, &mut seen).unwrap() > 0,
            "ended before its pause: {seen}"
        );
    }
    // Another writer fills the file system while the run is paused.
    let mut filler = std::fs::File::create(&filler_path).unwrap();
    let block = vec![0u8; 4096];
    while std::io::Write::write_all(&mut filler, &block).is_ok() {}
    drop(filler);
    std::fs::write(&release, "").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(2), "{rest}");
    let _ = std::fs::remove_file(&filler_path);
    assert!(rest.contains(DISK_FULL), "{rest}");
    assert!(
        rest.contains(&dst.display().to_string()),
        "names the file: {rest}"
    );
    assert_consistent(&dst, &hashes(&clean_dir));
    let temps: Vec<_> = hashes(&dst)
        .into_keys()
        .filter(|n| n.ends_with(".reshard-tmp"))
        .collect();
    let _ = std::fs::remove_dir_all(&dst); // a shared volume on Windows
    assert!(temps.is_empty(), "temp files left: {temps:?}");
}

#[test]
fn read_only_dst_is_a_clear_error() {
    let Some((_volume, mnt)) = small_volume(true) else {
        return;
    };
    let out = convert_cmd(&fixture("tiny-llama"), &mnt).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    // EROFS; on Windows write-protected media (19), or access denied (5),
    // which is what Wine reports for a read-only mount.
    let said = if cfg!(windows) {
        stderr.contains("(os error 19)") || stderr.contains("(os error 5)")
    } else {
        stderr.contains("Read-only file system")
    };
    assert!(said, "{stderr}");
    assert!(
        stderr.contains(&mnt.display().to_string()),
        "names the path: {stderr}"
    );
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
    #[cfg_attr(unix, allow(unused_mut))]
    let mut cmd = convert_cmd(&src, &dst);
    // Ctrl-C reaches the processes of a console: give the child its own.
    #[cfg(windows)]
    std::os::windows::process::CommandExt::creation_flags(&mut cmd, CREATE_NEW_CONSOLE);
    let mut child = spawn_paused(cmd, 20, Some(&release)).expect("pauses");
    // Ctrl-C (SIGINT on Unix, CTRL_C_EVENT on Windows), then let the
    // paused write go on.
    send_ctrl_c(child.id());
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

#[cfg(windows)]
pub const CREATE_NEW_CONSOLE: u32 = 0x10;

#[cfg(unix)]
pub fn send_ctrl_c(pid: u32) {
    assert!(Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// A process cannot raise Ctrl-C in another console without attaching to
/// it, which would take this test process off its own: a helper process
/// (this test binary, running [`ctrl_c_helper`]) does it.
#[cfg(windows)]
pub fn send_ctrl_c(pid: u32) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["crash::ctrl_c_helper", "--exact", "--nocapture"])
        .env(CTRL_C_PID, pid.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Ctrl-C helper failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(windows)]
const CTRL_C_PID: &str = "RESHARD_TEST_CTRL_C_PID";

/// Not a test by itself: with `RESHARD_TEST_CTRL_C_PID` set, attaches to
/// that process's console and raises CTRL_C_EVENT in it, as pressing Ctrl-C
/// there does (the console control handler path of `ctrlc`).
#[cfg(windows)]
#[test]
fn ctrl_c_helper() {
    use windows_sys::Win32::System::Console::{
        AttachConsole, FreeConsole, GenerateConsoleCtrlEvent, SetConsoleCtrlHandler, CTRL_C_EVENT,
    };
    let Some(pid) = std::env::var(CTRL_C_PID).ok().and_then(|p| p.parse().ok()) else {
        return;
    };
    // SAFETY: plain Win32 calls without pointers; this helper process
    // leaves its own console, joins the child's, ignores the event itself
    // (a null handler with TRUE) and raises it for the whole console.
    unsafe {
        FreeConsole();
        assert_ne!(AttachConsole(pid), 0, "{}", std::io::Error::last_os_error());
        assert_ne!(SetConsoleCtrlHandler(None, 1), 0);
        assert_ne!(
            GenerateConsoleCtrlEvent(CTRL_C_EVENT, 0),
            0,
            "{}",
            std::io::Error::last_os_error()
        );
    }
}
