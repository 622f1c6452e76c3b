//! The scheduler examples users copy from docs/batch.md: the Slurm job script
//! (docs/examples/slurm-batch.sh, which scripts/slurm-test.sh also submits to
//! a real cluster) and the Kubernetes Indexed Job
//! (docs/examples/k8s-indexed-job.yaml). The page must show each file
//! verbatim; each must give every part index to `--part` with an N that
//! matches its task count; and each, rendered for every index and run with
//! the real binary, must convert every model of a folder exactly once.
//! The pages' other command blocks are compared with what the binary
//! prints in docs_output.rs.

use std::path::Path;
#[cfg(unix)]
use std::path::PathBuf;

#[cfg(unix)]
use crate::common::*;

fn repo_file(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fenced code blocks of a markdown page: (info string, body).
fn code_blocks(md: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in md.lines() {
        match open.as_mut() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    open = Some((info.trim().to_string(), String::new()));
                }
            }
            Some((_, body)) => {
                if line.trim_end() == "```" {
                    blocks.extend(open.take());
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    blocks
}

#[test]
fn batch_page_shows_both_examples_verbatim() {
    let blocks = code_blocks(&repo_file("docs/batch.md"));
    for (file, lang) in [
        ("docs/examples/slurm-batch.sh", "bash"),
        ("docs/examples/k8s-indexed-job.yaml", "yaml"),
    ] {
        let text = repo_file(file);
        assert!(
            blocks
                .iter()
                .any(|(info, body)| info == lang && *body == text),
            "docs/batch.md has no ```{lang} block equal to {file}"
        );
    }
}

/// The value of `--part` in a command line, quotes and `$` removed:
/// (I, N) as written, e.g. ("SLURM_ARRAY_TASK_ID", "PARTS").
fn part_flag(command: &str) -> (String, String) {
    let words: Vec<&str> = command.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| *w == "--part")
        .unwrap_or_else(|| panic!("no --part in {command:?}"));
    let value = words[at + 1].trim_matches('"');
    let (i, n) = value.split_once('/').unwrap();
    (
        i.trim_start_matches('$').into(),
        n.trim_start_matches('$').into(),
    )
}

/// ROOT with three tiny models; returns (ROOT, their names).
#[cfg(unix)] // the scripts these run need a POSIX shell
fn models(dir: &Path) -> (PathBuf, Vec<String>) {
    let root = dir.join("models");
    for f in ["tiny-gpt2", "tiny-t5", "tiny-llama"] {
        copy_fixture(f, &root);
    }
    (
        root,
        vec!["tiny-gpt2".into(), "tiny-llama".into(), "tiny-t5".into()],
    )
}

/// The models each part's report lists as converted, all parts together.
#[cfg(unix)] // the scripts these run need a POSIX shell
fn converted(out: &Path, parts: u64) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..parts {
        let path = out.join(format!(".reports/part-{i}.json"));
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(report["part"], format!("{i}/{parts}"), "{}", path.display());
        for m in report["models"].as_array().unwrap() {
            assert_eq!(m["status"], "converted", "{m}");
            names.push(m["name"].as_str().unwrap().to_string());
        }
    }
    names.sort();
    names
}

/// A PATH with the tested binary first.
#[cfg(unix)] // the scripts these run need a POSIX shell
fn path_with_reshard() -> std::ffi::OsString {
    let bin = assert_cmd::cargo::cargo_bin("reshard");
    let mut dirs = vec![bin.parent().unwrap().to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

#[test]
fn slurm_script_gives_each_array_task_its_part() {
    let script = repo_file("docs/examples/slurm-batch.sh");
    let array = script
        .lines()
        .find_map(|l| l.strip_prefix("#SBATCH --array="))
        .expect("#SBATCH --array=");
    let (first, last) = array.split_once('-').unwrap();
    assert_eq!(first, "0", "parts count from 0");
    let tasks = last.parse::<u64>().unwrap() + 1;
    let parts: u64 = script
        .lines()
        .find_map(|l| l.strip_prefix("PARTS=${PARTS:-"))
        .and_then(|rest| rest.strip_suffix('}'))
        .expect("PARTS=${PARTS:-N}")
        .parse()
        .unwrap();
    assert_eq!(parts, tasks, "--array must cover 0..PARTS-1");
    let command = script
        .lines()
        .skip_while(|l| !l.starts_with("reshard batch"))
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(
        part_flag(&command),
        ("SLURM_ARRAY_TASK_ID".into(), "PARTS".into())
    );
    assert!(
        command.contains("--report \"$CONVERTED/.reports/part-$SLURM_ARRAY_TASK_ID.json\""),
        "{command}"
    );
}

#[cfg(unix)]
#[test]
fn slurm_script_run_for_every_task_converts_each_model_once() {
    // What each array task runs, without Slurm (scripts/slurm-test.sh runs
    // it under a real slurmctld): the script as it is, with the
    // environment Slurm would give it.
    let tmp = tempfile::tempdir().unwrap();
    let (root, names) = models(tmp.path());
    let out = tmp.path().join("converted");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples/slurm-batch.sh");
    for task in 0..8 {
        let status = std::process::Command::new("bash")
            .arg(&script)
            .env("PATH", path_with_reshard())
            .env("SLURM_ARRAY_TASK_ID", task.to_string())
            .env("SLURM_CPUS_PER_TASK", "1")
            .env("MODELS", &root)
            .env("CONVERTED", &out)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "task {task}: {status}");
    }
    assert_eq!(converted(&out, 8), names);
}

/// The Indexed Job's one container's `sh -c` command line.
fn k8s_command(job: &serde_norway::Value) -> String {
    let container = &job["spec"]["template"]["spec"]["containers"][0];
    let command: Vec<&str> = container["command"]
        .as_sequence()
        .expect("command")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(command, ["sh", "-c"]);
    let args = container["args"].as_sequence().expect("args");
    assert_eq!(args.len(), 1, "one shell command");
    args[0].as_str().unwrap().to_string()
}

#[test]
fn k8s_manifest_is_an_indexed_job_over_n_parts() {
    let job: serde_norway::Value =
        serde_norway::from_str(&repo_file("docs/examples/k8s-indexed-job.yaml")).unwrap();
    assert_eq!(job["apiVersion"].as_str(), Some("batch/v1"));
    assert_eq!(job["kind"].as_str(), Some("Job"));
    let spec = &job["spec"];
    assert_eq!(spec["completionMode"].as_str(), Some("Indexed"));
    assert_eq!(
        spec["template"]["spec"]["restartPolicy"].as_str(),
        Some("Never"),
        "backoffLimitPerIndex needs restartPolicy: Never"
    );
    let completions = spec["completions"].as_u64().expect("completions");
    let parallelism = spec["parallelism"].as_u64().expect("parallelism");
    assert!(parallelism <= completions);
    let command = k8s_command(&job);
    let (index, n) = part_flag(&command);
    assert_eq!(index, "JOB_COMPLETION_INDEX");
    assert_eq!(n.parse::<u64>().unwrap(), completions, "N = completions");
    assert!(
        command.contains("--report /converted/.reports/part-$JOB_COMPLETION_INDEX.json"),
        "{command}"
    );
    let mounts: Vec<&str> = spec["template"]["spec"]["containers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(mounts, ["/models", "/converted"]);
}

#[cfg(unix)]
#[test]
fn k8s_manifest_rendered_for_every_index_converts_each_model_once() {
    // Each pod's command, with the index Kubernetes sets and the volumes
    // mounted at temp folders, run through `sh -c` as the pod would.
    let job: serde_norway::Value =
        serde_norway::from_str(&repo_file("docs/examples/k8s-indexed-job.yaml")).unwrap();
    let completions = job["spec"]["completions"].as_u64().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (root, names) = models(tmp.path());
    let out = tmp.path().join("converted");
    let command = k8s_command(&job)
        .replace("/models", &root.display().to_string())
        .replace("/converted", &out.display().to_string());
    for index in 0..completions {
        let status = std::process::Command::new("sh")
            .args(["-c", &command])
            .env("PATH", path_with_reshard())
            .env("JOB_COMPLETION_INDEX", index.to_string())
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "index {index}: {status}");
    }
    assert_eq!(converted(&out, completions), names);
}
