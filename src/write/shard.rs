//! One output shard: header built from the plan, data streamed in, sha256
//! computed on the bytes as they are written, then fsync and rename.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{create_temp, temp_path, WriteError};
use crate::plan::ShardPlan;

/// The header of a shard: 8-byte little-endian length, then JSON padded with
/// spaces to a multiple of 8 so the data section starts 8-aligned.
///
/// Built through the safetensors crate's `Metadata`, which checks the
/// offsets, and serialized in our order (the crate's `serialize_to_file`
/// would re-sort by dtype and name).
pub fn header_bytes(
    path: &Path,
    shard: &ShardPlan,
    metadata: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<u8>, WriteError> {
    use safetensors::tensor::{Metadata, TensorInfo};
    let bad = |reason: String| WriteError::Header {
        path: path.to_path_buf(),
        reason,
    };
    let tensors = shard
        .tensors
        .iter()
        .map(|t| {
            let shape = t
                .shape
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>();
            let begin = usize::try_from(t.offset);
            let end = usize::try_from(t.offset + t.len);
            match (shape, begin, end) {
                (Ok(shape), Ok(b), Ok(e)) => Ok((
                    t.name.clone(),
                    TensorInfo {
                        dtype: t.dtype.to_safetensors(),
                        shape,
                        data_offsets: (b, e),
                    },
                )),
                _ => Err(bad(format!(
                    "tensor {:?} does not fit this platform's usize",
                    t.name
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let meta: HashMap<String, String> = metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let metadata = Metadata::new(Some(meta), tensors).map_err(|e| bad(e.to_string()))?;
    let mut json = serde_json::to_vec(&metadata).map_err(|e| bad(e.to_string()))?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// A shard being written under its temporary name. Dropping it unfinished
/// removes the temporary file.
pub struct ShardWriter {
    final_path: PathBuf,
    tmp_path: PathBuf,
    file: Option<File>,
    sha: Sha256,
    written: u64,
    expected: u64,
}

/// A shard committed under its final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedShard {
    pub file: String,
    pub size: u64,
    pub sha256: String,
}

impl ShardWriter {
    /// Creates `dir/.name.PID-TOKEN.reshard-tmp` and writes the header into it.
    pub fn create(
        dir: &Path,
        name: &str,
        header: &[u8],
        data_len: u64,
    ) -> Result<ShardWriter, WriteError> {
        let final_path = dir.join(name);
        let tmp_path = temp_path(dir, name);
        let file = create_temp(&tmp_path).map_err(|e| WriteError::io(&final_path, e))?;
        let mut w = ShardWriter {
            final_path,
            tmp_path,
            file: Some(file),
            sha: Sha256::new(),
            written: 0,
            expected: header.len() as u64 + data_len,
        };
        w.write(header)?;
        Ok(w)
    }

    /// Appends bytes, hashing them on the way.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        super::failpoint::step();
        self.sha.update(bytes);
        let file = self.file.as_mut().ok_or_else(|| {
            WriteError::io(
                &self.final_path,
                std::io::Error::other("shard already finished"),
            )
        })?;
        file.write_all(bytes)
            .map_err(|e| WriteError::io(&self.final_path, e))?;
        crate::platform::start_writeback(file, self.written, bytes.len() as u64);
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Checks the length, flushes to disk and renames to the final name.
    pub fn finish(mut self) -> Result<FinishedShard, WriteError> {
        if self.written != self.expected {
            return Err(WriteError::WrongLength {
                path: self.final_path.clone(),
                written: self.written,
                expected: self.expected,
            });
        }
        let file = self.file.take();
        if let Some(f) = file {
            f.sync_all()
                .map_err(|e| WriteError::io(&self.final_path, e))?;
        }
        super::failpoint::step();
        std::fs::rename(&self.tmp_path, &self.final_path)
            .map_err(|e| WriteError::io(&self.final_path, e))?;
        let sha = std::mem::take(&mut self.sha);
        Ok(FinishedShard {
            file: self
                .final_path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            size: self.written,
            sha256: hex(&sha.finalize()),
        })
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        if self.file.is_some() {
            self.file = None;
            let _ = std::fs::remove_file(&self.tmp_path);
        }
    }
}

/// Lower-case hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// sha256 of a whole file, read in bounded chunks (used to verify shards a
/// killed run finished, before a resume keeps them).
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut f, &mut buf)?;
        if n == 0 {
            break;
        }
        sha.update(&buf[..n]);
    }
    Ok(hex(&sha.finalize()))
}
