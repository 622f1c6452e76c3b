//! Tensor names: a llama.cpp tensor's transformers name, the tensors
//! llama.cpp adds that transformers does not have, and the rotary row
//! permutation llama.cpp's converter applied to q and k.
//!
//! The permutation: for Llama-family checkpoints `convert_hf_to_gguf.py`
//! reorders the rows of `q_proj` (with `num_attention_heads`) and `k_proj`
//! (with `num_key_value_heads`), weights and biases alike, from
//! transformers' half-split rotary layout to ggml's interleaved one: each
//! head's `d` rows, read as a `(2, d/2)` grid, are transposed to `(d/2, 2)`.
//! Qwen2 and Qwen3 are written without it.

use crate::format::gguf::{GgufTensor, Metadata};

use super::error::GgufHfError;
use super::family::Family;
use super::meta;

/// The tensor llama.cpp writes for Llama 3.1-style rope scaling: one f32
/// factor per rotary frequency, computed from `rope_scaling`. transformers
/// has no such weight; its values go back into config.json.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// The Hugging Face name of a GGUF tensor of `family`
/// (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`),
/// `None` for a name the family's transformers model does not have (the
/// caller refuses it, naming it, unless [`skip_reason`] accounts for it).
pub fn hf_name(family: Family, gguf_name: &str) -> Option<String> {
    match gguf_name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (block, rest) = rest.split_once('.')?;
    let canonical = !block.is_empty()
        && block.bytes().all(|b| b.is_ascii_digit())
        && (block == "0" || !block.starts_with('0'));
    if !canonical {
        return None;
    }
    let (part, kind) = rest.rsplit_once('.')?;
    let bias = match kind {
        "weight" => false,
        "bias" => true,
        _ => return None,
    };
    let qwen3 = family == Family::Qwen3;
    let llama = family.permutes_qk();
    let hf = match part {
        "attn_norm" if !bias => "input_layernorm",
        "ffn_norm" if !bias => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        // Qwen2's o_proj never has a bias; Llama's and Qwen3's follow
        // `attention_bias`.
        "attn_output" if !bias || family != Family::Qwen2 => "self_attn.o_proj",
        "attn_q_norm" if qwen3 && !bias => "self_attn.q_norm",
        "attn_k_norm" if qwen3 && !bias => "self_attn.k_norm",
        // Only Llama's MLP has biases (`mlp_bias`).
        "ffn_gate" if !bias || llama => "mlp.gate_proj",
        "ffn_up" if !bias || llama => "mlp.up_proj",
        "ffn_down" if !bias || llama => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{block}.{hf}.{kind}"))
}

/// Why a GGUF tensor that has no Hugging Face name is left out on purpose,
/// `None` for every other tensor. Only `rope_freqs.weight` (Llama 3 rope
/// scaling factors, which [`super::config_json`] turns back into
/// `rope_scaling`) is.
pub fn skip_reason(family: Family, gguf_name: &str) -> Option<&'static str> {
    (family.permutes_qk() && gguf_name == ROPE_FREQS)
        .then_some("Llama 3 rope scaling factors, written into config.json's rope_scaling")
}

/// The head count llama.cpp permuted `tensor`'s rows with (see the module
/// doc), `None` for a tensor it did not permute. Refuses a tensor whose
/// rows do not split into that many heads of an even size, and a missing
/// head count.
pub fn permuted_heads(
    family: Family,
    metadata: &Metadata,
    tensor: &GgufTensor,
) -> Result<Option<u64>, GgufHfError> {
    if !family.permutes_qk() {
        return Ok(None);
    }
    let Some(rest) = tensor.name.strip_prefix("blk.") else {
        return Ok(None);
    };
    let Some((_, part)) = rest.split_once('.') else {
        return Ok(None);
    };
    let prefix = family.key_prefix();
    let head_count = format!("{prefix}.attention.head_count");
    let heads = match part {
        "attn_q.weight" | "attn_q.bias" => meta::require_uint(metadata, &head_count)?,
        "attn_k.weight" | "attn_k.bias" => {
            match meta::uint(metadata, &format!("{prefix}.attention.head_count_kv"))? {
                Some(kv) => kv,
                None => meta::require_uint(metadata, &head_count)?,
            }
        }
        _ => return Ok(None),
    };
    let rows = tensor.shape.first().copied().unwrap_or(0);
    if heads == 0 || rows % heads != 0 || (rows / heads) % 2 != 0 {
        return Err(GgufHfError::HeadsDoNotDivide {
            tensor: tensor.name.clone(),
            rows,
            heads,
        });
    }
    Ok(Some(heads))
}
