//! GGUF out, proven in llama.cpp itself: the GGUF reshard writes from a
//! Hugging Face Llama or Qwen2 loads in llama-cpp-python's libllama, whose
//! tokenizer (from the GGUF's metadata) gives the original's ids and whose
//! logits at every position match transformers' on the original within
//! the weight type's bound, and transformers' on the same GGUF within
//! llama.cpp's own arithmetic (tests/fixtures/gguf/llm/llama_cpp_check.py
//! states and derives both). F16 and Q8_0 on the tiny Llama and Qwen2;
//! Q6_K and Q4_K on a 256-wide Llama, Q4_K on a 256-wide Qwen2 (widen.py),
//! whose rows divide into K-quant blocks. A gguf-split set loads from its
//! first file. Measured for the Qwen2s: F16 0.0016 (same file 0.0010),
//! Q8_0 0.038 (0.027), 256-wide Q4_K 0.61 (0.063) on logits up to 1.9
//! (5.3 for the wide one, whose tied embeddings keep their spread).
//!
//! Needs two Pythons: `RESHARD_GGML_PYTHON` (llama-cpp-python, built by
//! scripts/lib/ggml-venv.sh) runs the model, the test venv (torch,
//! transformers) runs the original. Without the first the tests skip.

use std::path::{Path, PathBuf};

use crate::common::*;

fn llm(name: &str) -> PathBuf {
    fixture("gguf/llm").join(name)
}

/// Runs `gguf` in llama.cpp and checks it against `original` with
/// `weights`' bound and, with `same_file`, against the same file in
/// transformers (which reads no split set); returns the check's report.
fn check_in_llama_cpp(
    (ggml, python): &(PathBuf, PathBuf),
    gguf: &Path,
    original: &Path,
    weights: &str,
    same_file: bool,
) -> String {
    let result = run_python(ggml, Program::Script(&llm("llama_cpp_logits.py")), &[gguf]);
    let json = gguf.with_extension("llama-cpp.json");
    std::fs::write(&json, result).unwrap();
    let mut args = vec![
        json.as_os_str(),
        original.as_os_str(),
        "--weights".as_ref(),
        weights.as_ref(),
    ];
    if same_file {
        args.extend(["--gguf".as_ref(), gguf.as_os_str()]);
    }
    let out = run_python(python, Program::Script(&llm("llama_cpp_check.py")), &args);
    assert!(out.contains("ok"), "{}: {out}", gguf.display());
    out
}

/// The two Pythons, when both are here.
fn pythons() -> Option<(PathBuf, PathBuf)> {
    Some((ggml_python()?, python_with("torch, transformers, gguf")?))
}

/// Converts `original` with `args` into `name` and checks the GGUF in
/// llama.cpp.
fn load_in_llama_cpp(original: &str, args: &[&str], weights: &str, name: &str) {
    let Some(py) = pythons() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join(name);
    convert(&llm(original), &gguf, args).success();
    let out = check_in_llama_cpp(&py, &gguf, &llm(original), weights, true);
    eprintln!("{original} {args:?}: {out}");
}

/// `original` made 256 wide and converted with `--quantize scheme`,
/// checked in llama.cpp.
fn wide_in_llama_cpp(original: &str, scheme: &str) {
    let Some(py) = pythons() else { return };
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide");
    run_python(
        &py.1,
        Program::Script(&llm("widen.py")),
        &[llm(original).as_os_str(), wide.as_os_str()],
    );
    let gguf = dir.path().join(format!("wide-{original}-{scheme}.gguf"));
    convert(&wide, &gguf, &["--quantize", scheme]).success();
    let out = check_in_llama_cpp(&py, &gguf, &wide, scheme, true);
    eprintln!("wide {original} {scheme}: {out}");
}

#[test]
fn a_llama_q8_0_gguf_runs_in_llama_cpp_within_q8_0_error() {
    load_in_llama_cpp("llama", &["--quantize", "q8_0"], "q8_0", "llama-q8_0.gguf");
}

#[test]
fn a_llama_f16_gguf_runs_in_llama_cpp_within_f16_error() {
    load_in_llama_cpp("llama", &["--dtype", "f16"], "f16", "llama-f16.gguf");
}

#[test]
fn a_qwen2_q8_0_gguf_runs_in_llama_cpp_within_q8_0_error() {
    load_in_llama_cpp("qwen2", &["--quantize", "q8_0"], "q8_0", "qwen2-q8_0.gguf");
}

#[test]
fn a_qwen2_f16_gguf_runs_in_llama_cpp_within_f16_error() {
    load_in_llama_cpp("qwen2", &["--dtype", "f16"], "f16", "qwen2-f16.gguf");
}

#[test]
fn a_q6_k_gguf_runs_in_llama_cpp_within_q6_k_error() {
    wide_in_llama_cpp("llama", "q6_k");
}

#[test]
fn a_q4_k_gguf_runs_in_llama_cpp_within_q4_k_error() {
    wide_in_llama_cpp("llama", "q4_k");
}

#[test]
fn a_qwen2_q4_k_gguf_runs_in_llama_cpp_within_q4_k_error() {
    wide_in_llama_cpp("qwen2", "q4_k");
}

#[test]
fn a_split_llama_gguf_runs_in_llama_cpp_from_its_first_file() {
    let Some(py) = pythons() else { return };
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("llama-q8_0.gguf");
    convert(
        &llm("llama"),
        &first,
        &["--quantize", "q8_0", "--max-shard-size", "40KiB"],
    )
    .success();
    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gguf"))
        .collect();
    files.sort();
    assert!(files.len() > 1, "not split: {files:?}");
    assert!(files[0].starts_with("llama-q8_0-00001-of-"), "{files:?}");
    let out = check_in_llama_cpp(
        &py,
        &dir.path().join(&files[0]),
        &llm("llama"),
        "q8_0",
        false,
    );
    eprintln!("split into {}: {out}", files.len());
}
