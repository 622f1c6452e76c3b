//! `batch --part I/N` split by bytes (the default) or by name, what
//! `--plan-parts N` shows, and `batch-report merge` joining the parts'
//! reports, end to end on a folder of models of mixed sizes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::*;

/// ROOT with one model ~7x the smallest and nine small ones.
fn build_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    copy_fixture("tiny-llama-f32-sharded", &root.join("big"));
    for f in ["tiny-gpt2", "tiny-t5", "tiny-moe-sharded"] {
        for org in ["a", "b", "c"] {
            copy_fixture(f, &root.join(org));
        }
    }
    root
}

fn run(root: &Path, out: &Path, extra: &[&str]) -> assert_cmd::assert::Assert {
    reshard()
        .arg("batch")
        .arg(root)
        .arg("--out")
        .arg(out)
        .arg("--no-progress")
        .args(extra)
        .assert()
}

fn json(a: &assert_cmd::assert::Assert) -> serde_json::Value {
    serde_json::from_slice(&a.get_output().stdout).unwrap()
}

fn names(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn plan_parts_shows_what_each_part_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = build_root(tmp.path());
    let out = tmp.path().join("out");
    for balance in ["bytes", "name"] {
        let plan = json(
            &run(
                &root,
                &out,
                &["--plan-parts", "3", "--json", "--balance", balance],
            )
            .success(),
        );
        assert_eq!(plan["balance"], balance);
        assert_eq!(plan["count"], 3);
        let parts = plan["parts"].as_array().unwrap();
        assert_eq!(parts.len(), 3);
        let mut all = BTreeSet::new();
        let mut total = 0;
        for (i, part) in parts.iter().enumerate() {
            let planned = names(&part["models"]);
            // The plan is what --part runs.
            let listed = json(
                &run(
                    &root,
                    &out,
                    &[
                        "--dry-run",
                        "--json",
                        "--balance",
                        balance,
                        "--part",
                        &format!("{i}/3"),
                    ],
                )
                .success(),
            );
            assert_eq!(names(&listed["models"]), planned, "{balance} part {i}");
            let bytes: u64 = part["models"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["bytes"].as_u64().unwrap())
                .sum();
            assert_eq!(part["bytes"].as_u64().unwrap(), bytes);
            total += bytes;
            assert!(
                planned.iter().all(|n| all.insert(n.clone())),
                "a model in two parts"
            );
            if balance == "name" {
                for n in &planned {
                    assert_eq!(reshard::batch::part_of(n, 3), i as u64, "{n}");
                }
            }
        }
        assert_eq!(all.len(), 10, "{all:?}");
        assert_eq!(plan["total_bytes"].as_u64().unwrap(), total);
        if balance == "bytes" {
            let avg = total as f64 / 3.0;
            let largest = plan["largest_part_bytes"].as_u64().unwrap() as f64;
            let biggest = plan["largest_model_bytes"].as_u64().unwrap() as f64;
            assert!(largest <= (1.25 * avg).max(biggest), "{plan}");
            assert_eq!(parts[0]["models"][0]["name"], "big/tiny-llama-f32-sharded");
        }
    }
    let text = run(&root, &out, &["--plan-parts", "2"]).success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(
        text.contains("10 models") && text.contains("in 2 parts by bytes"),
        "{text}"
    );
    assert!(!out.exists(), "--plan-parts writes nothing");
    run(&root, &out, &["--plan-parts", "2", "--part", "0/2"]).code(2);
}

#[test]
fn merged_reports_of_all_parts_hold_every_model_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = build_root(tmp.path());
    let out = tmp.path().join("out");
    let reports = tmp.path().join("reports");
    let report = |i: u64| reports.join(format!("part-{i}.json"));
    for i in 0..3 {
        run(
            &root,
            &out,
            &[
                "--part",
                &format!("{i}/3"),
                "--report",
                report(i).to_str().unwrap(),
            ],
        )
        .success();
    }
    let merge = |files: &[PathBuf], extra: &[&str]| {
        reshard()
            .args(["batch-report", "merge"])
            .args(files)
            .args(extra)
            .assert()
    };
    let merged_path = tmp.path().join("merged.json");
    let all = [report(0), report(1), report(2)];
    let a = merge(&all, &["--json", "-o", merged_path.to_str().unwrap()]).success();
    let m = json(&a);
    assert_eq!(m["totals"]["converted"], 10);
    assert_eq!(names(&m["models"]).len(), 10);
    assert_eq!(m["models"].as_array().unwrap().len(), 10);
    assert_eq!(m["missing_count"], 0);
    assert_eq!(m["balance"], "bytes");
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&merged_path).unwrap()).unwrap();
    assert_eq!(on_disk, m, "-o writes what --json prints");
    let text = merge(&all, &[]).success();
    let text = String::from_utf8_lossy(&text.get_output().stdout).into_owned();
    assert!(
        text.contains("10 models in 3 of 3 parts: 10 converted"),
        "{text}"
    );

    // A part missing is a failed check (1); reports of two runs, an error (2).
    let a = merge(&all[..2], &[]).code(1);
    let text = String::from_utf8_lossy(&a.get_output().stdout).into_owned();
    assert!(text.contains("missing 1 of 3 parts: 2/3"), "{text}");
    let a = merge(&[report(0), report(0)], &[]).code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("part 0/3 is also in"), "{err}");
    let other = tmp.path().join("by-name.json");
    run(
        &root,
        &out,
        &[
            "--part",
            "1/3",
            "--balance",
            "name",
            "--report",
            other.to_str().unwrap(),
        ],
    )
    .success();
    let a = merge(&[report(0), other], &[]).code(2);
    let err = String::from_utf8_lossy(&a.get_output().stderr).into_owned();
    assert!(err.contains("balance is name"), "{err}");
    merge(&[tmp.path().join("none.json")], &[]).code(2);
}
