//! "Make it fit" on checkpoints shaped like real ones, written as sparse
//! files (the header and a hole: the error estimate's sample reads zeros,
//! so ties keep the table's order), each case saying why its choice is
//! the highest-precision form that fits; and one small dense file whose
//! sampled errors reorder a width.

use std::path::{Path, PathBuf};

use super::*;
use crate::fit::loader::Os;
use crate::fit::machine::{Detected, Given};
use crate::fit::program::program;

const GIB: u64 = 1 << 30;

/// FLUX.1-dev's transformer as one bf16 file: 19 double and 38 single
/// blocks of width 3072 and the input and output layers, 11.9 billion
/// weights, 23.7 GB (the shapes tests/cli/fit_for.rs writes as a file).
fn flux_shapes() -> Vec<(String, Vec<u64>)> {
    serde_json::from_str(include_str!("../../tests/fixtures/flux1-dev-shapes.json")).unwrap()
}

fn flux(dir: &Path) -> Checkpoint {
    open(&sparse(
        dir,
        "flux1-dev.safetensors",
        &flux_shapes(),
        Dtype::BF16,
    ))
}

/// A safetensors file of `shapes` in `dtype` whose data section is a
/// hole: only the header is written, so a 24 GB model costs nothing, and
/// the error estimate's sample is all zeros ("n/a").
fn sparse(dir: &Path, name: &str, shapes: &[(String, Vec<u64>)], dtype: Dtype) -> PathBuf {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, shape) in shapes {
        let len = shape.iter().product::<u64>() * (dtype.bits() / 8);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let path = dir.join(name);
    let mut json = serde_json::to_vec(&header).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&json);
    std::fs::write(&path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(bytes.len() as u64 + offset).unwrap();
    path
}

/// Writes F32 `value(i)` for every element of the sparse F32 file at
/// `path` (its data section in order), so its sample is not zeros.
fn fill_f32(path: &Path, value: impl Fn(u64) -> f32) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut n = [0u8; 8];
    f.read_exact(&mut n).unwrap();
    let start = 8 + u64::from_le_bytes(n);
    let len = f.metadata().unwrap().len() - start;
    let data: Vec<u8> = (0..len / 4).flat_map(|i| value(i).to_le_bytes()).collect();
    f.seek(SeekFrom::Start(start)).unwrap();
    f.write_all(&data).unwrap();
}

fn open(path: &Path) -> Checkpoint {
    crate::format::open(path).unwrap()
}

fn machine(os: Os, ram: u64, pagefile: u64, vram: Option<u64>) -> Machine {
    let given = Given {
        os: Some(os),
        ram: Some(ram),
        pagefile: Some(pagefile),
        commit_limit: None,
        vram,
    };
    Machine::resolve(&given, &Detected::default(), Os::Linux)
}

fn plan_for(ck: &Checkpoint, m: Machine, name: &str) -> MakeFit {
    let options = FitOptions {
        path: ck.files[0]
            .path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into(),
        ..FitOptions::default()
    };
    make_fit(ck, m, &options, program(name).unwrap(), None).unwrap()
}

fn forms(r: &MakeFit) -> Vec<(Form, bool, u8)> {
    r.candidates
        .iter()
        .map(|c| (c.form, c.fits, super::placement_rank(&c.placement)))
        .collect()
}

#[test]
fn flux_on_a_12_gib_windows_card_in_comfyui_offloads_the_bf16_weights() {
    // 23.8 GB of weights against ComfyUI's 0.88 x 12 GiB - 1.4 GiB = 9.2
    // GiB: no form ComfyUI reads (8-bit at best: 11.9 GB) fits VRAM, and it
    // offloads in lowvram mode, so the highest precision whose host side
    // fits wins: the model as it is.
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Windows, 32 * GIB, 32 * GIB, Some(12 * GIB)),
        "comfyui",
    );
    let best = r.best().unwrap();
    assert!(
        matches!(best.placement, Placement::Offload { .. }),
        "{:?}",
        forms(&r)
    );
    assert_eq!(best.form, Form::AsIs, "{:?}", forms(&r));
    assert!(r.candidates.iter().all(|c| c.placement != Placement::Gpu));
    // Bits per weight: 16 as is; 8 and a little for the FP8 layouts,
    // whose kept input and output layers and norms stay bf16.
    for c in &r.candidates {
        let bits = c.bits_per_weight;
        match c.form {
            Form::AsIs | Form::F16 => assert_eq!(bits, 16.0),
            _ => assert!(bits > 8.0 && bits < 9.0, "{:?} {bits}", c.form),
        }
    }
}

#[test]
fn flux_on_a_12_gib_card_with_comfyui_gguf_takes_the_best_gguf_that_fits_whole() {
    // ComfyUI-GGUF reads GGUF: Q8_0 (8.5 bits, 12.6 GB) is over the
    // 9.85 GB (0.88 x 12 GiB - 1.4 GiB) budget, Q6_K (6.56 bits, 9.74 GB)
    // fits it whole, and a form wholly on the GPU beats any that offloads.
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Windows, 32 * GIB, 32 * GIB, Some(12 * GIB)),
        "comfyui-gguf",
    );
    let best = r.best().unwrap();
    assert_eq!(best.placement, Placement::Gpu, "{:?}", forms(&r));
    assert_eq!(best.form, Form::Q6K, "{:?}", forms(&r));
    assert!(best.vram_weights < r.vram_budget.unwrap());
    let q8 = r.candidates.iter().find(|c| c.form == Form::Q8_0).unwrap();
    assert!(matches!(q8.placement, Placement::Offload { .. }));
    let cmd = best.command.as_deref().unwrap();
    assert!(cmd.ends_with("OUT.gguf --quantize q6_k"), "{cmd}");
}

#[test]
fn flux_in_invokeai_counts_scaled_fp8_as_the_bf16_it_folds_into() {
    // InvokeAI folds scaled FP8 into bf16 on load and keeps whole models
    // on the GPU: fp8-scaled needs the bf16 23.8 GB of VRAM, so on a 16
    // GiB card (15 GiB for weights) it does not fit, and the best that
    // fits whole is GGUF Q8_0 (8.5 bits, 12.6 GB).
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Linux, 64 * GIB, 0, Some(16 * GIB)),
        "invokeai",
    );
    let scaled = r
        .candidates
        .iter()
        .find(|c| c.form == Form::Fp8Scaled)
        .unwrap();
    let as_is = r.candidates.iter().find(|c| c.form == Form::AsIs).unwrap();
    assert_eq!(scaled.vram_weights, as_is.vram_weights);
    assert!(matches!(scaled.placement, Placement::TooBigForVram { .. }));
    assert_eq!(r.best().unwrap().form, Form::Q8_0, "{:?}", forms(&r));
}

#[test]
fn when_nothing_fits_the_smallest_machine_is_named() {
    // vLLM neither offloads nor reads a 4-bit form: on a 4 GiB card the
    // smallest it reads (8-bit, 13.0 GB with the kept layers) needs that
    // and the 1 GiB reserve.
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Linux, 64 * GIB, 0, Some(4 * GIB)),
        "vllm",
    );
    assert!(r.best().is_none(), "{:?}", forms(&r));
    let m = r.smallest_machine.as_ref().unwrap();
    let smallest = r.candidates.iter().map(|c| c.vram_weights).min().unwrap();
    assert_eq!(m.vram, Some(smallest + DEFAULT_RESERVE));
    assert!(matches!(m.form, Form::Fp8Channel | Form::Fp8Block));
}

/// The best candidate is the first that fits, and none that fits is more
/// precise at the same or a better placement: the ranking the tests state.
fn assert_highest_precision_that_fits(r: &MakeFit) -> &Candidate {
    let best = r
        .best()
        .unwrap_or_else(|| panic!("nothing fits: {:?}", forms(r)));
    let rank = |c: &Candidate| (super::placement_rank(&c.placement), c.form.class());
    for c in r.candidates.iter().filter(|c| c.fits) {
        assert!(rank(c) >= rank(best), "{:?} beats {:?}", c.form, best.form);
    }
    best
}

/// A Llama-layout decoder (Llama, Qwen2): embeddings, `layers` blocks of
/// attention (q/k/v biases for Qwen2) and a gated MLP, the final norm and
/// an untied head.
struct Decoder {
    hidden: u64,
    intermediate: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    vocab: u64,
    qkv_bias: bool,
}

impl Decoder {
    /// Qwen2-14B-shaped (Qwen2.5-14B's config): 14.8 billion weights,
    /// 27.51 GiB of bf16.
    const QWEN2_14B: Decoder = Decoder {
        hidden: 5120,
        intermediate: 13824,
        layers: 48,
        heads: 40,
        kv_heads: 8,
        vocab: 152064,
        qkv_bias: true,
    };
    /// TinyLlama-1.1B: 1.1 billion weights, 2.05 GiB of bf16.
    const TINYLLAMA: Decoder = Decoder {
        hidden: 2048,
        intermediate: 5632,
        layers: 22,
        heads: 32,
        kv_heads: 4,
        vocab: 32000,
        qkv_bias: false,
    };

    fn shapes(&self) -> Vec<(String, Vec<u64>)> {
        let (h, i) = (self.hidden, self.intermediate);
        let kv = self.kv_heads * (h / self.heads);
        let mut s = vec![("model.embed_tokens.weight".to_string(), vec![self.vocab, h])];
        for l in 0..self.layers {
            let p = |n: &str| format!("model.layers.{l}.{n}");
            s.push((p("input_layernorm.weight"), vec![h]));
            for (name, rows) in [("q_proj", h), ("k_proj", kv), ("v_proj", kv)] {
                s.push((p(&format!("self_attn.{name}.weight")), vec![rows, h]));
                if self.qkv_bias {
                    s.push((p(&format!("self_attn.{name}.bias")), vec![rows]));
                }
            }
            s.push((p("self_attn.o_proj.weight"), vec![h, h]));
            s.push((p("post_attention_layernorm.weight"), vec![h]));
            s.push((p("mlp.gate_proj.weight"), vec![i, h]));
            s.push((p("mlp.up_proj.weight"), vec![i, h]));
            s.push((p("mlp.down_proj.weight"), vec![h, i]));
        }
        s.push(("model.norm.weight".into(), vec![h]));
        s.push(("lm_head.weight".into(), vec![self.vocab, h]));
        s
    }

    /// The model's config.json, on the tiny Llama fixture's (whose
    /// tokenizer files a GGUF output reads).
    fn config(&self, architecture: &str) -> serde_json::Value {
        let mut c: serde_json::Value = serde_json::from_str(include_str!(
            "../../tests/fixtures/gguf/llm/llama/config.json"
        ))
        .unwrap();
        c["architectures"] = serde_json::json!([architecture]);
        c["hidden_size"] = self.hidden.into();
        c["intermediate_size"] = self.intermediate.into();
        c["num_hidden_layers"] = self.layers.into();
        c["num_attention_heads"] = self.heads.into();
        c["num_key_value_heads"] = self.kv_heads.into();
        c["head_dim"] = (self.hidden / self.heads).into();
        c["vocab_size"] = self.vocab.into();
        c["dtype"] = "bfloat16".into();
        c
    }

    /// A model folder: config.json, the fixture's tokenizer, and the
    /// weights as `shards` sparse bf16 files with their index.
    fn folder(&self, dir: &Path, architecture: &str, shards: usize) -> Checkpoint {
        let write = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
        write("config.json", self.config(architecture).to_string());
        let llama = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/llm/llama");
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(llama.join(f), dir.join(f)).unwrap();
        }
        let shapes = self.shapes();
        if shards == 1 {
            sparse(dir, "model.safetensors", &shapes, Dtype::BF16);
            return open(dir);
        }
        let bytes = |s: &(String, Vec<u64>)| s.1.iter().product::<u64>() * 2;
        let total: u64 = shapes.iter().map(bytes).sum();
        let mut parts: Vec<Vec<(String, Vec<u64>)>> = vec![Vec::new()];
        let mut in_part = 0;
        for s in shapes {
            if in_part >= total / shards as u64 && parts.len() < shards {
                parts.push(Vec::new());
                in_part = 0;
            }
            in_part += bytes(&s);
            parts.last_mut().unwrap().push(s);
        }
        let mut weight_map = serde_json::Map::new();
        for (k, part) in parts.iter().enumerate() {
            let name = format!("model-{:05}-of-{:05}.safetensors", k + 1, parts.len());
            sparse(dir, &name, part, Dtype::BF16);
            for (t, _) in part {
                weight_map.insert(t.clone(), name.clone().into());
            }
        }
        let index =
            serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        write("model.safetensors.index.json", index.to_string());
        open(dir)
    }
}

/// Wan 2.1 T2V 14B's transformer (the layout ComfyUI loads): 40 blocks of
/// width 5120 with self and cross attention and a 13824-wide FFN, 14.3
/// billion weights, 26.6 GiB of bf16.
fn wan_14b() -> Vec<(String, Vec<u64>)> {
    let (d, f) = (5120u64, 13824u64);
    let mut s: Vec<(String, Vec<u64>)> = vec![
        ("patch_embedding.weight".into(), vec![d, 16, 1, 2, 2]),
        ("patch_embedding.bias".into(), vec![d]),
        ("text_embedding.0.weight".into(), vec![d, 4096]),
        ("text_embedding.0.bias".into(), vec![d]),
        ("text_embedding.2.weight".into(), vec![d, d]),
        ("text_embedding.2.bias".into(), vec![d]),
        ("time_embedding.0.weight".into(), vec![d, 256]),
        ("time_embedding.0.bias".into(), vec![d]),
        ("time_embedding.2.weight".into(), vec![d, d]),
        ("time_embedding.2.bias".into(), vec![d]),
        ("time_projection.1.weight".into(), vec![6 * d, d]),
        ("time_projection.1.bias".into(), vec![6 * d]),
    ];
    for b in 0..40 {
        let p = |n: &str| format!("blocks.{b}.{n}");
        for attn in ["self_attn", "cross_attn"] {
            for x in ["q", "k", "v", "o"] {
                s.push((p(&format!("{attn}.{x}.weight")), vec![d, d]));
                s.push((p(&format!("{attn}.{x}.bias")), vec![d]));
            }
            s.push((p(&format!("{attn}.norm_q.weight")), vec![d]));
            s.push((p(&format!("{attn}.norm_k.weight")), vec![d]));
        }
        s.push((p("norm3.weight"), vec![d]));
        s.push((p("norm3.bias"), vec![d]));
        s.push((p("ffn.0.weight"), vec![f, d]));
        s.push((p("ffn.0.bias"), vec![f]));
        s.push((p("ffn.2.weight"), vec![d, f]));
        s.push((p("ffn.2.bias"), vec![d]));
        s.push((p("modulation"), vec![1, 6, d]));
    }
    s.push(("head.head.weight".into(), vec![64, d]));
    s.push(("head.head.bias".into(), vec![64]));
    s.push(("head.modulation".into(), vec![1, 2, d]));
    s
}

#[test]
fn qwen2_14b_in_four_shards_with_transformers_on_windows_without_a_gpu_loads_as_is() {
    // The 27.51 GiB, 4-shard bf16 Qwen2-14B on a 32 GB Windows
    // machine (8 GiB pagefile) with no discrete GPU: transformers on
    // Windows reads with its pread backend (sum of tensors plus its
    // staging, no shard mapped), so the bf16 weights fit the 40 GiB
    // commit limit as they are, in host memory; nothing is more precise.
    let dir = tempfile::tempdir().unwrap();
    let ck = Decoder::QWEN2_14B.folder(dir.path(), "Qwen2ForCausalLM", 4);
    assert_eq!(ck.files.len(), 4);
    let r = plan_for(
        &ck,
        machine(Os::Windows, 32 * GIB, 8 * GIB, None),
        "transformers",
    );
    let best = assert_highest_precision_that_fits(&r);
    assert_eq!(best.form, Form::AsIs, "{:?}", forms(&r));
    assert_eq!(best.placement, Placement::Host);
    assert_eq!(best.command, None);
    assert!(r.vram_budget.is_none());
}

#[test]
fn qwen2_14b_with_vllm_on_a_24_gib_card_takes_fp8_channel() {
    // vLLM keeps the whole model on the GPU and does not offload: the
    // 27.5 GiB of bf16 are over the 23 GiB (24 GiB less the 1 GiB
    // reserve); per-channel FP8 (compressed-tensors, the first 8-bit form
    // vLLM reads; the sparse file's sample is zeros, so no estimate breaks
    // the tie with fp8-block) halves the Linear weights and fits whole.
    let dir = tempfile::tempdir().unwrap();
    let ck = Decoder::QWEN2_14B.folder(dir.path(), "Qwen2ForCausalLM", 4);
    let r = plan_for(&ck, machine(Os::Linux, 64 * GIB, 0, Some(24 * GIB)), "vllm");
    let best = assert_highest_precision_that_fits(&r);
    assert_eq!(best.form, Form::Fp8Channel, "{:?}", forms(&r));
    assert_eq!(best.placement, Placement::Gpu);
    let as_is = r.candidates.iter().find(|c| c.form == Form::AsIs).unwrap();
    assert!(matches!(as_is.placement, Placement::TooBigForVram { .. }));
    assert_eq!(best.error_estimate, None, "a sparse file: n/a");
}

#[test]
fn tinyllama_with_llama_cpp_on_an_8_gib_card_takes_gguf_bf16() {
    // llama.cpp reads GGUF only; the 1.1B model's 2.05 GiB of bf16 fit
    // the 7 GiB (8 GiB less the reserve) whole, so the 16-bit GGUF of the
    // weights as they are (bf16, first of its width) wins over any
    // quantization.
    let dir = tempfile::tempdir().unwrap();
    let ck = Decoder::TINYLLAMA.folder(dir.path(), "LlamaForCausalLM", 1);
    let r = plan_for(
        &ck,
        machine(Os::Linux, 16 * GIB, 0, Some(8 * GIB)),
        "llama.cpp",
    );
    let best = assert_highest_precision_that_fits(&r);
    assert_eq!(best.form, Form::GgufBf16, "{:?}", forms(&r));
    assert_eq!(best.placement, Placement::Gpu);
    assert!(best
        .command
        .as_deref()
        .unwrap()
        .contains("OUT.gguf --dtype bf16"));
}

#[test]
fn tinyllama_with_llama_cpp_on_a_2_gib_card_takes_the_best_gguf_that_fits_whole() {
    // 2 GiB less the 1 GiB reserve: 16-bit (2.05 GiB) fits with 12 of 22
    // layers on the GPU, Q8_0 (1.09 GiB) with its head left on the CPU;
    // Q6_K (861 MiB) fits whole, and every form wholly on the GPU beats
    // one that offloads.
    let dir = tempfile::tempdir().unwrap();
    let ck = Decoder::TINYLLAMA.folder(dir.path(), "LlamaForCausalLM", 1);
    let r = plan_for(
        &ck,
        machine(Os::Linux, 16 * GIB, 0, Some(2 * GIB)),
        "llama.cpp",
    );
    let best = assert_highest_precision_that_fits(&r);
    assert_eq!(best.form, Form::Q6K, "{:?}", forms(&r));
    assert_eq!(best.placement, Placement::Gpu);
    let q8 = r.candidates.iter().find(|c| c.form == Form::Q8_0).unwrap();
    assert!(matches!(q8.placement, Placement::Offload { .. }), "{q8:?}");
}

#[test]
fn flux_with_forge_on_the_12_gib_windows_card_takes_q6_k_whole() {
    // Forge's rule on Windows below 15 GiB is ComfyUI's (0.88 x 12 GiB -
    // 0.8 GiB - 600 MiB = 9.17 GiB): Q6_K's 9.07 GiB fit whole, Q8_0 and
    // the FP8 forms only with blocks offloaded, and whole-on-the-GPU
    // beats offloading.
    let dir = tempfile::tempdir().unwrap();
    let r = plan_for(
        &flux(dir.path()),
        machine(Os::Windows, 32 * GIB, 8 * GIB, Some(12 * GIB)),
        "forge",
    );
    let best = assert_highest_precision_that_fits(&r);
    assert_eq!(
        (best.form, &best.placement),
        (Form::Q6K, &Placement::Gpu),
        "{:?}",
        forms(&r)
    );
    let q8 = r.candidates.iter().find(|c| c.form == Form::Q8_0).unwrap();
    assert!(matches!(q8.placement, Placement::Offload { .. }));
}

#[test]
fn wan_14b_with_comfyui_on_a_24_gib_card_takes_scaled_fp8_whole() {
    // 26.6 GiB of bf16 against ComfyUI's 0.88 x 24 GiB - 1.2 GiB = 19.9
    // GiB on Linux: 16-bit only runs offloaded; scaled FP8 (Wan's
    // embeddings, modulation and head kept in bf16) fits whole, and
    // whole-on-the-GPU wins.
    let dir = tempfile::tempdir().unwrap();
    let ck = open(&sparse(
        dir.path(),
        "wan2.1_t2v_14B_bf16.safetensors",
        &wan_14b(),
        Dtype::BF16,
    ));
    let r = plan_for(
        &ck,
        machine(Os::Linux, 64 * GIB, 0, Some(24 * GIB)),
        "comfyui",
    );
    let best = assert_highest_precision_that_fits(&r);
    assert_eq!(best.form, Form::Fp8Scaled, "{:?}", forms(&r));
    assert_eq!(best.placement, Placement::Gpu);
    let as_is = r.candidates.iter().find(|c| c.form == Form::AsIs).unwrap();
    assert!(matches!(as_is.placement, Placement::Offload { .. }));
    assert!(best.bits_per_weight > 8.0 && best.bits_per_weight < 8.5);
}

#[test]
fn within_a_width_the_lower_sampled_error_ranks_first() {
    // An F32 checkpoint: bf16 and f16 are both 16-bit casts, bf16 first in
    // ComfyUI's list, but f16 keeps 3 more mantissa bits of these values
    // (all within its range): its sampled error is about 8 times lower,
    // and it ranks above bf16 (both fit whole on the 24 GiB card).
    let dir = tempfile::tempdir().unwrap();
    let shapes: Vec<(String, Vec<u64>)> = (0..4)
        .flat_map(|b| {
            [
                (format!("blocks.{b}.attn.qkv.weight"), vec![384, 128]),
                (format!("blocks.{b}.mlp.0.weight"), vec![512, 128]),
            ]
        })
        .collect();
    let path = sparse(dir.path(), "f32.safetensors", &shapes, Dtype::F32);
    fill_f32(&path, |i| {
        let h = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f32 / (1u64 << 24) as f32;
        0.05 * (h - 0.5)
    });
    let r = plan_for(
        &open(&path),
        machine(Os::Linux, 64 * GIB, 0, Some(24 * GIB)),
        "comfyui",
    );
    let at = |f: Form| r.candidates.iter().position(|c| c.form == f).unwrap();
    let error = |f: Form| r.candidates[at(f)].error_estimate.unwrap();
    assert!(
        error(Form::F16) * 4.0 < error(Form::Bf16),
        "{:?}",
        forms(&r)
    );
    assert!(at(Form::F16) < at(Form::Bf16), "{:?}", forms(&r));
    assert_eq!(assert_highest_precision_that_fits(&r).form, Form::AsIs);
    // The estimate's sample stays under 10% of the weights.
    assert!(r.candidates.iter().all(|c| c.sampled_fraction < 0.10));
    assert!(r.candidates[at(Form::F16)].sampled_fraction > 0.0);
}
