//! Planning a GGUF output: which model a checkpoint is, the GGUF name and
//! GGML type of each tensor, and the key/value metadata of the file.
//!
//! Two kinds of model are written:
//!
//! - **Diffusion models** (FLUX, SD3, SDXL, SD1, Wan and the other families
//!   ComfyUI-GGUF's `tools/convert.py` detects, by the same tensor names):
//!   names kept (less a `model.diffusion_model.`, `model.` or `net.`
//!   wrapper; tensors outside the wrapper are left out, as that converter
//!   drops them), `general.architecture` the family's name. 1-D tensors,
//!   tensors of at most [`SMALL_TENSOR`] elements and the family's
//!   high-precision list stay F32 (F16 for an F16 source), as convert.py
//!   writes them; the rest take `--quantize`'s type, or `--dtype`'s, or
//!   keep their own.
//! - **LLMs** (`LlamaForCausalLM`, `MistralForCausalLM`,
//!   `MixtralForCausalLM`, `Qwen2ForCausalLM`, `Qwen2MoeForCausalLM` in
//!   config.json): [`super::to_gguf::llm_gguf`]'s names, metadata and F32
//!   rules; Llama's q/k rows permuted; MoE experts stacked (one
//!   `ToGgml` input naming every expert tensor).
//!
//! A row (the last dimension) that is not a whole number of the scheme's
//! blocks (32, or 256 for K-quants) falls back to F16, as llama.cpp's
//! quantizer and ComfyUI-GGUF's patch of it do; the plan lists each one.
//! Anything else is refused before a byte is written: an unknown
//! architecture, a non-float tensor, more than four dimensions.

use std::collections::{BTreeMap, HashMap};

use super::error::PlanError;
use super::gguf_families::FAMILIES;
pub use super::gguf_out_record::{
    Fallback, GgufOut, GgufOutError, Kv, KvPairs, TypeTotal, ALIGNMENT, MAX_DIMS, MAX_NAME,
    SMALL_TENSOR,
};
use super::input::TensorInput;
use super::order::{block_of, sort_indices};
use super::output::ShardLayout;
use super::pack::{pack, Item};
use super::quantize::QuantizeScheme;
use super::shards::{cut_into_shards, output_prefix};
use super::to_gguf::{self, file_type, LlmInput, LlmSource, TokenizerFiles};
use super::types::{Plan, PlanOptions, PlannedTensor};
use crate::format::gguf::ggml::GgmlType;
use crate::format::gguf::value::Value;
use crate::format::{Checkpoint, Dtype, Format};

/// The transformers classes written through `to_gguf`.
const LLM_CLASSES: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
];

/// Refuses a `--quantize` scheme that does not fit the output format.
pub fn check_scheme(options: &PlanOptions) -> Result<(), GgufOutError> {
    let Some(scheme) = options.quantize else {
        return Ok(());
    };
    let gguf = options.format == super::types::OutputFormat::Gguf;
    match (scheme.ggml().is_some(), gguf) {
        (true, false) => Err(GgufOutError::SchemeNeedsGguf {
            scheme: scheme.name(),
        }),
        (false, true) => Err(GgufOutError::Fp8ToGguf {
            scheme: scheme.name(),
        }),
        _ => Ok(()),
    }
}

/// One GGUF tensor as planned before packing.
struct Out {
    name: String,
    input: TensorInput,
    source_dtype: Dtype,
    ggml: GgmlType,
    shape: Vec<u64>,
}

/// The element type of an unquantized tensor: `--dtype`'s, else the
/// source's (F64 as F32).
fn float_type(dtype: Option<Dtype>, source: Dtype) -> GgmlType {
    match dtype.unwrap_or(source) {
        Dtype::F16 => GgmlType::F16,
        Dtype::BF16 => GgmlType::BF16,
        _ => GgmlType::F32,
    }
}

/// The plain dtype a GGML type's bytes are recorded as (U8 for blocks).
pub fn dtype_of(ty: GgmlType) -> Dtype {
    match ty {
        GgmlType::F32 => Dtype::F32,
        GgmlType::F16 => Dtype::F16,
        GgmlType::BF16 => Dtype::BF16,
        _ => Dtype::U8,
    }
}

/// `--keep`, `--quantize-only` and `--keep-dtype`, matched against a
/// tensor's GGUF name or its source name.
struct Select {
    keep: globset::GlobSet,
    only: Option<globset::GlobSet>,
    keep_dtype: globset::GlobSet,
}

impl Select {
    fn new(o: &PlanOptions) -> Result<Select, PlanError> {
        let set = |g: &[String]| {
            super::globs::glob_set(g).map_err(|(glob, source)| PlanError::BadGlob { glob, source })
        };
        Ok(Select {
            keep: set(&o.quantize_keep)?,
            only: match o.quantize_only.is_empty() {
                true => None,
                false => Some(set(&o.quantize_only)?),
            },
            keep_dtype: set(&o.keep_dtype)?,
        })
    }

    /// Whether a tensor the rules would quantize is quantized.
    fn quantizes(&self, names: [&str; 2]) -> bool {
        !names.iter().any(|n| self.keep.is_match(n))
            && self
                .only
                .as_ref()
                .is_none_or(|o| names.iter().any(|n| o.is_match(n)))
    }

    /// The element type of a tensor that is not quantized.
    fn float(&self, dtype: Option<Dtype>, names: [&str; 2], source: Dtype) -> GgmlType {
        match names.iter().any(|n| self.keep_dtype.is_match(n)) {
            true => float_type(None, source),
            false => float_type(dtype, source),
        }
    }
}

/// The type a tensor of `shape` that would take `scheme` is written in:
/// the scheme's, or F16 when its rows do not divide into blocks (the
/// fallback is recorded).
fn quantized_type(
    name: &str,
    shape: &[u64],
    scheme: GgmlType,
    fallbacks: &mut Vec<Fallback>,
) -> GgmlType {
    let block = scheme.layout().map_or(1, |l| l.block);
    let cols = shape.last().copied().unwrap_or(1);
    if cols.is_multiple_of(block) {
        return scheme;
    }
    fallbacks.push(Fallback {
        tensor: name.to_string(),
        wanted: scheme,
        written: GgmlType::F16,
        why: format!("rows of {cols} values are not whole {block}-value blocks"),
    });
    GgmlType::F16
}

/// `general.file_type` (gguf-py's `LlamaFileType`) of an output.
fn file_type_of(options: &PlanOptions, main: Dtype) -> u32 {
    match options.quantize.and_then(QuantizeScheme::ggml) {
        Some(GgmlType::Q8_0) => file_type::MOSTLY_Q8_0,
        Some(GgmlType::Q4_0) => file_type::MOSTLY_Q4_0,
        Some(GgmlType::Q4_K) => file_type::MOSTLY_Q4_K_S,
        Some(GgmlType::Q6_K) => file_type::MOSTLY_Q6_K,
        _ => match float_type(options.dtype, main) {
            GgmlType::F16 => file_type::MOSTLY_F16,
            GgmlType::BF16 => file_type::MOSTLY_BF16,
            _ => file_type::ALL_F32,
        },
    }
}

/// The dtype most of the source's elements are in.
fn main_dtype(ck: &Checkpoint) -> Dtype {
    let mut counts: BTreeMap<Dtype, u64> = BTreeMap::new();
    for t in &ck.tensors {
        *counts.entry(t.dtype).or_default() += t.numel();
    }
    counts
        .into_iter()
        .max_by_key(|&(_, n)| n)
        .map_or(Dtype::F32, |(d, _)| d)
}

/// Plans `ck` as a GGUF file (or gguf-split set) under `options`.
pub fn plan(
    ck: &Checkpoint,
    options: &PlanOptions,
    layout: &dyn ShardLayout,
) -> Result<Plan, PlanError> {
    check_scheme(options).map_err(gguf_err)?;
    if let Some(d) = options
        .dtype
        .filter(|d| !matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16))
    {
        return Err(gguf_err(GgufOutError::Dtype { dtype: d }));
    }
    if ck.format == Format::Gguf {
        return Err(gguf_err(GgufOutError::Source { what: "a GGUF" }));
    }
    for t in &ck.tensors {
        if !matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16 | Dtype::F64) {
            return Err(gguf_err(GgufOutError::NotFloat {
                file: ck.file_of(t).name(),
                tensor: t.name.clone(),
                dtype: t.dtype,
            }));
        }
        // A zero-element tensor passes the source's size check whatever its
        // other dimensions; gguf-py and ggml reject one whose others
        // overflow (4 bytes: the widest element a GGUF output holds).
        let mut nonzero = t.shape.iter().filter(|&&d| d != 0);
        if nonzero
            .try_fold(4u64, |a, &d| a.checked_mul(d))
            .is_none_or(|n| n > i64::MAX as u64)
        {
            return Err(gguf_err(GgufOutError::HugeDims {
                file: ck.file_of(t).name(),
                tensor: t.name.clone(),
                shape: t.shape.clone(),
            }));
        }
        if t.shape.len() > MAX_DIMS {
            return Err(gguf_err(GgufOutError::TooManyDims {
                file: ck.file_of(t).name(),
                tensor: t.name.clone(),
                dims: t.shape.len(),
            }));
        }
    }
    let scheme = options.quantize.and_then(QuantizeScheme::ggml);
    let select = Select::new(options)?;
    let mut fallbacks = Vec::new();
    let file_type = file_type_of(options, main_dtype(ck));
    let config = read_config(ck).map_err(gguf_err)?;
    let llm_class = config
        .as_ref()
        .is_some_and(|(_, classes)| classes.iter().any(|c| LLM_CLASSES.contains(&c.as_str())));
    let (architecture, kind, kv, outs, left_out) = match (llm_class, &config) {
        (true, Some((text, _))) => {
            let (arch, kv, outs) = llm(
                ck,
                text,
                options,
                &select,
                scheme,
                file_type,
                &mut fallbacks,
            )
            .map_err(gguf_err)?;
            (arch, "llm", kv, outs, Vec::new())
        }
        _ => {
            let classes = config
                .as_ref()
                .map(|(_, c)| c.join(", "))
                .filter(|c| !c.is_empty())
                .unwrap_or_else(|| "no architectures (or there is none)".into());
            let (arch, outs, left_out) =
                diffusion(ck, options, &select, scheme, &mut fallbacks, classes)
                    .map_err(gguf_err)?;
            let kv = vec![
                (
                    "general.architecture".into(),
                    Value::String(arch.as_bytes().to_vec()),
                ),
                ("general.quantization_version".into(), Value::U32(2)),
                ("general.file_type".into(), Value::U32(file_type)),
            ];
            (arch.to_string(), "diffusion", kv, outs, left_out)
        }
    };
    // Checked on the GGUF names (the LLM path renames): a longer one makes
    // a file gguf-py reads but llama.cpp and its tools refuse.
    if let Some(o) = outs.iter().find(|o| o.name.len() >= MAX_NAME) {
        let t = &ck.tensors[o.input.primary()];
        return Err(gguf_err(GgufOutError::NameTooLong {
            file: ck.file_of(t).name(),
            source_name: t.name.clone(),
            tensor: o.name.clone(),
            len: o.name.len(),
        }));
    }
    if let Some(s) = scheme {
        if !outs.iter().any(|o| o.ggml == s) {
            return Err(gguf_err(GgufOutError::NothingQuantized {
                scheme: options.quantize.map_or("", QuantizeScheme::name),
                block: s.layout().map_or(1, |l| l.block),
            }));
        }
    }
    let mut types: BTreeMap<GgmlType, TypeTotal> = BTreeMap::new();
    let planned: Vec<PlannedTensor> = outs
        .into_iter()
        .map(|o| {
            let numel = o.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let len = numel
                .and_then(|n| o.ggml.layout()?.byte_len(n))
                .unwrap_or(u64::MAX);
            let total = types.entry(o.ggml).or_insert(TypeTotal {
                ggml: o.ggml,
                tensors: 0,
                bytes: 0,
            });
            total.tensors += 1;
            total.bytes = total.bytes.saturating_add(len);
            PlannedTensor {
                name: o.name,
                input: o.input,
                source_dtype: o.source_dtype,
                dtype: dtype_of(o.ggml),
                shape: o.shape,
                len,
                offset: 0,
                after: None,
            }
        })
        .collect();
    let items: Vec<Item<super::order::Block>> = planned
        .iter()
        .map(|t| Item {
            bytes: t.len.saturating_add(ALIGNMENT),
            block: block_of(&t.name),
            glued: false,
        })
        .collect();
    let ranges = pack(&items, options.max_shard_size);
    let prefix = output_prefix(ck);
    let layer_order: Vec<String> = planned.iter().map(|t| t.name.clone()).collect();
    let total_size = planned.iter().map(|t| t.len).sum();
    let (shards, oversized) =
        cut_into_shards(layout, &prefix, planned, ranges, options.max_shard_size);
    Ok(Plan {
        options: options.clone(),
        index_file: None,
        prefix,
        layer_order,
        total_size,
        shards,
        oversized,
        casts: Vec::new(),
        dropped: Vec::new(),
        metadata: BTreeMap::new(),
        quantization: None,
        quantized: None,
        gguf: None,
        gguf_out: Some(GgufOut {
            architecture,
            kind,
            alignment: ALIGNMENT,
            kv: Kv(kv),
            types: types.into_values().collect(),
            fallbacks,
            left_out,
        }),
    })
}

fn gguf_err(e: GgufOutError) -> PlanError {
    PlanError::GgufOut(Box::new(e))
}

/// config.json beside the weights, if any: its text and `architectures`.
fn read_config(ck: &Checkpoint) -> Result<Option<(String, Vec<String>)>, GgufOutError> {
    let path = ck.dir.join("config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let bad = |why: String| GgufOutError::Config {
        dir: ck.dir.display().to_string(),
        why,
    };
    let text = crate::format::read::read_regular_string(&path, to_gguf::MAX_TOKENIZER_JSON)
        .map_err(|e| bad(e.to_string()))?;
    let value = crate::format::config::parse_config(&text).map_err(|e| bad(e.to_string()))?;
    let classes = value
        .get("architectures")
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|c| c.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    Ok(Some((text, classes)))
}

/// A diffusion model's family, wrapper and tensors.
fn diffusion(
    ck: &Checkpoint,
    options: &PlanOptions,
    select: &Select,
    scheme: Option<GgmlType>,
    fallbacks: &mut Vec<Fallback>,
    classes: String,
) -> Result<(&'static str, Vec<Out>, Vec<String>), GgufOutError> {
    let names: Vec<&str> = ck.tensors.iter().map(|t| t.name.as_str()).collect();
    let wrapper = ["model.diffusion_model.", "model."]
        .into_iter()
        .find(|p| names.iter().any(|n| n.starts_with(p)))
        .or_else(|| {
            let net = "net.";
            (!names.is_empty() && names.iter().all(|n| n.starts_with(net))).then_some(net)
        });
    let stripped: Vec<Option<&str>> = names
        .iter()
        .map(|n| match wrapper {
            Some(p) => n.strip_prefix(p),
            None => Some(*n),
        })
        .collect();
    let present: std::collections::HashSet<&str> = stripped.iter().flatten().copied().collect();
    let family = FAMILIES
        .iter()
        .find(|f| {
            f.detect
                .iter()
                .any(|set| set.iter().all(|k| present.contains(k)))
        })
        .ok_or_else(|| GgufOutError::UnknownArchitecture {
            architectures: classes,
            families: FAMILIES
                .iter()
                .map(|f| f.arch)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    if let Some(b) = family.banned.iter().find(|b| present.contains(*b)) {
        return Err(GgufOutError::DiffusersLayout {
            family: family.arch,
            tensor: (*b).to_string(),
        });
    }
    let mut kept = Vec::new();
    let mut left_out = Vec::new();
    for (i, s) in stripped.iter().enumerate() {
        match s {
            Some(n) if !family.ignore.iter().any(|x| n.contains(x)) => kept.push(i),
            _ => left_out.push(names[i].to_string()),
        }
    }
    let kept_names: Vec<&str> = kept.iter().map(|&i| stripped[i].unwrap_or("")).collect();
    let order = sort_indices(&kept_names, options.order);
    let mut outs = Vec::with_capacity(kept.len());
    for k in order {
        let i = kept[k];
        let t = &ck.tensors[i];
        let name = kept_names[k];
        let wide = matches!(t.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F64);
        let high = t.shape.len() <= 1
            || t.numel() <= SMALL_TENSOR
            || family.hiprec.iter().any(|h| name.contains(h));
        let names = [name, t.name.as_str()];
        let ggml = match (high, scheme) {
            (true, _) if wide => GgmlType::F32,
            (true, _) => GgmlType::F16,
            (false, Some(s)) if select.quantizes(names) => {
                quantized_type(name, &t.shape, s, fallbacks)
            }
            (false, _) => select.float(options.dtype, names, t.dtype),
        };
        outs.push(Out {
            name: name.to_string(),
            input: TensorInput::ToGgml {
                tensor: i,
                ggml,
                permute_heads: None,
                stacked: Vec::new(),
            },
            source_dtype: t.dtype,
            ggml,
            shape: t.shape.clone(),
        });
    }
    Ok((family.arch, outs, left_out))
}

/// An LLM through `to_gguf`: its architecture name, metadata and tensors.
fn llm(
    ck: &Checkpoint,
    config_json: &str,
    options: &PlanOptions,
    select: &Select,
    scheme: Option<GgmlType>,
    file_type: u32,
    fallbacks: &mut Vec<Fallback>,
) -> Result<(String, KvPairs, Vec<Out>), GgufOutError> {
    let tokenizer = TokenizerFiles::read(&ck.dir).map_err(|e| GgufOutError::Tokenizer {
        dir: ck.dir.display().to_string(),
        why: e.to_string(),
    })?;
    // convert_hf_to_gguf's order: shards by file name, names sorted in each.
    let mut order: Vec<usize> = (0..ck.tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&ck.tensors[a], &ck.tensors[b]);
        (ck.file_of(ta).name(), &ta.name).cmp(&(ck.file_of(tb).name(), &tb.name))
    });
    let tensors: Vec<(String, Vec<u64>)> = order
        .iter()
        .map(|&i| (ck.tensors[i].name.clone(), ck.tensors[i].shape.clone()))
        .collect();
    let folder_name = ck
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let g = to_gguf::llm_gguf(&LlmInput {
        config_json,
        tokenizer: &tokenizer,
        tensors: &tensors,
        folder_name: &folder_name,
        file_type,
    })?;
    let index: HashMap<&str, usize> = ck
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let mut outs = Vec::with_capacity(g.tensors.len());
    for t in g.tensors {
        let ggml_for = |source: &crate::format::Tensor, fallbacks: &mut Vec<Fallback>| {
            let names = [t.name.as_str(), source.name.as_str()];
            match (t.force_f32, scheme) {
                (true, _) => GgmlType::F32,
                (false, Some(s)) if t.shape.len() >= 2 && select.quantizes(names) => {
                    quantized_type(&t.name, &t.shape, s, fallbacks)
                }
                (false, _) => select.float(options.dtype, names, source.dtype),
            }
        };
        let out = match &t.source {
            LlmSource::Tensor(source) => {
                let &i = index
                    .get(source.as_str())
                    .ok_or_else(|| GgufOutError::MissingSource {
                        tensor: t.name.clone(),
                        source_name: source.clone(),
                    })?;
                let s = &ck.tensors[i];
                let ggml = ggml_for(s, fallbacks);
                Out {
                    input: TensorInput::ToGgml {
                        tensor: i,
                        ggml,
                        permute_heads: t.permute_heads,
                        stacked: Vec::new(),
                    },
                    source_dtype: s.dtype,
                    ggml,
                    name: t.name,
                    shape: t.shape,
                }
            }
            LlmSource::Generated(values) => Out {
                input: TensorInput::Constant {
                    of: order.first().copied().unwrap_or(0),
                    bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                },
                source_dtype: Dtype::F32,
                ggml: GgmlType::F32,
                name: t.name,
                shape: t.shape,
            },
            LlmSource::Stack(sources) => {
                let mut ids = Vec::with_capacity(sources.len());
                for source in sources {
                    let &i =
                        index
                            .get(source.as_str())
                            .ok_or_else(|| GgufOutError::MissingSource {
                                tensor: t.name.clone(),
                                source_name: source.clone(),
                            })?;
                    ids.push(i);
                }
                let first = *ids.first().ok_or_else(|| GgufOutError::MissingSource {
                    tensor: t.name.clone(),
                    source_name: "(no experts)".into(),
                })?;
                let s = &ck.tensors[first];
                let ggml = ggml_for(s, fallbacks);
                Out {
                    input: TensorInput::ToGgml {
                        tensor: first,
                        ggml,
                        permute_heads: None,
                        stacked: ids[1..].to_vec(),
                    },
                    source_dtype: s.dtype,
                    ggml,
                    name: t.name,
                    shape: t.shape,
                }
            }
        };
        outs.push(out);
    }
    Ok((g.architecture.name().to_string(), g.metadata, outs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uniform_q4_k_is_labelled_q4_k_s() {
        let options = PlanOptions {
            quantize: Some(QuantizeScheme::Q4K),
            ..PlanOptions::default()
        };
        assert_eq!(file_type_of(&options, Dtype::F32), 14);
    }
}
