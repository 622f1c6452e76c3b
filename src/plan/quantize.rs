//! `--quantize`: which tensors a quantized output stores in FP8, and why
//! the others are kept.
//!
//! Only Linear weights are quantized: 2-D floating-point `.weight`
//! tensors of more than [`MIN_ELEMENTS`] elements inside a numbered block
//! (`layers.3`, `double_blocks.0`, `down_blocks.1`). Never norms, biases,
//! embeddings or `lm_head`, nor what a model family's reference converters
//! keep in high precision ([`family_keep`]: FLUX's input and output
//! layers, Wan's modulation and embeddings, SD's time and label
//! embeddings and its first and last convolutions, a checkpoint's VAE and
//! text encoders). `--keep GLOB` keeps more; `--quantize-only GLOB` limits
//! quantization to what it matches (of what is eligible). Kept tensors
//! follow `--dtype` and `--keep-dtype` like any other.

use serde::{Deserialize, Serialize};

use super::order::block_of;
use crate::cast::quantize::Recipe;
use crate::format::{Dtype, Tensor};

/// Tensors of at most this many elements are kept: a tiny weight saves
/// nothing and its error is not averaged over many inputs.
pub const MIN_ELEMENTS: u64 = 1024;

/// The `__metadata__` key under which ComfyUI's mixed-precision files
/// list their quantized layers.
pub const COMFY_LAYERS_KEY: &str = "_quantization_metadata";

/// A `--quantize` scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuantizeScheme {
    /// Plain `float8_e4m3fn` storage, no scales: values clamped to ±448 and
    /// rounded to nearest even (ComfyUI's `fp8_e4m3fn` weight dtype, Forge,
    /// diffusers layerwise casting, InvokeAI's fp8 storage).
    Fp8,
    /// Plain `float8_e5m2` storage, clamped to ±57344.
    Fp8E5m2,
    /// ComfyUI's mixed-precision layout: per quantized Linear
    /// `<layer>.weight` E4M3, `<layer>.weight_scale` (F32 scalar),
    /// `<layer>.comfy_quant` (the U8 bytes of `{"format": "float8_e4m3fn"}`)
    /// and `_quantization_metadata` in the header; scales as comfy-kitchen
    /// computes them.
    Fp8Scaled,
    /// The older ComfyUI / Forge layout: a `scaled_fp8` marker tensor and
    /// `<layer>.scale_weight` (F32 scalar) per quantized Linear.
    Fp8ScaledLegacy,
    /// compressed-tensors `FP8_DYNAMIC` (llm-compressor): `weight_scale`
    /// `[out, 1]` in the model's dtype and a `quantization_config` in
    /// `config.json`.
    Fp8Channel,
    /// transformers FineGrainedFP8 / DeepSeek: `weight_scale_inv` F32 per
    /// block (`--block`, 128x128 by default) and `quant_method: fp8`.
    Fp8Block,
    /// GGUF block schemes (`crate::cast::gguf::quantize`), for a GGUF
    /// output only; which tensors they take is `super::gguf_out`'s.
    #[serde(rename = "q8_0")]
    Q8_0,
    #[serde(rename = "q4_0")]
    Q4_0,
    #[serde(rename = "q4_k")]
    Q4K,
    #[serde(rename = "q6_k")]
    Q6K,
}

/// The block of `--quantize fp8-block` unless `--block` says otherwise.
pub const DEFAULT_BLOCK: [u64; 2] = [128, 128];

impl QuantizeScheme {
    /// Every scheme, in the order `--help` lists them.
    pub const ALL: [QuantizeScheme; 10] = [
        QuantizeScheme::Fp8,
        QuantizeScheme::Fp8E5m2,
        QuantizeScheme::Fp8Scaled,
        QuantizeScheme::Fp8ScaledLegacy,
        QuantizeScheme::Fp8Channel,
        QuantizeScheme::Fp8Block,
        QuantizeScheme::Q8_0,
        QuantizeScheme::Q4_0,
        QuantizeScheme::Q4K,
        QuantizeScheme::Q6K,
    ];

    /// True for the layouts whose loaders read the scheme from
    /// `config.json`'s `quantization_config` (compressed-tensors,
    /// FineGrainedFP8): they need a folder output.
    pub fn needs_config(self) -> bool {
        matches!(self, QuantizeScheme::Fp8Channel | QuantizeScheme::Fp8Block)
    }

    /// The GGML type of a GGUF block scheme, `None` for the FP8 ones.
    pub fn ggml(self) -> Option<crate::format::gguf::ggml::GgmlType> {
        use crate::format::gguf::ggml::GgmlType;
        match self {
            QuantizeScheme::Q8_0 => Some(GgmlType::Q8_0),
            QuantizeScheme::Q4_0 => Some(GgmlType::Q4_0),
            QuantizeScheme::Q4K => Some(GgmlType::Q4_K),
            QuantizeScheme::Q6K => Some(GgmlType::Q6_K),
            _ => None,
        }
    }

    /// The dtype quantized weights are stored in.
    pub fn dtype(self) -> Dtype {
        match self {
            QuantizeScheme::Fp8E5m2 => Dtype::F8_E5M2,
            _ if self.ggml().is_some() => Dtype::U8,
            _ => Dtype::F8_E4M3,
        }
    }

    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            QuantizeScheme::Fp8 => "fp8",
            QuantizeScheme::Fp8E5m2 => "fp8-e5m2",
            QuantizeScheme::Fp8Scaled => "fp8-scaled",
            QuantizeScheme::Fp8ScaledLegacy => "fp8-scaled-legacy",
            QuantizeScheme::Fp8Channel => "fp8-channel",
            QuantizeScheme::Fp8Block => "fp8-block",
            QuantizeScheme::Q8_0 => "q8_0",
            QuantizeScheme::Q4_0 => "q4_0",
            QuantizeScheme::Q4K => "q4_k",
            QuantizeScheme::Q6K => "q6_k",
        }
    }

    /// How a scaled scheme derives its scales (`block` is `--block`);
    /// `None` for plain FP8, which is a cast.
    pub fn recipe(self, block: [u64; 2]) -> Option<Recipe> {
        match self {
            QuantizeScheme::Fp8
            | QuantizeScheme::Fp8E5m2
            | QuantizeScheme::Q8_0
            | QuantizeScheme::Q4_0
            | QuantizeScheme::Q4K
            | QuantizeScheme::Q6K => None,
            QuantizeScheme::Fp8Scaled | QuantizeScheme::Fp8ScaledLegacy => Some(Recipe::PerTensor),
            QuantizeScheme::Fp8Channel => Some(Recipe::PerChannel),
            QuantizeScheme::Fp8Block => Some(Recipe::Block {
                rows: block[0],
                cols: block[1],
            }),
        }
    }

    /// The suffix that replaces a quantized weight's `weight` in its
    /// scale's name.
    pub fn scale_suffix(self) -> &'static str {
        match self {
            QuantizeScheme::Fp8ScaledLegacy => "scale_weight",
            QuantizeScheme::Fp8Block => "weight_scale_inv",
            _ => "weight_scale",
        }
    }
}

/// Why a tensor is not quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeptBecause {
    /// Not a floating-point 2-D `.weight` of more than [`MIN_ELEMENTS`]
    /// elements in a numbered block (a norm, a bias, a tiny tensor, a
    /// projection outside the blocks, ...).
    NotALinearWeight,
    /// An embedding or the output head.
    EmbeddingOrHead,
    /// What the model family's converters keep in high precision.
    FamilyKeeps,
    /// `--keep` matched it.
    Keep,
    /// `--quantize-only` did not match it.
    NotSelected,
    /// `fp8-block`: a dimension neither a multiple of `--block` nor within
    /// one block, which loaders misread.
    NotTileable,
}

impl KeptBecause {
    pub fn describe(self) -> &'static str {
        match self {
            KeptBecause::NotALinearWeight => {
                "not a Linear weight of a block (norm, bias, 1-D, tiny or outside the blocks)"
            }
            KeptBecause::EmbeddingOrHead => "embedding or output head",
            KeptBecause::FamilyKeeps => "kept in high precision by the model family's converters",
            KeptBecause::Keep => "--keep",
            KeptBecause::NotSelected => "not matched by --quantize-only",
            KeptBecause::NotTileable => {
                "a dimension is neither a multiple of --block nor within one block (transformers misreads such scales)"
            }
        }
    }
}

/// What `--quantize` did, for the plan, the dry run and reshard.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantizeRecord {
    pub scheme: QuantizeScheme,
    pub dtype: Dtype,
    /// `fp8-block`: rows and columns of a scale's block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<[u64; 2]>,
    /// The quantized weights (the stems before `.weight`), in plan order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// Tensors quantized, and their bytes before and after.
    pub tensors: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Floating-point tensors kept (norms, biases and other tensors that
    /// are not Linear weights are only counted).
    pub kept: Vec<KeptTensor>,
    pub not_linear: usize,
    /// Linear layers (2-D `.weight` stems, embeddings aside) left
    /// unquantized: what `config.json` lists as `ignore` /
    /// `modules_to_not_convert`, since those loaders expect a scale for
    /// every other Linear.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unquantized_linear: Vec<String>,
}

impl QuantizeRecord {
    /// The `quantization_config` `config.json` needs for this layout:
    /// compressed-tensors' for `fp8-channel`, FineGrainedFP8's for
    /// `fp8-block`; `None` for the single-file layouts, and when nothing
    /// was quantized (`--keep '*'`): a config would make loaders expect
    /// scales no weight has.
    pub fn config(&self) -> Option<serde_json::Value> {
        use serde_json::json;
        if self.tensors == 0 {
            return None;
        }
        let ignore = &self.unquantized_linear;
        match self.scheme {
            QuantizeScheme::Fp8Channel => Some(json!({
                "config_groups": {
                    "group_0": {
                        "input_activations": {
                            "dynamic": true,
                            "num_bits": 8,
                            "strategy": "token",
                            "symmetric": true,
                            "type": "float"
                        },
                        "output_activations": null,
                        "targets": ["Linear"],
                        "weights": {
                            "dynamic": false,
                            "num_bits": 8,
                            "observer": "minmax",
                            "strategy": "channel",
                            "symmetric": true,
                            "type": "float"
                        }
                    }
                },
                "format": "float-quantized",
                "ignore": ignore,
                "kv_cache_scheme": null,
                "quant_method": "compressed-tensors",
                "quantization_status": "compressed"
            })),
            QuantizeScheme::Fp8Block => Some(json!({
                "activation_scheme": "dynamic",
                "fmt": "e4m3",
                "modules_to_not_convert": ignore,
                "quant_method": "fp8",
                "weight_block_size": self.block.unwrap_or(DEFAULT_BLOCK)
            })),
            _ => None,
        }
    }
}

/// A Linear-shaped tensor left unquantized, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptTensor {
    pub tensor: String,
    pub because: KeptBecause,
}

/// Whether `t` is quantized: `Ok(())` or why it is kept. `keep` and
/// `only` say whether `--keep` / `--quantize-only` match a name (`only` is
/// `None` without `--quantize-only`).
pub fn decide(
    t: &Tensor,
    keep: &dyn Fn(&str) -> bool,
    only: Option<&dyn Fn(&str) -> bool>,
) -> Result<(), KeptBecause> {
    let float = matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64);
    let matrix =
        float && t.shape.len() == 2 && t.name.ends_with(".weight") && t.numel() > MIN_ELEMENTS;
    if !matrix {
        return Err(KeptBecause::NotALinearWeight);
    }
    if is_embedding_or_head(&t.name) {
        return Err(KeptBecause::EmbeddingOrHead);
    }
    if keep(&t.name) {
        return Err(KeptBecause::Keep);
    }
    if let Some(only) = only {
        return if only(&t.name) {
            Ok(())
        } else {
            Err(KeptBecause::NotSelected)
        };
    }
    if family_keep(&t.name) {
        return Err(KeptBecause::FamilyKeeps);
    }
    if block_of(&t.name).is_none() {
        return Err(KeptBecause::NotALinearWeight);
    }
    Ok(())
}

/// Name parts (between dots) that mark an embedding or the output head.
fn is_embedding_or_head(name: &str) -> bool {
    name.split('.').any(|part| {
        (part.contains("embed") && !part.starts_with("embedder"))
            || matches!(part, "wte" | "wpe" | "lm_head" | "token_embd")
            || part.starts_with("norm")
            || part.ends_with("norm")
    })
}

/// Top-level (or, for a whole-model file, second-level) prefixes of
/// tensors the reference converters of each family keep in high precision,
/// and the components a one-file checkpoint holds besides its denoiser.
const FAMILY_KEEP_PREFIXES: &[&str] = &[
    // FLUX (black-forest-labs names, as ComfyUI's scaled-FP8 converters
    // keep them).
    "img_in",
    "txt_in",
    "time_in",
    "vector_in",
    "guidance_in",
    "final_layer",
    // Wan.
    "patch_embedding",
    "text_embedding",
    "time_embedding",
    "time_projection",
    "head",
    // SD 1.x / SDXL (LDM names).
    "time_embed",
    "label_emb",
    // VAE and text encoders of a one-file checkpoint.
    "first_stage_model",
    "cond_stage_model",
    "conditioner",
    "text_encoders",
    "vae",
];

/// True for a tensor a family's converters keep in high precision: a kept
/// prefix at the top of the name (after a `model.diffusion_model.` or
/// `diffusion_model.` wrapper), Wan's per-block `modulation`, or SD's first
/// and last convolutions (`input_blocks.0.0`, `out.2`; `conv_in`,
/// `conv_out`).
pub fn family_keep(name: &str) -> bool {
    let inner = name
        .strip_prefix("model.diffusion_model.")
        .or_else(|| name.strip_prefix("diffusion_model."))
        .unwrap_or(name);
    let first = inner.split('.').next().unwrap_or("");
    FAMILY_KEEP_PREFIXES.contains(&first)
        || FAMILY_KEEP_PREFIXES.contains(&name.split('.').next().unwrap_or(""))
        || inner
            .split('.')
            .any(|p| p == "modulation" || p == "conv_in" || p == "conv_out")
        || inner.starts_with("input_blocks.0.0.")
        || inner.starts_with("out.2.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::DataRef;

    fn t(name: &str, dtype: Dtype, shape: &[u64]) -> Tensor {
        Tensor {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            len: 0,
            file: 0,
            data: DataRef::Contiguous { offset: 0 },
        }
    }

    fn no(_: &str) -> bool {
        false
    }

    #[test]
    fn only_linear_weights_of_blocks_are_quantized() {
        let q = |name: &str, dtype, shape: &[u64]| decide(&t(name, dtype, shape), &no, None);
        assert_eq!(
            q("model.layers.0.mlp.up_proj.weight", Dtype::BF16, &[64, 32]),
            Ok(())
        );
        assert_eq!(
            q("double_blocks.3.img_attn.qkv.weight", Dtype::F32, &[96, 32]),
            Ok(())
        );
        for (name, dtype, shape) in [
            (
                "model.layers.0.mlp.up_proj.bias",
                Dtype::BF16,
                &[64, 32][..],
            ),
            (
                "model.layers.0.input_layernorm.weight",
                Dtype::BF16,
                &[2048],
            ),
            ("model.layers.0.mlp.up_proj.weight", Dtype::BF16, &[32, 32]),
            ("model.layers.0.mlp.up_proj.weight", Dtype::I8, &[64, 32]),
            ("model.layers.0.conv.weight", Dtype::F16, &[8, 8, 3, 3]),
            ("proj_out.weight", Dtype::BF16, &[64, 32]),
        ] {
            assert_eq!(
                q(name, dtype, shape),
                Err(KeptBecause::NotALinearWeight),
                "{name}"
            );
        }
        for name in ["model.embed_tokens.weight", "lm_head.weight"] {
            assert_eq!(
                q(name, Dtype::BF16, &[64, 32]),
                Err(KeptBecause::EmbeddingOrHead)
            );
        }
        assert_eq!(
            q("model.layers.0.q_norm.weight", Dtype::BF16, &[64, 32]),
            Err(KeptBecause::EmbeddingOrHead)
        );
    }

    #[test]
    fn family_lists_keep_and_only_apply() {
        let k = |name: &str| decide(&t(name, Dtype::BF16, &[64, 64]), &no, None);
        for name in [
            "final_layer.0.linear.weight",
            "img_in.0.weight",
            "model.diffusion_model.time_in.0.in_layer.weight",
            "blocks.3.modulation.0.weight",
            "model.diffusion_model.input_blocks.0.0.weight",
            "first_stage_model.decoder.up.0.block.0.conv1.weight",
            "conditioner.embedders.0.transformer.text_model.encoder.layers.0.mlp.fc1.weight",
        ] {
            assert_eq!(k(name), Err(KeptBecause::FamilyKeeps), "{name}");
        }
        assert_eq!(
            k("model.diffusion_model.double_blocks.0.img_mlp.0.weight"),
            Ok(())
        );
        let tensor = t("double_blocks.0.img_mlp.0.weight", Dtype::BF16, &[64, 64]);
        let keep_mlp = |n: &str| n.contains("mlp");
        assert_eq!(decide(&tensor, &keep_mlp, None), Err(KeptBecause::Keep));
        let only_attn: &dyn Fn(&str) -> bool = &|n: &str| n.contains("attn");
        assert_eq!(
            decide(&tensor, &no, Some(only_attn)),
            Err(KeptBecause::NotSelected)
        );
        // --quantize-only can pick what the family list keeps.
        let vae = t(
            "first_stage_model.decoder.up.0.attn.0.q.weight",
            Dtype::F32,
            &[64, 64],
        );
        assert_eq!(decide(&vae, &no, Some(only_attn)), Ok(()));
    }
}
