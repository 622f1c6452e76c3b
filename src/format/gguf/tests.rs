//! Hostile GGUF headers as byte literals: each is refused with the precise
//! error, no panic, within the budget.

use super::error::GgufError;
use super::ggml::GgmlType;
use super::header::parse;
use super::value::{ty, Array, Value};
use super::{parse_bytes, MAX_HEADER};

/// Writes GGUF bytes by hand, piece by piece.
#[derive(Default)]
struct B(Vec<u8>);

impl B {
    fn head(version: u32, tensors: u64, kvs: u64) -> B {
        let mut b = B(b"GGUF".to_vec());
        b.u32(version).u64(tensors).u64(kvs);
        b
    }
    fn u32(&mut self, v: u32) -> &mut B {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut B {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut B {
        self.u64(s.len() as u64);
        self.0.extend(s.as_bytes());
        self
    }
    fn kv(&mut self, key: &str, vty: u32, payload: &[u8]) -> &mut B {
        self.str(key).u32(vty);
        self.0.extend(payload);
        self
    }
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut B {
        self.kv(key, ty::U32, &v.to_le_bytes())
    }
    fn tensor(&mut self, name: &str, ne: &[u64], ggml: u32, off: u64) -> &mut B {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ggml).u64(off)
    }
    fn pad(&mut self, align: usize) -> &mut B {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    fn zeros(&mut self, n: usize) -> &mut B {
        self.0.extend(std::iter::repeat_n(0, n));
        self
    }
    fn parse(&self) -> Result<super::GgufFile, GgufError> {
        parse_bytes(&self.0)
    }
}

fn string_payload(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend(s.as_bytes());
    v
}

#[test]
fn a_valid_file_reads_typed_metadata_reversed_dims_and_absolute_offsets() {
    let mut b = B::head(3, 2, 3);
    b.kv("general.architecture", ty::STRING, &string_payload("llama"));
    b.kv_u32("llama.block_count", 2);
    let mut arr = ty::F32.to_le_bytes().to_vec();
    arr.extend(3u64.to_le_bytes());
    for v in [0.5f32, -1.0, 2.0] {
        arr.extend(v.to_le_bytes());
    }
    b.kv("tokenizer.ggml.scores", ty::ARRAY, &arr);
    b.tensor("a", &[4, 2], 0, 0).tensor("b", &[32], 8, 32);
    b.pad(32).zeros(32).zeros(34);
    let f = b.parse().unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.metadata.get_str("general.architecture"), Some("llama"));
    assert_eq!(f.metadata.get("llama.block_count"), Some(&Value::U32(2)));
    assert_eq!(
        f.metadata.get("tokenizer.ggml.scores"),
        Some(&Value::Array(Array::F32(vec![0.5, -1.0, 2.0])))
    );
    let a = &f.tensors[0];
    assert_eq!(
        (a.shape.clone(), a.len, a.offset),
        (vec![2, 4], Some(32), f.data_start)
    );
    let q = &f.tensors[1];
    assert_eq!(q.ggml_type, GgmlType::Q8_0);
    assert_eq!((q.len, q.offset), (Some(34), f.data_start + 32));
    assert_eq!(f.data_start % 32, 0);
}

#[test]
fn bad_magic_versions_and_truncation_are_refused() {
    assert!(matches!(
        parse_bytes(b"GGML\x03\0\0\0"),
        Err(GgufError::BadMagic { .. })
    ));
    assert!(matches!(
        B::head(1, 0, 0).parse(),
        Err(GgufError::UnsupportedVersion { version: 1 })
    ));
    // A big-endian v3 file reads as version 3 << 24.
    assert!(matches!(
        B::head(3u32.swap_bytes(), 0, 0).parse(),
        Err(GgufError::BigEndian)
    ));
    assert!(matches!(
        parse_bytes(b"GG"),
        Err(GgufError::Truncated { .. })
    ));
    let mut b = B::head(3, 0, 2);
    b.kv_u32("x", 1);
    let err = b.parse().unwrap_err();
    assert!(
        matches!(err, GgufError::Truncated { ref at, .. } if at.contains("pair 1")),
        "{err}"
    );
}

#[test]
fn huge_counts_are_refused_before_anything_is_allocated() {
    assert!(matches!(
        B::head(3, u64::MAX, 0).parse(),
        Err(GgufError::TooManyTensors { .. })
    ));
    assert!(matches!(
        B::head(3, 0, u64::MAX).parse(),
        Err(GgufError::TooManyKeys { .. })
    ));
    // Counts under the caps but far past the file: truncated, not allocated.
    assert!(matches!(
        B::head(3, 200_000, 500_000).parse(),
        Err(GgufError::Truncated { .. })
    ));
}

#[test]
fn long_strings_and_names_are_refused_naming_the_key() {
    let mut b = B::head(3, 0, 1);
    b.str("k").u32(ty::STRING).u64(u64::MAX);
    let err = b.parse().unwrap_err();
    assert!(
        matches!(err, GgufError::StringTooLong { ref at, .. } if at.contains("\"k\"")),
        "{err}"
    );
    // Within the cap but past the end of the file.
    let mut b = B::head(3, 0, 1);
    b.str("k").u32(ty::STRING).u64(10 << 20);
    assert!(matches!(b.parse(), Err(GgufError::Truncated { .. })));
    let mut b = B::head(3, 0, 1);
    b.u64(5000);
    assert!(matches!(b.parse(), Err(GgufError::StringTooLong { .. })));
    // 127-byte names (ComfyUI-GGUF) are read; a key that is not UTF-8 is not.
    let long = "n".repeat(127);
    let mut b = B::head(3, 1, 0);
    b.tensor(&long, &[1], 0, 0).pad(32).zeros(4);
    assert_eq!(b.parse().unwrap().tensors[0].name, long);
    let mut b = B::head(3, 0, 1);
    b.u64(2);
    b.0.extend([0xff, 0xfe]);
    b.u32(ty::U8).0.push(1);
    assert!(matches!(b.parse(), Err(GgufError::NotUtf8 { .. })));
}

#[test]
fn huge_and_nested_arrays_are_bounded() {
    let mut b = B::head(3, 0, 1);
    b.str("a").u32(ty::ARRAY).u32(ty::U64).u64(u64::MAX / 4);
    let err = b.parse().unwrap_err();
    assert!(
        matches!(err, GgufError::ArrayTooLong { ref key, .. } if key == "a"),
        "{err}"
    );
    // Nested past the depth limit.
    let mut b = B::head(3, 0, 1);
    b.str("n").u32(ty::ARRAY);
    for _ in 0..6 {
        b.u32(ty::ARRAY).u64(1);
    }
    b.u32(ty::U8).u64(0);
    assert!(matches!(b.parse(), Err(GgufError::ArrayTooDeep { .. })));
    // Two levels are read.
    let mut b = B::head(3, 0, 1);
    b.str("n").u32(ty::ARRAY).u32(ty::ARRAY).u64(2);
    b.u32(ty::I8).u64(1).0.push(0xff);
    b.u32(ty::STRING).u64(1).str("x");
    let f = b.parse().unwrap();
    let Some(Value::Array(Array::Array(v))) = f.metadata.get("n") else {
        panic!("{:?}", f.metadata.get("n"))
    };
    assert_eq!(v[0], Array::I8(vec![-1]));
    assert_eq!(v[1].to_string(), "[\"x\"]");
    // Many empty nested arrays are charged their memory, not only their
    // 12 file bytes: under a 4 KiB budget 1,000 of them are refused.
    let mut b = B::head(3, 0, 1);
    b.str("n").u32(ty::ARRAY).u32(ty::ARRAY).u64(1000);
    for _ in 0..1000 {
        b.u32(ty::U8).u64(0);
    }
    assert!(parse(b.0.as_slice(), MAX_HEADER).is_ok());
    assert!(matches!(
        parse(b.0.as_slice(), 16 << 10),
        Err(GgufError::HeaderTooLarge { .. })
    ));
    let mut b = B::head(3, 0, 1);
    b.str("t").u32(77).u32(0);
    assert!(matches!(
        b.parse(),
        Err(GgufError::UnknownValueType { ty: 77, .. })
    ));
}

#[test]
fn alignment_must_be_a_u32_power_of_two() {
    for (payload, vty) in [
        (string_payload("32"), ty::STRING),
        (32u64.to_le_bytes().to_vec(), ty::U64),
    ] {
        let mut b = B::head(3, 0, 1);
        b.kv("general.alignment", vty, &payload);
        let err = b.parse().unwrap_err();
        assert!(
            matches!(err, GgufError::WrongKeyType { ref key, .. } if key == "general.alignment"),
            "{err}"
        );
    }
    for bad in [0u32, 48, 3] {
        let mut b = B::head(3, 0, 1);
        b.kv_u32("general.alignment", bad);
        assert!(matches!(b.parse(), Err(GgufError::BadAlignment { .. })));
    }
    let mut b = B::head(3, 1, 1);
    b.kv_u32("general.alignment", 64).tensor("w", &[2], 0, 0);
    b.pad(64).zeros(8);
    let f = b.parse().unwrap();
    assert_eq!((f.alignment, f.data_start % 64), (64, 0));
}

#[test]
fn offsets_must_be_aligned_ordered_apart_and_inside_the_file() {
    let mut b = B::head(3, 1, 0);
    b.tensor("w", &[2], 0, 4).pad(32).zeros(64);
    assert!(matches!(
        b.parse(),
        Err(GgufError::Misaligned { offset: 4, .. })
    ));
    let mut b = B::head(3, 2, 0);
    b.tensor("a", &[8], 0, 0).tensor("b", &[8], 0, 32);
    b.pad(32).zeros(64);
    assert!(b.parse().is_ok());
    let mut b = B::head(3, 2, 0);
    b.tensor("a", &[16], 0, 0)
        .tensor("b", &[16], 0, 0)
        .pad(32)
        .zeros(128);
    let err = b.parse().unwrap_err();
    assert!(
        matches!(err, GgufError::Overlap { ref tensor, ref other, .. } if tensor == "b" && other == "a"),
        "{err}"
    );
    // Out of info order.
    let mut b = B::head(3, 2, 0);
    b.tensor("a", &[8], 0, 64)
        .tensor("b", &[8], 0, 0)
        .pad(32)
        .zeros(128);
    assert!(matches!(b.parse(), Err(GgufError::Overlap { .. })));
    let mut b = B::head(3, 1, 0);
    b.tensor("w", &[16], 0, 0).pad(32).zeros(63);
    let err = b.parse().unwrap_err();
    assert!(
        matches!(err, GgufError::PastEnd { ref tensor, .. } if tensor == "w"),
        "{err}"
    );
    let mut b = B::head(3, 1, 0);
    b.tensor("w", &[1], 0, u64::MAX - 31).pad(32);
    assert!(matches!(b.parse(), Err(GgufError::PastEnd { .. })));
}

#[test]
fn shapes_duplicates_and_unknown_types() {
    let mut b = B::head(3, 1, 0);
    b.tensor("q", &[16, 2], 8, 0).pad(32).zeros(64);
    let err = b.parse().unwrap_err();
    assert!(
        matches!(err, GgufError::BadShape { ref tensor, .. } if tensor == "q"),
        "{err}"
    );
    let mut b = B::head(3, 1, 0);
    b.tensor("big", &[1 << 62, 1 << 62], 0, 0).pad(32);
    assert!(matches!(b.parse(), Err(GgufError::BadShape { .. })));
    let mut b = B::head(3, 1, 0);
    b.tensor("neg", &[u64::MAX], 24, 0).pad(32);
    assert!(matches!(b.parse(), Err(GgufError::BadShape { .. })));
    let mut b = B::head(3, 1, 0);
    b.str("d").u32(9);
    assert!(matches!(
        b.parse(),
        Err(GgufError::TooManyDims { dims: 9, .. })
    ));
    let mut b = B::head(3, 2, 0);
    b.tensor("x", &[1], 0, 0)
        .tensor("x", &[1], 0, 32)
        .pad(32)
        .zeros(64);
    assert!(matches!(b.parse(), Err(GgufError::DuplicateTensor { ref tensor }) if tensor == "x"));
    let mut b = B::head(3, 0, 2);
    b.kv_u32("k", 1).kv_u32("k", 2);
    assert!(matches!(b.parse(), Err(GgufError::DuplicateKey { ref key }) if key == "k"));
    let mut b = B::head(3, 1, 0);
    b.tensor("", &[1], 0, 0).pad(32).zeros(4);
    assert!(matches!(b.parse(), Err(GgufError::BadName { .. })));
    // An unknown type id is read, its length unknown (and its element
    // count not bounded by the file).
    let mut b = B::head(3, 1, 0);
    b.tensor("u", &[32], 99, 0).pad(32).zeros(32);
    let f = b.parse().unwrap();
    assert_eq!(
        (f.tensors[0].ggml_type, f.tensors[0].len),
        (GgmlType(99), None)
    );
}

#[test]
fn a_header_past_the_budget_is_refused() {
    let mut b = B::head(3, 0, 1);
    b.kv("s", ty::STRING, &string_payload(&"x".repeat(10_000)));
    assert!(parse(b.0.as_slice(), 1 << 20).is_ok());
    let err = parse(b.0.as_slice(), 4096).unwrap_err();
    assert!(
        matches!(err, GgufError::HeaderTooLarge { max: 4096, .. }),
        "{err}"
    );
}

/// Writes a split member with `split.*` keys and one F32 tensor per name.
fn member(dir: &std::path::Path, file: &str, keys: &[(&str, u32)], tensors: &[&str]) {
    let mut b = B::head(3, tensors.len() as u64, keys.len() as u64);
    for (k, v) in keys {
        b.kv(k, ty::U16, &(*v as u16).to_le_bytes());
    }
    for (i, t) in tensors.iter().enumerate() {
        b.tensor(t, &[8], 0, 32 * i as u64);
    }
    b.pad(32).zeros(32 * tensors.len());
    std::fs::write(dir.join(file), &b.0).unwrap();
}

fn split_err(dir: &std::path::Path, file: &str) -> String {
    let err = super::open(&dir.join(file)).unwrap_err();
    let mut s = err.to_string();
    let mut cur: &dyn std::error::Error = &err;
    while let Some(next) = cur.source() {
        s.push_str(": ");
        s.push_str(&next.to_string());
        cur = next;
    }
    s
}

#[test]
fn split_members_must_agree_with_their_names_and_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let keys = |no| {
        [
            ("split.no", no),
            ("split.count", 2),
            ("split.tensors.count", 2),
        ]
    };
    member(d, "m-00001-of-00002.gguf", &keys(0), &["a"]);
    member(d, "m-00002-of-00002.gguf", &keys(1), &["b"]);
    let m = super::open(&d.join("m-00002-of-00002.gguf")).unwrap();
    assert_eq!(m.tensors.len(), 2);
    // The second member says it is the first.
    member(d, "m-00002-of-00002.gguf", &keys(0), &["b"]);
    let err = split_err(d, "m-00001-of-00002.gguf");
    assert!(
        err.contains("m-00002-of-00002.gguf") && err.contains("split.no 0"),
        "{err}"
    );
    // A tensor in both members.
    member(d, "m-00002-of-00002.gguf", &keys(1), &["a"]);
    let err = split_err(d, "m-00001-of-00002.gguf");
    assert!(
        err.contains("tensor \"a\" is in split 1 and in split 2"),
        "{err}"
    );
    // split.tensors.count disagrees with the tensors.
    member(d, "m-00002-of-00002.gguf", &keys(1), &["b", "c"]);
    let err = split_err(d, "m-00001-of-00002.gguf");
    assert!(
        err.contains("hold 3 tensors") && err.contains("is 2"),
        "{err}"
    );
    // A member under a name that does not follow the pattern.
    member(d, "renamed.gguf", &keys(0), &["a"]);
    let err = split_err(d, "renamed.gguf");
    assert!(err.contains("NAME-00001-of-00002.gguf"), "{err}");
    // A missing member is named; open_set lists it instead.
    std::fs::remove_file(d.join("m-00002-of-00002.gguf")).unwrap();
    let err = split_err(d, "m-00001-of-00002.gguf");
    assert!(
        err.contains("m-00002-of-00002.gguf is missing (split 2 of 2)"),
        "{err}"
    );
    let set = super::open_set(&d.join("m-00001-of-00002.gguf")).unwrap();
    assert_eq!(set.split.unwrap().missing.len(), 1);
    // A split.count past what a uint16 holds (no 2^64 names are tried).
    let mut b = B::head(3, 0, 2);
    b.kv("split.count", ty::U64, &u64::MAX.to_le_bytes());
    b.kv("split.no", ty::U64, &0u64.to_le_bytes());
    std::fs::write(d.join("h-00001-of-99999.gguf"), &b.0).unwrap();
    let err = split_err(d, "h-00001-of-99999.gguf");
    assert!(err.contains("more than 65535"), "{err}");
    // split.count of the wrong type.
    let mut b = B::head(3, 0, 1);
    b.kv("split.count", ty::STRING, &string_payload("2"));
    std::fs::write(d.join("s-00001-of-00002.gguf"), &b.0).unwrap();
    let err = split_err(d, "s-00001-of-00002.gguf");
    assert!(err.contains("\"split.count\" is string"), "{err}");
}

mod roundtrip {
    use proptest::prelude::*;

    use super::*;

    /// (ggml type id, rows, blocks a row): types from the table with known
    /// sizes, shapes a whole number of blocks.
    fn tensor() -> impl Strategy<Value = (u32, u64, u64)> {
        (
            prop::sample::select(vec![0u32, 1, 2, 8, 12, 14, 24, 28, 30, 39]),
            0u64..4,
            1u64..3,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any header built to the format's rules reads back exactly:
        /// values typed, dims reversed, offsets aligned and absolute.
        #[test]
        fn written_headers_read_back(
            align_log in 3u32..8,
            ints in prop::collection::vec(any::<u32>(), 0..4),
            words in prop::collection::vec("[a-z\u{e9}]{0,12}", 0..20),
            floats in prop::collection::vec(-1e6f32..1e6, 0..40),
            tensors in prop::collection::vec(tensor(), 0..6),
        ) {
            let align = 1u64 << align_log;
            let n_kv = 3 + ints.len() as u64;
            let mut b = B::head(3, tensors.len() as u64, n_kv);
            b.kv_u32("general.alignment", align as u32);
            for (i, v) in ints.iter().enumerate() {
                b.kv_u32(&format!("int.{i}"), *v);
            }
            let mut arr = ty::STRING.to_le_bytes().to_vec();
            arr.extend((words.len() as u64).to_le_bytes());
            for w in &words {
                arr.extend(string_payload(w));
            }
            b.kv("words", ty::ARRAY, &arr);
            let mut arr = ty::F32.to_le_bytes().to_vec();
            arr.extend((floats.len() as u64).to_le_bytes());
            for f in &floats {
                arr.extend(f.to_le_bytes());
            }
            b.kv("floats", ty::ARRAY, &arr);
            let mut rel = 0u64;
            let mut lens = Vec::new();
            for (i, &(t, rows, blocks)) in tensors.iter().enumerate() {
                let layout = GgmlType(t).layout().unwrap();
                let row = blocks * layout.block;
                let len = rows * blocks * layout.bytes;
                b.tensor(&format!("t{i}"), &[row, rows], t, rel);
                lens.push((rel, len));
                rel = (rel + len).div_ceil(align) * align;
            }
            b.pad(align as usize).zeros(rel as usize);
            let f = b.parse().unwrap();
            prop_assert_eq!(f.alignment, align);
            for (i, v) in ints.iter().enumerate() {
                prop_assert_eq!(f.metadata.get(&format!("int.{i}")), Some(&Value::U32(*v)));
            }
            let Some(Value::Array(Array::String(s))) = f.metadata.get("words") else {
                panic!("words")
            };
            let got: Vec<&str> = (0..s.len()).map(|i| s.get_str(i).unwrap()).collect();
            prop_assert_eq!(got, words.iter().map(String::as_str).collect::<Vec<_>>());
            prop_assert_eq!(f.metadata.get("floats"), Some(&Value::Array(Array::F32(floats.clone()))));
            prop_assert_eq!(f.tensors.len(), tensors.len());
            for (t, (&(ty, rows, blocks), &(off, len))) in f.tensors.iter().zip(tensors.iter().zip(&lens)) {
                let layout = GgmlType(ty).layout().unwrap();
                prop_assert_eq!(&t.shape, &vec![rows, blocks * layout.block]);
                prop_assert_eq!(t.offset, f.data_start + off);
                prop_assert_eq!(t.len, Some(len));
            }
        }
    }
}
