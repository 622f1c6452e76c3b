//! config.json to the `{arch}.*` hyperparameter keys, as
//! `TextModel.set_gguf_parameters` and the Llama, Qwen2 and Qwen2-MoE
//! converter classes write them: the same keys, in the same order, with
//! gguf-py's types (UINT32 for counts and lengths, FLOAT32 for epsilons,
//! theta and factors, STRING for the rope scaling type, BOOL for flags).
//!
//! Each value is looked up under the same list of config names the
//! converter tries (`find_hparam`), the first present one winning.

use serde_json::{Map, Value as Json};

use super::error::ToGgufError;
use super::kv::Kvs;

const CONFIG: &str = "config.json";

/// The GGUF architectures reshard writes, from config.json's
/// `architectures[0]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `LlamaForCausalLM`, `MistralForCausalLM` and `MixtralForCausalLM`
    /// (`LlamaModel`): q and k rows permuted, Llama 3 rope factors as a
    /// tensor, Mixtral's per-expert tensors stacked per block.
    Llama,
    /// `Qwen2ForCausalLM`: q/k/v biases, no permutation.
    Qwen2,
    /// `Qwen2MoeForCausalLM`: per-expert tensors stacked per block, a
    /// shared expert and its gate.
    Qwen2Moe,
}

/// The transformers classes reshard maps, for messages.
pub(super) const KNOWN: &str = "LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM";

impl Arch {
    /// `general.architecture` and the prefix of the hyperparameter keys.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen2Moe => "qwen2moe",
        }
    }

    fn of(class: &str) -> Option<Arch> {
        Some(match class {
            "LlamaForCausalLM" | "MistralForCausalLM" | "MixtralForCausalLM" => Arch::Llama,
            "Qwen2ForCausalLM" => Arch::Qwen2,
            "Qwen2MoeForCausalLM" => Arch::Qwen2Moe,
            _ => return None,
        })
    }
}

/// config.json as the converter sees it (`text_config` merged into the
/// top level, as `TextModel.__init__` does).
pub(super) struct Hparams {
    map: Map<String, Json>,
    pub(super) arch: Arch,
}

impl Hparams {
    pub(super) fn parse(config_json: &str) -> Result<Hparams, ToGgufError> {
        let value =
            crate::format::config::parse_config(config_json).map_err(|e| ToGgufError::Json {
                file: CONFIG,
                why: e.to_string(),
            })?;
        let Json::Object(mut map) = value else {
            unreachable!("parse_config returns objects only")
        };
        let class = map
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Json::as_str)
            .ok_or_else(|| missing("architectures"))?
            .to_string();
        let arch = Arch::of(&class).ok_or_else(|| ToGgufError::UnknownArchitecture {
            arch: class.clone(),
            known: KNOWN,
        })?;
        if let Some(Json::Object(text)) = map.get("text_config").cloned() {
            map.extend(text);
        }
        let mut hp = Hparams { map, arch };
        hp.fill_defaults(&class);
        Ok(hp)
    }

    /// The converter reads `AutoConfig.from_pretrained(...).to_dict()`, not
    /// the raw file: transformers fills in what an older config.json lacks.
    /// These are the fills of the Llama, Mistral, Qwen2 and Qwen2-MoE config
    /// classes that change what is written; any other missing key is
    /// refused where it is needed, not guessed.
    fn fill_defaults(&mut self, class: &str) {
        let absent = |m: &Map<String, Json>, k: &str| m.get(k).is_none_or(Json::is_null);
        // (num_key_value_heads, rms_norm_eps, rope_theta) of each class;
        // Llama's kv heads default to its attention heads.
        let (kv, eps, theta) = match class {
            "LlamaForCausalLM" => (None, 1e-6, 1e4),
            "MistralForCausalLM" => (Some(8), 1e-6, 1e4),
            "MixtralForCausalLM" => (Some(8), 1e-5, 1e6),
            "Qwen2ForCausalLM" => (Some(32), 1e-6, 1e4),
            _ => (Some(16), 1e-6, 1e4), // Qwen2MoeForCausalLM
        };
        if absent(&self.map, "num_key_value_heads") {
            let heads = self.map.get("num_attention_heads").cloned();
            if let Some(h) = kv.map(Json::from).or(heads) {
                self.map.insert("num_key_value_heads".into(), h);
            }
        }
        if absent(&self.map, "rms_norm_eps") {
            self.map
                .insert("rms_norm_eps".into(), serde_json::json!(eps));
        }
        let rope_theta_given = ["rope_parameters", "rope_scaling"]
            .iter()
            .any(|k| self.map.get(*k).and_then(|r| r.get("rope_theta")).is_some());
        if !rope_theta_given && absent(&self.map, "rope_theta") {
            self.map
                .insert("rope_theta".into(), serde_json::json!(theta));
        }
        // LlamaConfig and MistralConfig compute head_dim; Mixtral's and the
        // Qwen2 classes' stay empty.
        let computes = matches!(class, "LlamaForCausalLM" | "MistralForCausalLM");
        if computes && absent(&self.map, "head_dim") {
            let n = |k: &str| self.map.get(k).and_then(Json::as_u64);
            if let (Some(hidden), Some(heads)) = (n("hidden_size"), n("num_attention_heads")) {
                if let Some(d) = hidden.checked_div(heads) {
                    self.map.insert("head_dim".into(), Json::from(d));
                }
            }
        }
    }

    /// `find_hparam(keys, optional=True)`: the first key present, with a
    /// JSON null read as absent.
    pub(super) fn find(&self, keys: &[&'static str]) -> Option<(&'static str, &Json)> {
        let key = keys.iter().find(|k| self.map.contains_key(**k))?;
        let v = &self.map[*key];
        (!v.is_null()).then_some((key, v))
    }

    pub(super) fn get(&self, key: &str) -> Option<&Json> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn find_u32(&self, keys: &[&'static str]) -> Result<Option<u32>, ToGgufError> {
        self.find(keys).map(|(k, v)| to_u32(k, v)).transpose()
    }

    pub(super) fn require_u32(&self, keys: &[&'static str]) -> Result<u32, ToGgufError> {
        self.find_u32(keys)?.ok_or_else(|| missing(keys[0]))
    }

    fn find_f32(&self, keys: &[&'static str]) -> Result<Option<f32>, ToGgufError> {
        self.find(keys).map(|(k, v)| to_f32(k, v)).transpose()
    }

    /// `rope_dim`: `head_dim`, or `hidden_size // num_attention_heads`.
    pub(super) fn head_dim(&self) -> Result<u32, ToGgufError> {
        if let Some(d) = self.find_u32(&["head_dim"])? {
            return Ok(d);
        }
        let hidden = self.require_u32(&["hidden_size"])?;
        let heads = self.require_u32(&["num_attention_heads"])?;
        if heads == 0 {
            return Err(bad("num_attention_heads", "is 0".into()));
        }
        Ok(hidden / heads)
    }

    /// `self.rope_parameters` after `TextModel.__init__` mirrors the
    /// top-level rope keys into it.
    pub(super) fn rope_parameters(&self) -> Map<String, Json> {
        let mut rp = match self.map.get("rope_parameters") {
            Some(v) => v.clone(),
            None => self.map.get("rope_scaling").cloned().unwrap_or(Json::Null),
        };
        let mut rp = match rp.take() {
            Json::Object(m) => m,
            _ => Map::new(),
        };
        if !rp.contains_key("full_attention") && !rp.contains_key("sliding_attention") {
            let local = self.find(&[
                "local_rope_theta",
                "rope_local_theta",
                "rope_theta_local",
                "swa_rope_theta",
                "rope_local_base_freq",
            ]);
            if let Some((_, t)) = local {
                rp.insert(
                    "sliding_attention".into(),
                    serde_json::json!({"rope_theta": t}),
                );
            }
            let mirror = [
                (
                    "rope_theta",
                    &[
                        "global_rope_theta",
                        "rope_global_theta",
                        "rope_theta_global",
                        "rope_theta",
                        "rotary_emb_base",
                    ][..],
                ),
                (
                    "partial_rotary_factor",
                    &["partial_rotary_factor", "rope_pct", "rope_percent"][..],
                ),
                (
                    "original_max_position_embeddings",
                    &["original_max_position_embeddings"][..],
                ),
            ];
            for (name, keys) in mirror {
                if !rp.contains_key(name) {
                    if let Some((_, v)) = self.find(keys) {
                        rp.insert(name.into(), v.clone());
                    }
                }
            }
            if !rp.contains_key("rope_type") {
                if let Some(t) = rp.get("type").filter(|t| !t.is_null()).cloned() {
                    rp.insert("rope_type".into(), t);
                }
            }
        }
        rp
    }
}

pub(super) fn missing(key: &str) -> ToGgufError {
    ToGgufError::MissingKey {
        file: CONFIG,
        key: key.into(),
    }
}

pub(super) fn bad(key: &str, why: String) -> ToGgufError {
    ToGgufError::BadValue {
        file: CONFIG,
        key: key.into(),
        why,
    }
}

fn to_u32(key: &str, v: &Json) -> Result<u32, ToGgufError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| {
            bad(
                key,
                format!("{v} is not an integer in 0..=4294967295 (GGUF UINT32)"),
            )
        })
}

pub(super) fn to_f32(key: &str, v: &Json) -> Result<f32, ToGgufError> {
    // Python's struct.pack('<f', x) rounds the double to nearest, as `as` does.
    v.as_f64()
        .map(|x| x as f32)
        .ok_or_else(|| bad(key, format!("{v} is not a number")))
}

/// Keys the converter reads for model families reshard does not write;
/// refused rather than silently dropped.
const REFUSED: &[&str] = &[
    "n_group",
    "topk_group",
    "score_function",
    "scoring_func",
    "score_func",
    "moe_router_activation",
    "moe_router_activation_func",
    "expert_selection_fn",
    "classifier_pooling",
];

/// Writes the hyperparameters, `general.file_type` among them, in the
/// converter's order.
pub(super) fn write(hp: &Hparams, kv: &mut Kvs, file_type: u32) -> Result<(), ToGgufError> {
    let p = hp.arch.name();
    let key = |k: &str| format!("{p}.{k}");
    if let Some(k) = REFUSED.iter().find(|k| hp.get(k).is_some()) {
        return Err(bad(
            k,
            format!("reshard does not write what this means for {p}"),
        ));
    }
    kv.u32(
        key("block_count"),
        hp.require_u32(&["n_layers", "num_hidden_layers", "n_layer", "num_layers"])?,
    );
    let counts: [(&str, &[&'static str]); 5] = [
        (
            "context_length",
            &[
                "max_position_embeddings",
                "n_ctx",
                "n_positions",
                "max_length",
                "max_sequence_length",
                "model_max_length",
            ],
        ),
        ("embedding_length", &["hidden_size", "n_embd", "dim"]),
        (
            "feed_forward_length",
            &[
                "prefix_dense_intermediate_size",
                "dense_intermediate_size",
                "intermediate_size",
                "n_inner",
                "hidden_dim",
            ],
        ),
        (
            "attention.head_count",
            &["num_attention_heads", "n_head", "n_heads"],
        ),
        (
            "attention.head_count_kv",
            &["num_key_value_heads", "n_kv_heads"],
        ),
    ];
    for (name, keys) in counts {
        if let Some(n) = hp.find_u32(keys)? {
            kv.u32(key(name), n);
        }
    }
    if hp.get("is_causal") == Some(&Json::Bool(false)) {
        kv.bool(key("attention.causal"), false);
    }
    let rp = hp.rope_parameters();
    rope(hp, &rp, kv, &key)?;
    let eps: [(&str, &[&'static str]); 2] = [
        (
            "attention.layer_norm_rms_epsilon",
            &["rms_norm_eps", "norm_eps"],
        ),
        (
            "attention.layer_norm_epsilon",
            &["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"],
        ),
    ];
    for (name, keys) in eps {
        if let Some(x) = hp.find_f32(keys)? {
            kv.f32(key(name), x);
        }
    }
    let experts: [(&str, &[&'static str]); 2] = [
        (
            "expert_count",
            &["num_local_experts", "num_experts", "n_routed_experts"],
        ),
        (
            "expert_used_count",
            &[
                "num_experts_per_tok",
                "num_experts_per_token",
                "top_k_experts",
            ],
        ),
    ];
    for (name, keys) in experts {
        if let Some(n) = hp.find_u32(keys)? {
            kv.u32(key(name), n);
        }
    }
    if let Some(d) = hp.find_u32(&["head_dim"])? {
        kv.u32(key("attention.key_length"), d);
        kv.u32(key("attention.value_length"), d);
    }
    kv.u32("general.file_type", file_type);
    match hp.arch {
        Arch::Llama => {
            kv.u32(key("vocab_size"), hp.require_u32(&["vocab_size"])?);
            kv.u32(key("rope.dimension_count"), hp.head_dim()?);
        }
        Arch::Qwen2 => {}
        Arch::Qwen2Moe => {
            for (name, k) in [
                ("expert_feed_forward_length", "moe_intermediate_size"),
                (
                    "expert_shared_feed_forward_length",
                    "shared_expert_intermediate_size",
                ),
            ] {
                if let Some(n) = hp.find_u32(&[k])? {
                    kv.u32(key(name), n);
                }
            }
        }
    }
    Ok(())
}

/// The rope scaling keys, `rope.freq_base` and `rope.freq_base_swa`.
fn rope(
    hp: &Hparams,
    rp: &Map<String, Json>,
    kv: &mut Kvs,
    key: &dyn Fn(&str) -> String,
) -> Result<(), ToGgufError> {
    let params = match rp.get("full_attention") {
        Some(Json::Object(m)) => m,
        _ => rp,
    };
    let f32_of = |k: &str| params.get(k).filter(|v| !v.is_null()).map(|v| to_f32(k, v));
    if let Some(ty) = params.get("rope_type").filter(|v| !v.is_null()) {
        let ty = ty
            .as_str()
            .ok_or_else(|| bad("rope_type", format!("{ty} is not a string")))?;
        let factor = f32_of("factor").transpose()?;
        match (ty, factor) {
            ("linear", Some(f)) => {
                kv.string(key("rope.scaling.type"), "linear");
                kv.f32(key("rope.scaling.factor"), f);
            }
            ("yarn", Some(f)) => {
                kv.string(key("rope.scaling.type"), "yarn");
                kv.f32(key("rope.scaling.factor"), f);
                let orig = params
                    .get("original_max_position_embeddings")
                    .ok_or_else(|| missing("original_max_position_embeddings"))?;
                kv.u32(
                    key("rope.scaling.original_context_length"),
                    to_u32("original_max_position_embeddings", orig)?,
                );
                let attn = match f32_of("attention_factor") {
                    Some(v) => Some(v),
                    None => f32_of("attn_factor"),
                };
                for (name, v) in [
                    ("yarn_ext_factor", f32_of("extrapolation_factor")),
                    ("yarn_attn_factor", attn),
                    ("yarn_beta_fast", f32_of("beta_fast")),
                    ("yarn_beta_slow", f32_of("beta_slow")),
                ] {
                    if let Some(v) = v {
                        kv.f32(key(&format!("rope.scaling.{name}")), v?);
                    }
                }
            }
            ("llama3", _) | ("Llama3", _) | ("LLAMA3", _) if hp.arch == Arch::Llama => {
                // Written as the rope_freqs.weight tensor (super::tensors).
            }
            ("default", _) | ("linear", None) | ("yarn", None) => {}
            (other, _) => {
                return Err(bad(
                    "rope_parameters",
                    format!(
                        "rope_type {other:?} is not one reshard writes for {}",
                        hp.arch.name()
                    ),
                ))
            }
        }
    }
    if rp.contains_key("mrope_section") {
        return Err(bad(
            "mrope_section",
            "multimodal rope sections are not written".into(),
        ));
    }
    if let Some(theta) = f32_of("rope_theta") {
        kv.f32(key("rope.freq_base"), theta?);
    }
    if let Some(Json::Object(swa)) = rp.get("sliding_attention") {
        if let Some(t) = swa.get("rope_theta").filter(|v| !v.is_null()) {
            kv.f32(key("rope.freq_base_swa"), to_f32("rope_theta", t)?);
        }
    }
    Ok(())
}
