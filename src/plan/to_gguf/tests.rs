//! The plan against what llama.cpp's converter wrote: the committed GGUF
//! fixtures of tests/fixtures/gguf/llm (llama, qwen2; ../make.py) and the
//! converter's GGUFReader views in tests/fixtures/gguf/llm/to_gguf
//! (Qwen2-MoE, Llama 3 rope, linear and YaRN rope; to_gguf/make.py), key
//! by key with types, tensor by tensor; then back through reshard's own
//! GGUF -> transformers direction; then the refusals.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::*;
use crate::format::gguf::ggml::GgmlType;
use crate::format::gguf::value::{Array, Strings};
use crate::plan::gguf::{hf_name, Family};

fn llm() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/llm")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// The tensors of safetensors files as the converter reads them: files
/// sorted by name, each file's names sorted.
fn source_tensors(files: &[PathBuf]) -> Vec<(String, Vec<u64>)> {
    let mut files = files.to_vec();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Json = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let mut names: Vec<(String, Vec<u64>)> = header
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "__metadata__")
            .map(|(k, v)| {
                let shape = v["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap());
                (k.clone(), shape.collect())
            })
            .collect();
        names.sort();
        out.extend(names);
    }
    out
}

fn plan(
    config: &Path,
    tokenizer_dir: &Path,
    tensors: &[(String, Vec<u64>)],
    folder: &str,
    file_type: u32,
) -> LlmGguf {
    let tok = TokenizerFiles::read(tokenizer_dir).unwrap();
    llm_gguf(&LlmInput {
        config_json: &text(config),
        tokenizer: &tok,
        tensors,
        folder_name: folder,
        file_type,
    })
    .unwrap()
}

fn assert_same_kvs(got: &[(String, Value)], want: &[(String, Value)], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.0, w.0, "{what}: key {i}");
        assert_eq!(g.1, w.1, "{what}: value of {}", g.0);
    }
    assert_eq!(got.len(), want.len(), "{what}: key count");
}

/// Our plan equals a GGUF the converter wrote: every key, type and value
/// in order, every tensor name in order with its shape, and F32 exactly
/// where the converter kept F32 in a quantized file.
fn same_as_gguf(model: &str, gguf: &str, file_type: u32) -> LlmGguf {
    let dir = llm().join(model);
    let tensors = source_tensors(&[dir.join("model.safetensors")]);
    let ours = plan(&dir.join("config.json"), &dir, &tensors, model, file_type);
    let theirs = crate::format::gguf::open(&llm().join(gguf)).unwrap();
    let want: Vec<(String, Value)> = theirs
        .metadata
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    assert_same_kvs(&ours.metadata, &want, gguf);
    assert_eq!(ours.tensors.len(), theirs.tensors.len());
    for (o, t) in ours.tensors.iter().zip(&theirs.tensors) {
        assert_eq!(o.name, t.name);
        assert_eq!(o.shape, t.shape, "{}", o.name);
        assert_eq!(o.force_f32, t.ggml_type == GgmlType::F32, "{}", o.name);
    }
    ours
}

#[test]
fn llama_matches_the_converters_q8_0_and_f16_files() {
    let q8 = same_as_gguf("llama", "llama-q8_0.gguf", file_type::MOSTLY_Q8_0);
    same_as_gguf("llama", "llama-f16.gguf", file_type::MOSTLY_F16);
    assert_eq!(q8.architecture, Arch::Llama);
    for t in &q8.tensors {
        let want = match t.name.rsplit('.').nth(1) {
            Some("attn_q") => Some(4),
            Some("attn_k") => Some(2),
            _ => None,
        };
        assert_eq!(t.permute_heads, want, "{}", t.name);
    }
    assert!(q8.tensors.iter().any(|t| t.name == "output.weight"));
}

#[test]
fn qwen2_matches_the_converters_file_without_permutation_and_tied() {
    let q = same_as_gguf("qwen2", "qwen2-q8_0.gguf", file_type::MOSTLY_Q8_0);
    assert!(q.tensors.iter().all(|t| t.permute_heads.is_none()));
    assert!(!q.tensors.iter().any(|t| t.name == "output.weight"));
    let bias = q
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.attn_q.bias")
        .unwrap();
    assert!(bias.force_f32);
}

/// A `[key, type, value]` of a to_gguf/*.json view as a GGUF value.
fn json_kv(kv: &Json) -> (String, Value) {
    let key = kv[0].as_str().unwrap().to_string();
    let v = &kv[2];
    let strings = |v: &Json| {
        let mut s = Strings::default();
        v.as_array()
            .unwrap()
            .iter()
            .for_each(|x| s.push(x.as_str().unwrap().as_bytes()));
        s
    };
    let value = match kv[1].as_str().unwrap() {
        "STRING" => Value::String(v.as_str().unwrap().as_bytes().to_vec()),
        "UINT32" => Value::U32(v.as_u64().unwrap() as u32),
        "FLOAT32" => Value::F32(v.as_f64().unwrap() as f32),
        "BOOL" => Value::Bool(v.as_bool().unwrap()),
        "ARRAY:STRING" => Value::Array(Array::String(strings(v))),
        "ARRAY:INT32" => Value::Array(Array::I32(
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap() as i32)
                .collect(),
        )),
        other => panic!("{key}: type {other} not in the fixtures"),
    };
    (key, value)
}

/// Our plan equals a converter output recorded as a GGUFReader view.
fn same_as_view(view: &str, ours: &LlmGguf) -> Json {
    let v: Json = serde_json::from_str(&text(&llm().join("to_gguf").join(view))).unwrap();
    let want: Vec<(String, Value)> = v["kv"].as_array().unwrap().iter().map(json_kv).collect();
    assert_same_kvs(&ours.metadata, &want, view);
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(ours.tensors.len(), tensors.len(), "{view}");
    for (o, t) in ours.tensors.iter().zip(tensors) {
        assert_eq!(o.name, t[0].as_str().unwrap());
        let mut dims: Vec<u64> = t[2]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        dims.reverse();
        assert_eq!(o.shape, dims, "{}", o.name);
        assert_eq!(o.force_f32, t[1] == "F32", "{}", o.name);
    }
    v
}

#[test]
fn qwen2moe_matches_the_converter_with_experts_stacked() {
    let moe = fixtures().join("tiny-moe-sharded");
    let shards: Vec<PathBuf> = (1..=3)
        .map(|i| moe.join(format!("model-0000{i}-of-00003.safetensors")))
        .collect();
    let tensors = source_tensors(&shards);
    let ours = plan(
        &moe.join("config.json"),
        &llm().join("qwen2"),
        &tensors,
        "qwen2moe",
        1,
    );
    same_as_view("qwen2moe.json", &ours);
    let gate = ours
        .tensors
        .iter()
        .find(|t| t.name == "blk.1.ffn_gate_exps.weight")
        .unwrap();
    let want: Vec<String> = (0..4)
        .map(|e| format!("model.layers.1.mlp.experts.{e}.gate_proj.weight"))
        .collect();
    assert_eq!(gate.source, LlmSource::Stack(want));
}

#[test]
fn llama3_rope_factors_are_the_converters_bits() {
    let dir = llm().join("llama");
    let tensors = source_tensors(&[dir.join("model.safetensors")]);
    let config = llm().join("to_gguf/llama3rope.config.json");
    let ours = plan(
        &config,
        &dir,
        &tensors,
        "llama3rope",
        file_type::MOSTLY_Q8_0,
    );
    let view = same_as_view("llama3rope.json", &ours);
    let LlmSource::Generated(f) = &ours.tensors[0].source else {
        panic!("rope_freqs.weight first")
    };
    let want: Vec<f32> = view["rope_freqs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(
        f.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    // Llama 3.1's own settings, through the converter's function.
    let r: Json = serde_json::from_str(&text(&llm().join("to_gguf/rope_llama31.json"))).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "head_dim": 128, "hidden_size": 4096,
        "num_attention_heads": 32, "rope_parameters": r["rope_parameters"],
    });
    let hp = hparams::Hparams::parse(&config.to_string()).unwrap();
    let got = rope::llama3_factors(&hp).unwrap().unwrap();
    let want: Vec<u32> = r["factors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x.as_f64().unwrap() as f32).to_bits())
        .collect();
    assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
}

#[test]
fn linear_and_yarn_rope_and_transformers_defaults_match() {
    // linear.config.json is transformers 4 style: rope_theta and
    // rope_scaling {"type"}, no head_dim, no rms_norm_eps.
    let ours = plan(
        &llm().join("to_gguf/linear.config.json"),
        &llm().join("llama"),
        &[],
        "linear",
        1,
    );
    same_as_view("linear.json", &ours);
    let ours = plan(
        &llm().join("to_gguf/yarn.config.json"),
        &llm().join("qwen2"),
        &[],
        "yarn",
        1,
    );
    same_as_view("yarn.json", &ours);
}

#[test]
fn names_come_back_through_reshards_gguf_to_hf_names() {
    for (model, family) in [("llama", Family::Llama), ("qwen2", Family::Qwen2)] {
        let dir = llm().join(model);
        let tensors = source_tensors(&[dir.join("model.safetensors")]);
        let ours = plan(&dir.join("config.json"), &dir, &tensors, model, 1);
        for t in &ours.tensors {
            let LlmSource::Tensor(src) = &t.source else {
                panic!()
            };
            assert_eq!(hf_name(family, &t.name).as_deref(), Some(src.as_str()));
        }
    }
}
