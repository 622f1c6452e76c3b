//! The command blocks of README.md and docs/ run against the real binary:
//! each listed block's `$ ` lines are run in order (through `sh`, stdout and
//! stderr together, in a temporary folder laid out with the names the page
//! uses) and what they print must be the block's other lines. Times, rates,
//! the SECONDS column and the buffer peak (it depends on how many workers
//! run at once) are masked on both sides; everything else is compared as
//! printed. A block that is not listed here is either checked elsewhere
//! (docs_examples.rs: the scheduler examples) or needs what this suite has
//! not (a GPU, Wine, Slurm, the Python venv, a large download).

use std::path::{Path, PathBuf};

use crate::common::{copy_dir, fixture, write_safetensors_raw};

/// One block to check: the page, its first command (after `$ `), and what
/// the folder it runs in must hold first.
struct Example {
    page: &'static str,
    first: &'static str,
    setup: fn(&Path),
}

const EXAMPLES: &[Example] = &[
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
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn readme(dir: &Path) {
    copy_dir(
        &repo().join("examples/tiny-llama"),
        &dir.join("examples/tiny-llama"),
    );
}

fn moe(dir: &Path) {
    copy_dir(
        &fixture("tiny-moe-sharded"),
        &dir.join("tests/fixtures/tiny-moe-sharded"),
    );
}

fn tiny_llama(dir: &Path) {
    copy_dir(&fixture("tiny-llama"), &dir.join("tiny-llama"));
}

/// fit.md's FLUX.1-dev-shaped file: real names and dims, sparse data.
fn flux_dev(dir: &Path) {
    crate::fit_for::flux(dir);
}

/// gguf.md's FLUX-shaped file: the shapes its dry run shows (the plan
/// reads no values, so they are zeros).
fn flux(dir: &Path) {
    let tensors: [(&str, &[u64]); 5] = [
        ("double_blocks.0.img_attn.proj.weight", &[64, 256]),
        ("double_blocks.0.img_attn.proj.bias", &[64]),
        ("double_blocks.0.img_mlp.0.weight", &[48, 96]),
        ("img_in.weight", &[64, 40]),
        ("final_layer.linear.weight", &[16, 16]),
    ];
    let mut header = serde_json::Map::new();
    let mut at = 0u64;
    for (name, shape) in tensors {
        let len = shape.iter().product::<u64>() * 4;
        header.insert(
            name.into(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let json = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    write_safetensors_raw(
        &dir.join("flux.safetensors"),
        &json,
        &vec![0u8; at as usize],
    );
}

/// One F32 tensor with three values past F16's range.
fn overflowing(dir: &Path) {
    let data: Vec<u8> = [1e6f32, -1e6, 7e4, 1.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    write_safetensors_raw(
        &dir.join("big.safetensors"),
        br#"{"__metadata__":{"format":"pt"},"model.layers.3.mlp.down_proj.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        &data,
    );
}

/// inspect.md's folder with four findings: no `format: pt`, a misaligned
/// tensor, a shard the index does not list, a wrong total_size.
fn damaged(dir: &Path) {
    let d = dir.join("damaged-folder");
    std::fs::create_dir_all(&d).unwrap();
    // A header of 128 bytes puts "b" (data offset 3) at byte 139.
    let json = br#"{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}}"#;
    let mut header = json.to_vec();
    header.resize(128, b' ');
    write_safetensors_raw(
        &d.join("model-00001-of-00002.safetensors"),
        &header,
        &[1; 11],
    );
    write_safetensors_raw(
        &d.join("model-00002-of-00002.safetensors"),
        br#"{"c":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[0],
    );
    std::fs::write(
        d.join("model.safetensors.index.json"),
        br#"{"metadata": {"total_size": 99}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}}"#,
    )
    .unwrap();
}

/// batch.md's small ROOT, already converted into `out`.
fn batch_root(dir: &Path) {
    for f in ["tiny-gpt2", "tiny-t5"] {
        copy_dir(&fixture(f), &dir.join("root").join(f));
    }
    crate::common::reshard()
        .arg("batch")
        .arg(dir.join("root"))
        .arg("--out")
        .arg(dir.join("out"))
        .arg("-q")
        .assert()
        .success();
}

/// The block of `page` whose first line is `$ first`, as (command, the
/// lines it prints) pairs.
fn block(page: &str, first: &str) -> Vec<(String, String)> {
    let md = std::fs::read_to_string(repo().join(page)).unwrap();
    let head = format!("$ {first}");
    let mut lines = md.lines().skip_while(|l| *l != head).peekable();
    assert!(
        lines.peek().is_some(),
        "{page}: no block starts with {head:?}"
    );
    let mut out: Vec<(String, String)> = Vec::new();
    for line in lines.take_while(|l| !l.starts_with("```")) {
        match line.strip_prefix("$ ") {
            Some(cmd) => out.push((cmd.to_string(), String::new())),
            None => {
                let last = out.last_mut().unwrap();
                last.1.push_str(line);
                last.1.push('\n');
            }
        }
    }
    out
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

/// A PATH with the tested binary first.
fn path_with_reshard() -> std::ffi::OsString {
    let bin = assert_cmd::cargo::cargo_bin("reshard");
    let mut dirs = vec![bin.parent().unwrap().to_path_buf()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

#[cfg(unix)] // the blocks are POSIX shell command lines
#[test]
fn doc_blocks_show_what_the_binary_prints() {
    let mut wrong = Vec::new();
    for ex in EXAMPLES {
        let tmp = tempfile::tempdir().unwrap();
        (ex.setup)(tmp.path());
        for (cmd, want) in block(ex.page, ex.first) {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{cmd} 2>&1"))
                .current_dir(tmp.path())
                .env("PATH", path_with_reshard())
                .env("NO_COLOR", "1")
                .output()
                .unwrap();
            let got = String::from_utf8_lossy(&out.stdout);
            if mask(&got) != mask(&want) {
                wrong.push(format!(
                    "{}: $ {cmd}\n--- the page shows\n{want}--- the binary prints\n{got}",
                    ex.page
                ));
            }
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
    assert_eq!(mask("short by 984.23 MiB"), "short by 984.23 MiB");
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
