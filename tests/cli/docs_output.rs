//! The command blocks of README.md and docs/ run against the real binary:
//! each listed block's `$ ` lines are run in order (through `sh`, stdout and
//! stderr together, in a temporary folder laid out with the names the page
//! uses, see docs_setups.rs) and what they print must be the block's other
//! lines. Times, rates, the SECONDS column and the buffer peak (it depends
//! on how many workers run at once) are masked on both sides; everything
//! else is compared as printed, but for the temporary folder's path, which
//! prints as `/tmp/demo`; `$EDITOR` is `sh .edit` (a setup writes `.edit`
//! where a block edits a file). A line that is only `...` (indented or
//! not) in a block stands for any number of lines the page leaves out.
//!
//! Every fenced block of these pages with a `$ reshard` line is either
//! listed in EXAMPLES (checked here) or carries, on the line right above its
//! opening fence, a marker saying why not:
//!
//! ```text
//! <!-- not checked: needs the Python venv (python:transformers) -->
//! ```
//!
//! The reason must start with one of REASONS (the Python venv, a GPU, Wine,
//! Slurm, a large checkpoint, or `illustrative` for a block that only shows
//! the shape of a run); anything after it is free text. A block that is
//! neither fails `every_command_block_is_checked_or_marked`, naming the page
//! and line. Blocks whose folders the Python libraries write are listed in
//! VENV_EXAMPLES and checked the same way wherever the venv is (CI always
//! has it: scripts/test.sh builds it); a block marked "needs the Python
//! venv" is one no setup here builds yet.
//!
//! Bless mode: `RESHARD_BLESS_DOCS=1 cargo test --test cli -- docs_output`
//! rewrites the output lines of every checked block that differs with what
//! the binary printed. A printed line equal to the page's line once masked
//! keeps the page's text (its times stay as they were); the others are the
//! real output. An abridged block (one with `...`) is not rewritten: the
//! test names it, to be fixed by hand.

use std::path::{Path, PathBuf};

use crate::docs_setups::*;
use crate::docs_setups_venv as venv;

/// One block to check: the page, its first command (after `$ `), and what
/// the folder it runs in must hold first.
struct Example {
    page: &'static str,
    first: &'static str,
    setup: fn(&Path),
}

/// Why a block may go unchecked here: the marker's text after
/// `not checked: ` must start with one of these.
const REASONS: &[&str] = &[
    "needs the Python venv",
    "needs a GPU",
    "needs Wine",
    "needs Slurm",
    "needs a large checkpoint",
    "illustrative",
];

const EXAMPLES: &[Example] = &[
    Example {
        page: "docs/validate.md",
        first: "reshard validate llama-302m --emulate per-shard-mmap --json | jq \"{emulation, commit}\"",
        setup: llama_302m,
    },
    Example {
        page: "docs/validate.md",
        first: "reshard validate out; echo \"[exit $?]\"",
        setup: validate_real,
    },
    Example {
        page: "docs/layouts.md",
        first: "/usr/bin/time -f \"peak RSS %M KiB\" reshard convert big bigout --single-file --window 64MiB",
        setup: big_merge,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard fit llama-302m --os windows --ram 1GiB --pagefile 512MiB",
        setup: llama_302m,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard fit llama-302m --os windows --ram 1GiB --pagefile 512MiB --loader per-shard-mmap --loader transformers-v5-mmap --max-shard-size 64MiB",
        setup: llama_302m,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard fit tests/fixtures/gguf/split-00002-of-00002.gguf --os windows --ram 8GiB --pagefile 1GiB --vram 1KiB",
        setup: gguf_split,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard fit qwen2-14b --os windows --ram 32GiB --pagefile 8GiB --vram 32GiB --baseline 10.93GiB --loader transformers-v5-mmap --loader per-shard-mmap",
        setup: qwen2_14b,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard convert flux1-dev.safetensors flux1-dev-fp8.safetensors --fit --for comfyui --os windows --ram 32GiB --pagefile 8GiB --vram 12GiB --dry-run",
        setup: flux_dev,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard fit llama-q8_0.gguf --for llama.cpp --os linux --ram 16GiB --vram 100KiB --reserve 0",
        setup: llama_q8_0,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard convert tiny-llama out --fit --for transformers --os linux --ram 16GiB --vram 345KiB --reserve 0 --validate",
        setup: tiny_llama,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard convert tiny-llama out2 --fit --for vllm --os linux --ram 16GiB --vram 1KiB --reserve 0; echo \"exit $?\"",
        setup: tiny_llama,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch root --out out --fit --for transformers --os linux --ram 4GiB --vram 345KiB --reserve 0",
        setup: fit_root,
    },
    Example {
        page: "README.md",
        first: "reshard fit examples/tiny-llama --os windows --ram 8GiB --pagefile 2GiB -q",
        setup: readme,
    },
    Example {
        page: "docs/convert.md",
        first: "reshard convert tests/fixtures/tiny-moe-sharded out/moe --max-shard-size 20KiB --dry-run",
        setup: moe,
    },
    Example {
        page: "docs/convert.md",
        first: "reshard convert tests/fixtures/tiny-moe-sharded out/moe --max-shard-size 20KiB -v",
        setup: moe,
    },
    Example {
        page: "docs/convert.md",
        first: "reshard convert tests/fixtures/tiny-moe-sharded out/moe2 --max-shard-size 20KiB -v --sha256",
        setup: moe,
    },
    Example {
        page: "docs/inspect.md",
        first: "reshard inspect damaged-folder --strict; echo \"exit $?\"",
        setup: damaged,
    },
    Example {
        page: "docs/cast.md",
        first: "reshard convert tiny-llama out --dtype f8_e4m3",
        setup: tiny_llama,
    },
    Example {
        page: "docs/cast.md",
        first: "reshard convert big.safetensors out --dtype f16",
        setup: overflowing,
    },
    Example {
        page: "docs/gguf.md",
        first: "reshard convert flux.safetensors flux-q8_0.gguf --quantize q8_0 --dry-run",
        setup: flux,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard fit flux1-dev.safetensors --for comfyui-gguf --os windows --ram 32GiB --pagefile 8GiB --vram 12GiB",
        setup: flux_dev,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch root --out out --mode validate",
        setup: batch_root,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch root --out out --mode fit --os windows --ram 16GiB --pagefile 4GiB --vram 8GiB",
        setup: batch_root,
    },
    Example {
        page: "docs/inspect.md",
        first: "reshard inspect tests/fixtures/tiny-moe-sharded",
        setup: tiny_moe_and_t5,
    },
    Example {
        page: "docs/inspect.md",
        first: "reshard inspect tests/fixtures/tiny-t5 --tensors | head -5",
        setup: tiny_moe_and_t5,
    },
    Example {
        page: "docs/inspect.md",
        first: "reshard inspect truncated-model",
        setup: truncated,
    },
    Example {
        page: "docs/pytorch.md",
        first: "reshard inspect tests/fixtures/tiny-gpt2-bin",
        setup: gpt2_bin,
    },
    Example {
        page: "docs/convert.md",
        first: "reshard convert tests/fixtures/tiny-llama tests/fixtures/tiny-llama/out",
        setup: fixture_tiny_llama,
    },
    Example {
        page: "docs/layouts.md",
        first: "reshard convert tiny-llama out2",
        setup: tiny_llama_aux,
    },
    Example {
        page: "docs/gguf.md",
        first: "reshard inspect tests/fixtures/gguf/split-00002-of-00002.gguf",
        setup: gguf_fixtures,
    },
    Example {
        page: "docs/gguf.md",
        first: "reshard convert llama-q8_0.gguf tiny-llama --dtype bf16 --dry-run",
        setup: llama_q8_0,
    },
    Example {
        page: "docs/gguf.md",
        first: "reshard validate tiny-llama --against llama-q8_0.gguf --device cpu",
        setup: gguf_page_converted,
    },
    Example {
        page: "docs/gguf.md",
        first: "reshard convert tiny-llama tiny-llama-q8_0.gguf --quantize q8_0",
        setup: gguf_page_converted,
    },
    Example {
        page: "docs/gguf.md",
        first: "reshard validate tiny-llama-q8_0.gguf --device cpu",
        setup: gguf_page_quantized,
    },
    Example {
        page: "docs/gguf.md",
        first: "reshard convert tests/fixtures/gguf/llm/llama llama-q8_0.gguf --quantize q8_0 -q",
        setup: gguf_llm,
    },
    Example {
        page: "docs/fit.md",
        first: "reshard fit flux1-dev.safetensors --for transformers --os linux --ram 64GiB --vram 12GiB --device-map device_map.json",
        setup: flux_dev,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch models --out converted --dry-run",
        setup: batch_models,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch models --out converted --jobs 2 --report converted/.reports/batch.json",
        setup: batch_models,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch models --out converted",
        setup: batch_converted,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch models --out converted --verify-source",
        setup: batch_corrupted,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch models --out converted --plan-parts 3",
        setup: batch_models,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch models --out converted --dry-run --part 2/3",
        setup: batch_models,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch-report merge converted/.reports/part-*.json -o converted/.reports/all.json",
        setup: batch_parts,
    },
    Example {
        page: "docs/batch.md",
        first: "reshard batch gguf --out converted --dry-run",
        setup: batch_gguf,
    },
    Example {
        page: "docs/layouts.md",
        first: "reshard convert tiny-llama out",
        setup: tiny_llama_editor,
    },
    Example {
        page: "docs/validate.md",
        first: "reshard validate tiny-llama --loader python:transformers --python ./hangs --loader-timeout 2s",
        setup: tiny_llama_hangs,
    },
    Example {
        page: "docs/layouts.md",
        first: "reshard convert sd15-aio.safetensors sd15-parts --split-components",
        setup: sd15_aio,
    },
    Example {
        page: "docs/quantize.md",
        first: "reshard convert flux-tiny.safetensors flux-fp8 --quantize fp8 --dry-run",
        setup: flux_tiny,
    },
    Example {
        page: "docs/quantize.md",
        first: "reshard convert flux-tiny.safetensors flux-fp8 --quantize fp8-scaled",
        setup: flux_tiny,
    },
    Example {
        page: "docs/quantize.md",
        first: "reshard validate flux-fp8 --against flux-tiny.safetensors",
        setup: flux_tiny_scaled,
    },
];

/// The blocks whose folders the venv's libraries write (see
/// docs_setups_venv.rs): checked only where the venv is.
const VENV_EXAMPLES: &[Example] = &[
    Example {
        page: "docs/layouts.md",
        first: "find all-MiniLM-L6-v2 -type f | sort",
        setup: venv::minilm,
    },
    Example {
        page: "docs/layouts.md",
        first: "find tiny-st -type f | sort",
        setup: venv::tiny_st,
    },
    Example {
        page: "docs/layouts.md",
        first: "find tiny-sd -type f | sed 's/-000[0-9][0-9]-of-/-000NN-of-/' | sort | uniq -c",
        setup: venv::tiny_sd,
    },
    Example {
        page: "docs/layouts.md",
        first: "reshard inspect sd-out | grep -v '^  file '",
        setup: venv::sd_out,
    },
    Example {
        page: "docs/quantized.md",
        first: "reshard inspect fp8-block",
        setup: venv::fp8_block,
    },
    Example {
        page: "docs/validate.md",
        first: "reshard validate llama-302m --loader python:transformers --python venv/bin/python --commit-budget 1GiB",
        setup: venv::llama_302m_pythons,
    },
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every checked block, the venv's included.
fn all_examples() -> impl Iterator<Item = &'static Example> {
    EXAMPLES.iter().chain(VENV_EXAMPLES)
}

/// README.md and every page of docs/.
fn pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// A fenced block: the index of its opening fence's line and of its
/// closing one.
struct Fence {
    open: usize,
    close: usize,
}

fn fences(lines: &[&str]) -> Vec<Fence> {
    let mut out = Vec::new();
    let mut open = None;
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with("```") {
            continue;
        }
        match open.take() {
            None => open = Some(i),
            Some(o) => out.push(Fence { open: o, close: i }),
        }
    }
    out
}

/// The first `$ ` command of a block, when one of its commands runs reshard.
fn first_reshard_block(body: &[&str]) -> Option<String> {
    let runs_reshard = body.iter().any(|l| {
        l.strip_prefix("$ ")
            .is_some_and(|c| c.split_whitespace().any(|w| w == "reshard"))
    });
    let first = body.iter().find_map(|l| l.strip_prefix("$ "))?;
    runs_reshard.then(|| first.to_string())
}

/// What is wrong with the marker right above a block's fence, if anything:
/// `Ok(true)` for a valid marker, `Ok(false)` for none.
fn marker(above: Option<&str>) -> Result<bool, String> {
    let Some(text) = above.and_then(|l| l.trim().strip_prefix("<!-- not checked:")) else {
        return Ok(false);
    };
    let Some(reason) = text.strip_suffix("-->") else {
        return Err("a marker must end with -->".into());
    };
    let reason = reason.trim();
    if REASONS.iter().any(|r| reason.starts_with(r)) {
        Ok(true)
    } else {
        Err(format!(
            "marker reason {reason:?} is not one of {REASONS:?}"
        ))
    }
}

#[test]
fn every_command_block_is_checked_or_marked() {
    let mut wrong = Vec::new();
    let mut seen = Vec::new();
    for page in pages() {
        let md = std::fs::read_to_string(repo().join(&page)).unwrap();
        let lines: Vec<&str> = md.lines().collect();
        for f in fences(&lines) {
            let above = f.open.checked_sub(1).map(|i| lines[i]);
            let marked = marker(above);
            let Some(first) = first_reshard_block(&lines[f.open + 1..f.close]) else {
                if marked != Ok(false) {
                    wrong.push(format!(
                        "{page}:{}: a marker above a block that runs no reshard command",
                        f.open + 1
                    ));
                }
                continue;
            };
            let checked = all_examples().any(|e| e.page == page && e.first == first);
            if checked {
                seen.push((page.clone(), first.clone()));
            }
            match (marked, checked) {
                (Err(why), _) => wrong.push(format!("{page}:{}: {why}", f.open + 1)),
                (Ok(true), true) => wrong.push(format!(
                    "{page}:{}: block `$ {first}` is checked but marked not checked",
                    f.open + 1
                )),
                (Ok(false), false) => wrong.push(format!(
                    "{page}:{}: block `$ {first}` is neither in docs_output.rs's EXAMPLES nor marked `<!-- not checked: REASON -->` (REASON one of {REASONS:?})",
                    f.open + 1
                )),
                _ => {}
            }
        }
    }
    for (page, first) in all_examples().map(|e| (e.page, e.first)) {
        if !seen.iter().any(|(p, c)| p == page && c == first) {
            wrong.push(format!("{page}: no block starts with `$ {first}`"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// One command of a block and the lines the page shows it printing (as
/// indices into the page's lines).
struct Step {
    cmd: String,
    shown: std::ops::Range<usize>,
}

/// The block of `lines` whose first line is `$ first`.
fn block(page: &str, lines: &[&str], first: &str) -> Vec<Step> {
    let head = format!("$ {first}");
    let fence = fences(lines)
        .into_iter()
        .find(|f| lines.get(f.open + 1) == Some(&head.as_str()))
        .unwrap_or_else(|| panic!("{page}: no block starts with {head:?}"));
    let mut steps: Vec<Step> = Vec::new();
    for (i, line) in lines
        .iter()
        .enumerate()
        .take(fence.close)
        .skip(fence.open + 1)
    {
        match line.strip_prefix("$ ") {
            Some(cmd) => steps.push(Step {
                cmd: cmd.to_string(),
                shown: i + 1..i + 1,
            }),
            None => steps.last_mut().unwrap().shown.end = i + 1,
        }
    }
    steps
}

/// What differs between runs of the same command, masked.
fn mask(text: &str) -> String {
    let rules = [
        (r"in \d+(\.\d+)? s\b", "in T s"),
        (r"\(\d+(\.\d+)? [KMGT]?i?B/s\)", "(RATE)"),
        (
            r"buffers peaked at \d+(\.\d+)? [KMGT]?i?B",
            "buffers peaked at PEAK",
        ),
        (r"(?m)^(\S+ +\S+ [KMGT]?i?B) +\d+\.\d\d ", "$1 SECONDS "),
        (r"(?m)( [KMGT]?i?B) +\d+\.\d\d$", "$1 SECONDS"),
        (r"longest part \d+(\.\d+)? s\b", "longest part T s"),
        // validate --json's absolute commit figures and sample count.
        // (peak_above_baseline too: the allocator's arenas add up to a few
        // hundred KB under parallel tests).
        (
            r#""(baseline|peak|peak_above_baseline|samples)": \d+"#,
            r#""$1": N"#,
        ),
        // A commit peak or level in MiB to the MiB: the same arenas move
        // its hundredths.
        (r"peak (\d+)\.\d\d MiB above", "peak $1.NN MiB above"),
        // A peak under a MiB is all arenas and page-table noise (a
        // validate of a tiny checkpoint read 140 KiB here, 280 KiB in CI).
        (r"peak \d+(\.\d+)? (KiB|B) above", "peak UNDER-A-MiB above"),
        (
            r"with (\d+)\.\d\d MiB already committed",
            "with $1.NN MiB already committed",
        ),
        // GNU time's peak RSS (the allocator's and the page cache's share
        // vary; the page's sentence says what bounds it).
        (r"peak RSS \d+ KiB", "peak RSS N KiB"),
        // The process's commit before loading: the Python or shell that
        // started it, and the allocator's arenas, differ per machine.
        (
            r"baseline of \d+(\.\d+)? [KMGT]?i?B \(\d+(\.\d+)? [KMGT]?i?B absolute\)",
            "baseline of BASE (ABS absolute)",
        ),
        // A Python loader's baseline (its interpreter and libraries), the
        // samples taken, and its RSS: per machine and per run.
        (
            r"a baseline of \d+(\.\d+)? [KMGT]?i?B \(\d+(\.\d+)? [KMGT]?i?B absolute, \d+ samples\)",
            "a baseline of BASE (ABS absolute, N samples)",
        ),
        (
            r"rss: peak \d+(\.\d+)? [KMGT]?i?B \(baseline \d+(\.\d+)? [KMGT]?i?B\)",
            "rss: peak RSS (baseline RSS)",
        ),
        // validate's per-shard line: `  NAME  SIZE  N tensors  0.006 s  0.06 GB/s`.
        (r"\d+\.\d{3} s  \d+\.\d\d GB/s", "T s  RATE"),
    ];
    let mut text = text.to_string();
    for (re, with) in rules {
        text = regex::Regex::new(re)
            .unwrap()
            .replace_all(&text, with)
            .into_owned();
    }
    text
}

/// Whether the printed lines are the shown ones, masked, a shown `...`
/// standing for any number of printed lines.
fn matches(shown: &[String], got: &[String]) -> bool {
    match shown.split_first() {
        None => got.is_empty(),
        Some((s, rest)) if s.trim() == "..." => (0..=got.len()).any(|k| matches(rest, &got[k..])),
        Some((s, rest)) => got
            .split_first()
            .is_some_and(|(g, more)| mask(s) == mask(g) && matches(rest, more)),
    }
}

/// The lines to write in place of `shown`: the printed ones, each kept as
/// the page has it where it is the same once masked.
fn blessed(shown: &[String], got: &[String]) -> Vec<String> {
    got.iter()
        .enumerate()
        .map(|(i, g)| match shown.get(i) {
            Some(s) if mask(s) == mask(g) => s.clone(),
            _ => g.clone(),
        })
        .collect()
}

/// A PATH with the tested binary first.
fn path_with_reshard() -> std::ffi::OsString {
    let bin = assert_cmd::cargo::cargo_bin("reshard");
    let mut dirs = vec![bin.parent().unwrap().to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

/// Runs one command line in `dir` as the pages' reader would, `$?` being
/// `prev`, the exit status of the block's command before; returns what it
/// printed and its own exit status.
fn run(cmd: &str, dir: &Path, prev: i32) -> (Vec<String>, i32) {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("(exit {prev}); {{ {cmd}\n}} 2>&1"))
        .current_dir(dir)
        .env("PATH", path_with_reshard())
        .env("NO_COLOR", "1")
        .env("EDITOR", "sh .edit")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout)
        .replace(&dir.display().to_string(), "/tmp/demo")
        .lines()
        .map(str::to_string)
        .collect();
    (printed, out.status.code().unwrap_or(1))
}

#[cfg(unix)] // the blocks are POSIX shell command lines
#[test]
fn doc_blocks_show_what_the_binary_prints() {
    check(EXAMPLES);
}

#[cfg(unix)]
#[test]
fn venv_doc_blocks_show_what_the_binary_prints() {
    if venv::venv_python().is_none() {
        return; // python_with said why (and fails under CI)
    }
    check(VENV_EXAMPLES);
}

/// Runs each example's block in a folder its setup laid out; the blocks
/// that differ fail the test, or are rewritten in bless mode.
fn check(examples: &[Example]) {
    let bless = std::env::var_os("RESHARD_BLESS_DOCS").is_some_and(|v| v == "1");
    let mut wrong = Vec::new();
    for ex in examples {
        let path = repo().join(ex.page);
        let md = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = md.lines().collect();
        let tmp = tempfile::tempdir().unwrap();
        (ex.setup)(tmp.path());
        let mut edits = Vec::new();
        let mut status = 0;
        for step in block(ex.page, &lines, ex.first) {
            let shown: Vec<String> = lines[step.shown.clone()]
                .iter()
                .map(|l| l.to_string())
                .collect();
            let got;
            (got, status) = run(&step.cmd, tmp.path(), status);
            if matches(&shown, &got) {
                continue;
            }
            let abridged = shown.iter().any(|l| l.trim() == "...");
            if bless && !abridged {
                edits.push((step.shown.clone(), blessed(&shown, &got)));
                continue;
            }
            wrong.push(format!(
                "{}:{}: $ {}{}\n--- the page shows\n{}\n--- the binary prints\n{}",
                ex.page,
                step.shown.start,
                step.cmd,
                if bless {
                    " (abridged: fix it by hand)"
                } else {
                    ""
                },
                shown.join("\n"),
                got.join("\n")
            ));
        }
        if !edits.is_empty() {
            let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            for (range, with) in edits.into_iter().rev() {
                out.splice(range, with);
            }
            let mut text = out.join("\n");
            if md.ends_with('\n') {
                text.push('\n');
            }
            std::fs::write(&path, text).unwrap();
            eprintln!("blessed {} (block `$ {}`)", ex.page, ex.first);
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_mask_hides_only_what_varies() {
    assert_eq!(
        mask("wrote 4 shards (429.81 KiB) to o in 0.02 s (19.35 MiB/s), buffers peaked at 293.00 KiB of a 256.00 MiB window"),
        "wrote 4 shards (429.81 KiB) to o in T s (RATE), buffers peaked at PEAK of a 256.00 MiB window"
    );
    assert_eq!(
        mask("tiny-gpt2  109.81 KiB      0.03  passed"),
        "tiny-gpt2  109.81 KiB SECONDS  passed"
    );
    assert_eq!(
        mask("0/3             2          1           0       0        1  857.35 KiB      0.07"),
        "0/3             2          1           0       0        1  857.35 KiB SECONDS"
    );
    assert_eq!(
        mask("1.62 MiB; longest part 0.15 s"),
        "1.62 MiB; longest part T s"
    );
    assert_eq!(
        mask("commit (VmData): peak 141.15 MiB above a baseline of 975.75 MiB (1.09 GiB absolute, 1885 samples), budget 200.00 MiB (enforced)"),
        "commit (VmData): peak 141.NN MiB above a baseline of BASE (ABS absolute, N samples), budget 200.00 MiB (enforced)"
    );
    assert_eq!(
        mask("rss: peak 877.46 MiB (baseline 755.39 MiB)"),
        "rss: peak RSS (baseline RSS)"
    );
    assert_eq!(
        mask("commit (VmData): peak 280.00 KiB above a baseline of 2.66 MiB (2.94 MiB absolute)"),
        mask(
            "commit (VmData): peak 140.00 KiB above a baseline of 520.00 KiB (660.00 KiB absolute)"
        )
    );
    assert_ne!(
        mask("commit (VmData): peak 1.00 MiB above a baseline of 2.66 MiB (2.94 MiB absolute)"),
        mask(
            "commit (VmData): peak 140.00 KiB above a baseline of 520.00 KiB (660.00 KiB absolute)"
        )
    );
    assert_eq!(mask("short by 984.23 MiB"), "short by 984.23 MiB");
    assert_eq!(mask("max abs error 1.6748e-3"), "max abs error 1.6748e-3");
}

#[test]
fn an_ellipsis_stands_for_any_lines_and_bless_keeps_masked_lines() {
    let v = |s: &[&str]| s.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    assert!(matches(&v(&["a", "...", "d"]), &v(&["a", "b", "c", "d"])));
    assert!(matches(&v(&["a", "...", "d"]), &v(&["a", "d"])));
    assert!(matches(&v(&["a", "  ..."]), &v(&["a", "b"])));
    assert!(!matches(&v(&["a", "...", "d"]), &v(&["a", "b", "e"])));
    assert!(!matches(&v(&["a", "b"]), &v(&["a", "b", "c"])));
    assert_eq!(
        blessed(
            &v(&["done in 1.00 s", "x"]),
            &v(&["done in 2.00 s", "y", "z"])
        ),
        v(&["done in 1.00 s", "y", "z"])
    );
}

/// Markers: a fixed reason passes, another reason or no `-->` fails.
#[test]
fn a_marker_reason_must_be_one_of_the_fixed_set() {
    assert_eq!(
        marker(Some("<!-- not checked: needs a GPU (cuda) -->")),
        Ok(true)
    );
    assert_eq!(marker(Some("<!-- not checked: illustrative -->")), Ok(true));
    assert_eq!(marker(Some("some prose")), Ok(false));
    assert_eq!(marker(None), Ok(false));
    assert!(marker(Some("<!-- not checked: too slow -->")).is_err());
    assert!(marker(Some("<!-- not checked: illustrative")).is_err());
}

/// The long flags `reshard SUBCOMMAND --help` lists.
fn help_flags(subcommand: &str) -> Vec<String> {
    let out = crate::common::reshard()
        .args([subcommand, "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut flags: Vec<String> = help
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            if !l.starts_with('-') {
                return None;
            }
            let at = l.find("--")?;
            let flag: String = l[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            Some(flag)
        })
        .filter(|f| f != "--help" && f.len() > 2)
        .collect();
    flags.dedup();
    flags
}

#[test]
fn convert_page_synopsis_lists_every_flag_of_the_binary() {
    let page = std::fs::read_to_string(repo().join("docs/convert.md")).unwrap();
    let synopsis: String = page
        .lines()
        .skip_while(|l| !l.starts_with("reshard convert SRC DST"))
        .take_while(|l| !l.starts_with("```"))
        .collect();
    let flags = help_flags("convert");
    assert!(flags.len() > 20, "{flags:?}");
    let missing: Vec<&String> = flags
        .iter()
        .filter(|f| {
            !synopsis
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .any(|w| w == f.as_str())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/convert.md's synopsis lacks {missing:?}"
    );
}
