//! llama.cpp's own converter's GGUFs (tests/fixtures/gguf/llm, made by
//! make.py there with `convert_hf_to_gguf.py` from llama-cpp-python's
//! source package) come back through `reshard convert --dtype` into a
//! folder transformers loads: every weight under its Hugging Face name,
//! llama's q/k rows put back, config.json and the tokenizer from the
//! header, logits within the GGUF type's error of the original model
//! (check.py states and derives the bounds), and `validate --against` the
//! GGUF passes.

use std::path::Path;

use crate::common::*;

fn llm(name: &str) -> std::path::PathBuf {
    fixture("gguf/llm").join(name)
}

/// Converts `gguf` to `dtype` and runs check.py on the result.
fn round_trip(gguf: &str, original: &str, weights: &str, dtype: &str) {
    let Some(python) = python_with("torch, transformers") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("out");
    convert(&llm(gguf), &dst, &["--dtype", dtype]).success();
    for file in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        assert!(dst.join(file).is_file(), "{gguf}: no {file}");
    }
    let out = run_python(
        &python,
        Program::Script(&llm("check.py")),
        &[
            dst.as_os_str(),
            llm(original).as_os_str(),
            "--weights".as_ref(),
            weights.as_ref(),
        ],
    );
    assert!(out.contains("ok"), "{out}");
    reshard()
        .args(["validate", "--device", "cpu"])
        .arg(&dst)
        .arg("--against")
        .arg(llm(gguf))
        .assert()
        .success();
}

#[test]
fn a_llama_q8_0_gguf_loads_in_transformers_within_q8_0_error() {
    round_trip("llama-q8_0.gguf", "llama", "q8_0", "f32");
    round_trip("llama-q8_0.gguf", "llama", "q8_0", "bf16");
}

#[test]
fn a_llama_f16_gguf_loads_in_transformers_within_f16_error() {
    round_trip("llama-f16.gguf", "llama", "f16", "f16");
}

#[test]
fn a_qwen2_q8_0_gguf_with_biases_and_tied_embeddings_loads_in_transformers() {
    round_trip("qwen2-q8_0.gguf", "qwen2", "q8_0", "bf16");
}

/// The dry-run plan's tensors, name -> planned input.
fn planned_inputs(gguf: &Path) -> serde_json::Map<String, serde_json::Value> {
    planned(gguf, &[])
        .into_iter()
        .map(|(name, t)| (name, t["input"].clone()))
        .collect()
}

/// The dry-run plan's tensors of `--dtype bf16 EXTRA...`, name -> tensor.
fn planned(gguf: &Path, extra: &[&str]) -> serde_json::Map<String, serde_json::Value> {
    let out = reshard()
        .args(["convert", "--dry-run", "--json", "--dtype", "bf16"])
        .args(extra)
        .arg(gguf)
        .arg(tempfile::tempdir().unwrap().path().join("out"))
        .assert()
        .success();
    let plan: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let plan = if plan.get("plan").is_some() {
        &plan["plan"]
    } else {
        &plan
    };
    plan["shards"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["tensors"].as_array().unwrap())
        .map(|t| (t["name"].as_str().unwrap().to_string(), t.clone()))
        .collect()
}

#[test]
fn only_llamas_q_and_k_rows_are_put_back_with_their_head_counts() {
    let llama = planned_inputs(&llm("llama-q8_0.gguf"));
    for (name, input) in &llama {
        let heads = input.get("unpermute_heads").and_then(|h| h.as_u64());
        let want = if name.ends_with("q_proj.weight") {
            Some(4)
        } else if name.ends_with("k_proj.weight") {
            Some(2)
        } else {
            None
        };
        assert_eq!(heads, want, "{name}");
    }
    assert!(llama.contains_key("model.layers.1.mlp.down_proj.weight"));
    let qwen = planned_inputs(&llm("qwen2-q8_0.gguf"));
    assert!(qwen.contains_key("model.layers.0.self_attn.q_proj.bias"));
    assert!(qwen.values().all(|i| i.get("unpermute_heads").is_none()));
}

#[test]
fn keep_dtype_matches_the_name_written_as_well_as_the_gguf_name() {
    for glob in ["model.norm.weight", "output_norm.weight"] {
        let tensors = planned(&llm("llama-q8_0.gguf"), &["--keep-dtype", glob]);
        assert_eq!(tensors["model.norm.weight"]["dtype"], "F32", "{glob}");
    }
}
