//! The data the GGUF reader returns (one file's header: [`GgufFile`], its
//! [`GgufTensor`]s and typed [`Metadata`]) and the limits it reads under.

use serde::Serialize;

use super::error::GgufError;
use super::ggml::GgmlType;
use super::value::Value;

/// The most bytes a header's key/value pairs and tensor infos may take,
/// counting both the bytes read and the memory their values cost. Real
/// headers are dominated by the tokenizer: a 262,144-token vocabulary's
/// tokens, scores and types take about 6 MiB, Llama 3's 280,000 merges
/// about 5 MiB, a `tokenizer.huggingface.json` embedded whole up to about
/// 35 MiB; 64 MiB holds the largest of these with room to spare.
pub const MAX_HEADER: u64 = 64 << 20;

/// The longest string value: the header budget itself (an embedded
/// tokenizer.json is one string).
pub const MAX_STRING: u64 = MAX_HEADER;

/// The longest key or tensor name. llama.cpp's 63 bytes is its own limit,
/// not the format's: ComfyUI-GGUF writes names of up to 127 bytes, and its
/// `comfy.gguf.orig_shape.NAME` keys are longer still.
pub const MAX_NAME: u64 = 4096;

/// The most key/value pairs: real files have 20 to 60, ComfyUI-GGUF adds
/// one `comfy.gguf.orig_shape.*` key per reshaped tensor, so at most one
/// per tensor plus the rest.
pub const MAX_KEYS: u64 = 2 * crate::format::MAX_TENSORS as u64;

/// How deep arrays of arrays may nest. llama.cpp refuses nested arrays and
/// gguf-py flattens them; no real file nests at all.
pub const MAX_ARRAY_DEPTH: usize = 4;

/// Most dimensions a tensor may have: the safetensors reader's limit
/// (ggml itself has 4).
pub const MAX_DIMS: usize = crate::format::safetensors::MAX_DIMS;

/// `general.alignment` when the key is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One tensor of a GGUF file or split set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GgufTensor {
    pub name: String,
    pub ggml_type: GgmlType,
    /// Safetensors (row-major) order: ggml's `ne` reversed, so the last
    /// dimension is the row ggml blocks run along.
    pub shape: Vec<u64>,
    /// Index of the file (split member) that holds the data.
    pub file: usize,
    /// Absolute offset of the data in that file.
    pub offset: u64,
    /// Byte length of the data, `None` for a type id the table does not know.
    pub len: Option<u64>,
}

impl GgufTensor {
    /// Number of elements (the product of the shape, checked when read).
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// One file's parsed header.
#[derive(Debug, Clone)]
pub struct GgufFile {
    pub version: u32,
    pub metadata: Metadata,
    /// In tensor-info order, which is also data order.
    pub tensors: Vec<GgufTensor>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    pub file_len: u64,
}

/// Key/value metadata in file order, with lookup by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    kvs: Vec<(String, Value)>,
    /// Indices into `kvs` sorted by key.
    sorted: Vec<u32>,
}

impl Metadata {
    /// Builds the lookup; a key that appears twice is refused.
    pub fn new(kvs: Vec<(String, Value)>) -> Result<Metadata, GgufError> {
        let mut sorted: Vec<u32> = (0..kvs.len() as u32).collect();
        sorted.sort_unstable_by(|&a, &b| kvs[a as usize].0.cmp(&kvs[b as usize].0));
        if let Some(w) = sorted
            .windows(2)
            .find(|w| kvs[w[0] as usize].0 == kvs[w[1] as usize].0)
        {
            return Err(GgufError::DuplicateKey {
                key: kvs[w[0] as usize].0.clone(),
            });
        }
        Ok(Metadata { kvs, sorted })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.sorted
            .binary_search_by(|&i| self.kvs[i as usize].0.as_str().cmp(key))
            .ok()
            .map(|i| &self.kvs[self.sorted[i] as usize].1)
    }

    /// A string value, if `key` holds one.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// Every pair, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> + '_ {
        self.kvs.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.kvs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kvs.is_empty()
    }
}

/// Refuses a tensor name that appears twice (sorting indices, as the
/// safetensors reader does, so no second copy of the names is made).
pub(super) fn refuse_duplicate_tensors(tensors: &[GgufTensor]) -> Result<(), GgufError> {
    let mut order: Vec<u32> = (0..tensors.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| tensors[a as usize].name.cmp(&tensors[b as usize].name));
    match order
        .windows(2)
        .find(|w| tensors[w[0] as usize].name == tensors[w[1] as usize].name)
    {
        Some(w) => Err(GgufError::DuplicateTensor {
            tensor: tensors[w[0] as usize].name.clone(),
        }),
        None => Ok(()),
    }
}
