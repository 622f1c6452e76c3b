//! What a new user meets first (issue 31): validate's progress bar and
//! `-q`, `-q` on inspect, errors as JSON under `--json`, the hints for a
//! forgotten unit and for a folder of models, plurals, shell completions.

use std::path::Path;

use serde_json::Value;

use crate::common::*;

/// `reshard ARGS` run under `script`, which gives it a terminal: what it
/// wrote there (stdout is sent to /dev/null). `None` where `script` is
/// missing.
fn on_a_terminal(args: &[&str]) -> Option<String> {
    terminal_output(&format!("{} >/dev/null", command_line(args)))
}

/// `reshard ARGS` as one `sh` command line.
fn command_line(args: &[&str]) -> String {
    let exe = assert_cmd::cargo::cargo_bin("reshard");
    let mut line = quote(&exe.display().to_string());
    for a in args {
        line.push(' ');
        line.push_str(&quote(a));
    }
    line
}

/// What the `sh` command `line` writes to the terminal `script` gives it.
fn terminal_output(line: &str) -> Option<String> {
    let out = std::process::Command::new("script")
        // A CI runner's TERM may be `dumb`, which turns colour off.
        .env("TERM", "xterm")
        .args(["-qec", line, "/dev/null"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `s` as one word for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn converted(tmp: &Path) -> std::path::PathBuf {
    let out = tmp.join("out");
    convert(&fixture("tiny-llama"), &out, &["--max-shard-size", "100KB"]).success();
    out
}

#[test]
fn validate_draws_progress_on_a_terminal_only() {
    let tmp = tempfile::tempdir().unwrap();
    let out = converted(tmp.path());
    let src = fixture("tiny-llama");
    let (out_s, src_s) = (out.display().to_string(), src.display().to_string());
    let args = ["validate", out_s.as_str(), "--against", src_s.as_str()];
    // Piped stderr (not a terminal): no bar, not a byte of it.
    let piped = reshard().args(args).output().unwrap();
    assert!(piped.status.success());
    assert_eq!(String::from_utf8_lossy(&piped.stderr), "");
    let Some(drawn) = on_a_terminal(&args) else {
        eprintln!("skipped the terminal half: `script` is not available");
        return;
    };
    // 427.62 KiB of tensors, read twice (the load and the comparison).
    assert!(drawn.contains("/855.25 KiB"), "{drawn:?}");
    let hidden = on_a_terminal(&[&args[..], &["--no-progress"]].concat()).unwrap();
    assert!(!hidden.contains("KiB"), "{hidden:?}");
    let quiet = on_a_terminal(&[&args[..], &["-q"]].concat()).unwrap();
    assert!(!quiet.contains("KiB"), "{quiet:?}");
    // `convert --validate` draws the same bar for its validation.
    let dst = tmp.path().join("again").display().to_string();
    let convert = on_a_terminal(&["convert", src_s.as_str(), dst.as_str(), "--validate"]).unwrap();
    assert!(convert.contains("/855.25 KiB"), "{convert:?}");
}

/// `batch --mode validate` drew only each model's "planning" line, never a
/// bar, though `--mode convert` drew one per model: each validate job now
/// draws the bar `validate` draws, on a terminal only.
#[test]
fn batch_validate_draws_each_models_bar_on_a_terminal_only() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    copy_fixture("tiny-llama", &root);
    let out = tmp.path().join("out");
    let (root_s, out_s) = (root.display().to_string(), out.display().to_string());
    let convert = ["batch", root_s.as_str(), "--out", out_s.as_str()];
    let args = [&convert[..], &["--mode", "validate"]].concat();
    let Some(converted) = on_a_terminal(&convert) else {
        eprintln!("skipped: `script` is not available");
        return;
    };
    // convert's job bar: 427.62 KiB of tensors, read once.
    assert!(converted.contains("/427.62 KiB"), "{converted:?}");
    let piped = reshard().args(&args).output().unwrap();
    assert!(piped.status.success());
    assert_eq!(String::from_utf8_lossy(&piped.stderr), "");
    let drawn = on_a_terminal(&args).unwrap();
    // validate's: read twice (the load and the comparison), under the
    // model's name.
    assert!(drawn.contains("/855.25 KiB"), "{drawn:?}");
    assert!(drawn.contains("tiny-llama"), "{drawn:?}");
    let hidden = on_a_terminal(&[&args[..], &["--no-progress"]].concat()).unwrap();
    assert!(!hidden.contains("/855.25 KiB"), "{hidden:?}");
}

#[test]
fn validate_quiet_prints_the_verdict_only() {
    let tmp = tempfile::tempdir().unwrap();
    let out = converted(tmp.path());
    let ok = reshard()
        .arg("validate")
        .arg(&out)
        .args(["-q", "--no-progress"])
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "passed\n");
    // One flipped byte: FAILED, one problem (singular), and its line.
    let shard = out.join("model-00002-of-00004.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&shard, bytes).unwrap();
    let bad = reshard()
        .arg("validate")
        .arg(&out)
        .arg("-q")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let text = String::from_utf8_lossy(&bad.stdout).into_owned();
    let mut lines = text.lines();
    let head = lines.next().unwrap();
    let n: usize = head
        .strip_prefix("FAILED: ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    let word = if n == 1 { "problem" } else { "problems" };
    assert_eq!(head, format!("FAILED: {n} {word}"), "{text}");
    assert_eq!(lines.filter(|l| l.starts_with("  - ")).count(), n, "{text}");
    assert!(!text.contains("loaded"), "{text}");
}

#[test]
fn inspect_quiet_prints_findings_only() {
    let clean = reshard()
        .arg("inspect")
        .arg(fixture("tiny-llama"))
        .arg("-q")
        .output()
        .unwrap();
    assert_eq!(clean.status.code(), Some(0));
    let full = reshard()
        .arg("inspect")
        .arg(fixture("tiny-llama"))
        .output()
        .unwrap();
    let full = String::from_utf8_lossy(&full.stdout).into_owned();
    if full.contains("findings      none") {
        assert_eq!(String::from_utf8_lossy(&clean.stdout), "");
    }
    // A file without `format: pt` and with its tensors out of order has
    // findings: one `PATH: finding` line each, and --strict exits 1.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.safetensors");
    let header = serde_json::json!({
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    });
    write_safetensors(&path, &header, &[0u8; 8]);
    let text = reshard().arg("inspect").arg(&path).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    let n = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("findings"))
        .and_then(|r| r.trim().parse::<usize>().ok())
        .unwrap_or(0);
    assert!(n > 0, "the file was meant to have findings: {text}");
    let quiet = reshard()
        .arg("inspect")
        .arg(&path)
        .args(["-q", "--strict"])
        .output()
        .unwrap();
    let q = String::from_utf8_lossy(&quiet.stdout).into_owned();
    assert_eq!(q.lines().count(), n, "{q}\n{text}");
    let prefix = format!("{}: ", path.display());
    assert!(q.lines().all(|l| l.starts_with(&prefix)), "{q}");
    assert_eq!(quiet.status.code(), Some(1));
}

#[test]
fn errors_are_json_on_stdout_under_json() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("missing");
    let commands: [&[&str]; 4] = [
        &["inspect"],
        &["fit", "--os", "linux", "--ram", "1GiB"],
        &["validate"],
        &["convert", "DST"],
    ];
    for cmd in commands {
        let mut c = reshard();
        c.arg(cmd[0]).arg(&missing);
        for a in &cmd[1..] {
            if *a == "DST" {
                c.arg(tmp.path().join("dst"));
            } else {
                c.arg(a);
            }
        }
        let out = c.arg("--json").output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{cmd:?}");
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}: {:?}", out.stdout));
        assert_eq!(v["exit"], 2, "{cmd:?}");
        let error = v["error"].as_str().unwrap();
        assert!(error.starts_with("cannot "), "{cmd:?}: {v}");
        let causes = v["causes"].as_array().unwrap();
        assert!(
            causes
                .iter()
                .any(|c| c.as_str().unwrap().contains("no such file or folder")),
            "{cmd:?}: {v}"
        );
        // The same chain still reads as text on stderr.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with(&format!("error: {error}")), "{stderr}");
    }
    // Without --json, stdout stays empty.
    let out = reshard().arg("inspect").arg(&missing).output().unwrap();
    assert!(out.stdout.is_empty());
}

#[test]
fn a_bare_shard_size_under_a_mib_asks_for_its_unit() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let out = reshard()
        .arg("convert")
        .arg(fixture("tiny-llama"))
        .arg(&dst)
        .args(["--max-shard-size", "10"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did you mean 10GB?"), "{stderr}");
    assert!(!dst.exists(), "nothing written");
    // fit's what-if takes the same rule; an explicit unit is fine.
    let fit = reshard()
        .arg("fit")
        .arg(fixture("tiny-llama"))
        .args(["--max-shard-size", "10", "--os", "linux", "--ram", "1GiB"])
        .output()
        .unwrap();
    assert_eq!(fit.status.code(), Some(2));
    convert(
        &fixture("tiny-llama"),
        &dst,
        &["--max-shard-size", "100000B"],
    )
    .success();
    convert(
        &fixture("tiny-llama"),
        &tmp.path().join("b"),
        &["--max-shard-size", "2000000"],
    )
    .success();
}

#[test]
fn a_folder_of_models_as_src_suggests_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("models");
    std::fs::create_dir_all(&root).unwrap();
    copy_fixture("tiny-llama", &root);
    copy_fixture("tiny-gpt2", &root);
    let dst = tmp.path().join("out");
    let out = reshard()
        .arg("convert")
        .arg(&root)
        .arg(&dst)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("it is a folder of models (tiny-gpt2, tiny-llama), not one"),
        "{stderr}"
    );
    assert!(stderr.contains("`reshard batch "), "{stderr}");
    assert!(!dst.exists());
    // An empty folder has no models to point to: the plain error.
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = reshard()
        .arg("convert")
        .arg(&empty)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("batch"));
}

#[test]
fn one_shard_is_singular() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let out = convert(&fixture("tiny-llama"), &dst, &[]).success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(text.starts_with("wrote 1 shard ("), "{text}");
    let again = convert(&fixture("tiny-llama"), &dst, &[]).success();
    let text = String::from_utf8_lossy(&again.get_output().stdout).into_owned();
    assert!(text.contains("(1 shard); nothing written"), "{text}");
    let fit = reshard()
        .arg("fit")
        .arg(fixture("tiny-llama"))
        .args(["--os", "linux", "--ram", "1GiB"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&fit.stdout).into_owned();
    assert!(text.contains("as it is: 1 shard,"), "{text}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    for (shell, mark) in [
        ("bash", "_reshard()"),
        ("zsh", "#compdef reshard"),
        ("fish", "complete -c reshard"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let out = reshard().args(["completions", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(mark), "{shell}: {script}");
        assert!(script.contains("max-shard-size"), "{shell}");
    }
    let bad = reshard().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn verdicts_and_errors_are_coloured_on_a_terminal_unless_no_color() {
    let tmp = tempfile::tempdir().unwrap();
    let out = converted(tmp.path());
    let out_s = out.display().to_string();
    let missing = tmp.path().join("missing").display().to_string();
    let validate = command_line(&["validate", out_s.as_str(), "-q"]);
    let inspect = command_line(&["inspect", missing.as_str()]);
    let Some(coloured) = terminal_output(&format!(
        "env -u NO_COLOR {validate}; env -u NO_COLOR {inspect}"
    )) else {
        eprintln!("skipped: `script` is not available");
        return;
    };
    assert!(coloured.contains("\x1b[1;32mpassed\x1b[0m"), "{coloured:?}");
    assert!(
        coloured.contains("\x1b[1;31merror\x1b[0m: cannot inspect"),
        "{coloured:?}"
    );
    let plain = terminal_output(&format!("NO_COLOR=1 {validate}; NO_COLOR=1 {inspect}")).unwrap();
    assert!(!plain.contains('\x1b'), "{plain:?}");
    assert!(plain.contains("passed"), "{plain:?}");
    // Piped: never coloured.
    let piped = reshard()
        .arg("validate")
        .arg(&out)
        .arg("-q")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&piped.stdout), "passed\n");
}
