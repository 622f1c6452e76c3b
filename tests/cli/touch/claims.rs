//! Issue 30's half of "never touch what is not ours" for convert: the lock
//! file is never written through a link, a manifest found in DST is a
//! claim that is checked before anything it names is removed or replaced,
//! and every file reshard writes is recorded with a digest that validate
//! and a rerun check.

use std::path::Path;

use super::*;
use crate::common::*;

// ---- the lock file ------------------------------------------------------------

/// `cp -al out copy`: every file of `out` hard-linked into `copy`.
fn hard_link_copy(out: &Path, copy: &Path) {
    std::fs::create_dir(copy).unwrap();
    for e in std::fs::read_dir(out).unwrap() {
        let e = e.unwrap();
        std::fs::hard_link(e.path(), copy.join(e.file_name())).unwrap();
    }
}

#[test]
fn a_hard_linked_lock_file_is_refused_and_its_other_name_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    // Someone's file, hard-linked at the lock's name.
    let theirs = tmp.path().join("counter.txt");
    std::fs::write(&theirs, "7\n").unwrap();
    let dst = tmp.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    std::fs::hard_link(&theirs, dst.join(".reshard.lock")).unwrap();
    let out = convert_out(&fixture("tiny-llama"), &dst, &[]);
    assert_refused(&out, &dst.join(".reshard.lock").display().to_string());
    assert!(stderr_of(&out).contains("2 links"), "{}", stderr_of(&out));
    assert_eq!(std::fs::read(&theirs).unwrap(), b"7\n");
    // An output copied with `cp -al`: a finished output holds no lock
    // file, and a run into the copy writes every file under a new name, so
    // the original is untouched.
    let orig = tmp.path().join("orig");
    convert(&fixture("tiny-llama"), &orig, &[]).success();
    let variants = [
        &[][..],
        &["--overwrite"],
        &["--dtype", "f16", "--overwrite"],
    ];
    let before = tree(&orig);
    for (n, extra) in variants.iter().enumerate() {
        let copy = tmp.path().join(format!("copy{n}"));
        hard_link_copy(&orig, &copy);
        let out = convert_out(&fixture("tiny-llama"), &copy, extra);
        assert!(out.status.success(), "{extra:?}: {}", stderr_of(&out));
        assert_eq!(tree(&orig), before, "{extra:?}: the original is untouched");
    }
    // The lock file a killed run left is shared by the copy: refused.
    std::fs::write(orig.join(".reshard.lock"), "4000000000\n").unwrap();
    let copy = tmp.path().join("copy-of-a-killed-run");
    hard_link_copy(&orig, &copy);
    let before = tree(&orig);
    for extra in variants {
        let out = convert_out(&fixture("tiny-llama"), &copy, extra);
        assert_refused(&out, "links");
        assert_eq!(tree(&orig), before, "{extra:?}: the original is untouched");
    }
}

#[test]
fn converting_an_output_again_does_not_note_its_lock_file() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    convert(&fixture("tiny-llama"), &first, &[]).success();
    assert!(
        !first.join(".reshard.lock").exists(),
        "a finished run removes its lock file"
    );
    // What a killed run leaves: the lock file with its pid.
    std::fs::write(first.join(".reshard.lock"), "4000000000\n").unwrap();
    let out = convert_out(&first, &tmp.path().join("second"), &[]);
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains(".reshard.lock"), "{stderr}");
    assert!(!tmp.path().join("second/.reshard.lock").exists());
    // A rerun into the first output does not mention it either, takes it
    // over and removes it.
    let again = convert_out(&fixture("tiny-llama"), &first, &[]);
    assert!(again.status.success());
    assert!(!stderr_of(&again).contains(".reshard.lock"));
    assert!(!first.join(".reshard.lock").exists());
}

/// A folder's modification time, set back to a fixed past one: a file
/// created in it (and removed again) moves it.
#[cfg(unix)]
fn backdate(dir: &Path) -> std::time::SystemTime {
    let past = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::open(dir)
        .unwrap()
        .set_modified(past)
        .unwrap();
    std::fs::metadata(dir).unwrap().modified().unwrap()
}

/// A convert refused because DST holds the user's files wrote its lock
/// file into that folder and left it there: the refusal is decided before
/// the lock is taken (the folder is not written at all), and a refusal
/// decided under the lock removes the lock file again.
#[test]
fn a_refused_convert_leaves_no_lock_file_in_the_users_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let weights = tmp.path().join("weights");
    std::fs::create_dir(&weights).unwrap();
    std::fs::write(weights.join("model.safetensors"), "their weights").unwrap();
    let notes = tmp.path().join("notes");
    std::fs::create_dir(&notes).unwrap();
    std::fs::write(notes.join("notes.txt"), "mine").unwrap();
    for (dst, refusal) in [
        (&weights, "holds weight files reshard did not write"),
        (&notes, "folder is not empty and was not written by reshard"),
    ] {
        let before = tree(dst);
        #[cfg(unix)]
        let mtime = backdate(dst);
        let out = convert_out(&fixture("tiny-llama"), dst, &[]);
        assert_refused(&out, refusal);
        assert_eq!(tree(dst), before, "{}", dst.display());
        #[cfg(unix)]
        assert_eq!(
            std::fs::metadata(dst).unwrap().modified().unwrap(),
            mtime,
            "{}: nothing was created in it, not even for a moment",
            dst.display()
        );
    }
    // Refused under the lock (DST holds another conversion): the lock file
    // is taken and removed again.
    let other = tmp.path().join("other");
    convert(&fixture("tiny-llama"), &other, &[]).success();
    let before = tree(&other);
    let out = convert_out(&fixture("tiny-llama"), &other, &["--dtype", "f16"]);
    assert_refused(&out, "holds a different conversion");
    assert_eq!(tree(&other), before);
}

// ---- manifests found in DST are claims ----------------------------------------

fn manifest_json(dir: &Path, name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
}

#[test]
fn a_planted_partial_manifest_deletes_none_of_the_users_files() {
    let tmp = tempfile::tempdir().unwrap();
    // A real partial manifest (another plan's), edited to claim the user's
    // files as planned, recorded and copied.
    let other = tmp.path().join("other");
    convert(&fixture("tiny-t5"), &other, &[]).success();
    let mut m = manifest_json(&other, "reshard.json");
    m["planned"] = serde_json::json!(["notes.txt", "mydata.csv", "mine.safetensors"]);
    m["shards"][0]["file"] = "notes.txt".into();
    m["copied_files"] = serde_json::json!(["mydata.csv"]);
    let dst = tmp.path().join("out");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("notes.txt"), "my notes").unwrap();
    std::fs::write(dst.join("mydata.csv"), "a,b\n1,2\n").unwrap();
    std::fs::write(
        dst.join(".reshard-partial.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let mine = |d: &Path| {
        (
            std::fs::read(d.join("notes.txt")).unwrap(),
            std::fs::read(d.join("mydata.csv")).unwrap(),
        )
    };
    let want = mine(&dst);
    let out = convert_out(&fixture("tiny-llama"), &dst, &[]);
    assert_refused(&out, "not empty");
    assert_eq!(mine(&dst), want);
    let out = convert_out(&fixture("tiny-llama"), &dst, &["--overwrite"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(mine(&dst), want, "written beside, never removed");
    assert_matches_expected(&dst, "tiny-llama");
}

#[test]
fn a_claimed_shard_that_is_not_as_recorded_is_moved_aside_not_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(&fixture("tiny-t5"), &dst, &["--max-shard-size", "50KB"]).success();
    let mut m = manifest_json(&dst, "reshard.json");
    let shards: Vec<String> = m["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["file"].as_str().unwrap().to_string())
        .collect();
    // As after a crash right after the last shard's rename: the partial
    // manifest plans it but has not recorded it.
    let last = shards.last().unwrap().clone();
    m["planned"] = serde_json::json!(shards);
    m["shards"].as_array_mut().unwrap().pop();
    std::fs::write(
        dst.join(".reshard-partial.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    std::fs::remove_file(dst.join("reshard.json")).unwrap();
    std::fs::remove_file(dst.join(m["index_file"].as_str().unwrap())).unwrap();
    let last_bytes = std::fs::read(dst.join(&last)).unwrap();
    let out = convert_out(
        &fixture("tiny-t5"),
        &dst,
        &["--max-shard-size", "200KB", "--overwrite"],
    );
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("note: moved aside: "), "{stderr}");
    assert!(stderr.contains(&last), "{stderr}");
    let aside: Vec<_> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".reshard-aside"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), last_bytes);
    // The recorded, verified shards were removed.
    for name in &shards[..shards.len() - 1] {
        assert!(!dst.join(name).exists(), "{name} survived");
    }
    assert_matches_expected(&dst, "tiny-t5");
    assert!(validate_passes(&dst));
}

#[test]
fn overwrite_never_replaces_a_hand_edited_config() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    convert(&fixture("tiny-llama"), &dst, &[]).success();
    let edited = std::fs::read_to_string(dst.join("config.json"))
        .unwrap()
        .replace("\"model_type\"", "\"my_note\": 1, \"model_type\"");
    std::fs::write(dst.join("config.json"), &edited).unwrap();
    for extra in [
        &["--overwrite", "--dtype", "f16"][..],
        &["--overwrite"],
        &[],
    ] {
        let out = convert_out(&fixture("tiny-llama"), &dst, extra);
        assert_refused(&out, "cannot prove it wrote");
        assert!(
            stderr_of(&out).contains("\"config.json\""),
            "{}",
            stderr_of(&out)
        );
        assert_eq!(
            std::fs::read_to_string(dst.join("config.json")).unwrap(),
            edited,
            "{extra:?}"
        );
    }
    // A config.json in a folder reshard never wrote into, too.
    let foreign = tmp.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("config.json"), "{\"mine\": true}").unwrap();
    let out = convert_out(&fixture("tiny-llama"), &foreign, &["--overwrite"]);
    assert_refused(&out, "\"config.json\"");
    assert_eq!(
        std::fs::read_to_string(foreign.join("config.json")).unwrap(),
        "{\"mine\": true}"
    );
    // The same bytes as the source's lose nothing: written over.
    std::fs::copy(
        fixture("tiny-llama/config.json"),
        foreign.join("config.json"),
    )
    .unwrap();
    let out = convert_out(&fixture("tiny-llama"), &foreign, &["--overwrite"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
}

#[test]
fn a_changed_index_or_config_is_not_up_to_date_and_fails_validate() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama-f32-sharded");
    for file in ["index", "config.json"] {
        let dst = tmp.path().join(file);
        convert(&src, &dst, &["--max-shard-size", "300KB"]).success();
        let name = if file == "index" {
            manifest_json(&dst, "reshard.json")["index_file"]
                .as_str()
                .unwrap()
                .to_string()
        } else {
            file.to_string()
        };
        let text = std::fs::read_to_string(dst.join(&name)).unwrap();
        // One digit changed, same size.
        let pos = text.find(|c: char| c.is_ascii_digit()).unwrap();
        let digit = text.as_bytes()[pos];
        let mut bytes = text.into_bytes();
        bytes[pos] = if digit == b'9' { b'8' } else { digit + 1 };
        std::fs::write(dst.join(&name), &bytes).unwrap();
        let out = reshard().arg("validate").arg(&dst).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{file}: {}", stderr_of(&out));
        let rerun = convert_out(&src, &dst, &["--max-shard-size", "300KB"]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&rerun.stdout),
            stderr_of(&rerun)
        );
        assert!(!text.contains("up to date"), "{file}: {text}");
        assert_eq!(std::fs::read(dst.join(&name)).unwrap(), bytes, "{file}");
    }
}

// ---- names Windows reserves ------------------------------------------------------

#[test]
fn source_weights_named_like_windows_devices_are_refused() {
    if cfg!(windows) {
        // Such a file cannot be made there: `CON.safetensors` opens the
        // console. The refusal is the same code on every platform.
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for (folder, file) in [("con-model", "CON.safetensors"), ("aux", "aux.safetensors")] {
        let src = tmp.path().join(folder);
        std::fs::create_dir(&src).unwrap();
        std::fs::copy(fixture("tiny-llama/model.safetensors"), src.join(file)).unwrap();
        std::fs::copy(fixture("tiny-llama/config.json"), src.join("config.json")).unwrap();
        let dst = tmp.path().join(format!("{folder}-out"));
        for from in [src.clone(), src.join(file)] {
            let out = convert_out(&from, &dst, &[]);
            assert_refused(&out, "Windows reserves it for a device");
            assert!(stderr_of(&out).contains(file), "{}", stderr_of(&out));
            assert!(!dst.join(file).exists(), "{file} written");
        }
    }
}
