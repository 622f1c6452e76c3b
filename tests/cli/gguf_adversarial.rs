//! Hostile GGUF files found by the adversarial review of GGUF -> safetensors
//! (findings/ holds each one's Python reproducer). Every file here is built
//! byte by byte, so no Python is needed: each bad input must give exit
//! status 2 naming the file or tensor, never a panic, and never an output
//! that looks complete but is not.

use std::path::Path;

use crate::common::*;

/// A GGUF v3 metadata value.
enum Kv {
    U32(u32),
    U64(u64),
    F32(f32),
    Str(&'static str),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

/// A tensor: name, ggml dims (innermost first), GGML type, data bytes.
struct T {
    name: &'static str,
    ne: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
}

fn f32_tensor(name: &'static str, ne: &[u64]) -> T {
    let n: u64 = ne.iter().product();
    let data = (0..n)
        .flat_map(|i| ((i % 7) as f32 * 0.25 - 0.5).to_le_bytes())
        .collect();
    T {
        name,
        ne: ne.to_vec(),
        ty: 0,
        data,
    }
}

fn string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s);
}

/// Writes a GGUF v3 file (alignment 32) of `kvs` and `tensors`.
fn write_gguf(path: &Path, kvs: &[(&str, Kv)], tensors: &[T]) {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        string(&mut b, k.as_bytes());
        match v {
            Kv::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Kv::U64(x) => {
                b.extend(10u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Kv::F32(x) => {
                b.extend(6u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            Kv::Str(s) => {
                b.extend(8u32.to_le_bytes());
                string(&mut b, s.as_bytes());
            }
            Kv::Strs(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                for s in v {
                    string(&mut b, s.as_bytes());
                }
            }
            Kv::I32s(v) => {
                b.extend(9u32.to_le_bytes());
                b.extend(5u32.to_le_bytes());
                b.extend((v.len() as u64).to_le_bytes());
                for x in v {
                    b.extend(x.to_le_bytes());
                }
            }
        }
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for t in tensors {
        string(&mut b, t.name.as_bytes());
        b.extend((t.ne.len() as u32).to_le_bytes());
        for d in &t.ne {
            b.extend(d.to_le_bytes());
        }
        b.extend(t.ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.data.len() as u64).div_ceil(32) * 32;
    }
    while !b.len().is_multiple_of(32) {
        b.push(0);
    }
    let start = b.len();
    for (t, o) in tensors.iter().zip(offsets) {
        b.resize(start + o as usize, 0);
        b.extend(&t.data);
    }
    std::fs::write(path, b).unwrap();
}

/// The keys of a one-block llama GGUF (hidden 64, 4 heads, 2 kv heads),
/// with a small byte-level BPE tokenizer.
fn llama_kvs(arch: &'static str) -> Vec<(String, Kv)> {
    let k = |s: &str| format!("{arch}.{s}");
    let tokens: Vec<String> = (b'a'..=b'z').map(|c| (c as char).to_string()).collect();
    vec![
        ("general.architecture".into(), Kv::Str(arch)),
        (k("block_count"), Kv::U32(1)),
        (k("embedding_length"), Kv::U32(64)),
        (k("attention.head_count"), Kv::U32(4)),
        (k("attention.head_count_kv"), Kv::U32(2)),
        (k("feed_forward_length"), Kv::U32(128)),
        (k("context_length"), Kv::U32(256)),
        (k("attention.layer_norm_rms_epsilon"), Kv::F32(1e-5)),
        ("tokenizer.ggml.model".into(), Kv::Str("gpt2")),
        ("tokenizer.ggml.tokens".into(), Kv::Strs(tokens)),
        ("tokenizer.ggml.token_type".into(), Kv::I32s(vec![1; 26])),
        ("tokenizer.ggml.merges".into(), Kv::Strs(vec!["a b".into()])),
    ]
}

fn write_llama(path: &Path, arch: &'static str, extra: Vec<(String, Kv)>, tensors: &[T]) {
    let mut kvs = llama_kvs(arch);
    for (k, v) in extra {
        kvs.retain(|(old, _)| *old != k);
        kvs.push((k, v));
    }
    let kvs: Vec<(&str, Kv)> = kvs.iter().map(|(k, v)| (k.as_str(), clone_kv(v))).collect();
    write_gguf(path, &kvs, tensors);
}

fn clone_kv(v: &Kv) -> Kv {
    match v {
        Kv::U32(x) => Kv::U32(*x),
        Kv::U64(x) => Kv::U64(*x),
        Kv::F32(x) => Kv::F32(*x),
        Kv::Str(s) => Kv::Str(s),
        Kv::Strs(s) => Kv::Strs(s.clone()),
        Kv::I32s(s) => Kv::I32s(s.clone()),
    }
}

fn stderr_of(out: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&out.get_output().stderr).into_owned()
}

/// A GGUF tensor named `__metadata__` would become the safetensors
/// metadata key: the shard is unreadable (safetensors: "invalid JSON in
/// header") and its real `__metadata__` is lost, yet convert exited 0.
#[test]
fn a_gguf_tensor_named_metadata_is_refused_naming_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    write_gguf(
        &src,
        &[("general.architecture", Kv::Str("flux"))],
        &[
            f32_tensor("__metadata__", &[4]),
            f32_tensor("b.weight", &[4]),
        ],
    );
    let dst = dir.path().join("out");
    let out = convert(&src, &dst, &["--dtype", "bf16"]).code(2);
    let err = stderr_of(&out);
    assert!(
        err.contains("m.gguf") && err.contains("\"__metadata__\"") && !err.contains("panicked"),
        "{err}"
    );
    assert!(!dst.join("model.safetensors").exists());
}

/// A llama q bias (or weight) of zero elements is "unpermuted" in head
/// groups of zero bytes: GgufStream::fill divided by a min_buffer of 0
/// (stream.rs, `buf.len() / need`) and the executor thread panicked.
#[test]
fn a_zero_element_permuted_tensor_does_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("z.gguf");
    let empty = T {
        name: "blk.0.attn_q.bias",
        ne: vec![0],
        ty: 0,
        data: Vec::new(),
    };
    write_llama(
        &src,
        "llama",
        Vec::new(),
        &[
            f32_tensor("token_embd.weight", &[64, 26]),
            f32_tensor("blk.0.attn_q.weight", &[64, 64]),
            empty,
        ],
    );
    let dst = dir.path().join("out");
    let out = reshard()
        .arg("convert")
        .arg(&src)
        .arg(&dst)
        .args(["--no-progress", "--dtype", "bf16"])
        .assert();
    let code = out.get_output().status.code();
    let err = stderr_of(&out);
    assert!(
        matches!(code, Some(0) | Some(2)) && !err.contains("panicked"),
        "exit {code:?}: {err}"
    );
    if code == Some(0) {
        let got = read_all(&dst);
        assert_eq!(got["model.layers.0.self_attn.q_proj.bias"].1, vec![0u64]);
    }
}

/// Qwen2's `head_dim * heads != hidden` check multiplied two header
/// integers unchecked: a debug build panicked ("attempt to multiply with
/// overflow", config.rs), a release build wraps (2^62 * 4 == 0 passes
/// with hidden 0).
#[test]
fn a_qwen2_key_length_that_overflows_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("q.gguf");
    write_llama(
        &src,
        "qwen2",
        vec![("qwen2.attention.key_length".into(), Kv::U64(1 << 62))],
        &[f32_tensor("token_embd.weight", &[64, 26])],
    );
    let dst = dir.path().join("out");
    let out = convert(&src, &dst, &["--dtype", "bf16"]).code(2);
    let err = stderr_of(&out);
    assert!(
        err.contains("key_length") && !err.contains("panicked"),
        "{err}"
    );
    assert!(!dst.join("config.json").exists());
}

/// Plain integer and F64 GGUF tensors are copied (or cast) by convert, but
/// `validate --against` sent every tensor through GgufStream: I8/I32
/// outputs were reported as mismatches (exit 1) and an F64 tensor stopped
/// the check (exit 2, "F64 codes cannot be dequantized").
#[test]
fn validate_against_passes_a_correct_conversion_of_plain_int_and_f64_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("ints.gguf");
    let ints = T {
        name: "b.idx",
        ne: vec![16],
        ty: 26, // I32
        data: (0..16i32).flat_map(i32::to_le_bytes).collect(),
    };
    let f64s = T {
        name: "c.f64",
        ne: vec![4],
        ty: 28, // F64
        data: [0.5f64, -1.0, 2.25, 3.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
    };
    write_gguf(
        &src,
        &[("general.architecture", Kv::Str("flux"))],
        &[f32_tensor("a.weight", &[32, 4]), ints, f64s],
    );
    let dst = dir.path().join("out");
    convert(&src, &dst, &["--dtype", "bf16"]).success();
    let out = reshard()
        .arg("validate")
        .arg(&dst)
        .arg("--against")
        .arg(&src)
        .assert();
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
    out.success().stdout(predicates::str::contains("passed"));
    let _ = stdout;
}

/// A config the header cannot give failed only the real run: the dry run
/// (and so `fit` and `batch --dry-run`) said it would work.
#[test]
fn a_dry_run_fails_where_the_run_would() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("q.gguf");
    write_llama(
        &src,
        "qwen2",
        vec![("qwen2.attention.key_length".into(), Kv::U64(1 << 62))],
        &[f32_tensor("token_embd.weight", &[64, 26])],
    );
    let dst = dir.path().join("out");
    let out = convert(&src, &dst, &["--dtype", "bf16", "--dry-run"]).code(2);
    assert!(
        stderr_of(&out).contains("key_length"),
        "{}",
        stderr_of(&out)
    );
}
