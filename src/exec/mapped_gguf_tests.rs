//! The GGUF encoder and the FP8 quantizer on the mapped-input path: a
//! Llama-shaped model with tensors larger than [`MAP_MIN`] (so they are
//! mapped, several chunks each; for GGUF the q and k projections a head's
//! rows at a time) gives the same files and records through mappings as
//! through reads.

use std::path::Path;

use super::tests::run_in;
use super::*;
use crate::exec::CopyPath;
use crate::plan::quantize::QuantizeScheme;
use crate::plan::{OutputFormat, Plan, PlanOptions};
use crate::write::manifest::ShardRecord;

/// A one-layer Llama of hidden size 256 (4 heads of 64, 2 kv heads) in
/// f32, the tokenizer of the tiny Llama fixture: q_proj is 256 KiB, the
/// MLP weights 512 KiB.
fn llama(dir: &Path) -> Checkpoint {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/llm/llama");
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    for (key, value) in [
        ("hidden_size", 256),
        ("intermediate_size", 512),
        ("head_dim", 64),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("num_hidden_layers", 1),
    ] {
        config[key] = value.into();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let (h, i, kv, vocab) = (256u64, 512u64, 128u64, 306u64);
    let shapes: [(&str, Vec<u64>); 11] = [
        ("model.embed_tokens.weight", vec![vocab, h]),
        ("model.layers.0.self_attn.q_proj.weight", vec![h, h]),
        ("model.layers.0.self_attn.k_proj.weight", vec![kv, h]),
        ("model.layers.0.self_attn.v_proj.weight", vec![kv, h]),
        ("model.layers.0.self_attn.o_proj.weight", vec![h, h]),
        ("model.layers.0.mlp.gate_proj.weight", vec![i, h]),
        ("model.layers.0.mlp.up_proj.weight", vec![i, h]),
        ("model.layers.0.mlp.down_proj.weight", vec![h, i]),
        ("model.layers.0.input_layernorm.weight", vec![h]),
        ("model.layers.0.post_attention_layernorm.weight", vec![h]),
        ("model.norm.weight", vec![h]),
    ];
    let mut header = serde_json::Map::new();
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut at = 0u64;
    for (n, (name, shape)) in shapes.iter().enumerate() {
        let count: u64 = shape.iter().product();
        let bytes: Vec<u8> = (0..count)
            .flat_map(|k| {
                let s = (k + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (n as u64) << 7;
                (((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0).to_le_bytes()
            })
            .collect();
        let end = at + bytes.len() as u64;
        header.insert(
            (*name).into(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, end]}),
        );
        at = end;
        data.push(bytes);
    }
    let lm_head = data[0].clone();
    header.insert(
        "lm_head.weight".into(),
        serde_json::json!({"dtype": "F32", "shape": [vocab, h], "data_offsets": [at, at + lm_head.len() as u64]}),
    );
    data.push(lm_head);
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let path = dir.join("model.safetensors");
    crate::format::safetensors::write_test_file(&path, &serde_json::Value::Object(header), &slices);
    crate::format::open(dir).unwrap()
}

/// A temporary folder holding [`llama`] under `src/`.
fn llama_in_temp() -> (tempfile::TempDir, Checkpoint) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let ck = llama(&src);
    (tmp, ck)
}

/// Runs `plan` into `dir-map` through mappings and into `dir-read`
/// through reads, asserts the files are byte-identical, and returns the
/// records (mapped, read).
fn both_ways(
    ck: &Checkpoint,
    plan: &Plan,
    dir: &Path,
    window: u64,
) -> (Vec<ShardRecord>, Vec<ShardRecord>) {
    let (fast, slow) = (dir.with_extension("map"), dir.with_extension("read"));
    let mapped = run_in(ck, plan, &fast, CopyPath::Auto, window);
    let read = run_in(ck, plan, &slow, CopyPath::ReadWrite, window);
    assert!(!mapped.is_empty());
    for r in &mapped {
        let a = std::fs::read(fast.join(&r.file)).unwrap();
        let b = std::fs::read(slow.join(&r.file)).unwrap();
        assert!(a == b, "{}: {} differs", dir.display(), r.file);
    }
    (mapped, read)
}

fn gguf_plan(ck: &Checkpoint, quantize: Option<QuantizeScheme>, dtype: Option<Dtype>) -> Plan {
    let options = PlanOptions {
        max_shard_size: u64::MAX,
        quantize,
        dtype,
        format: OutputFormat::Gguf,
        on_overflow: OverflowPolicy::Inf,
        ..PlanOptions::default()
    };
    crate::write::format::plan(ck, &options).unwrap()
}

#[test]
fn gguf_tensors_encode_the_same_from_mappings_as_from_reads() {
    let (tmp, ck) = llama_in_temp();
    let schemes = [
        (Some(QuantizeScheme::Q8_0), None),
        (Some(QuantizeScheme::Q4K), None),
        (None, Some(Dtype::F16)),
    ];
    for (quantize, dtype) in schemes {
        let plan = gguf_plan(&ck, quantize, dtype);
        let permuted = plan.shards[0].tensors.iter().any(|t| {
            matches!(
                t.input,
                TensorInput::ToGgml {
                    permute_heads: Some(_),
                    ..
                }
            )
        });
        assert!(permuted, "{quantize:?}: q and k are permuted");
        // Taken through mappings: eligible, and a layout with room for a
        // head's rows at the smaller window.
        assert!(plan.shards.iter().all(|s| eligible(&ck, s)), "{quantize:?}");
        for window in [1u64 << 20, 16 << 20] {
            let pool = WindowPool::new(window);
            let layout = acquire(&ck, &plan.shards[0], &pool, window as usize / 2).unwrap();
            let layout = layout.expect("a mapped layout");
            assert!(
                layout.map_len < 512 << 10 || window > 1 << 20,
                "{}",
                layout.map_len
            );
            drop(layout);
            let name = format!("{quantize:?}-{dtype:?}-{window}");
            let (mapped, read) = both_ways(&ck, &plan, &tmp.path().join(&name), window);
            assert_eq!(mapped, read, "{name}: records");
        }
    }
}

#[test]
fn fp8_codes_and_scales_are_the_same_from_mappings_as_from_reads() {
    let (tmp, ck) = llama_in_temp();
    let schemes = [
        QuantizeScheme::Fp8Channel,
        QuantizeScheme::Fp8Scaled,
        QuantizeScheme::Fp8ScaledLegacy,
        QuantizeScheme::Fp8Block,
    ];
    for scheme in schemes {
        let options = PlanOptions {
            max_shard_size: u64::MAX,
            quantize: Some(scheme),
            on_overflow: OverflowPolicy::Inf,
            ..PlanOptions::default()
        };
        let plan = crate::write::format::plan(&ck, &options).unwrap();
        let quantized = plan.shards[0]
            .tensors
            .iter()
            .filter(|t| matches!(t.input, TensorInput::Quantized { .. }))
            .count();
        assert!(quantized >= 14, "{scheme:?}: {quantized} codes and scales");
        assert!(plan.shards.iter().all(|s| eligible(&ck, s)), "{scheme:?}");
        // At 1 MiB a mapping holds less than a per-tensor weight (the lead
        // reads it first); at 16 MiB whole weights.
        for window in [1u64 << 20, 16 << 20] {
            let name = format!("{scheme:?}-{window}");
            let (mapped, read) = both_ways(&ck, &plan, &tmp.path().join(&name), window);
            // The error sums may differ in their last bits (they are added
            // chunk by chunk); names, types and bytes may not.
            let key = |records: &[ShardRecord]| -> Vec<(String, String, Dtype)> {
                let tensors = records.iter().flat_map(|r| &r.tensors);
                tensors
                    .map(|t| (t.name.clone(), t.xxh3.clone(), t.dtype))
                    .collect()
            };
            assert_eq!(key(&mapped), key(&read), "{name}: records");
        }
    }
}
