//! `reshard.json`: what was converted from what, with which options, and the
//! checksums that let `validate` and a later run trust the output.
//!
//! The same structure, with only the finished shards, is kept in
//! `.reshard-partial.json` while a conversion runs: a rerun keeps the shards
//! it lists (after checking their digest) and writes the rest. The partial
//! manifest also lists every name the run is going to write (`planned`), so
//! a later run can clean up after it without touching anything else.
//!
//! Both are read with [`crate::format::read::read_regular`]: a regular file (never a FIFO or a
//! device) of at most [`MAX_MANIFEST_LEN`] bytes.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::digest::ShardDigest;
use crate::cast::CastStats;
use crate::format::read::read_regular;
use crate::format::{Checkpoint, Dtype, Format, FormatError, SourceFile};
use crate::plan::dequant::QuantRecord;
use crate::plan::{Dropped, GgufRecord, Oversized, PlanOptions};

/// File name of the manifest, written last.
pub const MANIFEST: &str = "reshard.json";
/// File name of the progress record of an unfinished run.
pub const PARTIAL: &str = ".reshard-partial.json";

/// The source a conversion read: enough to tell whether it changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceIdentity {
    pub dir: String,
    /// The model's real root folder (see [`super::scope::OutputScope::root`]):
    /// what `batch` compares to decide that an output is its own conversion
    /// of the same source. Not part of the plan id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    pub format: Format,
    pub files: Vec<SourceFile>,
}

impl SourceIdentity {
    pub fn of(ck: &Checkpoint) -> SourceIdentity {
        SourceIdentity {
            dir: ck.dir.display().to_string(),
            root: None,
            format: ck.format,
            files: ck.files.clone(),
        }
    }
}

/// One tensor as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorRecord {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// xxh3-64 of the tensor's output bytes, lower-case hex.
    pub xxh3: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cast: Option<CastRecord>,
    /// `--quantize` with scales: how far the codes are from the source.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quantized: Option<crate::cast::quantize::QuantQuality>,
}

/// What a cast did to one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CastRecord {
    pub from: Dtype,
    pub to: Dtype,
    #[serde(flatten)]
    pub stats: CastStats,
}

/// One shard as written. Its digest is recorded under the algorithm's name
/// (`"blake3": HEX`, or `"sha256": HEX` with `--sha256` and in manifests
/// from before BLAKE3; `sha256sum FILE` prints the latter).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub file: String,
    pub size: u64,
    #[serde(flatten)]
    pub digest: ShardDigest,
    #[serde(deserialize_with = "super::capped::tensors")]
    pub tensors: Vec<TensorRecord>,
}

/// A mirrored non-weight file (config.json, a tokenizer file) with its
/// source's size and mtime when it was copied: a rerun recopies it when the
/// source's differ, though the shards are up to date.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopiedFile {
    /// Its path under the model folder, `/` separators.
    pub name: String,
    pub size: u64,
    /// Nanoseconds since the Unix epoch (0 if unknown).
    pub mtime_ns: u64,
}

/// A file reshard wrote or copied beside the shards (the index, config.json,
/// tokenizer files, every mirrored file), as it was written: `validate`
/// and the up-to-date test of a rerun check it, and a later run replaces or
/// removes the file only while it still has these bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Its path under DST, `/` separators.
    pub name: String,
    pub size: u64,
    #[serde(flatten)]
    pub digest: ShardDigest,
}

/// The whole manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub reshard_version: String,
    /// Hash of the source identity and the options: equal ids mean a rerun
    /// would write the same output.
    pub plan_id: String,
    pub source: SourceIdentity,
    pub options: PlanOptions,
    #[serde(default)]
    pub index_file: Option<String>,
    #[serde(deserialize_with = "super::capped::tensors")]
    pub shards: Vec<ShardRecord>,
    #[serde(default, deserialize_with = "super::capped::files")]
    pub copied_files: Vec<String>,
    /// The source identity of each of `copied_files` when copied; absent
    /// in manifests before reshard recorded it (a rerun then recopies
    /// them all once).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::capped::files"
    )]
    pub copied_sources: Vec<CopiedFile>,
    /// The size and digest of every file written beside the shards (the
    /// index, copied and generated files); absent in manifests before
    /// reshard recorded them (nothing beside the shards is proven then).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::capped::files"
    )]
    pub files: Vec<FileRecord>,
    #[serde(default, deserialize_with = "super::capped::tensors")]
    pub oversized: Vec<Oversized>,
    #[serde(default, deserialize_with = "super::capped::tensors")]
    pub dropped: Vec<Dropped>,
    /// Partial manifest only: every name this run may write (shards and
    /// index), recorded before the first of them is created.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "super::capped::tensors"
    )]
    pub planned: Vec<String>,
    /// A quantized source: its quantization config as it was, and what was
    /// dequantized from what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<QuantRecord>,
    /// A GGUF source: each output tensor's GGUF name and GGML type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gguf: Option<GgufRecord>,
    /// `--quantize`: what was quantized, the bytes it saved and the error
    /// figures over the written codes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized: Option<QuantizedOutput>,
}

/// What `--quantize` did to the output, as convert prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantizedOutput {
    pub scheme: crate::plan::quantize::QuantizeScheme,
    /// Weights quantized, and their bytes before (as they would have been
    /// written) and after (codes and scales).
    pub tensors: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// The figures of every quantized weight with scales (plain FP8 is a
    /// cast: its clamping is counted as a cast's).
    pub quality: crate::cast::quantize::QualityReport,
}

impl Manifest {
    /// The quality report of the tensors written so far (resumed shards'
    /// included), from their records.
    pub fn quality(&self) -> crate::cast::quantize::QualityReport {
        let mut report = crate::cast::quantize::QualityReport::default();
        for t in self.shards.iter().flat_map(|s| &s.tensors) {
            if let Some(q) = &t.quantized {
                report.add(&t.name, q);
            }
        }
        report
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// A manifest from its JSON bytes, every list within its cap
    /// ([`super::capped`]).
    pub fn parse(bytes: &[u8]) -> Result<Manifest, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Reads a manifest; `Ok(None)` if there is none.
    pub fn read(path: &Path) -> Result<Option<Manifest>, ManifestError> {
        let bytes = match read_regular(path, MAX_MANIFEST_LEN) {
            Ok(b) => b,
            Err(FormatError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(ManifestError::Read(e)),
        };
        Manifest::parse(&bytes)
            .map(Some)
            .map_err(|e| ManifestError::Invalid {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
    }

    /// Every file name this manifest says reshard wrote or meant to write,
    /// the manifest files themselves excluded. Only plain names (one path
    /// component) count: a record naming `../x` or `/x` is ignored, never
    /// followed.
    pub fn own_names(&self) -> impl Iterator<Item = &str> {
        self.shards
            .iter()
            .map(|s| s.file.as_str())
            .chain(self.index_file.as_deref())
            .chain(self.copied_files.iter().map(String::as_str))
            .chain(self.planned.iter().map(String::as_str))
            .filter(|n| crate::names::is_plain_relative(n))
    }

    /// The record of the file `name` (beside the shards), if any.
    pub fn file_record(&self, name: &str) -> Option<&FileRecord> {
        self.files.iter().find(|r| r.name == name)
    }

    /// Every tensor record, shard by shard.
    pub fn tensors(&self) -> impl Iterator<Item = (&ShardRecord, &TensorRecord)> {
        self.shards
            .iter()
            .flat_map(|s| s.tensors.iter().map(move |t| (s, t)))
    }
}

/// The largest manifest read back. A manifest costs about 250 bytes per
/// tensor; the largest real checkpoints have about 100,000 tensors (25 MB),
/// so 128 MiB leaves five times that.
pub const MAX_MANIFEST_LEN: u64 = 128 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Read(FormatError),
    #[error("cannot read {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{}: not a reshard manifest ({reason}); reshard replaces only files it can prove it \
         wrote: move this one away, or name another DST",
        .path.display()
    )]
    Invalid { path: PathBuf, reason: String },
}

/// The plan id: sha256 over the source identity (file names, sizes, mtimes)
/// and the options that change output bytes.
pub fn plan_id(source: &SourceIdentity, options: &PlanOptions) -> String {
    use sha2::{Digest, Sha256};
    let files: Vec<(String, u64, u64)> = source
        .files
        .iter()
        .map(|f| (f.name(), f.size, f.mtime_ns))
        .collect();
    let key = serde_json::json!({ "files": files, "format": source.format, "options": options });
    super::shard::hex(&Sha256::digest(key.to_string().as_bytes()))
}
