//! "Never touch what is not ours" (issue 13): each attack an adversarial
//! review found, reproduced in a temp folder through the real binary. After
//! each: the source's bytes are unchanged, nothing outside DST/OUT changed,
//! and a refusal exits 2 naming the path. batch and `--report`: [`batch`].

mod against;
mod batch;
mod cancel;
mod claims;
mod loader;
mod manifests;
mod names;
mod publish;
mod scales;
mod shrink;
#[cfg(unix)] // Windows cannot name a folder with control characters.
mod terminal;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sha2::{Digest, Sha256};

use crate::common::*;

/// Every file under `dir` (not following symlinked folders) with the sha256
/// of its bytes, or of its link text for a symlink; folders listed too.
pub fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let t = e.file_type().unwrap();
        if t.is_symlink() {
            let target = std::fs::read_link(&p).unwrap();
            out.insert(p, format!("link {}", target.display()));
        } else if t.is_dir() {
            out.insert(p.clone(), "dir".into());
            out.extend(tree(&p));
        } else {
            out.insert(p.clone(), hex(&Sha256::digest(std::fs::read(&p).unwrap())));
        }
    }
    out
}

pub fn sha(path: &Path) -> String {
    hex(&Sha256::digest(std::fs::read(path).unwrap()))
}

pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn run(args: &[&std::ffi::OsStr]) -> Output {
    reshard().args(args).output().unwrap()
}

pub fn convert_out(src: &Path, dst: &Path, extra: &[&str]) -> Output {
    reshard()
        .arg("convert")
        .arg(src)
        .arg(dst)
        .arg("--no-progress")
        .args(extra)
        .output()
        .unwrap()
}

pub fn assert_refused(out: &Output, want: &str) {
    let stderr = stderr_of(out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(want), "{want:?} missing from\n{stderr}");
}

pub fn validate_passes(dst: &Path) -> bool {
    reshard()
        .arg("validate")
        .arg(dst)
        .output()
        .unwrap()
        .status
        .success()
}

// ---- 1. deleting the source ------------------------------------------------

/// A "view" folder whose weight file is a symlink to the only copy, which
/// lives in DST.
#[cfg(unix)]
fn view_into(tmp: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let store = tmp.join("store");
    std::fs::create_dir(&store).unwrap();
    let real = store.join("model.safetensors");
    std::fs::copy(fixture("tiny-llama/model.safetensors"), &real).unwrap();
    let view = tmp.join("view");
    std::fs::create_dir(&view).unwrap();
    std::os::unix::fs::symlink(&real, view.join("model.safetensors")).unwrap();
    std::fs::copy(fixture("tiny-llama/config.json"), view.join("config.json")).unwrap();
    (view, store, real)
}

#[cfg(unix)]
#[test]
fn source_symlinked_into_dst_survives_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let (view, store, real) = view_into(tmp.path());
    let before = tree(tmp.path());
    let out = convert_out(&view, &store, &["--overwrite"]);
    assert_refused(&out, "holds the source file");
    assert!(stderr_of(&out).contains(&store.display().to_string()));
    assert_eq!(tree(tmp.path()), before, "nothing changed");
    assert_eq!(sha(&real), sha(&fixture("tiny-llama/model.safetensors")));
}

#[cfg(unix)]
#[test]
fn source_symlinked_into_dst_survives_a_foreign_partial_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let (view, store, real) = view_into(tmp.path());
    // The partial manifest of some other run, recording the source's name.
    let other = tmp.path().join("other");
    convert(&fixture("tiny-t5"), &other, &[]).success();
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(other.join("reshard.json")).unwrap()).unwrap();
    m["shards"][0]["file"] = "model.safetensors".into();
    std::fs::write(
        store.join(".reshard-partial.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let before = tree(tmp.path());
    for extra in [&[][..], &["--overwrite"]] {
        let out = convert_out(&view, &store, extra);
        assert_refused(&out, "holds the source file");
        assert_eq!(tree(tmp.path()), before, "{extra:?}: nothing changed");
    }
    assert_eq!(sha(&real), sha(&fixture("tiny-llama/model.safetensors")));
}

#[test]
fn overwrite_removes_only_what_reshard_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(&fixture("tiny-t5"), &dst, &["--max-shard-size", "50KB"]).success();
    std::fs::write(dst.join("notes.txt"), "mine").unwrap();
    // A planted record of a name outside DST is never followed.
    std::fs::write(tmp.path().join("outside.safetensors"), "keep").unwrap();
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dst.join("reshard.json")).unwrap()).unwrap();
    m["copied_files"]
        .as_array_mut()
        .unwrap()
        .push("../outside.safetensors".into());
    std::fs::write(dst.join("reshard.json"), serde_json::to_vec(&m).unwrap()).unwrap();
    let old: Vec<String> = m["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["file"].as_str().unwrap().to_string())
        .collect();
    let out = convert_out(
        &fixture("tiny-t5"),
        &dst,
        &["--max-shard-size", "200KB", "--overwrite"],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        std::fs::read_to_string(dst.join("notes.txt")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("outside.safetensors")).unwrap(),
        "keep"
    );
    for name in old.iter().filter(|n| n.contains("-of-")) {
        assert!(
            !dst.join(name).exists(),
            "{name} of the old layout survived"
        );
    }
    assert_matches_expected(&dst, "tiny-t5");
    assert!(validate_passes(&dst));
}

#[test]
fn foreign_weights_in_dst_are_refused_even_with_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("model.safetensors"), "someone's weights").unwrap();
    for extra in [&[][..], &["--overwrite"]] {
        let out = convert_out(&fixture("tiny-llama"), &dst, extra);
        assert_refused(&out, "holds weight files reshard did not write");
        assert!(stderr_of(&out).contains("\"model.safetensors\""));
        assert_eq!(
            std::fs::read_to_string(dst.join("model.safetensors")).unwrap(),
            "someone's weights"
        );
    }
    // Beside reshard's own conversion too.
    let ours = tmp.path().join("ours");
    convert(&fixture("tiny-t5"), &ours, &["--max-shard-size", "50KB"]).success();
    std::fs::write(ours.join("extra.safetensors"), "x").unwrap();
    let out = convert_out(
        &fixture("tiny-t5"),
        &ours,
        &["--max-shard-size", "60KB", "--overwrite"],
    );
    assert_refused(&out, "\"extra.safetensors\"");
    assert!(ours.join("reshard.json").exists(), "nothing was removed");
}

/// An HF cache repo folder named `name` holding tiny-llama.
#[cfg(unix)]
pub fn cache_repo(hub: &Path, name: &str) {
    let repo = hub.join(name);
    std::fs::create_dir_all(repo.join("snapshots/abc")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "abc").unwrap();
    for file in ["model.safetensors", "config.json"] {
        let bytes = std::fs::read(fixture("tiny-llama").join(file)).unwrap();
        let blob = hex(&Sha256::digest(&bytes));
        std::fs::write(repo.join("blobs").join(&blob), &bytes).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(&blob),
            repo.join("snapshots/abc").join(file),
        )
        .unwrap();
    }
}

// ---- 2. other files through symlinks ----------------------------------------

#[cfg(unix)]
#[test]
fn other_files_linking_out_of_the_model_are_not_copied() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    std::os::unix::fs::symlink("/proc/self/environ", src.join("notes.txt")).unwrap();
    std::fs::write(tmp.path().join("secret.txt"), "token").unwrap();
    std::os::unix::fs::symlink(tmp.path().join("secret.txt"), src.join("tokenizer.json")).unwrap();
    let dst = tmp.path().join("out");
    let out = reshard()
        .arg("convert")
        .arg(&src)
        .arg(&dst)
        .arg("--no-progress")
        .env("RESHARD_CANARY", "do-not-copy")
        .output()
        .unwrap();
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(!dst.join("notes.txt").exists());
    assert!(!dst.join("tokenizer.json").exists());
    assert!(
        dst.join("config.json").exists(),
        "regular other files still copied"
    );
    assert!(
        stderr.contains("note: not copied: \"notes.txt\": a symlink to \"/proc/"),
        "{stderr}"
    );
    assert!(stderr.contains("\"tokenizer.json\""), "{stderr}");
    for file in std::fs::read_dir(&dst).unwrap() {
        let bytes = std::fs::read(file.unwrap().path()).unwrap();
        assert!(!bytes.windows(11).any(|w| w == b"do-not-copy"));
    }
}

#[cfg(unix)]
#[test]
fn hf_cache_snapshot_links_into_blobs_are_still_copied() {
    let tmp = tempfile::tempdir().unwrap();
    cache_repo(tmp.path(), "models--org--tiny");
    let dst = tmp.path().join("out");
    convert(&tmp.path().join("models--org--tiny"), &dst, &[]).success();
    assert_eq!(
        std::fs::read(dst.join("config.json")).unwrap(),
        std::fs::read(fixture("tiny-llama/config.json")).unwrap()
    );
    // Through the snapshot folder itself, too.
    let dst2 = tmp.path().join("out2");
    convert(
        &tmp.path().join("models--org--tiny/snapshots/abc"),
        &dst2,
        &[],
    )
    .success();
    assert!(dst2.join("config.json").is_file());
}

#[cfg(unix)]
#[test]
fn names_that_differ_only_in_invalid_utf8_are_not_copied_onto_one_name() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    for byte in [0xfe_u8, 0xff] {
        let bytes = [b'a', byte, b'.', b't', b'x', b't'];
        std::fs::write(src.join(std::ffi::OsStr::from_bytes(&bytes)), [byte]).unwrap();
    }
    let dst = tmp.path().join("out");
    let out = convert_out(&src, &dst, &[]);
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("not valid UTF-8").count(), 2, "{stderr}");
    let names: Vec<String> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.starts_with('a')), "{names:?}");
}

// ---- 3. single-file SRC --------------------------------------------------------

#[test]
fn single_file_src_may_write_beside_itself_never_onto_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama", tmp.path());
    let file = src.join("model.safetensors");
    let want = sha(&file);
    convert(&file, &src.join("out"), &[]).success();
    assert_matches_expected(&src.join("out"), "tiny-llama");
    assert_refused(
        &convert_out(&file, &src, &["--overwrite"]),
        "holds the source file",
    );
    assert_refused(&convert_out(&file, &file, &[]), "is the source file");
    assert_refused(
        &convert_out(&file, &file.join("x"), &[]),
        "is the source file",
    );
    assert_eq!(sha(&file), want);
    // A folder SRC still refuses its own folder and anything inside.
    assert_refused(&convert_out(&src, &src.join("out2"), &[]), "inside it");
    assert!(!src.join("out2").exists());
}

// ---- 4. free space -----------------------------------------------------------

#[test]
fn too_little_free_space_is_refused_before_writing_with_both_numbers() {
    let Some((_volume, mnt)) = crate::crash::volume_with_free(300 * 1024) else {
        return;
    };
    let dst = mnt.join(format!("out-{}", std::process::id()));
    let out = convert_out(&fixture("tiny-llama-f32-sharded"), &dst, &[]);
    let stderr = stderr_of(&out);
    assert_refused(&out, "not enough free space");
    // "... needs 885 KiB (906181 bytes) and ... has 300 KiB (307200 bytes) available"
    let numbers: Vec<u64> = stderr
        .split(" bytes)")
        .filter_map(|part| part.rsplit('(').next()?.parse().ok())
        .collect();
    assert_eq!(numbers.len(), 2, "both byte counts: {stderr}");
    assert!(
        numbers[0] > 880_000 && numbers[1] < 310_000,
        "{numbers:?}: {stderr}"
    );
    assert!(
        !dst.exists(),
        "the DST it made is taken back: {:?}",
        tree(&dst)
    );
}

// ---- 5. one run at a time --------------------------------------------------

fn convert_cmd(src: &Path, dst: &Path) -> Command {
    let mut c = Command::new(assert_cmd::cargo::cargo_bin("reshard"));
    c.arg("convert")
        .arg(src)
        .arg(dst)
        .args(["--no-progress", "--threads", "1", "--window", "16KiB"])
        .args(["--max-shard-size", "120KB"]);
    c
}

const LOCKED: &str = "is being written by another reshard (pid ";

#[test]
fn second_run_into_a_locked_dst_fails_at_once_naming_the_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama-f32-sharded");
    let dst = tmp.path().join("out");
    let release = tmp.path().join("go");
    // The first run pauses in the middle of a shard.
    let mut first = convert_cmd(&src, &dst)
        .env("RESHARD_PAUSE_AT", "5")
        .env("RESHARD_PAUSE_UNTIL", &release)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    crate::convert::wait_for_pause(&mut first);
    let temps = |d: &Path| -> Vec<PathBuf> {
        tree(d)
            .into_keys()
            .filter(|p| p.to_string_lossy().ends_with(".reshard-tmp"))
            .collect()
    };
    let before = temps(&dst);
    assert!(!before.is_empty(), "the first run has a temp file open");
    let second = convert_cmd(&src, &dst).output().unwrap();
    assert_refused(&second, &format!("{LOCKED}{})", first.id()));
    assert_eq!(
        temps(&dst),
        before,
        "the first run's temp files are untouched"
    );
    std::fs::write(&release, "").unwrap();
    assert!(first.wait().unwrap().success());
    assert_matches_expected(&dst, "tiny-llama-f32-sharded");
    assert!(validate_passes(&dst));
    assert!(!dst.join(".reshard.lock").exists(), "released and removed");
}

#[test]
fn two_converts_into_one_dst_never_both_succeed_with_a_broken_output() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama-f32-sharded", tmp.path());
    for round in 0..30 {
        let dst = tmp.path().join(format!("out{round}"));
        let spawn = || {
            convert_cmd(&src, &dst)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
        for o in &outs {
            let stderr = stderr_of(o);
            assert!(
                o.status.success() || (o.status.code() == Some(2) && stderr.contains(LOCKED)),
                "round {round}: {:?}\n{stderr}",
                o.status
            );
        }
        assert!(
            outs.iter().any(|o| o.status.success()),
            "round {round}: one of them holds the lock and finishes"
        );
        assert!(
            validate_passes(&dst),
            "round {round}: DST does not validate"
        );
        assert_matches_expected(&dst, "tiny-llama-f32-sharded");
        assert!(
            !dst.join(".reshard.lock").exists(),
            "round {round}: the lock file is removed"
        );
    }
}

/// Each run removes the lock file as it lets go, so runs racing on one
/// output open, lock and remove the name again and again (an up-to-date
/// run takes a few milliseconds). A run that opened the name just before
/// the holder removed it must open it again, not fail ("No such file")
/// nor believe it holds a lock no name reaches; the lock's own unit test
/// (`runs_that_remove_the_lock_file_never_hold_it_two_at_a_time`) checks
/// that no two ever hold it at once.
#[test]
fn runs_racing_on_one_output_take_turns_and_leave_no_lock_file() {
    let tmp = tempfile::tempdir().unwrap();
    let src = copy_fixture("tiny-llama-f32-sharded", tmp.path());
    let dst = tmp.path().join("out");
    assert!(convert_cmd(&src, &dst).output().unwrap().status.success());
    let mut succeeded = 0;
    for round in 0..15 {
        let runs: Vec<_> = (0..3)
            .map(|_| {
                convert_cmd(&src, &dst)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for run in runs {
            let o = run.wait_with_output().unwrap();
            let stderr = stderr_of(&o);
            assert!(
                o.status.success() || (o.status.code() == Some(2) && stderr.contains(LOCKED)),
                "round {round}: {:?}\n{stderr}",
                o.status
            );
            succeeded += usize::from(o.status.success());
        }
        assert!(
            !dst.join(".reshard.lock").exists(),
            "round {round}: left {:?}",
            tree(&dst).keys().collect::<Vec<_>>()
        );
    }
    assert!(succeeded >= 15, "one run of each round at least");
    assert!(validate_passes(&dst));
    assert_matches_expected(&dst, "tiny-llama-f32-sharded");
}
