//! Bounded work and memory on hostile inputs (issue 13, readers): each
//! input is built as bytes in a temp folder and run through the real
//! binary. Every one must exit 2 with a message naming the file (and the
//! tensor), leave the source byte-identical, write nothing under a final
//! name, and peak under `--window` + 64 MiB of RSS. Special files (FIFOs, a
//! link to /dev/zero) must be refused by type, within a timeout guard, so a
//! regression fails instead of hanging.

use std::ffi::OsStr;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::common::*;
use crate::pytorch::{archive, write_bin, Pickle};

const GUARD: Duration = Duration::from_secs(120);
const MIB: u64 = 1024;

/// A `.bin` whose data.pkl is deflated.
fn deflated_bin(dir: &Path, pkl_chunks: impl Iterator<Item = Vec<u8>>) -> PathBuf {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    w.start_file("archive/data.pkl", opts).unwrap();
    for chunk in pkl_chunks {
        w.write_all(&chunk).unwrap();
    }
    write_bin(dir, &w.finish().unwrap().into_inner())
}

/// A safetensors file from raw header JSON (padded) and no data.
fn raw_safetensors(path: &Path, mut json: Vec<u8>) {
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    write_safetensors_raw(path, &json, &[]);
}

/// A header of `count` zero-size tensors (`{"t0000000": F32 [0] at [0, 0]}`).
fn zero_size_header(dir: &Path, count: usize) -> PathBuf {
    let mut json = b"{".to_vec();
    for i in 0..count {
        if i > 0 {
            json.push(b',');
        }
        write!(
            json,
            r#""t{i:07}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#
        )
        .unwrap();
    }
    json.push(b'}');
    let p = dir.join("model.safetensors");
    raw_safetensors(&p, json);
    p
}

fn one_shard(dir: &Path) {
    write_safetensors(
        &dir.join("model-00001-of-00001.safetensors"),
        &json!({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "__metadata__": {"format": "pt"}}),
        &[1],
    );
}

/// An index listing `count` tensors (none of which the shard holds).
fn big_index(dir: &Path, count: usize) -> PathBuf {
    one_shard(dir);
    let mut text = String::from(r#"{"metadata": {"total_size": 1}, "weight_map": {"#);
    for i in 0..count {
        if i > 0 {
            text.push_str(",\n");
        }
        text.push_str(&format!(
            r#"  "model.layers.{}.mlp.experts.{}.down_proj.weight_scale_inv": "model-00001-of-00001.safetensors""#,
            i / 256,
            i % 256
        ));
    }
    text.push_str("}}");
    std::fs::write(dir.join("model.safetensors.index.json"), text).unwrap();
    dir.to_path_buf()
}

/// A model folder with one F32 tensor and `config` as its config.json.
fn with_config(dir: &Path, config: impl FnOnce(&mut std::fs::File)) -> PathBuf {
    write_safetensors(
        &dir.join("model.safetensors"),
        &json!({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "__metadata__": {"format": "pt"}}),
        &1f32.to_le_bytes(),
    );
    config(&mut std::fs::File::create(dir.join("config.json")).unwrap());
    dir.to_path_buf()
}

/// One hostile input: how to build it, the extra convert flags, the window
/// it runs under, and what the error must say.
struct Case {
    name: &'static str,
    build: fn(&Path) -> PathBuf,
    extra: &'static [&'static str],
    window_mib: u64,
    expect: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "38 KiB .bin whose deflated pickle appends 39,000,000 None to a list",
            build: |d| {
                let chunk = [b"(".to_vec(), vec![b'N'; 3_900_000], b"e".to_vec()].concat();
                deflated_bin(
                    d,
                    std::iter::once(b"\x80\x02]".to_vec())
                        .chain(std::iter::repeat_n(chunk, 10))
                        .chain(std::iter::once(b".".to_vec())),
                )
            },
            extra: &[],
            window_mib: 1,
            expect: &["pytorch_model.bin", "archive/data.pkl", "deflate bomb"],
        },
        Case {
            name: "1 MB stored pickle appending 1,000,000 None to a list",
            build: |d| {
                let mut pkl = b"\x80\x02]".to_vec();
                for _ in 0..20 {
                    pkl.push(b'(');
                    pkl.extend(std::iter::repeat_n(b'N', 50_000));
                    pkl.push(b'e');
                }
                pkl.push(b'.');
                write_bin(d, &archive(&pkl, &[]))
            },
            extra: &[],
            window_mib: 1,
            expect: &["pytorch_model.bin", "data.pkl", "budget"],
        },
        Case {
            name: "510 KiB deflate bomb as data.pkl (520 MiB of zeros)",
            build: |d| deflated_bin(d, std::iter::repeat_n(vec![0u8; 1 << 20], 520)),
            extra: &[],
            window_mib: 1,
            expect: &[
                "pytorch_model.bin",
                "archive/data.pkl",
                "more than the limit",
            ],
        },
        Case {
            name: "35 MB header of 600,000 zero-size tensors",
            build: |d| zero_size_header(d, 600_000),
            extra: &[],
            window_mib: 1,
            expect: &[
                "model.safetensors",
                "header length",
                "larger than the limit",
            ],
        },
        Case {
            name: "29 MB header (under the limit) of 500,000 zero-size tensors",
            build: |d| zero_size_header(d, 500_000),
            extra: &[],
            window_mib: 256,
            expect: &["model.safetensors", "more than 262144 tensors"],
        },
        Case {
            name: "20 MB header with a 10,000,000-dimension shape",
            build: |d| {
                let mut json = br#"{"w":{"dtype":"U8","shape":["#.to_vec();
                json.extend(std::iter::repeat_n(*b"1,", 9_999_999).flatten());
                json.extend_from_slice(br#"1],"data_offsets":[0,1]}}"#);
                let p = d.join("model.safetensors");
                raw_safetensors(&p, json);
                p
            },
            extra: &[],
            window_mib: 1,
            expect: &["model.safetensors", "\"w\"", "10000000 dimensions", "8"],
        },
        Case {
            name: "45 MB index",
            build: |d| big_index(d, 450_000),
            extra: &[],
            window_mib: 1,
            expect: &["model.safetensors.index.json", "more than the", "limit"],
        },
        Case {
            name: "26 MB index (under the limit) of 250,000 entries",
            build: |d| big_index(d, 250_000),
            extra: &[],
            window_mib: 256,
            expect: &["model.safetensors.index.json", "does not hold it"],
        },
        Case {
            name: "5 MiB config.json with --dtype",
            build: |d| {
                with_config(d, |f| {
                    f.write_all(b"{\"torch_dtype\": \"float32\", \"pad\": \"")
                        .unwrap();
                    f.write_all(&vec![b'x'; 5 << 20]).unwrap();
                    f.write_all(b"\"}").unwrap();
                })
            },
            extra: &["--dtype", "bf16"],
            window_mib: 1,
            expect: &["config.json", "limit"],
        },
        Case {
            name: "4 MiB config.json of 2,000,000 numbers with --dtype",
            build: |d| {
                with_config(d, |f| {
                    f.write_all(b"{\"torch_dtype\": \"float32\", \"pad\": [0")
                        .unwrap();
                    f.write_all(&b",0".repeat(2_000_000)).unwrap();
                    f.write_all(b"]}").unwrap();
                })
            },
            extra: &["--dtype", "bf16"],
            window_mib: 1,
            expect: &["config.json", "json values"],
        },
        Case {
            name: "expanded view of 2^50 elements from one stored float",
            build: |d| {
                let pkl = Pickle::state_dict(|p| {
                    p.tensor("w", "0", 1, 0, &[1 << 50], &[0]);
                });
                write_bin(d, &archive(&pkl, &[("0", &[0; 4])]))
            },
            extra: &[],
            window_mib: 1,
            expect: &[
                "pytorch_model.bin",
                "\"w\"",
                "expanded view",
                "4 bytes stored",
                "--allow-expanded",
            ],
        },
        Case {
            name: "tensor named __metadata__ in a .bin",
            build: |d| {
                let pkl = Pickle::state_dict(|p| {
                    p.tensor("__metadata__", "0", 1, 0, &[1], &[1]);
                });
                write_bin(d, &archive(&pkl, &[("0", &[0; 4])]))
            },
            extra: &[],
            window_mib: 1,
            expect: &["pytorch_model.bin", "\"__metadata__\"", "refused"],
        },
        Case {
            name: "tensor with an empty name in a .bin",
            build: |d| {
                let pkl = Pickle::state_dict(|p| {
                    p.tensor("", "0", 1, 0, &[1], &[1]);
                });
                write_bin(d, &archive(&pkl, &[("0", &[0; 4])]))
            },
            extra: &[],
            window_mib: 1,
            expect: &["pytorch_model.bin", "\"\"", "empty name"],
        },
        Case {
            name: "tensor set twice in a .bin's state dict",
            build: |d| {
                let pkl = Pickle::state_dict(|p| {
                    p.tensor("w", "0", 1, 0, &[1], &[1]);
                    p.tensor("w", "0", 1, 0, &[1], &[1]);
                });
                write_bin(d, &archive(&pkl, &[("0", &[0; 4])]))
            },
            extra: &[],
            window_mib: 1,
            expect: &["pytorch_model.bin", "\"w\"", "twice"],
        },
    ]
}

/// `convert` under the case's window: exit 2, the messages, the source
/// unchanged, nothing under a final name in DST, peak RSS under the window
/// plus 64 MiB.
fn check_convert(case: &Case) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let path = (case.build)(&src);
    let before = tree_hashes(&src);
    let dst = tmp.path().join("dst");
    let window = format!("{}MiB", case.window_mib);
    let mut args: Vec<&OsStr> = vec!["convert".as_ref(), path.as_os_str(), dst.as_os_str()];
    args.extend(["--no-progress", "--window", &window].map(OsStr::new));
    args.extend(case.extra.iter().map(OsStr::new));
    let Some((out, peak_kib)) = run_measured(&args, GUARD) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}: {stderr}", case.name);
    for want in case.expect {
        assert!(
            stderr.contains(want),
            "{}: {want:?} not in {stderr}",
            case.name
        );
    }
    assert_eq!(tree_hashes(&src), before, "{}: source changed", case.name);
    // Every refusal comes before anything is written: not even a temp file.
    let written: Vec<_> = tree_hashes(&dst).into_keys().collect();
    assert!(written.is_empty(), "{}: wrote {written:?}", case.name);
    let bound = (case.window_mib + 64) * MIB;
    assert!(
        peak_kib < bound,
        "{}: peak RSS {peak_kib} KiB, over --window + 64 MiB ({bound} KiB)",
        case.name
    );
    eprintln!("{}: exit 2, peak RSS {peak_kib} KiB", case.name);
}

#[test]
fn hostile_inputs_are_refused_by_convert_within_the_window() {
    for case in cases() {
        check_convert(&case);
    }
}

#[test]
fn hostile_readers_inputs_are_refused_by_inspect() {
    // config.json is not read by inspect; an expanded view is a finding there.
    for case in cases().into_iter().filter(|c| c.extra.is_empty()) {
        if case.name.starts_with("expanded view") {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = (case.build)(tmp.path());
        let out = reshard()
            .arg("inspect")
            .arg(&path)
            .timeout(GUARD)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {stderr}", case.name);
        for want in case.expect {
            assert!(
                stderr.contains(want),
                "{}: {want:?} not in {stderr}",
                case.name
            );
        }
    }
}

/// `.bin` with `w` = `torch.zeros(1).expand(n)` (stride 0).
fn expanded_bin(dir: &Path, n: i64) -> PathBuf {
    let pkl = Pickle::state_dict(|p| {
        p.tensor("w", "0", 1, 0, &[n], &[0]);
    });
    write_bin(dir, &archive(&pkl, &[("0", &2.5f32.to_le_bytes())]))
}

#[test]
fn expanded_view_is_a_finding_in_inspect() {
    let tmp = tempfile::tempdir().unwrap();
    let path = expanded_bin(tmp.path(), 1 << 50);
    let out = reshard().arg("inspect").arg(&path).assert().success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains("tensor \"w\" in pytorch_model.bin is an expanded view: 4.00 PiB")
            && text.contains("from 4 bytes stored"),
        "{text}"
    );
    reshard()
        .args(["inspect", "--strict"])
        .arg(&path)
        .assert()
        .code(1);
}

#[test]
fn allow_expanded_writes_the_view_gathered_from_one_read() {
    // 8,388,608 copies of one float: 32 MiB of output from 4 bytes, over
    // both the ratio and the floor.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let path = expanded_bin(&src, 1 << 23);
    let dst = tmp.path().join("out");
    convert(&path, &dst, &["--window", "8MiB"])
        .code(2)
        .stderr(predicates::str::contains("--allow-expanded"));
    convert(&path, &dst, &["--window", "8MiB", "--allow-expanded"]).success();
    let ck = reshard::format::open(&dst).unwrap();
    let reader = reshard::format::read::SourceReader::open(&ck).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut reader.tensor_bytes(&ck.tensors[0]), &mut bytes).unwrap();
    assert_eq!(bytes.len(), 32 << 20);
    assert!(bytes.chunks_exact(4).all(|c| c == 2.5f32.to_le_bytes()));
    // A small expansion (under 16 MiB of output) is written without the flag.
    let small = tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let path = expanded_bin(&small, 1 << 10);
    convert(&path, &tmp.path().join("small-out"), &[]).success();
}

#[test]
fn control_characters_in_tensor_names_are_escaped_when_printed() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.safetensors");
    write_safetensors(
        &path,
        &json!({"evil\u{1b}[2J\u{202e}name": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}),
        &[7],
    );
    for args in [vec!["inspect"], vec!["inspect", "--tensors"]] {
        let out = reshard().args(&args).arg(&path).assert().success();
        let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{202e}'),
            "{text:?}"
        );
        assert!(
            text.contains("evil\\u{1b}[2J\\u{202e}name"),
            "{args:?}: {text}"
        );
    }
}

#[cfg(unix)]
mod special {
    use super::*;

    /// A Hugging Face cache repo whose snapshot `abc` holds one tensor; returns
    /// the repo folder.
    fn hf_cache(dir: &Path) -> PathBuf {
        let repo = dir.join("models--org--m");
        let snap = repo.join("snapshots/abc");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        write_safetensors(
            &snap.join("model.safetensors"),
            &json!({"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "__metadata__": {"format": "pt"}}),
            &[1],
        );
        repo
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "mkfifo {}", path.display());
    }

    fn link_to_dev_zero(path: &Path) {
        std::os::unix::fs::symlink("/dev/zero", path).unwrap();
    }

    /// Where a special file goes: a builder that puts `make(path)` in the
    /// right place and returns the path to run on, the file's name, and the
    /// extra convert flags.
    type Placement = (
        &'static str,
        fn(&Path, fn(&Path)) -> PathBuf,
        &'static [&'static str],
    );

    fn placements() -> Vec<Placement> {
        vec![
            (
                "index",
                |d, make| {
                    one_shard(d);
                    make(&d.join("model.safetensors.index.json"));
                    d.to_path_buf()
                },
                &[],
            ),
            (
                "refs/main",
                |d, make| {
                    let repo = hf_cache(d);
                    make(&repo.join("refs/main"));
                    repo
                },
                &[],
            ),
            (
                "weight file",
                |d, make| {
                    make(&d.join("model.safetensors"));
                    d.to_path_buf()
                },
                &[],
            ),
            (
                "weight file given as the path",
                |d, make| {
                    let p = d.join("model.safetensors");
                    make(&p);
                    p
                },
                &[],
            ),
            (
                "config.json",
                |d, make| {
                    let dir = with_config(d, |_| {});
                    std::fs::remove_file(dir.join("config.json")).unwrap();
                    make(&dir.join("config.json"));
                    dir
                },
                &["--dtype", "bf16"],
            ),
        ]
    }

    fn refused(kind: &str, place: &Placement, make: fn(&Path)) {
        let (what, build, extra) = place;
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        std::fs::create_dir(&src).unwrap();
        let path = build(&src, make);
        let before = tree_hashes(&src);
        let commands: Vec<Vec<&OsStr>> = vec![
            vec!["inspect".as_ref()],
            vec!["convert".as_ref(), "--no-progress".as_ref()],
        ];
        for args in commands {
            if args[0] == "inspect" && !extra.is_empty() {
                continue; // inspect does not read config.json
            }
            let dst = tmp.path().join("dst");
            let mut cmd = reshard();
            cmd.args(&args).arg(&path);
            if args[0] == "convert" {
                cmd.arg(&dst).args(*extra);
            }
            // The guard turns a blocking open into a failed test.
            let out = cmd.timeout(Duration::from_secs(60)).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{kind} as {what} via {args:?}: {stderr}"
            );
            assert!(
                stderr.contains("not a regular file"),
                "{kind} as {what}: {stderr}"
            );
            let name = if *what == "refs/main" {
                "refs/main"
            } else if *what == "index" {
                "model.safetensors.index.json"
            } else if *what == "config.json" {
                "config.json"
            } else {
                "model.safetensors"
            };
            assert!(stderr.contains(name), "{kind} as {what}: {stderr}");
            assert_eq!(
                tree_hashes(&src),
                before,
                "{kind} as {what}: source changed"
            );
            assert!(
                tree_hashes(&dst).is_empty(),
                "{kind} as {what}: convert wrote into DST"
            );
        }
    }

    #[test]
    fn fifos_are_refused_by_type_without_blocking() {
        for place in placements() {
            refused("a FIFO", &place, mkfifo);
        }
    }

    #[test]
    fn links_to_dev_zero_are_refused_not_read() {
        for place in placements() {
            refused("a link to /dev/zero", &place, link_to_dev_zero);
        }
    }

    #[test]
    fn an_unreadable_refs_main_is_an_error_not_a_guess() {
        // A refs/main that is a folder names no revision; the one snapshot
        // there must not be taken instead.
        let tmp = tempfile::tempdir().unwrap();
        let repo = hf_cache(tmp.path());
        std::fs::create_dir(repo.join("refs/main")).unwrap();
        reshard()
            .arg("inspect")
            .arg(&repo)
            .timeout(Duration::from_secs(60))
            .assert()
            .code(2)
            .stderr(predicates::str::contains("refs/main"));
        // Without refs/main at all, the single snapshot is still read.
        std::fs::remove_dir(repo.join("refs/main")).unwrap();
        reshard().arg("inspect").arg(&repo).assert().success();
    }
}
