//! batch's half of "never touch what is not ours": model names that would
//! leave OUT, outputs through symlinks, overwrite by itself, `--report`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use super::*;
use crate::common::*;

fn batch_json(
    root: &Path,
    out: &Path,
    extra: &[&str],
) -> (Output, BTreeMap<String, (String, String)>) {
    let out = reshard()
        .arg("batch")
        .arg(root)
        .arg("--out")
        .arg(out)
        .args(["--no-progress", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let map = report["models"]
        .as_array()
        .map(|models| {
            models
                .iter()
                .map(|m| {
                    (
                        m["name"].as_str().unwrap().to_string(),
                        (
                            m["status"].as_str().unwrap().to_string(),
                            m["reason"].as_str().unwrap_or_default().to_string(),
                        ),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (out, map)
}

#[cfg(unix)]
#[test]
fn cache_repos_named_dot_dot_or_dot_never_write_outside_out() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let root = work.join("root");
    let out = work.join("out");
    cache_repo(&root, "models--..");
    cache_repo(&root, "models--.");
    cache_repo(&root, "models--org--ok");
    // What `models--..` would have clobbered: weights beside OUT.
    std::fs::create_dir_all(&work).unwrap();
    std::fs::copy(
        fixture("tiny-llama/model.safetensors"),
        work.join("model.safetensors"),
    )
    .unwrap();
    let outside =
        |t: BTreeMap<std::path::PathBuf, String>| -> BTreeMap<std::path::PathBuf, String> {
            t.into_iter()
                .filter(|(p, _)| !p.starts_with(&out))
                .collect()
        };
    let before = outside(tree(&work));
    let (result, status) = batch_json(&root, &out, &[]);
    assert!(result.status.success(), "{}", stderr_of(&result));
    assert_eq!(
        outside(tree(&work)),
        before,
        "something outside OUT changed"
    );
    assert_eq!(status["org--ok"].0, "converted");
    for bad in ["models--..", "models--."] {
        let (s, reason) = status
            .iter()
            .find(|(n, _)| n.ends_with(bad))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{bad} not reported: {status:?}"));
        assert_eq!(s, "skipped", "{bad}");
        assert!(
            reason.contains("cannot be an output folder name"),
            "{reason}"
        );
    }
    assert!(!out.join("reshard.json").exists());
}

#[cfg(unix)]
#[test]
fn batch_output_through_a_symlink_out_of_out_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    copy_fixture("tiny-gpt2", &root.join("org"));
    let out = tmp.path().join("out");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("org")).unwrap();
    let (result, status) = batch_json(&root, &out, &[]);
    assert_eq!(result.status.code(), Some(1), "{}", stderr_of(&result));
    assert_eq!(status["org/tiny-gpt2"].0, "failed");
    assert!(
        status["org/tiny-gpt2"]
            .1
            .contains("not inside the output folder"),
        "{:?}",
        status["org/tiny-gpt2"]
    );
    assert!(tree(&elsewhere).is_empty(), "{:?}", tree(&elsewhere));
}

#[test]
fn batch_never_overwrites_a_conversion_of_another_source_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    copy_fixture("tiny-gpt2", &root);
    let out = tmp.path().join("out");
    // reshard's output, but of another model, where tiny-gpt2's would go.
    convert(&fixture("tiny-t5"), &out.join("tiny-gpt2"), &[]).success();
    let before = tree(&out);
    let (result, status) = batch_json(&root, &out, &[]);
    assert_eq!(result.status.code(), Some(1));
    assert_eq!(status["tiny-gpt2"].0, "failed");
    assert!(
        status["tiny-gpt2"].1.contains("--overwrite"),
        "{:?}",
        status["tiny-gpt2"]
    );
    assert_eq!(tree(&out), before);
    // Its own conversion of the same source is replaced when options change.
    let (result, _) = batch_json(&root, &out, &["--overwrite"]);
    assert!(result.status.success(), "{}", stderr_of(&result));
    let (result, status) = batch_json(&root, &out, &["--max-shard-size", "40KB"]);
    assert!(result.status.success(), "{}", stderr_of(&result));
    assert_eq!(status["tiny-gpt2"].0, "converted");
    assert_matches_expected(&out.join("tiny-gpt2"), "tiny-gpt2");
}

#[test]
fn report_onto_a_source_or_a_foreign_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let model = copy_fixture("tiny-gpt2", &root);
    let out = tmp.path().join("out");
    let weights = model.join("model.safetensors");
    let want = sha(&weights);
    let s = |p: &Path| p.as_os_str().to_owned();
    let report_args = |report: &Path| -> Vec<std::ffi::OsString> {
        vec![
            "batch".into(),
            s(&root),
            "--out".into(),
            s(&out),
            "--no-progress".into(),
            "--report".into(),
            s(report),
        ]
    };
    let run_with = |report: &Path| {
        let args = report_args(report);
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        run(&refs)
    };
    let refused = run_with(&weights);
    assert_refused(&refused, "is (or resolves to) the source file");
    assert_eq!(sha(&weights), want);
    assert!(!out.exists(), "refused before any model was written");
    assert_refused(
        &run_with(&model.join("report.json")),
        "inside the source model folder",
    );

    let foreign = tmp.path().join("notes.json");
    std::fs::write(&foreign, "{\"mine\": true}").unwrap();
    assert_refused(&run_with(&foreign), "not a report reshard wrote");
    assert_eq!(
        std::fs::read_to_string(&foreign).unwrap(),
        "{\"mine\": true}"
    );

    let report = tmp.path().join("report.json");
    let first = run_with(&report);
    assert!(first.status.success(), "{}", stderr_of(&first));
    let again = run_with(&report);
    assert!(
        again.status.success(),
        "its own report is replaced: {}",
        stderr_of(&again)
    );
}

#[cfg(unix)]
#[test]
fn report_through_a_symlink_to_a_source_file_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let model = copy_fixture("tiny-gpt2", &root);
    let weights = model.join("model.safetensors");
    let want = sha(&weights);
    let link = tmp.path().join("report.json");
    std::os::unix::fs::symlink(&weights, &link).unwrap();
    let out = reshard()
        .arg("batch")
        .arg(&root)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .arg("--report")
        .arg(&link)
        .output()
        .unwrap();
    assert_refused(&out, "source file");
    assert_eq!(sha(&weights), want);
}

#[cfg(unix)]
#[test]
fn batch_reports_other_files_it_did_not_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    let model = copy_fixture("tiny-gpt2", &root);
    std::os::unix::fs::symlink("/proc/self/environ", model.join("notes.txt")).unwrap();
    let out = tmp.path().join("out");
    let result = reshard()
        .arg("batch")
        .arg(&root)
        .arg("--out")
        .arg(&out)
        .args(["--no-progress", "--json"])
        .output()
        .unwrap();
    assert!(result.status.success(), "{}", stderr_of(&result));
    let report: serde_json::Value = serde_json::from_slice(&result.stdout).unwrap();
    let notes = report["models"][0]["notes"].to_string();
    assert!(
        notes.contains("not copied") && notes.contains("notes.txt"),
        "{report}"
    );
    assert!(!out.join("tiny-gpt2/notes.txt").exists());
}

/// `batch-report merge -o` onto one of its inputs, or onto a model's source
/// weights a report names, replaced it (430 KB of weights became 900 bytes
/// of JSON): the output path guard of `batch --report` applies.
#[test]
fn merge_output_onto_an_input_report_or_a_source_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let model = copy_fixture("tiny-llama", &root);
    let weights = model.join("model.safetensors");
    let want = sha(&weights);
    let report = tmp.path().join("part-0.json");
    let (out, _) = batch_json(
        &root,
        &tmp.path().join("out"),
        &["--report", report.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let before = sha(&report);
    let merge = |target: &Path| {
        reshard()
            .args(["batch-report", "merge"])
            .arg(&report)
            .arg("-o")
            .arg(target)
            .output()
            .unwrap()
    };
    assert_refused(&merge(&report), "being read");
    assert_eq!(sha(&report), before);
    assert_refused(&merge(&weights), "source file");
    assert_refused(&merge(&model.join("merged.json")), "inside the source");
    assert_eq!(sha(&weights), want);
    assert!(!model.join("merged.json").exists());
    // Elsewhere, it is written.
    let merged = tmp.path().join("merged.json");
    assert!(merge(&merged).status.success());
    assert!(merged.is_file());
}
