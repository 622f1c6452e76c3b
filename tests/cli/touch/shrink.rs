//! Sources and outputs truncated while reshard reads them (issue 30): a
//! clear error naming the file, exit status 2, never a panic, a death by
//! SIGBUS or a "passed".

use std::path::Path;
use std::process::Command;

use crate::common::*;

fn shards(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    v
}

/// Spawns `cmd` paused at step `at`; returns it and a thread collecting
/// the rest of its stderr.
pub fn paused(
    mut cmd: Command,
    at: &str,
    release: &Path,
) -> (std::process::Child, std::thread::JoinHandle<String>) {
    use std::io::BufRead;
    cmd.env("RESHARD_PAUSE_AT", at)
        .env("RESHARD_PAUSE_UNTIL", release)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut before = String::new();
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 {
        if line.contains("paused at write step") {
            let rest = std::thread::spawn(move || {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
                s
            });
            return (child, rest);
        }
        before.push_str(&line);
        line.clear();
    }
    let _ = child.wait();
    panic!("never paused at {at}: {before}");
}

/// `validate --emulate` panicked in `copy_from_slice` (exit 101), died by
/// SIGBUS (exit 135), or, for transformers-v5-mmap, reported "passed" with
/// 1 MiB "loaded" from a 1000-byte file. Every shard is cut to 1000 bytes
/// while the run holds its first one: the shard being read faults through
/// the registered-mapping handler, the others fail their size check.
#[test]
fn emulated_loaders_on_shards_truncated_mid_run_fail_cleanly() {
    if cfg!(windows) {
        // Windows refuses to truncate a file while a view of it is mapped
        // ("File has a user-mapped section"): the subject cannot arise.
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let loaders = [
        "per-shard-mmap",
        "diffusers",
        "transformers-v5-mmap",
        "transformers-v5-pread",
        "full-read",
    ];
    for loader in loaders {
        let model = tmp.path().join(loader);
        copy_dir(&fixture("tiny-llama-f32-sharded"), &model);
        let release = tmp.path().join(format!("go-{loader}"));
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("reshard"));
        cmd.args(["validate", "--emulate", loader]).arg(&model);
        let (mut child, stderr) = paused(cmd, "emulate", &release);
        for shard in shards(&model) {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&shard)
                .unwrap();
            f.set_len(1000).unwrap();
        }
        std::fs::write(&release, "").unwrap();
        let status = child.wait().unwrap();
        let err = stderr.join().unwrap();
        assert_eq!(status.code(), Some(2), "{loader}: {status:?}: {err}");
        assert!(
            err.contains("truncated") && err.contains(".safetensors"),
            "{loader}: {err}"
        );
        assert!(!err.contains("panicked"), "{loader}: {err}");
    }
}
