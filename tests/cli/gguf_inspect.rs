//! `reshard inspect` on GGUF files and split sets, and hostile GGUF files
//! through the real binary: exit 2, a message naming the file and the key
//! or tensor.

use std::path::Path;

use crate::common::*;

fn stdout(a: &assert_cmd::assert::Assert) -> String {
    String::from_utf8(a.get_output().stdout.clone()).unwrap()
}

#[test]
fn inspect_shows_architecture_types_summarized_tokenizer_and_findings() {
    let path = fixture("gguf").join("types.gguf");
    let out = reshard().arg("inspect").arg(&path).assert().success();
    let text = stdout(&out);
    for want in [
        "gguf v3 (single file)",
        "architecture  llama",
        "tensors       18",
        "tokenizer.ggml.tokens = [string; 64]",
        "tokenizer.ggml.scores = [float32; 64]",
        "Q4_K            1 tensor ",
        "Q8_0            2 tensors",
        "IQ4_NL          1 tensor   1.12 KiB  (cannot be dequantized)",
        "1 tensor of IQ4_NL (first \"iq4_nl.weight\") cannot be dequantized",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    reshard()
        .args(["inspect", "--strict"])
        .arg(&path)
        .assert()
        .code(1);
    let out = reshard()
        .args(["inspect", "--json", "--tensors"])
        .arg(&path)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["tensor_count"], 18);
    assert_eq!(v["types"]["Q8_0"]["tensors"], 2);
    assert_eq!(v["types"]["IQ4_NL"]["dequantizable"], false);
    assert_eq!(v["findings"][0]["kind"], "not_dequantizable");
    let exps = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "blk.0.ffn_gate_exps.weight")
        .unwrap();
    assert_eq!(exps["shape"], serde_json::json!([2, 3, 256]));
    assert_eq!(exps["ggml_type"], "Q8_0");
}

#[test]
fn inspect_of_a_split_member_lists_the_set_and_reports_a_missing_member() {
    let dir = tempfile::tempdir().unwrap();
    for n in ["split-00001-of-00002.gguf", "split-00002-of-00002.gguf"] {
        std::fs::copy(fixture("gguf").join(n), dir.path().join(n)).unwrap();
    }
    let second = dir.path().join("split-00002-of-00002.gguf");
    let out = reshard().arg("inspect").arg(&second).assert().success();
    let text = stdout(&out);
    assert!(text.contains("split set of 2"), "{text}");
    assert!(
        text.contains("split-00001-of-00002.gguf  704 B  (2 tensors"),
        "{text}"
    );
    assert!(text.contains("tensors       3"), "{text}");
    std::fs::remove_file(dir.path().join("split-00001-of-00002.gguf")).unwrap();
    let out = reshard().arg("inspect").arg(&second).assert().success();
    let text = stdout(&out);
    assert!(
        text.contains("split member split-00001-of-00002.gguf is missing"),
        "{text}"
    );
    reshard()
        .args(["inspect", "--strict"])
        .arg(&second)
        .assert()
        .code(1);
}

/// GGUF bytes by hand.
struct B(Vec<u8>);

impl B {
    fn new(tensors: u64, kvs: u64) -> B {
        let mut v = b"GGUF".to_vec();
        v.extend(3u32.to_le_bytes());
        v.extend(tensors.to_le_bytes());
        v.extend(kvs.to_le_bytes());
        B(v)
    }
    fn str(mut self, s: &str) -> B {
        self.0.extend((s.len() as u64).to_le_bytes());
        self.0.extend(s.as_bytes());
        self
    }
    fn u32(mut self, v: u32) -> B {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn tensor(self, name: &str, n: u64, off: u64) -> B {
        let mut b = self.str(name).u32(1);
        b.0.extend(n.to_le_bytes());
        b = b.u32(0);
        b.0.extend(off.to_le_bytes());
        b
    }
    fn data(mut self, n: usize) -> B {
        while !self.0.len().is_multiple_of(32) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0, n));
        self
    }
}

fn assert_refused(dir: &Path, name: &str, bytes: &[u8], wants: &[&str]) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let out = reshard().arg("inspect").arg(&path).assert().code(2);
    let err = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(err.contains(name), "{name}: {err}");
    for w in wants {
        assert!(err.contains(w), "{name}: {w:?} not in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn hostile_gguf_files_exit_2_naming_the_file_and_the_key_or_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let align = B::new(0, 1).str("general.alignment").u32(8).str("32");
    assert_refused(
        d,
        "align.gguf",
        &align.0,
        &["\"general.alignment\"", "not uint32"],
    );
    let align = B::new(0, 1).str("general.alignment").u32(4).u32(24);
    assert_refused(d, "pow2.gguf", &align.0, &["24, not a power of two"]);
    let overlap = B::new(2, 0)
        .tensor("a", 16, 0)
        .tensor("b", 16, 32)
        .data(128);
    assert_refused(d, "overlap.gguf", &overlap.0, &["tensor \"b\"", "\"a\""]);
    let past = B::new(1, 0).tensor("w", 1024, 0).data(64);
    assert_refused(d, "past.gguf", &past.0, &["tensor \"w\"", "past the end"]);
    let unaligned = B::new(1, 0).tensor("w", 4, 8).data(64);
    assert_refused(
        d,
        "unaligned.gguf",
        &unaligned.0,
        &["tensor \"w\"", "multiple of the alignment 32"],
    );
    let dup = B::new(2, 0).tensor("x", 8, 0).tensor("x", 8, 32).data(64);
    assert_refused(d, "dup.gguf", &dup.0, &["tensor \"x\" appears twice"]);
    let mut cut = B::new(0, 2)
        .str("k")
        .u32(4)
        .u32(1)
        .str("tokenizer.ggml.tokens")
        .u32(9)
        .u32(8);
    cut.0.extend(1000u64.to_le_bytes());
    assert_refused(
        d,
        "cut.gguf",
        &cut.0,
        &["\"tokenizer.ggml.tokens\"", "ends at byte"],
    );
    let mut huge = B::new(0, 1).str("a").u32(9).u32(10);
    huge.0.extend((u64::MAX / 8).to_le_bytes());
    assert_refused(d, "huge.gguf", &huge.0, &["key \"a\"", "cannot fit"]);
    let split = B::new(0, 1).str("split.count").u32(8).str("2");
    assert_refused(
        d,
        "split-00001-of-00002.gguf",
        &split.0,
        &["\"split.count\""],
    );
    let count = B::new(u64::MAX, 0);
    assert_refused(d, "count.gguf", &count.0, &["more than the 262144"]);
}

#[test]
fn unknown_types_are_shown_and_their_counts_do_not_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = B::new(2, 0);
    for name in ["u0", "u1"] {
        b = b.str(name).u32(2);
        b.0.extend((1u64 << 62).to_le_bytes());
        b.0.extend(2u64.to_le_bytes());
        b = b.u32(99);
        b.0.extend(0u64.to_le_bytes());
    }
    let b = b.data(32);
    let path = dir.path().join("unknown.gguf");
    std::fs::write(&path, &b.0).unwrap();
    let out = reshard()
        .args(["inspect", "--json"])
        .arg(&path)
        .assert()
        .success();
    let v: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(v["types"]["type 99"]["tensors"], 2);
    assert_eq!(v["parameter_count"], u64::MAX);
    assert_eq!(v["findings"][0]["kind"], "not_dequantizable");
}

#[test]
fn the_inspect_output_in_docs_gguf_md_is_the_binarys() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/gguf.md")).unwrap();
    let cmd = "$ reshard inspect tests/fixtures/gguf/split-00002-of-00002.gguf\n";
    let start = page.find(cmd).expect("the inspect block") + cmd.len();
    let shown = &page[start..start + page[start..].find("```").unwrap()];
    let out = reshard()
        .current_dir(root)
        .args(["inspect", "tests/fixtures/gguf/split-00002-of-00002.gguf"])
        .assert()
        .success();
    assert_eq!(stdout(&out).replace("\r\n", "\n"), shown);
}
