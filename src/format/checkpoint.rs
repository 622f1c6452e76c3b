//! The data a reader returns: a [`Checkpoint`] of [`Tensor`]s with exact
//! byte locations ([`DataRef`]) in its [`SourceFile`]s.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::dtype::Dtype;
use super::error::FormatError;
use super::finding::Finding;
use super::gguf::ggml::GgmlType;

/// The on-disk format of a checkpoint's weight files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Safetensors,
    Pytorch,
    /// A GGUF file or gguf-split set (see [`crate::format::gguf`]).
    Gguf,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Safetensors => "safetensors",
            Format::Pytorch => "pytorch",
            Format::Gguf => "gguf",
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
    /// `len` contiguous bytes at `offset` holding GGML blocks of
    /// `ggml_type` (a GGUF quantized tensor): the tensor's `dtype` is `U8`,
    /// its shape the dense one, and only `crate::cast::gguf` turns the bytes
    /// into values.
    Blocks { offset: u64, ggml_type: GgmlType },
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
                span(&self.shape, strides, elem).map_or(self.len, |s| s.min(self.len))
            }
            DataRef::Contiguous { .. } | DataRef::Deflated { .. } | DataRef::Blocks { .. } => {
                self.len
            }
        }
    }

    /// The GGML type of a GGUF quantized tensor's blocks.
    pub fn ggml_type(&self) -> Option<GgmlType> {
        match self.data {
            DataRef::Blocks { ggml_type, .. } => Some(ggml_type),
            _ => None,
        }
    }

    /// The absolute file offset where the tensor's bytes (or its storage) begin.
    pub fn offset(&self) -> u64 {
        match &self.data {
            DataRef::Contiguous { offset } | DataRef::Blocks { offset, .. } => *offset,
            DataRef::Strided { storage, .. } => *storage,
            DataRef::Deflated { entry, .. } => *entry,
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

/// The bytes of storage a view with these dimensions can reach, from its
/// first element to just past its last; 0 for an empty view, `None` on
/// overflow.
pub fn span(shape: &[u64], strides: &[u64], elem_size: u64) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let last = shape.iter().zip(strides).try_fold(0u64, |acc, (&d, &s)| {
        acc.checked_add((d - 1).checked_mul(s)?)
    })?;
    last.checked_add(1)?.checked_mul(elem_size)
}
