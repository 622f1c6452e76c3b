//! What a reader tells the user about a checkpoint without refusing it
//! ([`Finding`]), and the limits those findings are measured against.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::names;

/// Something worth telling the user about a checkpoint that does not stop it
/// from being read. `inspect --strict` turns findings into exit status 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Finding {
    /// A shard holds a tensor that its index does not list; loaders that go
    /// by the index will never load it.
    TensorNotInIndex { tensor: String, file: String },
    /// A weight file sits beside an index that does not list it; loaders
    /// that go by the index ignore it.
    FileNotInIndex { file: String },
    /// `metadata.total_size` of an index disagrees with the tensors' bytes.
    TotalSizeMismatch { declared: u64, actual: u64 },
    /// A safetensors file without `"format": "pt"` in `__metadata__`.
    /// With a `__metadata__` of other keys (most UI checkpoints),
    /// transformers 4 and accelerate's `load_state_dict` (1.15) refuse it;
    /// with no `__metadata__` at all, transformers before 4.48.2 fails on
    /// it. transformers 5 (checked on 5.24) loads both.
    MissingFormatPt {
        file: String,
        /// The file has a `__metadata__` (without `"format": "pt"`).
        #[serde(default)]
        has_metadata: bool,
    },
    /// Two shards disagree on a `__metadata__` key; the first value is kept.
    MetadataConflict {
        key: String,
        kept: String,
        dropped: String,
        file: String,
    },
    /// A tensor does not start at a multiple of its element size, so
    /// zero-copy loaders must copy it.
    Misaligned {
        tensor: String,
        file: String,
        offset: u64,
        alignment: u64,
    },
    /// Several names share one PyTorch storage (tied weights).
    SharedStorage { tensors: Vec<String> },
    /// A shard so large that loaders mapping one shard at a time need about
    /// that much commit; resharding helps.
    LargeShard { file: String, size: u64 },
    /// A strided view whose elements repeat (`expand`, stride 0): `bytes`
    /// of output from `stored` bytes of storage. `convert` refuses large
    /// ones unless `--allow-expanded`.
    ExpandedView {
        tensor: String,
        file: String,
        bytes: u64,
        stored: u64,
    },
    /// A quantized weight (F8 or MXFP4 codes) without its scale: read as
    /// is, its values are wrong by the missing factor.
    QuantWeightWithoutScale {
        tensor: String,
        file: String,
        scale: String,
    },
    /// A scale tensor whose quantized weight is not in the checkpoint.
    QuantScaleWithoutWeight { tensor: String, file: String },
    /// A scale whose shape does not fit its weight and the block size.
    QuantScaleShape {
        tensor: String,
        file: String,
        shape: Vec<u64>,
        expected: String,
    },
    /// Quantized codes stored in a dtype their scheme does not use
    /// (gpt-oss's MXFP4 `*_blocks` as I8 rather than U8).
    QuantCodesDtype {
        tensor: String,
        file: String,
        dtype: String,
        expected: String,
    },
    /// The quantization could not be told apart (two schemes, a config
    /// that disagrees with the names) or its config is unreadable; convert
    /// refuses it.
    QuantUnclear { reason: String },
}

/// Most tensors one checkpoint may hold. The largest real index (~10 MB, at
/// about 100 bytes an entry) lists about 100,000 tensors; 262,144 is 2.6
/// times that. Each tensor costs about 1 KiB through `convert` (names,
/// shapes, plan, manifest), so this also bounds the memory of a header full
/// of zero-size tensors.
pub const MAX_TENSORS: usize = 262_144;

/// Shards above this size are reported: loaders that map a shard at a time
/// need at least this much free commit. 5 GB is transformers v4's old default.
pub const LARGE_SHARD: u64 = 5_000_000_000;

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::TensorNotInIndex { tensor, file } => {
                let file = names::escape(file);
                write!(f, "tensor {tensor:?} is in {file} but not in the index; index-driven loaders will skip it")
            }
            Finding::FileNotInIndex { file } => {
                let file = names::escape(file);
                write!(f, "{file} is in the folder but the index does not list it; index-driven loaders ignore it")
            }
            Finding::TotalSizeMismatch { declared, actual } => write!(
                f,
                "index metadata.total_size is {declared} but the tensors hold {actual} bytes"
            ),
            Finding::MissingFormatPt {
                file,
                has_metadata: true,
            } => write!(
                f,
                "{} has no \"format\": \"pt\" in __metadata__; transformers 4 and accelerate's load_state_dict refuse it (transformers 5 loads it)",
                names::escape(file)
            ),
            Finding::MissingFormatPt {
                file,
                has_metadata: false,
            } => write!(
                f,
                "{} has no __metadata__ (no \"format\": \"pt\"); transformers before 4.48.2 fails on it (later versions and accelerate load it)",
                names::escape(file)
            ),
            Finding::MetadataConflict { key, kept, dropped, file } => write!(
                f,
                "__metadata__ key {key:?} is {dropped:?} in {} but {kept:?} in an earlier shard; keeping {kept:?}",
                names::escape(file)
            ),
            Finding::Misaligned { tensor, file, offset, alignment } => write!(
                f,
                "tensor {tensor:?} in {} starts at offset {offset}, not a multiple of {alignment}",
                names::escape(file)
            ),
            Finding::SharedStorage { tensors } => {
                let names: Vec<_> = tensors.iter().map(|t| names::escape(t)).collect();
                write!(f, "tensors share one storage (tied weights): {}", names.join(", "))
            }
            Finding::LargeShard { file, size } => write!(
                f,
                "{} is {}; a loader that maps one shard at a time needs about that much free commit",
                names::escape(file),
                crate::units::human(*size)
            ),
            Finding::ExpandedView { tensor, file, bytes, stored } => write!(
                f,
                "tensor {tensor:?} in {} is an expanded view: {} ({bytes} bytes) from {stored} bytes stored",
                names::escape(file),
                crate::units::human(*bytes)
            ),
            Finding::QuantWeightWithoutScale { tensor, file, scale } => write!(
                f,
                "quantized weight {tensor:?} in {} has no scale ({scale:?} is missing)",
                names::escape(file)
            ),
            Finding::QuantScaleWithoutWeight { tensor, file } => write!(
                f,
                "scale {tensor:?} in {} has no quantized weight",
                names::escape(file)
            ),
            Finding::QuantScaleShape { tensor, file, shape, expected } => write!(
                f,
                "scale {tensor:?} in {} has shape {shape:?}; its weight needs {expected}",
                names::escape(file)
            ),
            Finding::QuantCodesDtype { tensor, file, dtype, expected } => write!(
                f,
                "quantized weight {tensor:?} in {} is {dtype}; its codes are read as {expected}",
                names::escape(file)
            ),
            Finding::QuantUnclear { reason } => write!(f, "{reason}"),
        }
    }
}
