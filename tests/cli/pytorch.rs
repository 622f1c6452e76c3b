//! PyTorch `.bin` checkpoints: the torch-written fixtures read exactly, and
//! a corpus of hostile archives (built here, byte by byte) refused with exit
//! status 2 and a message, never a panic and never any code run.

use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use crate::common::*;

#[test]
fn pytorch_fixtures_match_expected() {
    for name in ["tiny-llama-bin", "tiny-gpt2-bin", "tiny-moe-bin-sharded"] {
        assert_matches_expected(&fixture(name), name);
    }
}

#[test]
fn pytorch_tied_storage_is_reported_as_in_expected_json() {
    for name in ["tiny-llama-bin", "tiny-gpt2-bin", "tiny-moe-bin-sharded"] {
        let ck = reshard::format::open(&fixture(name)).unwrap();
        let mut got: Vec<Vec<String>> = ck
            .findings
            .iter()
            .filter_map(|f| match f {
                reshard::format::Finding::SharedStorage { tensors } => {
                    let mut t = tensors.clone();
                    t.sort();
                    Some(t)
                }
                _ => None,
            })
            .collect();
        got.sort();
        let shared = expected(name).shared_storage;
        let mut want: Vec<Vec<String>> = shared
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(alias, orig)| {
                        let mut t = vec![alias.clone(), orig.as_str().unwrap().to_string()];
                        t.sort();
                        t
                    })
                    .collect()
            })
            .unwrap_or_default();
        want.sort();
        assert_eq!(got, want, "{name}");
    }
    // Both tied tensors are there, pointing at the same bytes.
    let ck = reshard::format::open(&fixture("tiny-gpt2-bin")).unwrap();
    let find = |n: &str| ck.tensors.iter().find(|t| t.name == n).unwrap();
    assert_eq!(
        find("lm_head.weight").data,
        find("transformer.wte.weight").data
    );
}

#[test]
fn pytorch_inspect_reads_every_bin_fixture() {
    for name in ["tiny-llama-bin", "tiny-gpt2-bin", "tiny-moe-bin-sharded"] {
        let out = reshard()
            .arg("inspect")
            .arg(fixture(name))
            .assert()
            .success();
        let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
        assert!(text.contains("pytorch"), "{text}");
    }
    let out = reshard()
        .arg("inspect")
        .arg(fixture("tiny-gpt2-bin"))
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    assert!(
        text.contains("transformer.wte.weight, lm_head.weight"),
        "{text}"
    );
}

/// A protocol-2 pickle writer for the shapes torch.save emits, and for
/// the ones it never would.
#[derive(Default)]
pub struct Pickle(pub Vec<u8>);

impl Pickle {
    pub fn new() -> Pickle {
        Pickle(vec![0x80, 2])
    }
    pub fn op(&mut self, b: &[u8]) -> &mut Pickle {
        self.0.extend_from_slice(b);
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Pickle {
        self.op(b"X")
            .op(&(s.len() as u32).to_le_bytes())
            .op(s.as_bytes())
    }
    pub fn int(&mut self, n: i64) -> &mut Pickle {
        // LONG1 with 8 bytes: any i64.
        self.op(&[0x8a, 8]).op(&n.to_le_bytes())
    }
    pub fn ints(&mut self, ns: &[i64]) -> &mut Pickle {
        self.op(b"(");
        for &n in ns {
            self.int(n);
        }
        self.op(b"t")
    }
    pub fn tensor(
        &mut self,
        name: &str,
        key: &str,
        numel: i64,
        offset: i64,
        shape: &[i64],
        strides: &[i64],
    ) -> &mut Pickle {
        self.tensor_of(name, "FloatStorage", key, numel, offset, shape, strides)
    }
    /// [`Pickle::tensor`] of a storage type other than F32
    /// (`Float8_e4m3fnStorage`, `BFloat16Storage`).
    #[allow(clippy::too_many_arguments)]
    pub fn tensor_of(
        &mut self,
        name: &str,
        storage_type: &str,
        key: &str,
        numel: i64,
        offset: i64,
        shape: &[i64],
        strides: &[i64],
    ) -> &mut Pickle {
        self.str(name).op(b"ctorch._utils\n_rebuild_tensor_v2\n((");
        self.str("storage")
            .op(format!("ctorch\n{storage_type}\n").as_bytes());
        self.str(key).str("cpu").int(numel).op(b"tQ").int(offset);
        self.ints(shape).ints(strides);
        self.op(b"\x89ccollections\nOrderedDict\n)RtR")
    }
    pub fn state_dict(f: impl FnOnce(&mut Pickle)) -> Vec<u8> {
        let mut p = Pickle::new();
        p.op(b"}(");
        f(&mut p);
        p.op(b"u.");
        p.0
    }
}

/// A torch.save-shaped zip: `archive/data.pkl`, `archive/byteorder` and one
/// stored entry per storage.
pub fn archive(pkl: &[u8], storages: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    w.start_file("archive/data.pkl", opts).unwrap();
    w.write_all(pkl).unwrap();
    w.start_file("archive/byteorder", opts).unwrap();
    w.write_all(b"little").unwrap();
    for (key, bytes) in storages {
        w.start_file(format!("archive/data/{key}"), opts).unwrap();
        w.write_all(bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

pub fn write_bin(dir: &Path, bytes: &[u8]) -> PathBuf {
    let path = dir.join("pytorch_model.bin");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `reshard inspect`, `convert` and `validate` on `bytes` as a
/// pytorch_model.bin: exit 2 (a panic would be 101), with `want` in the
/// message, the input untouched and nothing written.
fn assert_refused(bytes: &[u8], want: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_bin(dir.path(), bytes);
    let dst = dir.path().join("out");
    for args in [
        vec!["inspect"],
        vec!["convert", "--window", "1MiB"],
        vec!["validate"],
    ] {
        let mut cmd = reshard();
        cmd.arg(args[0]).arg(&path);
        if args[0] == "convert" {
            cmd.arg(&dst).args(&args[1..]);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{want} via {args:?}: {stderr}");
        assert!(
            stderr.contains("cannot read PyTorch checkpoint"),
            "{stderr}"
        );
        assert!(stderr.contains(want), "{want:?} not in {stderr}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "input changed");
        assert!(!dst.exists(), "convert wrote output for a refused input");
    }
}

#[test]
fn pytorch_posix_system_is_refused_and_never_run() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("pwned");
    let mut p = Pickle::new();
    p.op(b"cposix\nsystem\n(")
        .str(&format!("touch {}", marker.display()))
        .op(b"tR.");
    assert_refused(
        &archive(&p.0, &[]),
        "refusing to load: the pickle calls posix.system, which would run code",
    );
    // Even nested inside an otherwise valid state dict.
    let pkl = Pickle::state_dict(|p| {
        p.tensor("w", "0", 1, 0, &[1], &[1]);
        p.str("x")
            .op(b"cposix\nsystem\n(")
            .str(&format!("touch {}", marker.display()))
            .op(b"tR");
    });
    assert_refused(&archive(&pkl, &[("0", &[0; 4])]), "posix.system");
    assert!(!marker.exists(), "the pickle ran code");
}

#[test]
fn pytorch_hostile_pickles_are_refused() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"\x80\x02cbuiltins\neval\n(X\x04\x00\x00\x001+1tR.".to_vec(),
            "builtins.eval",
        ),
        (
            b"\x80\x04\x8c\x08builtins\x8c\x04exec\x93.".to_vec(),
            "builtins.exec",
        ),
        (b"\x80\x02ctorch\nload\n.".to_vec(), "torch.load"),
        (
            b"\x80\x02(ccollections\nOrderedDict\no.".to_vec(),
            "opcode OBJ",
        ),
        (b"\x80\x02\xfe.".to_vec(), "opcode unknown (0xfe)"),
        (b"\x80\x02}(X\x01\x00\x00\x00a".to_vec(), "truncated"),
        (
            b"\x80\x02}q\x00h\x07.".to_vec(),
            "memo index 7 was never stored",
        ),
        (
            b"\x80\x02X\xff\xff\xff\xffabc.".to_vec(),
            "declares 4294967295 bytes but only",
        ),
        (
            b"\x80\x02].".to_vec(),
            "not a state dict: the pickle holds a list",
        ),
        (
            b"\x80\x02}(X\x01\x00\x00\x00aK\x01u.".to_vec(),
            "entry \"a\" is a int, not a tensor",
        ),
    ];
    for (pkl, want) in cases {
        assert_refused(&archive(&pkl, &[]), want);
    }
}

#[test]
fn pytorch_deep_nesting_is_refused_without_a_crash() {
    // 100,000 open MARKs and 100,000 nested tuples: no recursion anywhere.
    let mut pkl = b"\x80\x02".to_vec();
    pkl.extend(std::iter::repeat_n(b'(', 100_000));
    assert_refused(&archive(&pkl, &[]), "truncated");
    let mut pkl = b"\x80\x02N".to_vec();
    pkl.extend(std::iter::repeat_n(0x85u8, 100_000));
    pkl.push(b'.');
    assert_refused(
        &archive(&pkl, &[]),
        "not a state dict: the pickle holds a tuple",
    );
}

#[test]
fn pytorch_bad_storages_are_refused_naming_the_tensor() {
    let ok = Pickle::state_dict(|p| {
        p.tensor("model.w", "0", 4, 0, &[4], &[1]);
    });
    assert_refused(
        &archive(&ok, &[]),
        "tensor \"model.w\": its storage \"0\" has no entry \"archive/data/0\"",
    );
    let past = Pickle::state_dict(|p| {
        p.tensor("model.w", "0", 4, 2, &[4], &[1]);
    });
    assert_refused(
        &archive(&past, &[("0", &[0; 16])]),
        "tensor \"model.w\": its data reaches byte 24",
    );
    let huge_shape = Pickle::state_dict(|p| {
        p.tensor("model.w", "0", 4, 0, &[1 << 40, 1 << 40], &[1 << 40, 1]);
    });
    assert_refused(
        &archive(&huge_shape, &[("0", &[0; 16])]),
        "tensor \"model.w\"",
    );
    let huge_storage = Pickle::state_dict(|p| {
        p.tensor("model.w", "0", i64::MAX, 0, &[4], &[1]);
    });
    assert_refused(
        &archive(&huge_storage, &[("0", &[0; 16])]),
        "tensor \"model.w\"",
    );
    let bad_view = Pickle::state_dict(|p| {
        p.tensor("model.v", "0", 4, 0, &[2, 2], &[1, 3]);
    });
    assert_refused(
        &archive(&bad_view, &[("0", &[0; 16])]),
        "tensor \"model.v\": its data reaches byte 20",
    );
    let negative = Pickle::state_dict(|p| {
        p.tensor("model.w", "0", 4, -1, &[4], &[1]);
    });
    assert_refused(
        &archive(&negative, &[("0", &[0; 16])]),
        "tensor \"model.w\": negative storage offset",
    );
}

#[test]
fn pytorch_broken_containers_are_refused() {
    // Legacy (pre-1.6) torch.save: a bare pickle, no zip.
    assert_refused(
        b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.",
        "legacy torch format is not supported; re-save it with torch >= 1.6",
    );
    assert_refused(
        b"definitely not a checkpoint",
        "not a torch.save zip archive",
    );
    // Truncated: the central directory is gone.
    let good = archive(
        &Pickle::state_dict(|p| {
            p.tensor("w", "0", 4, 0, &[4], &[1]);
        }),
        &[("0", &[0; 16])],
    );
    assert_refused(&good[..good.len() - 30], "zip");
    // A zip without data.pkl.
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    w.start_file("archive/other", zip::write::SimpleFileOptions::default())
        .unwrap();
    w.write_all(b"x").unwrap();
    assert_refused(&w.finish().unwrap().into_inner(), "no data.pkl");
    // A corrupted data.pkl fails its CRC.
    let mut bad = good.clone();
    let at = bad
        .windows(8)
        .position(|w| w == b"}(X\x01\x00\x00\x00w")
        .unwrap();
    bad[at + 7] = b'v';
    assert_refused(&bad, "CRC-32");
}

#[test]
fn pytorch_every_truncation_exits_2() {
    let good = archive(
        &Pickle::state_dict(|p| {
            p.tensor("w", "0", 4, 0, &[4], &[1]);
        }),
        &[("0", &[0; 16])],
    );
    let dir = tempfile::tempdir().unwrap();
    for cut in (0..good.len()).step_by(37) {
        let path = write_bin(dir.path(), &good[..cut]);
        let out = reshard().arg("inspect").arg(&path).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "cut at {cut}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn pytorch_transposed_view_reads_row_major() {
    // Storage 0..6 as f32; "t" is its [2, 3] view with strides [1, 2], i.e.
    // t[i][j] = storage[i + 2j].
    let storage: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let pkl = Pickle::state_dict(|p| {
        p.tensor("t", "0", 6, 0, &[2, 3], &[1, 2]);
        p.tensor("flat", "0", 6, 0, &[6], &[1]);
    });
    let dir = tempfile::tempdir().unwrap();
    let path = write_bin(dir.path(), &archive(&pkl, &[("0", &storage)]));
    let ck = reshard::format::open(&path).unwrap();
    let reader = reshard::format::read::SourceReader::open(&ck).unwrap();
    let read = |name: &str| {
        let t = ck.tensors.iter().find(|t| t.name == name).unwrap();
        let mut bytes = Vec::new();
        reader.tensor_bytes(t).read_to_end(&mut bytes).unwrap();
        bytes
    };
    let want: Vec<u8> = [0f32, 2., 4., 1., 3., 5.]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    assert_eq!(read("t"), want);
    assert_eq!(read("flat"), storage);
    assert!(ck.findings.iter().any(
        |f| matches!(f, reshard::format::Finding::SharedStorage { tensors } if tensors.len() == 2)
    ));
}

#[test]
fn pytorch_fixtures_convert_to_equal_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["tiny-llama-bin", "tiny-gpt2-bin", "tiny-moe-bin-sharded"] {
        let dst = tmp.path().join(name);
        reshard()
            .args(["convert", "--no-progress", "--max-shard-size", "60KB"])
            .arg(fixture(name))
            .arg(&dst)
            .assert()
            .success();
        assert_matches_expected(&dst, name);
        // pytorch_model-*.bin becomes model-*.safetensors, as Hugging Face names them.
        assert!(dst.join("model.safetensors.index.json").exists(), "{name}");
        assert!(!dst.join("pytorch_model.bin.index.json").exists(), "{name}");
    }
}

#[test]
fn dedupe_tied_keeps_only_the_first_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("out");
    let out = reshard()
        .args(["convert", "--no-progress", "--dedupe-tied", "--json"])
        .arg(fixture("tiny-gpt2-bin"))
        .arg(&dst)
        .assert()
        .success();
    let summary: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let dropped = summary["manifest"]["dropped"].as_array().unwrap();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    let got = read_all(&dst);
    let expected = expected("tiny-gpt2-bin");
    assert_eq!(got.len(), expected.tensors.len() - 1);
    let gone = dropped[0]["tensor"].as_str().unwrap();
    let kept = dropped[0]["same_as"].as_str().unwrap();
    assert!(!got.contains_key(gone));
    assert_eq!(
        got[kept].2, expected.tensors[gone].sha256,
        "the kept name holds the shared bytes"
    );
}
