//! The GGUF output's part of a plan (what `--dry-run` prints and the
//! writer reads: architecture, metadata, the types chosen) and why one
//! cannot be planned. The planner is `super::gguf_out`.

use serde::{Serialize, Serializer};

use super::to_gguf;
use crate::format::gguf::ggml::GgmlType;
use crate::format::gguf::value::Value;
use crate::format::Dtype;

/// Tensors of at most this many elements stay F32 (convert.py's
/// `QUANTIZATION_THRESHOLD`): quantizing them saves nothing.
pub const SMALL_TENSOR: u64 = 1024;

/// The alignment of every tensor's data (gguf-py's default; the writer
/// records it as `general.alignment` only when it differs, as gguf-py).
pub const ALIGNMENT: u64 = 32;

/// GGML keeps at most four dimensions.
pub const MAX_DIMS: usize = 4;
/// GGML's `GGML_MAX_NAME`: a tensor name's bytes plus its closing NUL must
/// fit, so llama.cpp's loader takes names of at most `MAX_NAME - 1` bytes.
pub const MAX_NAME: usize = 64;

/// What a GGUF output holds beside its tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufOut {
    /// `general.architecture`.
    pub architecture: String,
    /// `llm` or `diffusion`.
    pub kind: &'static str,
    pub alignment: u64,
    /// Key/value metadata of the first file, in file order (split keys
    /// are the writer's). Printed summarized.
    pub kv: Kv,
    /// Tensors and bytes per GGML type.
    pub types: Vec<TypeTotal>,
    /// Tensors whose rows do not divide into the scheme's blocks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<Fallback>,
    /// Source tensors not written (outside a diffusion model's wrapper).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
}

// Metadata floats are never NaN (config values and scores), and plans are
// compared only to see whether two runs would write the same thing.
impl Eq for GgufOut {}

/// Key/value pairs in file order.
pub type KvPairs = Vec<(String, Value)>;

/// Ordered key/value pairs, serialized as a map of their summaries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kv(pub KvPairs);

impl Serialize for Kv {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, &v.to_string())?;
        }
        m.end()
    }
}

/// Tensors and output bytes of one GGML type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TypeTotal {
    pub ggml: GgmlType,
    pub tensors: usize,
    pub bytes: u64,
}

/// A tensor written in another type than the scheme's, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fallback {
    pub tensor: String,
    pub wanted: GgmlType,
    pub written: GgmlType,
    pub why: String,
}

/// Why a GGUF output cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum GgufOutError {
    #[error("--quantize {scheme} writes GGUF blocks; name a DST ending in .gguf (safetensors has no {scheme})")]
    SchemeNeedsGguf { scheme: &'static str },
    #[error("--quantize {scheme} is an FP8 safetensors scheme; a .gguf DST takes --quantize q8_0, q4_0, q4_k or q6_k (or --dtype f32, f16, bf16)")]
    Fp8ToGguf { scheme: &'static str },
    #[error(
        "--dtype {dtype}: GGUF stores F32, F16 or BF16 (or --quantize q8_0, q4_0, q4_k, q6_k)"
    )]
    Dtype { dtype: Dtype },
    #[error("the source is {what}; reshard writes GGUF from safetensors or PyTorch checkpoints (convert a GGUF to safetensors first)")]
    Source { what: &'static str },
    #[error("cannot tell which model this is: config.json names {architectures}, and the tensor names match none of ComfyUI-GGUF's diffusion families ({families}); reshard writes GGUF for LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, Qwen2MoeForCausalLM and those families")]
    UnknownArchitecture {
        architectures: String,
        families: String,
    },
    #[error("the tensors look like the diffusers layout of {family} (tensor {tensor:?}); ComfyUI-GGUF reads the reference layout only: convert the original checkpoint")]
    DiffusersLayout {
        family: &'static str,
        tensor: String,
    },
    #[error("{file}: tensor {tensor:?} is {dtype}; a GGUF output takes floating-point tensors (F32, F16, BF16, F64)")]
    NotFloat {
        file: String,
        tensor: String,
        dtype: Dtype,
    },
    #[error("{file}: tensor {tensor:?} has {dims} dimensions; GGML keeps at most 4 (ComfyUI-GGUF's tools/fix_5d_tensors.py handles such tensors)")]
    TooManyDims {
        file: String,
        tensor: String,
        dims: usize,
    },
    #[error("{file}: tensor {source_name:?} would be GGUF tensor {tensor:?}, {len} bytes long; llama.cpp refuses a file with a tensor name of 64 bytes or more (GGML_MAX_NAME counts the closing NUL): rename it in the source")]
    NameTooLong {
        file: String,
        source_name: String,
        tensor: String,
        len: usize,
    },
    #[error("{file}: tensor {tensor:?} has shape {shape:?}; GGML counts a tensor's elements and bytes in an int64 (zero dimensions aside), which these dimensions overflow")]
    HugeDims {
        file: String,
        tensor: String,
        shape: Vec<u64>,
    },
    #[error("--quantize {scheme}: no tensor has rows that divide into {block}-value blocks, so nothing would be quantized")]
    NothingQuantized { scheme: &'static str, block: u64 },
    #[error("config.json (in {dir}): {why}")]
    Config { dir: String, why: String },
    /// A tokenizer file that cannot be read (`why` names it).
    #[error("the tokenizer files (in {dir}): {why}")]
    Tokenizer { dir: String, why: String },
    #[error("cannot describe the model as GGUF")]
    Llm(#[from] to_gguf::ToGgufError),
    #[error(
        "GGUF tensor {tensor:?} names source tensor {source_name:?}, which the checkpoint lacks"
    )]
    MissingSource { tensor: String, source_name: String },
}
