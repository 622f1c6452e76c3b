//! GGUF out, proven through a real loader: the GGUF reshard writes from a
//! Hugging Face Llama or Qwen2 loads in transformers as GGUF
//! (`from_pretrained(dir, gguf_file=...)`, which dequantizes with gguf-py,
//! un-permutes llama's q/k rows and builds the tokenizer from the GGUF's
//! metadata) with no missing or unexpected weights, the original's token
//! ids, and logits within the weight type's bound of the original model
//! (tests/fixtures/gguf/llm/check.py states and derives the bounds: 0.1
//! for Q8_0, 0.05 for F16, each at least twice the measured error and ten
//! times below what a missed q/k permutation does). The byte-level match
//! with llama.cpp's own converter is `gguf_out_llms_are_the_bytes_...`.

use crate::common::*;

fn llm(name: &str) -> std::path::PathBuf {
    fixture("gguf/llm").join(name)
}

/// Converts `original` to one GGUF with `args`, checks it in transformers
/// against `original` with `weights`' bound, and `validate --against` it.
fn load_in_transformers(original: &str, args: &[&str], weights: &str) {
    let Some(python) = python_with("torch, transformers, gguf") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let name = format!("{original}-{weights}.gguf");
    let gguf = dir.path().join(&name);
    convert(&llm(original), &gguf, args).success();
    let out = run_python(
        &python,
        Program::Script(&llm("check.py")),
        &[
            dir.path().as_os_str(),
            llm(original).as_os_str(),
            "--weights".as_ref(),
            weights.as_ref(),
            "--gguf-file".as_ref(),
            name.as_ref(),
        ],
    );
    assert!(out.contains("ok"), "{original} {args:?}: {out}");
    reshard()
        .arg("validate")
        .arg(&gguf)
        .arg("--against")
        .arg(llm(original))
        .assert()
        .success();
}

#[test]
fn a_llama_q8_0_gguf_loads_in_transformers_within_q8_0_error() {
    load_in_transformers("llama", &["--quantize", "q8_0"], "q8_0");
}

#[test]
fn a_llama_f16_gguf_loads_in_transformers_within_f16_error() {
    load_in_transformers("llama", &["--dtype", "f16"], "f16");
}

#[test]
fn a_qwen2_q8_0_gguf_with_biases_and_tied_embeddings_loads_in_transformers() {
    load_in_transformers("qwen2", &["--quantize", "q8_0"], "q8_0");
}
