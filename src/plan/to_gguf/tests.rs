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
        "ARRAY:FLOAT32" => Value::Array(Array::F32(
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
        )),
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

/// The plan's metadata and tensors, read back by reshard's GGUF ->
/// transformers direction, give the original config.json's numbers and
/// the original vocabulary. (Llama 3 rope factors are checked against the
/// converter's bits above: the tiny model's 8 factors hold one between
/// the bands, too few for the reverse direction to recover the settings.)
#[test]
fn config_and_vocab_come_back_through_reshards_gguf_to_hf_direction() {
    use crate::format::gguf::Metadata;
    use crate::plan::gguf::{config_json, tokenizer_files};
    let cases = [
        ("llama", llm().join("llama/config.json"), Family::Llama),
        ("qwen2", llm().join("qwen2/config.json"), Family::Qwen2),
    ];
    for (model, config, family) in cases {
        let dir = llm().join(model);
        let tensors = source_tensors(&[dir.join("model.safetensors")]);
        let ours = plan(&config, &dir, &tensors, model, 0);
        let md = Metadata::new(ours.metadata.clone()).unwrap();
        let gguf_tensors: Vec<_> = ours
            .tensors
            .iter()
            .map(|t| crate::format::gguf::GgufTensor {
                name: t.name.clone(),
                ggml_type: GgmlType::F32,
                shape: t.shape.clone(),
                file: 0,
                offset: 0,
                len: Some(t.shape.iter().product::<u64>() * 4),
            })
            .collect();
        let factors = ours.tensors.iter().find_map(|t| match &t.source {
            LlmSource::Generated(f) => Some(f.as_slice()),
            _ => None,
        });
        let back: Json = serde_json::from_str(
            &config_json(
                family,
                &md,
                &gguf_tensors,
                crate::format::Dtype::F32,
                factors,
            )
            .unwrap(),
        )
        .unwrap();
        let original: Json = serde_json::from_str(&text(&config)).unwrap();
        for key in [
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "rms_norm_eps",
            "vocab_size",
            "tie_word_embeddings",
            "eos_token_id",
            "bos_token_id",
            "pad_token_id",
        ] {
            assert_eq!(back[key], original[key], "{model} {key}");
        }
        let rope = &original["rope_parameters"];
        for (k, v) in rope.as_object().unwrap() {
            assert_eq!(
                &back["rope_parameters"][k],
                v,
                "{} rope {k}",
                config.display()
            );
        }
        let files = tokenizer_files(&md).unwrap();
        let tok: Json = serde_json::from_str(&files[0].1).unwrap();
        let orig: Json = serde_json::from_str(&text(&dir.join("tokenizer.json"))).unwrap();
        assert_eq!(tok["model"]["vocab"], orig["model"]["vocab"], "{model}");
        assert_eq!(tok["model"]["merges"], orig["model"]["merges"], "{model}");
    }
}

/// Runs the plan on the llama fixture with `edit` applied to config.json
/// and tokenizer.json, returning the error text.
fn refusal(
    edit_config: impl FnOnce(&mut Json),
    edit_tokenizer: impl FnOnce(&mut Json),
    edit_tensors: impl FnOnce(&mut Vec<(String, Vec<u64>)>),
) -> String {
    let dir = llm().join("llama");
    let mut config: Json = serde_json::from_str(&text(&dir.join("config.json"))).unwrap();
    edit_config(&mut config);
    let mut tok = TokenizerFiles::read(&dir).unwrap();
    let mut tj: Json = serde_json::from_str(tok.tokenizer_json.as_deref().unwrap()).unwrap();
    edit_tokenizer(&mut tj);
    tok.tokenizer_json = Some(tj.to_string());
    let mut tensors = source_tensors(&[dir.join("model.safetensors")]);
    edit_tensors(&mut tensors);
    let config = config.to_string();
    let err = llm_gguf(&LlmInput {
        config_json: &config,
        tokenizer: &tok,
        tensors: &tensors,
        folder_name: "llama",
        file_type: 1,
    })
    .unwrap_err();
    err.to_string()
}

#[test]
fn refusals_name_what_stops_them() {
    let keep = |_: &mut Json| {};
    let all = |_: &mut Vec<(String, Vec<u64>)>| {};
    let e = refusal(
        |c| c["architectures"] = serde_json::json!(["GPT2LMHeadModel"]),
        keep,
        all,
    );
    assert!(
        e.contains("GPT2LMHeadModel") && e.contains("LlamaForCausalLM"),
        "{e}"
    );
    let e = refusal(keep, keep, |t| {
        t.push(("model.layers.0.mlp.extra.weight".into(), vec![4]))
    });
    assert!(
        e.contains("model.layers.0.mlp.extra.weight") && e.contains("llama"),
        "{e}"
    );
    let e = refusal(keep, keep, |t| {
        t.push(("model.layers.01.input_layernorm.weight".into(), vec![4]))
    });
    assert!(e.contains("model.layers.01.input_layernorm.weight"), "{e}");
    let e = refusal(
        keep,
        |t| t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{L}+".into(),
        all,
    );
    assert!(
        e.contains("pre-tokenizer") && e.contains("\\\\p{L}+") && e.contains("llama-bpe"),
        "{e}"
    );
    let e = refusal(keep, |t| t["model"]["ignore_merges"] = false.into(), all);
    assert!(e.contains("ignore_merges false"), "{e}");
    let e = refusal(keep, |t| t["model"]["byte_fallback"] = true.into(), all);
    assert!(e.contains("byte_fallback"), "{e}");
    let e = refusal(|c| c["vocab_size"] = 100.into(), keep, all);
    assert!(e.contains("vocab_size 100"), "{e}");
    let e = refusal(|c| c["num_key_value_heads"] = 3.into(), keep, all);
    assert!(
        e.contains("self_attn.k_proj") && e.contains("3 heads"),
        "{e}"
    );
    let e = refusal(
        |c| c["max_position_embeddings"] = (1u64 << 33).into(),
        keep,
        all,
    );
    assert!(
        e.contains("max_position_embeddings") && e.contains("UINT32"),
        "{e}"
    );
    let e = refusal(
        |c| c["rope_parameters"]["rope_type"] = "longrope".into(),
        keep,
        all,
    );
    assert!(e.contains("longrope"), "{e}");
    let e = refusal(
        keep,
        |t| t["post_processor"] = serde_json::json!({"x": vec![0; 300_000]}),
        all,
    );
    assert!(
        e.contains("tokenizer.json") && e.contains("post_processor"),
        "{e}"
    );
    let e = refusal(keep, keep, |t| t.push(t[0].clone()));
    assert!(e.contains("appears twice"), "{e}");
}

/// A SentencePiece vocabulary (pieces of every type, added_tokens.json,
/// added_tokens_decoder, padding) as the converter wrote it.
#[test]
fn sentencepiece_matches_the_converter() {
    let sp = llm().join("to_gguf/llama2spm");
    let tok = TokenizerFiles::read(&sp).unwrap();
    assert!(tok.tokenizer_json.is_none() && tok.sentencepiece_model.is_some());
    let ours = llm_gguf(&LlmInput {
        config_json: &text(&sp.join("config.json")),
        tokenizer: &tok,
        tensors: &[],
        folder_name: "llama2spm",
        file_type: 1,
    })
    .unwrap();
    same_as_view("llama2spm.json", &ours);
}

#[test]
fn a_broken_sentencepiece_model_is_refused() {
    let good = std::fs::read(llm().join("to_gguf/llama2spm/tokenizer.model")).unwrap();
    for cut in [1, 7, good.len() / 2] {
        let err = spm::pieces(&good[..cut]).unwrap_err().to_string();
        assert!(err.contains("tokenizer.model"), "{err}");
    }
    assert!(spm::pieces(&[]).is_err());
    // Field 1, length 200, in 3 bytes.
    let err = spm::pieces(&[0x0a, 0xc8, 0x01]).unwrap_err().to_string();
    assert!(err.contains("runs past the end"), "{err}");
}

#[test]
fn a_block_missing_an_expert_is_refused() {
    let moe = fixtures().join("tiny-moe-sharded");
    let shards: Vec<PathBuf> = (1..=3)
        .map(|i| moe.join(format!("model-0000{i}-of-00003.safetensors")))
        .collect();
    let mut tensors = source_tensors(&shards);
    tensors.retain(|(n, _)| n != "model.layers.1.mlp.experts.2.up_proj.weight");
    let tok = TokenizerFiles::read(&llm().join("qwen2")).unwrap();
    let err = llm_gguf(&LlmInput {
        config_json: &text(&moe.join("config.json")),
        tokenizer: &tok,
        tensors: &tensors,
        folder_name: "qwen2moe",
        file_type: 1,
    })
    .unwrap_err();
    let e = err.to_string();
    assert!(
        e.contains("block 1") && e.contains("model.layers.1.mlp.experts.2.up_proj.weight"),
        "{e}"
    );
}

#[test]
fn names_and_size_labels_as_gguf_py_writes_them() {
    assert_eq!(general::id_to_title("qwen2moe"), "Qwen2Moe");
    assert_eq!(general::id_to_title("llama"), "Llama");
    assert_eq!(
        general::id_to_title("Llama-3.2-1B-Instruct"),
        "Llama 3.2 1B Instruct"
    );
    assert_eq!(general::id_to_title("mistral-7b-v0.3"), "Mistral 7b v0.3");
    let name = |name_or_path: Option<&str>| {
        let mut kv = kv::Kvs::default();
        general::write(&mut kv, name_or_path, "folder", &[]);
        kv.0.iter()
            .filter(|(k, _)| k != "general.type")
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        name(Some("meta-llama/Llama-2-7b-hf")),
        [
            "general.name=Llama 2 7b Hf",
            "general.organization=Meta Llama"
        ]
    );
    assert_eq!(name(Some("/home/me/models/x")), ["general.name=Folder"]);
    assert_eq!(name(Some("my model")), ["general.name=My Model"]);
    let t = |shape: Vec<u64>| LlmTensor {
        name: "x.weight".into(),
        source: LlmSource::Generated(vec![]),
        shape,
        permute_heads: None,
        force_f32: false,
    };
    let label = |ts: &[LlmTensor]| {
        let mut kv = kv::Kvs::default();
        general::write(&mut kv, None, "m", ts);
        kv.0.iter()
            .find(|(k, _)| k == "general.size_label")
            .and_then(|(_, v)| v.as_str().map(str::to_string))
    };
    assert_eq!(label(&[t(vec![1000, 8030])]).as_deref(), Some("8.0M"));
    assert_eq!(label(&[t(vec![113_000])]).as_deref(), Some("113K"));
    assert_eq!(label(&[t(vec![7_241_732_096])]).as_deref(), Some("7.2B"));
    assert_eq!(label(&[]), None);
}

/// The plan of the llama fixture with tokenizer.json and
/// tokenizer_config.json edited.
fn edited(edit_tokenizer: impl FnOnce(&mut Json), edit_config: impl FnOnce(&mut Json)) -> LlmGguf {
    let dir = llm().join("llama");
    let mut tok = TokenizerFiles::read(&dir).unwrap();
    let mut tj: Json = serde_json::from_str(tok.tokenizer_json.as_deref().unwrap()).unwrap();
    edit_tokenizer(&mut tj);
    tok.tokenizer_json = Some(tj.to_string());
    let mut tc: Json = serde_json::from_str(tok.tokenizer_config_json.as_deref().unwrap()).unwrap();
    edit_config(&mut tc);
    tok.tokenizer_config_json = Some(tc.to_string());
    llm_gguf(&LlmInput {
        config_json: &text(&dir.join("config.json")),
        tokenizer: &tok,
        tensors: &[],
        folder_name: "llama",
        file_type: 1,
    })
    .unwrap()
}

fn keys(g: &LlmGguf) -> Vec<&str> {
    g.metadata.iter().map(|(k, _)| k.as_str()).collect()
}

#[test]
fn gpt2_byte_level_is_named_gpt_2() {
    let g = edited(
        |t| {
            t["pre_tokenizer"] = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true});
            t["model"]["ignore_merges"] = false.into();
        },
        |_| {},
    );
    let pre = g
        .metadata
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.pre")
        .unwrap();
    assert_eq!(pre.1.as_str(), Some("gpt-2"));
}

#[test]
fn llamas_add_prefix_space_comes_before_the_vocabulary() {
    let g = edited(|_| {}, |c| c["add_prefix_space"] = false.into());
    let k = keys(&g);
    let at = k
        .iter()
        .position(|k| *k == "tokenizer.ggml.add_space_prefix")
        .unwrap();
    assert_eq!(k[at + 1], "tokenizer.ggml.model");
    assert_eq!(g.metadata[at].1, Value::Bool(false));
}

#[test]
fn a_template_ending_in_a_token_adds_eos_and_keeps_the_old_one_as_eot() {
    // tokenizer_config's eos is <|eot_id|> (304); a template that ends in
    // <|end_of_text|> (301) makes that the EOS and <|eot_id|> the EOT.
    let g = edited(
        |t| {
            let pp = &mut t["post_processor"]["processors"][1];
            pp["single"] = serde_json::json!([
                {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|end_of_text|>", "type_id": 0}}
            ]);
        },
        |_| {},
    );
    let get = |key: &str| {
        g.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("tokenizer.ggml.eos_token_id"), Some(Value::U32(301)));
    assert_eq!(get("tokenizer.ggml.eot_token_id"), Some(Value::U32(304)));
    assert_eq!(get("tokenizer.ggml.add_eos_token"), Some(Value::Bool(true)));
}

proptest::proptest! {
    #[test]
    fn any_bytes_as_a_sentencepiece_model_fail_cleanly(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
        let _ = spm::pieces(&bytes);
    }
}

/// Mixtral (llama architecture): experts stacked w1, w2, w3 as
/// ffn_gate_exps, ffn_down_exps, ffn_up_exps, the router in F32, q/k rows
/// permuted, no key_length (MixtralConfig leaves head_dim empty).
#[test]
fn mixtral_matches_the_converter() {
    let view: Json = serde_json::from_str(&text(&llm().join("to_gguf/mixtral.json"))).unwrap();
    let tensors: Vec<(String, Vec<u64>)> = view["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let shape = s[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap());
            (s[0].as_str().unwrap().to_string(), shape.collect())
        })
        .collect();
    let config = llm().join("to_gguf/mixtral.config.json");
    let ours = plan(
        &config,
        &llm().join("llama"),
        &tensors,
        "mixtral",
        file_type::MOSTLY_Q8_0,
    );
    same_as_view("mixtral.json", &ours);
    let down = ours
        .tensors
        .iter()
        .find(|t| t.name == "blk.0.ffn_down_exps.weight")
        .unwrap();
    let want: Vec<String> = (0..4)
        .map(|e| format!("model.layers.0.block_sparse_moe.experts.{e}.w2.weight"))
        .collect();
    assert_eq!(down.source, LlmSource::Stack(want));
    let q = ours
        .tensors
        .iter()
        .find(|t| t.name == "blk.1.attn_q.weight")
        .unwrap();
    assert_eq!(q.permute_heads, Some(4));
}
