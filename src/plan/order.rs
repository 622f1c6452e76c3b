//! Layer order: the sort keys that decide in which order tensors are written
//! and loaded, and which numbered block (layer) a tensor belongs to.
//!
//! * `natural` is transformers v5's `dot_natural_key`: split the name on '.',
//!   all-digit parts compare as integers and sort before other parts, which
//!   compare as strings; ties break on the raw bytes.
//! * `forward` puts inputs (embeddings) first, then numbered blocks stack by
//!   stack in the order a forward pass meets them (vision, encoder, unknown,
//!   decoder), each stack's own tail (final norm) after its blocks, and the
//!   head last. The stack ranking is a heuristic over common names; `natural`
//!   is the plain rule. It covers the diffusers models too: a UNet goes
//!   `conv_in`, time embedding, `down_blocks`, `mid_block`, `up_blocks`,
//!   output (and the original `input_blocks`, `middle_block`,
//!   `output_blocks`); a DiT goes embedders, `transformer_blocks` in order,
//!   then `single_transformer_blocks` (Flux), then `norm_out`/`proj_out`; a
//!   VAE goes encoder, `quant_conv`, `post_quant_conv`, decoder (its
//!   `decoder.conv_in` leading the decoder, not the model).
//! * `source` keeps the order the files list.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// Which order tensors are laid out in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    #[default]
    Forward,
    Natural,
    Source,
}

/// One '.'-separated part of a name, compared as transformers v5 does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part<'a> {
    /// All digits; leading zeros stripped so the length orders magnitude.
    Num(&'a str),
    Str(&'a str),
}

impl Ord for Part<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Part::Num(a), Part::Num(b)) => a.len().cmp(&b.len()).then_with(|| a.cmp(b)),
            (Part::Num(_), Part::Str(_)) => Ordering::Less,
            (Part::Str(_), Part::Num(_)) => Ordering::Greater,
            (Part::Str(a), Part::Str(b)) => a.cmp(b),
        }
    }
}

impl PartialOrd for Part<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn parts(name: &str) -> Vec<Part<'_>> {
    name.split('.')
        .map(|p| {
            if is_digits(p) {
                let trimmed = p.trim_start_matches('0');
                Part::Num(if trimmed.is_empty() { "0" } else { trimmed })
            } else {
                Part::Str(p)
            }
        })
        .collect()
}

/// Compares two names by transformers v5's `dot_natural_key`, ties on bytes.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    parts(a).cmp(&parts(b)).then_with(|| a.cmp(b))
}

/// The numbered block a tensor belongs to: the name up to its first
/// all-digit part. `model.layers.3.mlp.experts.7.w1` is in block
/// `model.layers.3` of stack `model.layers`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Block {
    /// The stack the block is numbered in (`model.layers`, `encoder.block`).
    pub stack: String,
    pub index: u64,
}

impl Block {
    /// `stack.index`, as it appears in tensor names.
    pub fn name(&self) -> String {
        if self.stack.is_empty() {
            self.index.to_string()
        } else {
            format!("{}.{}", self.stack, self.index)
        }
    }
}

/// The block of `name`, or `None` for tensors outside any numbered block.
pub fn block_of(name: &str) -> Option<Block> {
    let mut offset: usize = 0;
    for part in name.split('.') {
        if is_digits(part) {
            let stack = name[..offset.saturating_sub(1)].to_string();
            // Absurdly long numbers are still a block; cap the index.
            let index = part.parse::<u64>().unwrap_or(u64::MAX);
            return Some(Block { stack, index });
        }
        offset += part.len() + 1;
    }
    None
}

/// Where a name falls in a forward pass, coarsely.
fn stack_rank(name: &str) -> u8 {
    let n = name.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| n.contains(w));
    if has(&["vision", "visual", "image_encoder", "vit."]) {
        0
    } else if has(&["encoder", "down_blocks", "down.", "input_blocks"]) {
        1
    } else if has(&["decoder", "up_blocks", "up.", "output_blocks"]) {
        // Before the middle: a VAE's `decoder.mid_block` is the decoder's.
        4
    } else if has(&["mid_block", "middle"]) {
        2
    } else {
        3
    }
}

fn is_input(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["embed", "wte.", "wpe.", "conv_in.", "proj_in.", "patch"]
        .iter()
        .any(|w| n.contains(w))
        || n == "shared.weight"
        || n.ends_with(".shared.weight")
}

fn is_head(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.starts_with("lm_head")
        || n.contains(".lm_head")
        || n == "output.weight"
        || n.starts_with("score.")
        || n.starts_with("classifier.")
}

/// The forward-order key of a name; compare keys, then `natural_cmp`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ForwardKey {
    /// 0: inputs, 1: blocks and stack tails, 2: heads.
    class: u8,
    /// Stack position in a forward pass; 9 for tensors matching no stack.
    rank: u8,
    /// Within a rank: 1 for the single-stream blocks a DiT runs after its
    /// double-stream ones (`single_transformer_blocks`, `single_blocks`).
    stage: u8,
    /// 0: inside a numbered block, 1: after the stack's blocks.
    tail: u8,
    stack: String,
    index: u64,
}

/// A key outside any numbered block.
fn plain_key(class: u8, rank: u8, tail: u8) -> ForwardKey {
    ForwardKey {
        class,
        rank,
        stage: 0,
        tail,
        stack: String::new(),
        index: 0,
    }
}

fn forward_key(name: &str) -> ForwardKey {
    let block = block_of(name);
    if block.is_none() {
        // A VAE: the encoder's quant_conv ends the encoder; post_quant_conv
        // and the decoder's conv_in start the decoder.
        let n = name.to_ascii_lowercase();
        if n.starts_with("quant_conv.") {
            return plain_key(1, 1, 1);
        }
        if n.starts_with("post_quant_conv.") {
            return plain_key(1, 4, 0);
        }
        if let Some((stack, _)) = name.split_once("conv_in.").filter(|_| stack_rank(&n) == 4) {
            let mut key = plain_key(1, 4, 0);
            key.stack = stack.trim_end_matches('.').to_string();
            return key;
        }
        if is_input(name) {
            return plain_key(0, 0, 0);
        }
        if is_head(name) {
            return plain_key(2, 0, 0);
        }
    }
    match block {
        // A numbered embedding (`time_embed.0`, `label_emb.0.0`) is input.
        Some(b) if is_input(&format!("{}.", b.stack)) => ForwardKey {
            class: 0,
            rank: 0,
            stage: 0,
            tail: 0,
            stack: b.stack,
            index: b.index,
        },
        Some(b) => {
            let last = b.stack.rsplit('.').next().unwrap_or_default();
            ForwardKey {
                class: 1,
                rank: stack_rank(&b.stack),
                stage: u8::from(last.starts_with("single_")),
                tail: 0,
                stack: b.stack,
                index: b.index,
            }
        }
        None => {
            let rank = match stack_rank(name) {
                3 => 9,
                r => r,
            };
            plain_key(1, rank, 1)
        }
    }
}

/// Compares two names in forward order.
pub fn forward_cmp(a: &str, b: &str) -> Ordering {
    forward_key(a)
        .cmp(&forward_key(b))
        .then_with(|| natural_cmp(a, b))
}

/// The permutation that puts `names` (given in source order) in `order`.
pub fn sort_indices<S: AsRef<str>>(names: &[S], order: Order) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..names.len()).collect();
    match order {
        Order::Source => {}
        Order::Natural => idx.sort_by(|&a, &b| natural_cmp(names[a].as_ref(), names[b].as_ref())),
        Order::Forward => {
            // Compute each key once: sorting calls the comparator n log n times.
            let keys: Vec<ForwardKey> = names.iter().map(|n| forward_key(n.as_ref())).collect();
            idx.sort_by(|&a, &b| {
                keys[a]
                    .cmp(&keys[b])
                    .then_with(|| natural_cmp(names[a].as_ref(), names[b].as_ref()))
            });
        }
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(names: &[&str], order: Order) -> Vec<String> {
        sort_indices(names, order)
            .into_iter()
            .map(|i| names[i].to_string())
            .collect()
    }

    #[test]
    fn natural_orders_numbers_as_integers() {
        let names = ["model.layers.10.a", "model.layers.2.a", "model.layers.1.a"];
        assert_eq!(
            sorted(&names, Order::Natural),
            ["model.layers.1.a", "model.layers.2.a", "model.layers.10.a"]
        );
        // Digits sort before strings at the same position, as in transformers.
        assert_eq!(natural_cmp("a.0", "a.b"), Ordering::Less);
        // Ties on the key break on bytes.
        assert_eq!(natural_cmp("a.01", "a.1"), Ordering::Less);
        assert_eq!(
            natural_cmp("a.99999999999999999999999", "a.100000000000000000000000"),
            Ordering::Less
        );
    }

    #[test]
    fn llama_forward_order() {
        let names = [
            "lm_head.weight",
            "model.norm.weight",
            "model.layers.10.mlp.down_proj.weight",
            "model.layers.2.self_attn.q_proj.weight",
            "model.embed_tokens.weight",
        ];
        assert_eq!(
            sorted(&names, Order::Forward),
            [
                "model.embed_tokens.weight",
                "model.layers.2.self_attn.q_proj.weight",
                "model.layers.10.mlp.down_proj.weight",
                "model.norm.weight",
                "lm_head.weight",
            ]
        );
    }

    #[test]
    fn gpt2_forward_order() {
        let names = [
            "transformer.ln_f.weight",
            "transformer.h.1.attn.c_attn.weight",
            "transformer.wpe.weight",
            "transformer.h.0.ln_1.weight",
            "transformer.wte.weight",
        ];
        assert_eq!(
            sorted(&names, Order::Forward),
            [
                "transformer.wpe.weight",
                "transformer.wte.weight",
                "transformer.h.0.ln_1.weight",
                "transformer.h.1.attn.c_attn.weight",
                "transformer.ln_f.weight"
            ]
        );
    }

    #[test]
    fn t5_runs_encoder_stack_then_decoder_stack() {
        let names = [
            "decoder.block.0.layer.0.SelfAttention.q.weight",
            "decoder.final_layer_norm.weight",
            "encoder.block.1.layer.0.SelfAttention.q.weight",
            "encoder.block.0.layer.0.SelfAttention.q.weight",
            "encoder.final_layer_norm.weight",
            "shared.weight",
            "lm_head.weight",
        ];
        assert_eq!(
            sorted(&names, Order::Forward),
            [
                "shared.weight",
                "encoder.block.0.layer.0.SelfAttention.q.weight",
                "encoder.block.1.layer.0.SelfAttention.q.weight",
                "encoder.final_layer_norm.weight",
                "decoder.block.0.layer.0.SelfAttention.q.weight",
                "decoder.final_layer_norm.weight",
                "lm_head.weight",
            ]
        );
    }

    #[test]
    fn moe_experts_stay_in_their_layer_in_expert_order() {
        let names = [
            "model.layers.1.mlp.experts.10.up_proj.weight",
            "model.layers.1.mlp.experts.2.up_proj.weight",
            "model.layers.0.mlp.gate.weight",
            "model.layers.1.mlp.experts.2.down_proj.weight",
        ];
        assert_eq!(
            sorted(&names, Order::Forward),
            [
                "model.layers.0.mlp.gate.weight",
                "model.layers.1.mlp.experts.2.down_proj.weight",
                "model.layers.1.mlp.experts.2.up_proj.weight",
                "model.layers.1.mlp.experts.10.up_proj.weight",
            ]
        );
        assert_eq!(block_of(names[0]).unwrap().name(), "model.layers.1");
    }

    #[test]
    fn diffusion_unet_goes_down_mid_up() {
        let names = [
            "up_blocks.0.resnets.0.conv1.weight",
            "mid_block.resnets.0.conv1.weight",
            "down_blocks.1.resnets.0.conv1.weight",
            "down_blocks.0.resnets.1.conv1.weight",
            "conv_in.weight",
            "transformer_blocks.3.attn.to_q.weight",
        ];
        let s = sorted(&names, Order::Forward);
        assert_eq!(s[0], "conv_in.weight");
        assert_eq!(
            &s[1..3],
            [
                "down_blocks.0.resnets.1.conv1.weight",
                "down_blocks.1.resnets.0.conv1.weight"
            ]
        );
        assert_eq!(s[3], "mid_block.resnets.0.conv1.weight");
        assert_eq!(s[5], "up_blocks.0.resnets.0.conv1.weight");
        assert_eq!(
            block_of("transformer_blocks.3.attn.to_q.weight")
                .unwrap()
                .name(),
            "transformer_blocks.3"
        );
    }

    #[test]
    fn flux_runs_double_stream_blocks_then_single_stream_blocks() {
        let names = [
            "proj_out.weight",
            "single_transformer_blocks.0.attn.to_q.weight",
            "transformer_blocks.10.attn.to_q.weight",
            "norm_out.linear.weight",
            "transformer_blocks.2.attn.to_q.weight",
            "x_embedder.weight",
            "single_transformer_blocks.1.attn.to_q.weight",
        ];
        let s = sorted(&names, Order::Forward);
        assert_eq!(
            s[..5],
            [
                "x_embedder.weight",
                "transformer_blocks.2.attn.to_q.weight",
                "transformer_blocks.10.attn.to_q.weight",
                "single_transformer_blocks.0.attn.to_q.weight",
                "single_transformer_blocks.1.attn.to_q.weight",
            ]
        );
    }

    #[test]
    fn vae_runs_encoder_then_quant_convs_then_decoder() {
        let names = [
            "decoder.conv_out.weight",
            "decoder.up_blocks.0.resnets.0.conv1.weight",
            "decoder.mid_block.resnets.0.conv1.weight",
            "decoder.conv_in.weight",
            "post_quant_conv.weight",
            "quant_conv.weight",
            "encoder.conv_out.weight",
            "encoder.mid_block.resnets.0.conv1.weight",
            "encoder.down_blocks.1.resnets.0.conv1.weight",
            "encoder.down_blocks.0.resnets.0.conv1.weight",
            "encoder.conv_in.weight",
        ];
        assert_eq!(
            sorted(&names, Order::Forward),
            [
                "encoder.conv_in.weight",
                "encoder.down_blocks.0.resnets.0.conv1.weight",
                "encoder.down_blocks.1.resnets.0.conv1.weight",
                "encoder.mid_block.resnets.0.conv1.weight",
                "encoder.conv_out.weight",
                "quant_conv.weight",
                "post_quant_conv.weight",
                "decoder.conv_in.weight",
                "decoder.mid_block.resnets.0.conv1.weight",
                "decoder.up_blocks.0.resnets.0.conv1.weight",
                "decoder.conv_out.weight",
            ]
        );
    }

    #[test]
    fn original_unet_names_go_input_middle_output() {
        let names = [
            "model.diffusion_model.output_blocks.0.0.in_layers.2.weight",
            "model.diffusion_model.middle_block.0.in_layers.2.weight",
            "model.diffusion_model.input_blocks.1.0.in_layers.2.weight",
            "model.diffusion_model.time_embed.0.weight",
        ];
        let s = sorted(&names, Order::Forward);
        assert_eq!(s, [names[3], names[2], names[1], names[0]]);
    }

    #[test]
    fn vision_tower_before_language_model() {
        let names = [
            "language_model.model.layers.0.mlp.up_proj.weight",
            "vision_tower.vision_model.encoder.layers.1.mlp.fc1.weight",
        ];
        assert_eq!(sorted(&names, Order::Forward)[0], names[1]);
    }

    #[test]
    fn source_order_is_kept() {
        let names = ["b", "a", "c"];
        assert_eq!(sorted(&names, Order::Source), ["b", "a", "c"]);
    }

    #[test]
    fn names_without_blocks() {
        assert_eq!(block_of("lm_head.weight"), None);
        assert_eq!(
            block_of("0.weight").unwrap(),
            Block {
                stack: String::new(),
                index: 0
            }
        );
    }
}
