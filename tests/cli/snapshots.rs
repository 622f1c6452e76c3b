//! Snapshot tests of what each command prints as text (insta): the real
//! binary on the fixtures, with times, rates, and temporary and fixture
//! paths filtered, so a change to any renderer shows as a reviewed diff of
//! its output (`cargo insta review`, or `INSTA_UPDATE=always` then read
//! the `.snap` files). JSON output is checked field by field elsewhere.
//!
//! Skipped under Windows: the paths and the Wine figures differ there, and
//! the renderers are the same code.

use std::path::Path;

use crate::common::{fixture, reshard};

/// Runs reshard with `args` and returns stdout, then stderr (each under a
/// heading), with machine-dependent text filtered.
fn run(args: &[&str], tmp: &Path) -> String {
    let out = reshard().args(args).output().unwrap();
    let text = format!(
        "exit: {}\n--- stdout\n{}--- stderr\n{}",
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    filter(&text, tmp)
}

fn filter(text: &str, tmp: &Path) -> String {
    let fixtures = fixture("");
    let mut text = text.replace(&tmp.display().to_string(), "[TMP]").replace(
        fixtures.display().to_string().trim_end_matches('/'),
        "[FIXTURES]",
    );
    for (pattern, with) in [
        (r"\d+(\.\d+)? s\b", "[TIME]"),
        (r"\d+(\.\d+)? [KMGT]?i?B/s", "[RATE]"),
    ] {
        text = regex_lite(pattern, &text, with);
    }
    // Figures that depend on the machine or on thread timing: the commit
    // the OS charged, the window's peak, batch's seconds per model.
    text.lines()
        .map(|line| {
            if line.starts_with("commit (") {
                return "commit [FIGURES OF THIS MACHINE]".to_string();
            }
            let line = match (line.find("peaked at "), line.find(" of a ")) {
                (Some(a), Some(b)) if a < b => {
                    format!("{}peaked at [PEAK]{}", &line[..a], &line[b..])
                }
                _ => line.to_string(),
            };
            let words: Vec<&str> = line.split_whitespace().collect();
            let batch_row = words.len() >= 5
                && words[3].contains('.')
                && words[3].parse::<f64>().is_ok()
                && ["converted", "up", "failed", "skipped", "passed"].contains(&words[4]);
            if batch_row {
                return line.replacen(words[3], "[SECS]", 1);
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// A tiny regex replace for the two patterns above (digits, an optional
/// fraction, then a unit), so the tests need no regex crate.
fn regex_lite(pattern: &str, text: &str, with: &str) -> String {
    let rate = pattern.contains("B/s");
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.');
        if boundary && b[i].is_ascii_digit() {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'.') {
                j += 1;
            }
            let rest = &text[j..];
            let unit = if rate {
                [
                    "KiB/s", "MiB/s", "GiB/s", "TiB/s", "B/s", "KB/s", "MB/s", "GB/s",
                ]
                .iter()
                .find(|u| rest.starts_with(&format!(" {u}")))
                .map(|u| u.len() + 1)
            } else {
                (rest.starts_with(" s")
                    && !rest[2..].starts_with(|c: char| c.is_ascii_alphanumeric()))
                .then_some(2)
            };
            if let Some(n) = unit {
                out.push_str(with);
                i = j + n;
                continue;
            }
            out.push_str(&text[i..j]);
            i = j;
            continue;
        }
        let c = text[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

macro_rules! snapshot {
    ($name:expr, $text:expr) => {
        if cfg!(windows) {
            return;
        }
        insta::with_settings!({ snapshot_path => "snapshots", prepend_module_to_snapshot => false }, {
            insta::assert_snapshot!($name, $text);
        });
    };
}

#[test]
fn inspect_text() {
    let tmp = tempfile::tempdir().unwrap();
    let f = fixture("tiny-moe-sharded");
    let text = run(&["inspect", f.to_str().unwrap()], tmp.path());
    snapshot!("inspect_tiny_moe_sharded", text);
}

#[test]
fn convert_dry_run_run_and_validate_text() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("tiny-llama");
    let dst = tmp.path().join("out");
    let (src, dst) = (src.to_str().unwrap(), dst.to_str().unwrap());
    let shards = ["--max-shard-size", "100KB", "--no-progress"];
    let dry = run(
        &[&["convert", src, dst, "--dry-run"][..], &shards].concat(),
        tmp.path(),
    );
    let done = run(&[&["convert", src, dst][..], &shards].concat(), tmp.path());
    let again = run(&[&["convert", src, dst][..], &shards].concat(), tmp.path());
    let valid = run(&["validate", dst, "--against", src], tmp.path());
    snapshot!(
        "convert_tiny_llama",
        format!("$ convert --dry-run\n{dry}\n$ convert\n{done}\n$ convert (again)\n{again}\n$ validate --against\n{valid}")
    );
}

#[test]
fn fit_text() {
    let tmp = tempfile::tempdir().unwrap();
    let f = fixture("tiny-llama-f32-sharded");
    let text = run(
        &[
            "fit",
            f.to_str().unwrap(),
            "--os",
            "windows",
            "--ram",
            "8GiB",
            "--pagefile",
            "0",
            "--vram",
            "4GiB",
        ],
        tmp.path(),
    );
    snapshot!("fit_tiny_llama_f32_sharded_windows", text);
}

#[test]
fn batch_text() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("models");
    for name in ["tiny-llama", "tiny-gpt2"] {
        crate::common::copy_dir(&fixture(name), &root.join(name));
    }
    let out = tmp.path().join("out");
    let args = [
        "batch",
        root.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--no-progress",
    ];
    let first = run(&args, tmp.path());
    let again = run(&args, tmp.path());
    snapshot!(
        "batch_two_models",
        format!("$ batch\n{first}\n$ batch (again)\n{again}")
    );
}

#[test]
fn the_filters_replace_times_rates_and_paths_only() {
    let tmp = Path::new("/tmp/x");
    assert_eq!(
        filter(
            "in 0.02 s (19.35 MiB/s) at /tmp/x/out, 3 shards, 2.5 seconds",
            tmp
        ),
        "in [TIME] ([RATE]) at [TMP]/out, 3 shards, 2.5 seconds\n"
    );
    assert_eq!(
        filter(
            "tiny   1.00 KiB      0.02  converted\nbuffers peaked at 3 KiB of a 1 MiB window",
            tmp
        ),
        "tiny   1.00 KiB      [SECS]  converted\nbuffers peaked at [PEAK] of a 1 MiB window\n"
    );
}
