//! GGUF files written by gguf-py (tests/fixtures/gguf/make.py), read by
//! reshard: every tensor's type, shape, offset and length as gguf-py's
//! GGUFReader sees them, and its f32 dequantization equal, by sha256, to
//! `gguf.quants.dequantize`; split sets; and `reshard inspect` on them.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use reshard::cast::gguf::{dequantize_blocks, supports, DequantError, SUPPORTED};
use reshard::format::gguf::ggml::GgmlType;
use sha2::{Digest, Sha256};

use crate::common::*;

/// Checks every tensor of the GGUF files in `dir` against `dir/expected.json`;
/// returns the dequantized types it compared.
fn check_against_expected(dir: &Path) -> BTreeSet<GgmlType> {
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let files = expected["files"].as_object().unwrap();
    let mut covered = BTreeSet::new();
    for (file, tensors) in files {
        let model = reshard::format::gguf::open(&dir.join(file)).unwrap();
        let tensors = tensors.as_object().unwrap();
        let mine: Vec<_> = model
            .tensors
            .iter()
            .filter(|t| model.files[t.file].name() == *file)
            .collect();
        assert_eq!(mine.len(), tensors.len(), "tensor count of {file}");
        for t in mine {
            let e = &tensors[&t.name];
            let what = format!("{file}: {}", t.name);
            assert_eq!(t.ggml_type.to_string(), e["type"], "type of {what}");
            let shape: Vec<u64> = serde_json::from_value(e["shape"].clone()).unwrap();
            assert_eq!(t.shape, shape, "shape of {what}");
            assert_eq!(t.offset, e["offset"], "offset of {what}");
            assert_eq!(t.len, e["bytes"].as_u64(), "length of {what}");
            if !supports(t.ggml_type) {
                let mut out = vec![0f32; t.numel() as usize];
                let bytes = vec![0u8; t.len.unwrap() as usize];
                assert!(matches!(
                    dequantize_blocks(t.ggml_type, &bytes, &mut out),
                    Err(DequantError::Unsupported { .. })
                ));
                continue;
            }
            let sha = dequantized_sha(
                &model.files[t.file].path,
                t.ggml_type,
                t.offset,
                t.len.unwrap(),
            );
            assert_eq!(sha, e["sha256"].as_str().unwrap(), "f32 values of {what}");
            covered.insert(t.ggml_type);
        }
    }
    covered
}

/// Reads a tensor's bytes a few blocks at a time (as a streaming stage
/// would, window by window) and hashes the f32 little-endian values.
fn dequantized_sha(path: &Path, ty: GgmlType, offset: u64, len: u64) -> String {
    let layout = ty.layout().unwrap();
    let chunk = (3 * layout.bytes) as usize;
    let mut file = std::fs::File::open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    let mut left = len as usize;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; chunk];
    while left > 0 {
        let n = left.min(chunk);
        file.read_exact(&mut buf[..n]).unwrap();
        let mut out = vec![0f32; n / layout.bytes as usize * layout.block as usize];
        dequantize_blocks(ty, &buf[..n], &mut out).unwrap();
        for v in out {
            hash.update(v.to_le_bytes());
        }
        left -= n;
    }
    hex(&hash.finalize())
}

#[test]
fn gguf_py_fixtures_dequantize_bit_exact() {
    let covered = check_against_expected(&fixture("gguf"));
    let all: BTreeSet<GgmlType> = SUPPORTED.into_iter().collect();
    assert_eq!(covered, all, "a supported type has no fixture tensor");
}

#[test]
fn gguf_py_random_cases_dequantize_bit_exact() {
    let Some(python) = python_with("gguf") else {
        return;
    };
    let script = fixture("gguf").join("make.py");
    for seed in [1, 2, 3] {
        let dir = tempfile::tempdir().unwrap();
        let seed = seed.to_string();
        run_python(
            &python,
            Program::Script(&script),
            &[dir.path().as_os_str(), OsStr::new(&seed)],
        );
        assert_eq!(check_against_expected(dir.path()).len(), SUPPORTED.len());
    }
}

#[test]
fn a_split_set_opens_from_any_member_and_a_missing_member_is_named() {
    let dir = tempfile::tempdir().unwrap();
    for n in ["split-00001-of-00002.gguf", "split-00002-of-00002.gguf"] {
        std::fs::copy(fixture("gguf").join(n), dir.path().join(n)).unwrap();
    }
    for member in ["split-00001-of-00002.gguf", "split-00002-of-00002.gguf"] {
        let model = reshard::format::gguf::open(&dir.path().join(member)).unwrap();
        let names: Vec<_> = model.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["blk.0.weight", "blk.1.weight", "blk.2.weight"]);
        assert_eq!(model.files.len(), 2);
        assert_eq!(model.tensors[2].file, 1);
        assert!(
            model.metadata.get("llama.block_count").is_some(),
            "metadata from the first"
        );
        let split = model.split.unwrap();
        assert_eq!(
            (split.prefix.as_str(), split.count, split.tensors_count),
            ("split", 2, 3)
        );
    }
    std::fs::remove_file(dir.path().join("split-00001-of-00002.gguf")).unwrap();
    let err =
        reshard::format::gguf::open(&dir.path().join("split-00002-of-00002.gguf")).unwrap_err();
    let chain = format!("{:#}", anyhow::Error::from(err));
    assert!(
        chain.contains("split-00001-of-00002.gguf") && chain.contains("missing"),
        "{chain}"
    );
}

#[test]
fn every_value_type_gguf_py_writes_is_read_typed() {
    use reshard::format::gguf::value::{Array, Value};
    let path = fixture("gguf").join("kinds.gguf");
    let model = reshard::format::gguf::open(&path).unwrap();
    let md = &model.metadata;
    assert_eq!(md.get("a.u8"), Some(&Value::U8(1)));
    assert_eq!(md.get("a.i8"), Some(&Value::I8(-1)));
    assert_eq!(md.get("a.u16"), Some(&Value::U16(2)));
    assert_eq!(md.get("a.i16"), Some(&Value::I16(-2)));
    assert_eq!(md.get("a.u32"), Some(&Value::U32(3)));
    assert_eq!(md.get("a.i32"), Some(&Value::I32(-3)));
    assert_eq!(md.get("a.f32"), Some(&Value::F32(0.5)));
    assert_eq!(md.get("a.u64"), Some(&Value::U64(4)));
    assert_eq!(md.get("a.i64"), Some(&Value::I64(-4)));
    assert_eq!(md.get("a.f64"), Some(&Value::F64(0.25)));
    assert_eq!(md.get("a.bool"), Some(&Value::Bool(true)));
    assert_eq!(md.get_str("a.str"), Some("x"));
    let Some(Value::Array(Array::String(s))) = md.get("a.strs") else {
        panic!("{:?}", md.get("a.strs"))
    };
    assert_eq!(s.iter().collect::<Vec<_>>(), [&b"a"[..], b"bc", b""]);
    assert_eq!(
        md.get("a.ints"),
        Some(&Value::Array(Array::I32(vec![1, 2, 3])))
    );
    assert_eq!(
        md.get("a.nested"),
        Some(&Value::Array(Array::Array(vec![
            Array::I32(vec![1, 2]),
            Array::I32(vec![3])
        ])))
    );
    assert_eq!(md.get("general.alignment"), Some(&Value::U32(64)));
    assert_eq!(model.parts[0].alignment, 64);
    assert!(model.tensors.iter().all(|t| t.offset % 64 == 0));
}
