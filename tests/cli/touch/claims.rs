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
    // An output copied with `cp -al` shares its lock with the original.
    let orig = tmp.path().join("orig");
    convert(&fixture("tiny-llama"), &orig, &[]).success();
    let copy = tmp.path().join("copy");
    hard_link_copy(&orig, &copy);
    let before = tree(&orig);
    for extra in [
        &[][..],
        &["--overwrite"],
        &["--dtype", "f16", "--overwrite"],
    ] {
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
    assert!(first.join(".reshard.lock").is_file(), "the lock stays");
    let out = convert_out(&first, &tmp.path().join("second"), &[]);
    let stderr = stderr_of(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains(".reshard.lock"), "{stderr}");
    // A rerun into the first output does not mention it either.
    let again = convert_out(&fixture("tiny-llama"), &first, &[]);
    assert!(again.status.success());
    assert!(!stderr_of(&again).contains(".reshard.lock"));
}
