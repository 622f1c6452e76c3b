//! Source tensors to GGUF tensors: the names of gguf-py's `TensorNameMap`
//! for the transformers classes reshard writes, the q/k rows Llama's
//! converter permutes, Qwen2-MoE's per-expert tensors stacked into one per
//! block, the generated Llama 3 `rope_freqs.weight`, and which tensors the
//! converter keeps in F32 whatever the output type.
//!
//! The order is the converter's: generated tensors first, then the source
//! tensors in the order given (convert_hf_to_gguf reads shards sorted by
//! file name and each shard's names sorted), a stacked expert tensor where
//! its block's last expert tensor arrives.

use std::collections::{BTreeMap, HashSet};

use super::error::ToGgufError;
use super::hparams::{bad, Arch, Hparams};

/// Where a GGUF tensor's values come from.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmSource {
    /// One source tensor, as it is (rows permuted where
    /// [`LlmTensor::permute_heads`] says so).
    Tensor(String),
    /// Source tensors of one shape stacked along a new leading axis, in
    /// this order (`torch.stack(datas, dim=0)`): their bytes one after the
    /// other.
    Stack(Vec<String>),
    /// Values computed from config.json (Llama 3 rope factors), F32.
    Generated(Vec<f32>),
}

/// One GGUF tensor to write.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmTensor {
    /// The GGUF name (`blk.3.attn_q.weight`).
    pub name: String,
    pub source: LlmSource,
    /// The shape in safetensors (row-major) order, outermost first; GGUF's
    /// dims are this reversed.
    pub shape: Vec<u64>,
    /// Rows permuted as `LlamaModel.permute` does with this many heads
    /// (`crate::cast::gguf::permuted_row`), `None` for rows kept in order.
    pub permute_heads: Option<u64>,
    /// Written as F32 whatever the output type: 1-D tensors, norms, biases
    /// and the MoE router gates (`ffn_gate_inp`, `ffn_gate_inp_shexp`), as
    /// the converter's `prepare_tensors` decides.
    pub force_f32: bool,
}

/// Names the converter drops before mapping (`prepare_tensors`).
const DROPPED: [&str; 3] = [
    ".attention.masked_bias",
    ".attention.bias",
    ".rotary_emb.inv_freq",
];

/// The GGUF tensors for `tensors` (name, safetensors shape), in order.
pub(super) fn plan(
    hp: &Hparams,
    tensors: &[(String, Vec<u64>)],
) -> Result<Vec<LlmTensor>, ToGgufError> {
    let mut out = Vec::new();
    if let Some(factors) = super::rope::llama3_factors(hp)? {
        out.push(LlmTensor {
            name: "rope_freqs.weight".into(),
            shape: vec![factors.len() as u64],
            source: LlmSource::Generated(factors),
            permute_heads: None,
            force_f32: true,
        });
    }
    let mut seen = HashSet::new();
    let mut experts = Experts::new(hp);
    for (name, shape) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(ToGgufError::DuplicateTensor {
                tensor: name.clone(),
            });
        }
        if DROPPED.iter().any(|s| name.ends_with(s)) {
            continue;
        }
        let mapped = map_name(hp.arch, name).ok_or_else(|| ToGgufError::UnknownTensor {
            tensor: name.clone(),
            arch: hp.arch.name(),
        })?;
        match mapped {
            Mapped::Plain(gguf) => {
                let permute_heads = permute_heads(hp, name, shape)?;
                out.push(tensor(
                    gguf,
                    LlmSource::Tensor(name.clone()),
                    shape.clone(),
                    permute_heads,
                ));
            }
            Mapped::Expert {
                block,
                expert,
                proj,
            } => {
                experts.add(hp, (block, expert, proj), name, shape, &mut out)?;
            }
        }
    }
    experts.finish()?;
    Ok(out)
}

fn tensor(
    name: String,
    source: LlmSource,
    shape: Vec<u64>,
    permute_heads: Option<u64>,
) -> LlmTensor {
    let force_f32 = shape.len() <= 1
        || name.ends_with("_norm.weight")
        || !name.ends_with(".weight")
        || name.ends_with(".ffn_gate_inp.weight")
        || name.ends_with(".ffn_gate_inp_shexp.weight");
    LlmTensor {
        name,
        source,
        shape,
        permute_heads,
        force_f32,
    }
}

enum Mapped {
    Plain(String),
    /// `model.layers.B.mlp.experts.E.{proj}.weight` of Qwen2-MoE,
    /// `model.layers.B.block_sparse_moe.experts.E.{w1,w2,w3}.weight` of
    /// Mixtral; `proj` indexes [`expert_projs`].
    Expert {
        block: u64,
        expert: u64,
        proj: usize,
    },
}

/// Where an architecture's expert tensors live, and their projections in
/// the order the converter writes their stacks, with their GGUF names.
fn expert_projs(arch: Arch) -> (&'static str, &'static [(&'static str, &'static str)]) {
    match arch {
        // Qwen2MoeModel.modify_tensors
        Arch::Qwen2Moe => (
            "mlp.experts.",
            &[
                ("down_proj", "ffn_down_exps"),
                ("gate_proj", "ffn_gate_exps"),
                ("up_proj", "ffn_up_exps"),
            ],
        ),
        // LlamaModel.modify_tensors (Mixtral)
        _ => (
            "block_sparse_moe.experts.",
            &[
                ("w1", "ffn_gate_exps"),
                ("w2", "ffn_down_exps"),
                ("w3", "ffn_up_exps"),
            ],
        ),
    }
}

/// A canonical decimal (`3`, not `03`), as Python's `str.format(bid=3)`
/// of the map's patterns produces.
fn index(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

fn map_name(arch: Arch, name: &str) -> Option<Mapped> {
    let plain = |s: &str| Some(Mapped::Plain(s.to_string()));
    match name {
        "model.embed_tokens.weight" => return plain("token_embd.weight"),
        "model.norm.weight" => return plain("output_norm.weight"),
        "lm_head.weight" => return plain("output.weight"),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (block, rest) = rest.split_once('.')?;
    let block = index(block)?;
    let (part, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let weight = suffix == "weight";
    let moe = arch == Arch::Qwen2Moe;
    let llama = arch == Arch::Llama;
    let gguf = match part {
        "input_layernorm" if weight => "attn_norm",
        "post_attention_layernorm" if weight => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" if !moe => "ffn_gate",
        "mlp.up_proj" if !moe => "ffn_up",
        "mlp.down_proj" if !moe => "ffn_down",
        "mlp.gate" if moe && weight => "ffn_gate_inp",
        "mlp.shared_expert_gate" if moe && weight => "ffn_gate_inp_shexp",
        "mlp.shared_expert.gate_proj" if moe => "ffn_gate_shexp",
        "mlp.shared_expert.up_proj" if moe => "ffn_up_shexp",
        "mlp.shared_expert.down_proj" if moe => "ffn_down_shexp",
        "block_sparse_moe.gate" if llama && weight => "ffn_gate_inp",
        _ if (moe || llama) && weight => {
            let (prefix, projs) = expert_projs(arch);
            let (expert, proj) = part.strip_prefix(prefix)?.split_once('.')?;
            let proj = projs.iter().position(|(p, _)| *p == proj)?;
            return Some(Mapped::Expert {
                block,
                expert: index(expert)?,
                proj,
            });
        }
        _ => return None,
    };
    Some(Mapped::Plain(format!("blk.{block}.{gguf}.{suffix}")))
}

/// The head count `LlamaModel.modify_tensors` permutes `name`'s rows with:
/// `num_attention_heads` for q, `num_key_value_heads` for k (weights and
/// biases), none for other tensors or other architectures.
fn permute_heads(hp: &Hparams, name: &str, shape: &[u64]) -> Result<Option<u64>, ToGgufError> {
    if hp.arch != Arch::Llama {
        return Ok(None);
    }
    // The converter looks both up for every tensor, and fails without them.
    let n_head = hp.require_u32(&["n_heads", "num_attention_heads"])?;
    let n_kv = hp.require_u32(&["n_kv_heads", "num_key_value_heads"])?;
    let heads = if name.ends_with("q_proj.weight") || name.ends_with("q_proj.bias") {
        n_head
    } else if name.ends_with("k_proj.weight") || name.ends_with("k_proj.bias") {
        n_kv
    } else {
        return Ok(None);
    };
    let heads = u64::from(heads);
    let rows = shape.first().copied().unwrap_or(0);
    if heads == 0 || rows % heads != 0 || (rows / heads) % 2 != 0 {
        return Err(ToGgufError::HeadsDoNotDivide {
            tensor: name.into(),
            rows,
            heads,
        });
    }
    Ok(Some(heads))
}

/// One block's expert tensors so far: (expert, projection) -> (source
/// name, shape).
type Block = BTreeMap<(u64, usize), (String, Vec<u64>)>;

/// Per-expert tensors, collected per block until all `experts * 3` have
/// arrived, then stacked (`Qwen2MoeModel.modify_tensors`,
/// `LlamaModel.modify_tensors` for Mixtral).
struct Experts {
    /// The expert count, looked up at the first expert tensor as the
    /// converter does.
    count: Option<u64>,
    keys: &'static [&'static str],
    prefix: &'static str,
    projs: &'static [(&'static str, &'static str)],
    pending: BTreeMap<u64, Block>,
}

impl Experts {
    fn new(hp: &Hparams) -> Experts {
        let (prefix, projs) = expert_projs(hp.arch);
        let keys: &'static [&'static str] = match hp.arch {
            Arch::Qwen2Moe => &["num_local_experts", "num_experts"],
            _ => &["num_local_experts"],
        };
        Experts {
            count: None,
            keys,
            prefix,
            projs,
            pending: BTreeMap::new(),
        }
    }

    fn add(
        &mut self,
        hp: &Hparams,
        (block, expert, proj): (u64, u64, usize),
        name: &str,
        shape: &[u64],
        out: &mut Vec<LlmTensor>,
    ) -> Result<(), ToGgufError> {
        let count = match self.count {
            Some(n) => n,
            None => u64::from(hp.require_u32(self.keys)?),
        };
        self.count = Some(count);
        if expert >= count {
            return Err(bad(
                self.keys[0],
                format!("is {count}, but tensor {name:?} is expert {expert}"),
            ));
        }
        let got = self.pending.entry(block).or_default();
        got.insert((expert, proj), (name.to_string(), shape.to_vec()));
        if (got.len() as u64) < count * 3 {
            return Ok(());
        }
        let got = self.pending.remove(&block).unwrap_or_default();
        for (p, (_, gguf)) in self.projs.iter().enumerate() {
            let members: Vec<&(String, Vec<u64>)> =
                (0..count).filter_map(|e| got.get(&(e, p))).collect();
            let first = &members[0].1;
            if let Some(odd) = members.iter().find(|m| &m.1 != first) {
                return Err(ToGgufError::BadTensor {
                    tensor: odd.0.clone(),
                    why: format!(
                        "shape {:?} differs from {:?}'s {first:?}; experts are stacked into one tensor",
                        odd.1, members[0].0
                    ),
                });
            }
            let mut shape = vec![count];
            shape.extend_from_slice(first);
            let sources = members.iter().map(|m| m.0.clone()).collect();
            out.push(tensor(
                format!("blk.{block}.{gguf}.weight"),
                LlmSource::Stack(sources),
                shape,
                None,
            ));
        }
        Ok(())
    }

    fn finish(self) -> Result<(), ToGgufError> {
        let Some((&block, got)) = self.pending.iter().next() else {
            return Ok(());
        };
        let count = self.count.unwrap_or(0);
        let (prefix, projs) = (self.prefix, self.projs);
        let missing: Vec<String> = (0..count)
            .flat_map(|e| (0..projs.len()).map(move |p| (e, p)))
            .filter(|k| !got.contains_key(k))
            .take(4)
            .map(|(e, p)| format!("model.layers.{block}.{prefix}{e}.{}.weight", projs[p].0))
            .collect();
        Err(ToGgufError::MissingExperts {
            block,
            experts: count,
            missing: missing.join(", "),
        })
    }
}
