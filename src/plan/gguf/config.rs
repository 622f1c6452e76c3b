//! `config.json` and `generation_config.json` for transformers, from a
//! GGUF's `{arch}.*` and `tokenizer.ggml.*` keys and its tensor list.
//!
//! What GGUF does not store is derived the way llama.cpp's loader does:
//! `head_dim` is `attention.key_length` or `embedding_length /
//! attention.head_count`, `vocab_size` is the rows of `token_embd.weight`,
//! `tie_word_embeddings` is the absence of `output.weight`, the bias flags
//! are the presence of block 0's biases. Keys are written sorted, as
//! transformers writes them; the rope settings go both to
//! `rope_parameters` (transformers 5) and `rope_theta` (transformers 4).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::cast::torch_name;
use crate::format::gguf::{GgufTensor, Metadata};
use crate::format::Dtype;

use super::error::GgufHfError;
use super::family::Family;
use super::meta::{self, missing};
use super::names::ROPE_FREQS;

/// config.json text (2-space indent, trailing newline) for `family`, from
/// the GGUF `metadata` and `tensors`, with `dtype` the output's dtype.
/// `rope_factors` are the values of `rope_freqs.weight` where the file
/// has that tensor (Llama 3.1-style rope scaling, which llama.cpp keeps
/// only as those factors); without them such a file is refused.
pub fn config_json(
    family: Family,
    metadata: &Metadata,
    tensors: &[GgufTensor],
    dtype: Dtype,
    rope_factors: Option<&[f32]>,
) -> Result<String, GgufHfError> {
    let p = family.key_prefix();
    let key = |k: &str| format!("{p}.{k}");
    let layers = meta::require_uint(metadata, &key("block_count"))?;
    let hidden = meta::require_uint(metadata, &key("embedding_length"))?;
    let heads = meta::require_uint(metadata, &key("attention.head_count"))?;
    let kv_heads = meta::uint(metadata, &key("attention.head_count_kv"))?.unwrap_or(heads);
    let head_dim = match meta::uint(metadata, &key("attention.key_length"))? {
        Some(d) => d,
        None if heads > 0 && hidden % heads == 0 => hidden / heads,
        None => {
            return Err(GgufHfError::BadValue {
                key: key("attention.head_count"),
                why: format!("{heads} heads do not divide embedding_length {hidden}"),
            })
        }
    };
    let eps_key = key("attention.layer_norm_rms_epsilon");
    let eps = meta::float(metadata, &eps_key)?.ok_or_else(|| missing(&eps_key))?;
    let theta = meta::float(metadata, &key("rope.freq_base"))?.unwrap_or(10000.0);
    let embd = find(tensors, "token_embd.weight")?;
    let vocab = embd.shape.first().copied().unwrap_or(0);
    let has = |name: &str| tensors.iter().any(|t| t.name == name);
    let tied = !has("output.weight");
    let dtype_name = torch_name(dtype).ok_or_else(|| GgufHfError::BadValue {
        key: "dtype".into(),
        why: format!("{dtype} has no torch name"),
    })?;

    let mut c: BTreeMap<&str, Value> = BTreeMap::new();
    c.insert("architectures", json!([family.architecture()]));
    c.insert("model_type", json!(family.model_type()));
    c.insert("attention_dropout", json!(0.0));
    c.insert("dtype", json!(dtype_name));
    c.insert("hidden_act", json!("silu"));
    c.insert("hidden_size", json!(hidden));
    c.insert(
        "intermediate_size",
        json!(meta::require_uint(metadata, &key("feed_forward_length"))?),
    );
    c.insert(
        "max_position_embeddings",
        json!(meta::require_uint(metadata, &key("context_length"))?),
    );
    c.insert("num_attention_heads", json!(heads));
    c.insert("num_hidden_layers", json!(layers));
    c.insert("num_key_value_heads", json!(kv_heads));
    c.insert("rms_norm_eps", json!(eps));
    c.insert("tie_word_embeddings", json!(tied));
    c.insert("use_cache", json!(true));
    c.insert("vocab_size", json!(vocab));
    for (name, gguf_key) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ] {
        c.insert(name, json!(meta::uint(metadata, gguf_key)?));
    }
    let mut rope = rope_parameters(family, metadata, tensors, theta, head_dim, rope_factors)?;
    rope.insert("rope_theta".into(), json!(theta));
    c.insert("rope_parameters", Value::Object(rope));
    c.insert("rope_theta", json!(theta));
    match family {
        Family::Llama | Family::Mistral => {
            c.insert("attention_bias", json!(has("blk.0.attn_q.bias")));
            c.insert("head_dim", json!(head_dim));
            if family == Family::Llama {
                c.insert("mlp_bias", json!(has("blk.0.ffn_up.bias")));
                c.insert("pretraining_tp", json!(1));
            } else {
                c.insert("sliding_window", Value::Null);
            }
        }
        Family::Qwen2 | Family::Qwen3 => {
            if family == Family::Qwen3 {
                c.insert("attention_bias", json!(has("blk.0.attn_q.bias")));
                c.insert("head_dim", json!(head_dim));
            } else if head_dim.checked_mul(heads) != Some(hidden) {
                return Err(GgufHfError::BadValue {
                    key: key("attention.key_length"),
                    why: format!(
                        "Qwen2 needs head_dim * heads = hidden ({head_dim} * {heads} != {hidden})"
                    ),
                });
            }
            let layer_types = vec!["full_attention"; layers.min(1 << 20) as usize];
            c.insert("layer_types", json!(layer_types));
            c.insert("max_window_layers", json!(layers));
            c.insert("sliding_window", Value::Null);
            c.insert("use_sliding_window", json!(false));
        }
    }
    let map: Map<String, Value> = c.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let mut out = serde_json::to_string_pretty(&Value::Object(map))?;
    out.push('\n');
    Ok(out)
}

/// generation_config.json text: the BOS, EOS and padding ids, with the
/// end-of-turn and end-of-message ids llama.cpp also stops on added to
/// the EOS list. `None` when the file names none of them.
pub fn generation_config_json(metadata: &Metadata) -> Result<Option<String>, GgufHfError> {
    let bos = meta::uint(metadata, "tokenizer.ggml.bos_token_id")?;
    let pad = meta::uint(metadata, "tokenizer.ggml.padding_token_id")?;
    let mut eos = Vec::new();
    for k in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        if let Some(id) = meta::uint(metadata, k)? {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    if bos.is_none() && eos.is_empty() && pad.is_none() {
        return Ok(None);
    }
    let mut c = Map::new();
    if let Some(bos) = bos {
        c.insert("bos_token_id".into(), json!(bos));
    }
    match eos.as_slice() {
        [] => {}
        [one] => {
            c.insert("eos_token_id".into(), json!(one));
        }
        many => {
            c.insert("eos_token_id".into(), json!(many));
        }
    }
    if let Some(pad) = pad {
        c.insert("pad_token_id".into(), json!(pad));
    }
    let mut out = serde_json::to_string_pretty(&Value::Object(c))?;
    out.push('\n');
    Ok(Some(out))
}

fn find<'a>(tensors: &'a [GgufTensor], name: &str) -> Result<&'a GgufTensor, GgufHfError> {
    tensors
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| GgufHfError::MissingTensor {
            tensor: name.into(),
        })
}

/// `rope_parameters` without `rope_theta`: `{"rope_type": "default"}`, or
/// the linear, YaRN or Llama 3 scaling the file states.
fn rope_parameters(
    family: Family,
    metadata: &Metadata,
    tensors: &[GgufTensor],
    theta: f64,
    head_dim: u64,
    rope_factors: Option<&[f32]>,
) -> Result<Map<String, Value>, GgufHfError> {
    let p = family.key_prefix();
    let key = |k: &str| format!("{p}.rope.scaling.{k}");
    let mut r = Map::new();
    if tensors.iter().any(|t| t.name == ROPE_FREQS) && family.permutes_qk() {
        let factors = rope_factors.ok_or_else(|| GgufHfError::RopeFactorsNeeded {
            tensor: ROPE_FREQS.into(),
        })?;
        let l3 = llama3_from_factors(factors, theta, head_dim)?;
        r.insert("rope_type".into(), json!("llama3"));
        r.insert("factor".into(), json!(l3.factor));
        r.insert("low_freq_factor".into(), json!(l3.low_freq_factor));
        r.insert("high_freq_factor".into(), json!(l3.high_freq_factor));
        r.insert(
            "original_max_position_embeddings".into(),
            json!(l3.original_max_position_embeddings),
        );
        return Ok(r);
    }
    let ty_key = key("type");
    let factor = meta::float(metadata, &key("factor"))?;
    match meta::string(metadata, &ty_key)? {
        None | Some("none") => {
            r.insert("rope_type".into(), json!("default"));
        }
        Some("linear") => {
            let f = factor.ok_or_else(|| missing(&key("factor")))?;
            r.insert("rope_type".into(), json!("linear"));
            r.insert("factor".into(), json!(f));
        }
        Some("yarn") => {
            let f = factor.ok_or_else(|| missing(&key("factor")))?;
            let orig_key = key("original_context_length");
            let orig = meta::require_uint(metadata, &orig_key)?;
            r.insert("rope_type".into(), json!("yarn"));
            r.insert("factor".into(), json!(f));
            r.insert("original_max_position_embeddings".into(), json!(orig));
            for (hf, gguf) in [
                ("beta_fast", "yarn_beta_fast"),
                ("beta_slow", "yarn_beta_slow"),
                ("attention_factor", "yarn_attn_factor"),
                ("extrapolation_factor", "yarn_ext_factor"),
            ] {
                if let Some(v) = meta::float(metadata, &key(gguf))? {
                    r.insert(hf.into(), json!(v));
                }
            }
        }
        Some(other) => {
            return Err(GgufHfError::BadValue {
                key: ty_key,
                why: format!(
                    "rope scaling {other:?} has no transformers equivalent reshard writes"
                ),
            })
        }
    }
    Ok(r)
}

/// Llama 3 rope scaling, as transformers' `rope_parameters` states it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: u64,
}

impl Llama3Rope {
    /// The per-frequency factors llama.cpp's converter computes from these
    /// settings (`LlamaModel.generate_extra_tensors`).
    pub(super) fn factors(&self, theta: f64, head_dim: u64) -> Vec<f64> {
        let old = self.original_max_position_embeddings as f64;
        let low_wavelen = old / self.low_freq_factor;
        let high_wavelen = old / self.high_freq_factor;
        (0..head_dim / 2)
            .map(|k| {
                let freq = 1.0 / theta.powf((2 * k) as f64 / head_dim as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    self.factor
                } else {
                    let smooth = (old / wavelen - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    1.0 / ((1.0 - smooth) / self.factor + smooth)
                }
            })
            .collect()
    }
}

/// Recovers the Llama 3 rope settings from the factors llama.cpp stored.
/// `factor` is the largest factor; between the bands the factors follow
/// `1/f = (1 - s)/factor + s` with `s` linear in the frequency, which
/// fixes `original_max_position_embeddings / (high - low)` and `low /
/// (high - low)`; `low_freq_factor` is taken as 1, as in every Llama 3
/// release, and the result is accepted only if it reproduces every
/// factor.
fn llama3_from_factors(
    factors: &[f32],
    theta: f64,
    head_dim: u64,
) -> Result<Llama3Rope, GgufHfError> {
    let bad = |why: String| GgufHfError::RopeFactors {
        tensor: ROPE_FREQS.into(),
        why,
    };
    if factors.len() as u64 != head_dim / 2 {
        return Err(bad(format!(
            "{} factors for a head_dim of {head_dim} (expected {})",
            factors.len(),
            head_dim / 2
        )));
    }
    let f: Vec<f64> = factors.iter().map(|&x| x as f64).collect();
    let factor = f.iter().copied().fold(f64::NAN, f64::max);
    if !(factor.is_finite() && factor > 1.0) {
        return Err(bad(format!("largest factor {factor} is not above 1")));
    }
    let freq = |k: usize| 1.0 / theta.powf((2 * k) as f64 / head_dim as f64);
    let tol = 1e-4;
    let smooth: Vec<(f64, f64)> = f
        .iter()
        .enumerate()
        .filter(|(_, &x)| x > 1.0 + tol && x < factor * (1.0 - tol))
        .map(|(k, &x)| (freq(k), (1.0 / x - 1.0 / factor) / (1.0 - 1.0 / factor)))
        .collect();
    let (Some(&(f0, s0)), Some(&(f1, s1))) = (smooth.first(), smooth.last()) else {
        return Err(bad(
            "fewer than two factors between the bands; the settings cannot be recovered".into(),
        ));
    };
    if smooth.len() < 2 || f0 == f1 {
        return Err(bad(
            "fewer than two factors between the bands; the settings cannot be recovered".into(),
        ));
    }
    // s = a * freq + b, a = old / (2 pi (high - low)), b = -low / (high - low).
    let a = (s1 - s0) / (f1 - f0);
    let b = s0 - a * f0;
    if !(b < 0.0 && a > 0.0) {
        return Err(bad("the factors do not follow Llama 3's smoothing".into()));
    }
    let low = 1.0;
    let high = ((low - low / b) * 1000.0).round() / 1000.0;
    let old = (a * 2.0 * std::f64::consts::PI * (high - low)).round();
    let rope = Llama3Rope {
        factor: meta::f32_to_f64(factor as f32),
        low_freq_factor: low,
        high_freq_factor: high,
        original_max_position_embeddings: old as u64,
    };
    let again = rope.factors(theta, head_dim);
    if let Some((k, (x, y))) = f
        .iter()
        .zip(&again)
        .enumerate()
        .find(|(_, (x, y))| (*x - *y).abs() > 1e-3 * y.abs())
    {
        return Err(bad(format!(
            "factor {k} is {x}, but the recovered settings {rope:?} give {y}"
        )));
    }
    Ok(rope)
}
