//! Unit tests of the GGUF -> Hugging Face semantics: the rotary
//! permutation against numpy's formula, and names, config and tokenizer
//! against the committed fixtures in tests/fixtures/gguf/llm (tiny
//! transformers models and what llama.cpp's own converter made of them;
//! make.py there says how).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::format::gguf::value::{Strings, Value as GValue};
use crate::format::gguf::{self, GgufModel, Metadata};
use crate::format::Dtype;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/llm")
}

fn open(name: &str) -> GgufModel {
    gguf::open(&fixtures().join(name)).unwrap()
}

fn json_file(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Tensor names and shapes of a safetensors file, from its header.
fn safetensors_shapes(path: &Path) -> BTreeMap<String, Vec<u64>> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let shape = v["shape"].as_array().unwrap();
            (
                k.clone(),
                shape.iter().map(|d| d.as_u64().unwrap()).collect(),
            )
        })
        .collect()
}

/// What numpy's `w.reshape(heads, 2, d // 2).swapaxes(1, 2).reshape(-1)`
/// holds, element by element, for `w = arange(rows)`: GGUF row `g` holds
/// Hugging Face row `forward[g]`.
fn numpy_forward(rows: u64, heads: u64) -> Vec<u64> {
    let per_head = rows / heads;
    let half = per_head / 2;
    let mut out = Vec::new();
    // Iterating the swapped (heads, half, 2) array in C order reads the
    // original (heads, 2, half) array at [h, a, b].
    for h in 0..heads {
        for b in 0..half {
            for a in 0..2 {
                out.push(h * per_head + a * half + b);
            }
        }
    }
    out
}

/// The stream's row map (`crate::cast::gguf::unpermuted_row`, which counts
/// inside one head) over a whole tensor of `rows` rows.
fn unpermuted_row(row: u64, rows: u64, heads: u64) -> u64 {
    let per_head = rows / heads;
    row / per_head * per_head + crate::cast::gguf::unpermuted_row(row % per_head, per_head)
}

/// llama.cpp's forward permutation: the Hugging Face row GGUF row `row` holds.
fn permuted_row(row: u64, rows: u64, heads: u64) -> u64 {
    let per_head = rows / heads;
    let (head, r) = (row / per_head, row % per_head);
    head * per_head + (r % 2) * (per_head / 2) + r / 2
}

#[test]
fn unpermuted_rows_by_hand() {
    // np.arange(8).reshape(1, 2, 4).swapaxes(1, 2).reshape(8)
    // = [0, 4, 1, 5, 2, 6, 3, 7]: HF row 4 sits at GGUF row 1.
    let un: Vec<u64> = (0..8).map(|r| unpermuted_row(r, 8, 1)).collect();
    assert_eq!(un, [0, 2, 4, 6, 1, 3, 5, 7]);
    assert_eq!(numpy_forward(8, 1), [0, 4, 1, 5, 2, 6, 3, 7]);
    // Two heads of 6: [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11].
    assert_eq!(numpy_forward(12, 2), [0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11]);
    let un: Vec<u64> = (0..12).map(|r| unpermuted_row(r, 12, 2)).collect();
    assert_eq!(un, [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
    // Heads of 2 rows are left as they are.
    assert!((0..6).all(|r| unpermuted_row(r, 6, 3) == r));
}

proptest! {
    #[test]
    fn unpermuting_inverts_numpy(heads in 1u64..9, half in 1u64..17) {
        let rows = heads * half * 2;
        let forward = numpy_forward(rows, heads);
        let mut seen = vec![false; rows as usize];
        for r in 0..rows {
            let g = unpermuted_row(r, rows, heads);
            prop_assert!(g < rows);
            prop_assert!(!seen[g as usize], "row {} read twice", g);
            seen[g as usize] = true;
            // GGUF row g holds HF row forward[g]: it must be r.
            prop_assert_eq!(forward[g as usize], r);
            prop_assert_eq!(permuted_row(g, rows, heads), r);
            prop_assert_eq!(unpermuted_row(permuted_row(r, rows, heads), rows, heads), r);
        }
    }
}

/// Every tensor of `file` has a Hugging Face name or a reason to be left
/// out, and the names are the original model's tensors (less a tied
/// lm_head), with the same shapes.
fn names_match(file: &str, model_dir: &str, family: Family) {
    let model = open(file);
    assert_eq!(Family::of(&model.metadata), Some(family));
    let original = safetensors_shapes(&fixtures().join(model_dir).join("model.safetensors"));
    let mut mapped = BTreeMap::new();
    for t in &model.tensors {
        match hf_name(family, &t.name) {
            Some(hf) => assert!(mapped.insert(hf, t.shape.clone()).is_none(), "{}", t.name),
            None => assert!(
                skip_reason(family, &t.name).is_some(),
                "{} has no name",
                t.name
            ),
        }
    }
    assert_eq!(mapped, original, "{file}");
}

#[test]
fn every_tensor_maps_to_the_original_names() {
    names_match("llama-q8_0.gguf", "llama", Family::Llama);
    names_match("llama-f16.gguf", "llama", Family::Llama);
    // Qwen2 ties its embeddings: neither file has lm_head.
    names_match("qwen2-q8_0.gguf", "qwen2", Family::Qwen2);
}

#[test]
fn names_of_each_family() {
    let l = Family::Llama;
    assert_eq!(
        hf_name(l, "blk.3.attn_q.weight").as_deref(),
        Some("model.layers.3.self_attn.q_proj.weight")
    );
    assert_eq!(
        hf_name(l, "blk.10.ffn_norm.weight").as_deref(),
        Some("model.layers.10.post_attention_layernorm.weight")
    );
    assert_eq!(
        hf_name(l, "output.weight").as_deref(),
        Some("lm_head.weight")
    );
    assert_eq!(
        hf_name(Family::Qwen2, "blk.0.attn_k.bias").as_deref(),
        Some("model.layers.0.self_attn.k_proj.bias")
    );
    assert_eq!(
        hf_name(Family::Qwen3, "blk.1.attn_q_norm.weight").as_deref(),
        Some("model.layers.1.self_attn.q_norm.weight")
    );
    for (family, name) in [
        (l, "blk.0.attn_q_norm.weight"),
        (Family::Qwen2, "blk.0.attn_output.bias"),
        (Family::Qwen2, "blk.0.ffn_up.bias"),
        (l, "blk.01.attn_q.weight"),
        (l, "blk..attn_q.weight"),
        (l, "blk.0.attn_q.scale"),
        (l, "blk.0.attn_norm.bias"),
        (l, "rope_freqs.weight"),
        (l, "token_embd.bias"),
    ] {
        assert_eq!(hf_name(family, name), None, "{name}");
    }
    assert!(skip_reason(l, "rope_freqs.weight").is_some());
    assert!(skip_reason(l, "blk.0.attn_q.scale").is_none());
}

#[test]
fn q_and_k_of_llama_only_are_permuted() {
    let model = open("llama-q8_0.gguf");
    let heads: BTreeMap<&str, u64> = model
        .tensors
        .iter()
        .filter_map(|t| {
            permuted_heads(Family::Llama, &model.metadata, t)
                .unwrap()
                .map(|h| (t.name.as_str(), h))
        })
        .collect();
    let want: BTreeMap<&str, u64> = [
        ("blk.0.attn_q.weight", 4),
        ("blk.0.attn_k.weight", 2),
        ("blk.1.attn_q.weight", 4),
        ("blk.1.attn_k.weight", 2),
    ]
    .into();
    assert_eq!(heads, want);
    let qwen = open("qwen2-q8_0.gguf");
    for t in &qwen.tensors {
        assert_eq!(
            permuted_heads(Family::Qwen2, &qwen.metadata, t).unwrap(),
            None
        );
    }
    let mut odd = model
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.attn_k.weight")
        .unwrap()
        .clone();
    odd.shape[0] = 34;
    let err = permuted_heads(Family::Llama, &model.metadata, &odd).unwrap_err();
    assert!(err.to_string().contains("blk.0.attn_k.weight"), "{err}");
}

/// The config fields transformers reads, as the original config.json
/// states them.
fn config_matches(file: &str, model_dir: &str, family: Family) {
    let model = open(file);
    let text = config_json(family, &model.metadata, &model.tensors, Dtype::BF16, None).unwrap();
    let ours: Value = serde_json::from_str(&text).unwrap();
    let theirs = json_file(&fixtures().join(model_dir).join("config.json"));
    for key in [
        "architectures",
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_parameters",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "attention_bias",
        "mlp_bias",
        "hidden_act",
        "use_sliding_window",
        "sliding_window",
        "layer_types",
    ] {
        assert_eq!(ours.get(key), theirs.get(key), "{file}: {key}");
    }
    assert_eq!(ours["dtype"], "bfloat16");
    assert_eq!(ours["rope_theta"], theirs["rope_parameters"]["rope_theta"]);
}

#[test]
fn config_matches_the_original() {
    config_matches("llama-q8_0.gguf", "llama", Family::Llama);
    config_matches("llama-f16.gguf", "llama", Family::Llama);
    config_matches("qwen2-q8_0.gguf", "qwen2", Family::Qwen2);
}

#[test]
fn generation_config_names_the_special_ids() {
    let model = open("qwen2-q8_0.gguf");
    let text = generation_config_json(&model.metadata).unwrap().unwrap();
    let ours: Value = serde_json::from_str(&text).unwrap();
    let theirs = json_file(&fixtures().join("qwen2/generation_config.json"));
    for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        assert_eq!(ours.get(key), theirs.get(key), "{key}");
    }
}

/// Metadata with one key replaced (or removed, for `None`).
fn with_key(md: &Metadata, key: &str, value: Option<GValue>) -> Metadata {
    let mut kvs: Vec<(String, GValue)> = md
        .iter()
        .filter(|(k, _)| *k != key)
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    if let Some(v) = value {
        kvs.push((key.to_string(), v));
    }
    Metadata::new(kvs).unwrap()
}

#[test]
fn config_errors_name_the_key() {
    let model = open("llama-q8_0.gguf");
    for key in [
        "llama.block_count",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.context_length",
    ] {
        let md = with_key(&model.metadata, key, None);
        let err = config_json(Family::Llama, &md, &model.tensors, Dtype::F32, None).unwrap_err();
        assert!(err.to_string().contains(key), "{err}");
    }
    let md = with_key(
        &model.metadata,
        "llama.block_count",
        Some(GValue::String(b"2".to_vec())),
    );
    let err = config_json(Family::Llama, &md, &model.tensors, Dtype::F32, None).unwrap_err();
    assert!(err.to_string().contains("llama.block_count"), "{err}");
    let md = with_key(
        &model.metadata,
        "llama.rope.scaling.type",
        Some(GValue::String(b"longrope".to_vec())),
    );
    let err = config_json(Family::Llama, &md, &model.tensors, Dtype::F32, None).unwrap_err();
    assert!(err.to_string().contains("longrope"), "{err}");
    let md = with_key(
        &model.metadata,
        "general.architecture",
        Some(GValue::String(b"gemma3".to_vec())),
    );
    assert_eq!(Family::of(&md), None);
    assert!(Family::require(&md)
        .unwrap_err()
        .to_string()
        .contains("gemma3"));
}

#[test]
fn rope_scaling_of_each_kind() {
    let model = open("llama-q8_0.gguf");
    let md = with_key(
        &model.metadata,
        "llama.rope.scaling.type",
        Some(GValue::String(b"linear".to_vec())),
    );
    let md = with_key(&md, "llama.rope.scaling.factor", Some(GValue::F32(4.0)));
    let c: Value = serde_json::from_str(
        &config_json(Family::Llama, &md, &model.tensors, Dtype::F32, None).unwrap(),
    )
    .unwrap();
    assert_eq!(
        c["rope_parameters"],
        serde_json::json!({"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0})
    );

    // Llama 3.1's settings, with a Llama 3.1 head (128) and theta.
    let l3 = config::Llama3Rope {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let factors: Vec<f32> = l3
        .factors(500000.0, 128)
        .iter()
        .map(|&x| x as f32)
        .collect();
    let md = with_key(
        &model.metadata,
        "llama.attention.key_length",
        Some(GValue::U32(128)),
    );
    let mut tensors = model.tensors.clone();
    let mut freqs = tensors[0].clone();
    freqs.name = ROPE_FREQS.into();
    freqs.shape = vec![64];
    tensors.push(freqs);
    let err = config_json(Family::Llama, &md, &tensors, Dtype::F32, None).unwrap_err();
    assert!(err.to_string().contains(ROPE_FREQS), "{err}");
    let c: Value = serde_json::from_str(
        &config_json(Family::Llama, &md, &tensors, Dtype::F32, Some(&factors)).unwrap(),
    )
    .unwrap();
    assert_eq!(
        c["rope_parameters"],
        serde_json::json!({
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        })
    );
    let mut wrong = factors.clone();
    wrong[30] *= 1.5;
    let err = config_json(Family::Llama, &md, &tensors, Dtype::F32, Some(&wrong)).unwrap_err();
    assert!(err.to_string().contains(ROPE_FREQS), "{err}");
}

fn tokenizer_of(file: &str) -> (Value, Value) {
    let model = open(file);
    let files: BTreeMap<String, String> = tokenizer_files(&model.metadata)
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(
        files.keys().map(String::as_str).collect::<Vec<_>>(),
        ["tokenizer.json", "tokenizer_config.json"]
    );
    (
        serde_json::from_str(&files["tokenizer.json"]).unwrap(),
        serde_json::from_str(&files["tokenizer_config.json"]).unwrap(),
    )
}

/// Every token by id, from model.vocab and added_tokens together (what
/// `get_vocab()` returns).
fn all_tokens(tok: &Value) -> BTreeMap<u64, String> {
    let mut out: BTreeMap<u64, String> = tok["model"]["vocab"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(t, id)| (id.as_u64().unwrap(), t.clone()))
        .collect();
    for a in tok["added_tokens"].as_array().unwrap() {
        out.insert(
            a["id"].as_u64().unwrap(),
            a["content"].as_str().unwrap().into(),
        );
    }
    out
}

fn tokenizer_matches(file: &str, model_dir: &str) {
    let (ours, cfg) = tokenizer_of(file);
    let dir = fixtures().join(model_dir);
    let theirs = json_file(&dir.join("tokenizer.json"));
    assert_eq!(all_tokens(&ours), all_tokens(&theirs), "{file}: vocabulary");
    assert_eq!(
        ours["model"]["merges"], theirs["model"]["merges"],
        "{file}: merges"
    );
    for key in ["added_tokens", "normalizer", "pre_tokenizer"] {
        assert_eq!(ours[key], theirs[key], "{file}: {key}");
    }
    // ByteLevel decoding ignores its flags (and the tokenizers package
    // saves its defaults whatever it is given).
    assert_eq!(
        ours["decoder"]["type"], theirs["decoder"]["type"],
        "{file}: decoder"
    );
    for key in ["type", "ignore_merges", "byte_fallback", "unk_token"] {
        assert_eq!(
            ours["model"][key], theirs["model"][key],
            "{file}: model.{key}"
        );
    }
    let theirs_cfg = json_file(&dir.join("tokenizer_config.json"));
    for key in [
        "bos_token",
        "eos_token",
        "pad_token",
        "add_bos_token",
        "model_max_length",
    ] {
        assert_eq!(cfg.get(key), theirs_cfg.get(key), "{file}: {key}");
    }
    let template = std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap();
    assert_eq!(cfg["chat_template"], template.as_str());
}

#[test]
fn tokenizer_matches_the_original() {
    tokenizer_matches("llama-q8_0.gguf", "llama");
    tokenizer_matches("qwen2-q8_0.gguf", "qwen2");
    // Llama adds its BOS the way the original's template does.
    let (ours, _) = tokenizer_of("llama-f16.gguf");
    let theirs = json_file(&fixtures().join("llama/tokenizer.json"));
    assert_eq!(
        ours["post_processor"],
        theirs["post_processor"]["processors"][1]
    );
}

#[test]
fn tokenizer_refuses_what_it_cannot_build() {
    let model = open("qwen2-q8_0.gguf");
    let md = with_key(
        &model.metadata,
        "tokenizer.ggml.pre",
        Some(GValue::String(b"tekken".to_vec())),
    );
    let err = tokenizer_files(&md).unwrap_err();
    assert!(err.to_string().contains("\"tekken\""), "{err}");
    let md = with_key(
        &model.metadata,
        "tokenizer.ggml.model",
        Some(GValue::String(b"t5".to_vec())),
    );
    let err = tokenizer_files(&md).unwrap_err();
    assert!(err.to_string().contains("\"t5\""), "{err}");
    let md = with_key(&model.metadata, "tokenizer.ggml.merges", None);
    let err = tokenizer_files(&md).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.merges"), "{err}");
    let md = with_key(
        &model.metadata,
        "tokenizer.ggml.eos_token_id",
        Some(GValue::U32(100_000)),
    );
    let err = tokenizer_files(&md).unwrap_err();
    assert!(
        err.to_string().contains("tokenizer.ggml.eos_token_id"),
        "{err}"
    );
    let mut merges = Strings::default();
    merges.push(b"nospace");
    let md = with_key(
        &model.metadata,
        "tokenizer.ggml.merges",
        Some(GValue::Array(gguf::value::Array::String(merges))),
    );
    let err = tokenizer_files(&md).unwrap_err();
    assert!(err.to_string().contains("entry 0"), "{err}");
}

#[test]
fn an_embedded_tokenizer_json_is_written_as_is() {
    let model = open("qwen2-q8_0.gguf");
    let embedded = "{\"version\": \"1.0\", \"model\": {}}";
    let md = with_key(
        &model.metadata,
        "tokenizer.huggingface.json",
        Some(GValue::String(embedded.as_bytes().to_vec())),
    );
    let files = tokenizer_files(&md).unwrap();
    assert_eq!(
        files[0],
        ("tokenizer.json".to_string(), embedded.to_string())
    );
    let names: BTreeSet<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains("tokenizer_config.json"));
}
