//! Checkpoint readers: turn what a user has on disk into a [`Checkpoint`], a
//! plain list of tensors with exact byte locations.
//!
//! This stage owns file discovery ([`discover`]), the safetensors header
//! ([`safetensors`]), index files ([`index`]), the PyTorch zip format
//! ([`pytorch`]), bounded reads of tensor bytes ([`read`]) and the layout of
//! a model folder made of several weight sets ([`layout`]). It reads headers
//! only: no tensor data is touched until a later stage asks [`read`] for it.
//! It never writes anything.

pub mod discover;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod index;
mod json;
pub mod layout;
pub mod names;
pub mod pytorch;
pub mod quant;
pub mod read;
pub mod safetensors;
pub mod strided;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

pub use self::discover::open;
pub use self::dtype::Dtype;
pub use self::error::FormatError;

/// The on-disk format of a checkpoint's weight files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Safetensors,
    Pytorch,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Safetensors => "safetensors",
            Format::Pytorch => "pytorch",
        })
    }
}

/// How the weight files of a checkpoint are tied together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Layout {
    /// One weight file.
    Single,
    /// Shards listed by a `*.index.json`.
    Indexed { index: PathBuf },
    /// Several weight files without an index.
    Loose,
}

/// One weight file, with the identity it had when it was read.
///
/// Size and mtime let later stages notice a file that changed under them and
/// let `batch` decide whether an output is up to date.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    pub path: PathBuf,
    pub size: u64,
    /// Modification time in nanoseconds since the Unix epoch (0 if unknown).
    pub mtime_ns: u64,
}

impl SourceFile {
    /// Reads the current size and mtime of `path`, following symlinks.
    pub fn stat(path: &Path) -> Result<SourceFile, FormatError> {
        let meta = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Ok(SourceFile {
            path: path.to_path_buf(),
            size: meta.len(),
            mtime_ns,
        })
    }

    /// Fails with [`FormatError::SourceChanged`] if the file's size or mtime
    /// differ from when it was read.
    pub fn check_unchanged(&self) -> Result<(), FormatError> {
        let now = SourceFile::stat(&self.path)?;
        if now.size != self.size || now.mtime_ns != self.mtime_ns {
            return Err(FormatError::SourceChanged {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    /// The file name, for messages and index entries.
    pub fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

/// Where a tensor's bytes are, inside its file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum DataRef {
    /// `len` contiguous little-endian bytes at absolute file offset `offset`.
    Contiguous { offset: u64 },
    /// A strided view (PyTorch): element `i` of the logical, row-major tensor
    /// sits at `storage + (elem_offset + sum(index_k * strides_k)) * elem_size`.
    /// `storage_len` bounds every access.
    Strided {
        storage: u64,
        storage_len: u64,
        elem_offset: u64,
        strides: Vec<u64>,
    },
    /// Contiguous bytes inside a deflate-compressed zip entry whose compressed
    /// data starts at `entry` and is `compressed_len` long; the tensor starts
    /// `skip` bytes into the decompressed entry of `entry_len` bytes.
    Deflated {
        entry: u64,
        compressed_len: u64,
        entry_len: u64,
        skip: u64,
    },
}

/// One tensor of a checkpoint: what it is and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Byte length of the tensor's contiguous representation.
    pub len: u64,
    /// Index into [`Checkpoint::files`].
    pub file: usize,
    pub data: DataRef,
}

impl Tensor {
    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn numel(&self) -> u64 {
        // Readers check this product when they build the tensor.
        self.shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Bytes of the file the tensor's values are read from: its length,
    /// except for a strided view, which reads only the span of storage its
    /// strides reach (less than its length when elements repeat, as in an
    /// `expand`).
    pub fn stored_bytes(&self) -> u64 {
        match &self.data {
            DataRef::Strided { strides, .. } => {
                let elem = (self.dtype.bits() / 8).max(1);
                strided::span(&self.shape, strides, elem).map_or(self.len, |s| s.min(self.len))
            }
            DataRef::Contiguous { .. } | DataRef::Deflated { .. } => self.len,
        }
    }

    /// The absolute file offset where the tensor's bytes (or its storage) begin.
    pub fn offset(&self) -> u64 {
        match &self.data {
            DataRef::Contiguous { offset } => *offset,
            DataRef::Strided { storage, .. } => *storage,
            DataRef::Deflated { entry, .. } => *entry,
        }
    }
}

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
    /// A safetensors file without `"format": "pt"` in `__metadata__`;
    /// transformers and accelerate refuse it.
    MissingFormatPt { file: String },
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
            Finding::MissingFormatPt { file } => write!(
                f,
                "{} has no \"format\": \"pt\" in __metadata__; transformers refuses to load it",
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
            Finding::QuantUnclear { reason } => write!(f, "{reason}"),
        }
    }
}

/// A readable checkpoint: its files, its tensors in source order, and what
/// is wrong with it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The folder holding the weight files (for the HF cache: the snapshot).
    pub dir: PathBuf,
    pub format: Format,
    pub layout: Layout,
    /// The shard-name prefix: `model`, `diffusion_pytorch_model`, ...
    pub prefix: String,
    pub files: Vec<SourceFile>,
    /// Tensors in source order (index order, then file order).
    pub tensors: Vec<Tensor>,
    /// The union of every file's `__metadata__` (first value wins).
    pub metadata: BTreeMap<String, String>,
    pub findings: Vec<Finding>,
}

impl Checkpoint {
    /// Sum of every tensor's byte length.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.len).sum()
    }

    /// Sum of every tensor's element count.
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(Tensor::numel).sum()
    }

    /// The file a tensor lives in.
    pub fn file_of(&self, tensor: &Tensor) -> &SourceFile {
        &self.files[tensor.file]
    }

    /// Fails if any source file changed size or mtime since it was read.
    pub fn check_unchanged(&self) -> Result<(), FormatError> {
        self.files.iter().try_for_each(SourceFile::check_unchanged)
    }
}
