//! One output shard: its header (from [`super::format`]), data streamed in, its digest ([`super::digest`]) computed on the
//! bytes written, then fsync and rename.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

pub use super::digest::hex;
use super::digest::{DigestAlgo, ShardDigest, ShardHasher};
use super::{create_temp, temp_path, Publish, WriteError};

/// Bytes hashed by both hashes before moving on: well inside a core's L2.
const HASH_BLOCK: usize = 256 << 10;

/// A shard being written under its temporary name. Dropping it unfinished
/// removes the temporary file.
///
/// Bytes come from a buffer ([`ShardWriter::write`]) or, block by block
/// with the caller's per-tensor hash beside the digest, from a mapping of
/// the source ([`ShardWriter::write_blocks`]). The digest is taken on the
/// bytes handed to the file; from a mapping they are read twice (hash,
/// then `write`), so they match as long as the source is not rewritten in
/// place meanwhile, which the check of the sources before the commit
/// (`convert`) refuses anyway.
pub struct ShardWriter {
    final_path: PathBuf,
    tmp_path: PathBuf,
    file: Option<File>,
    hash: ShardHasher,
    written: u64,
    expected: u64,
}

/// A shard committed under its final name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedShard {
    pub file: String,
    pub size: u64,
    pub digest: ShardDigest,
}

impl ShardWriter {
    /// Creates `dir/.name.PID-TOKEN.reshard-tmp` and writes the header into it.
    pub fn create(
        dir: &Path,
        name: &str,
        header: &[u8],
        data_len: u64,
        algo: DigestAlgo,
    ) -> Result<ShardWriter, WriteError> {
        let final_path = dir.join(name);
        let tmp_path = temp_path(dir, name);
        let file = create_temp(&tmp_path).map_err(|e| WriteError::io(&final_path, e))?;
        let mut w = ShardWriter {
            final_path,
            tmp_path,
            file: Some(file),
            hash: ShardHasher::new(algo),
            written: 0,
            expected: header.len() as u64 + data_len,
        };
        w.write(header)?;
        Ok(w)
    }

    fn file(&self) -> Result<&File, WriteError> {
        self.file.as_ref().ok_or_else(|| {
            WriteError::io(
                &self.final_path,
                std::io::Error::other("shard already finished"),
            )
        })
    }

    /// Appends bytes, hashing them on the way.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        super::failpoint::step();
        self.hash.update(bytes);
        let mut file = self.file()?;
        file.write_all(bytes)
            .map_err(|e| WriteError::io(&self.final_path, e))?;
        crate::platform::start_writeback(file, self.written, bytes.len() as u64);
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Appends `bytes` (typically a mapping of the source) block by block:
    /// each block goes to the shard digest, then to `each` (the tensor's
    /// xxh3), then to the file, while it is in the CPU's cache, so the
    /// bytes are read from memory once. Writeback of the whole starts at
    /// the end, one call instead of one per block.
    pub fn write_blocks(
        &mut self,
        bytes: &[u8],
        each: &mut dyn FnMut(&[u8]),
    ) -> Result<(), WriteError> {
        super::failpoint::step();
        let Some(mut file) = self.file.as_ref() else {
            return Err(WriteError::io(
                &self.final_path,
                std::io::Error::other("shard already finished"),
            ));
        };
        for block in bytes.chunks(HASH_BLOCK) {
            self.hash.update(block);
            each(block);
            file.write_all(block)
                .map_err(|e| WriteError::io(&self.final_path, e))?;
        }
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
        // Only while the name is free: before a run writes shards, its
        // cleanup removed or moved aside whatever held their names (see
        // convert::run), so a file there now is one someone put there
        // during the run, and it is kept.
        let published = super::atomic::publish(&self.tmp_path, &self.final_path, Publish::New);
        if published.is_err() {
            let _ = std::fs::remove_file(&self.tmp_path);
        }
        published?;
        let hash = std::mem::replace(&mut self.hash, ShardHasher::new(DigestAlgo::Sha256));
        Ok(FinishedShard {
            file: self
                .final_path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            size: self.written,
            digest: hash.finish(),
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
