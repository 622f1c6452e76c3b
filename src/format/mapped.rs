//! Mapped reads of tensor bytes: one chunk of a source file at a time,
//! read-only and *shared* (never copy-on-write: nothing is charged against
//! the commit limit), for the paths that take input straight from the page
//! cache instead of a `pread` into a buffer of ours (the executor's cast
//! and copy paths, `crate::exec::mapped`, and the GGUF encoder). The caller
//! holds one mapping at a time and reserves its bytes from its window.
//!
//! A shared mapping of a file that shrinks under it faults instead of
//! returning an error. [`SourceReader::map_at`] checks the file's length
//! against the header's claim right before each mapping; a truncation after
//! that check, while the chunk is mapped, ends the process with an error
//! naming the file and exit status 2 on Unix (`crate::platform::MappedRange`),
//! and Windows refuses to truncate a mapped file.

use super::read::SourceReader;
use super::{DataRef, FormatError, Tensor};
use crate::platform::MappedRange;

impl SourceReader {
    /// Maps `len` bytes of `tensor`'s data from byte `done` of it. A tensor
    /// not stored as one contiguous range (a strided view, a deflated zip
    /// entry) cannot be mapped: an error naming it.
    pub fn map_chunk(
        &self,
        tensor: &Tensor,
        done: u64,
        len: usize,
    ) -> Result<MappedRange, FormatError> {
        let DataRef::Contiguous { offset } = tensor.data else {
            return Err(FormatError::BadData {
                path: self.file(tensor.file).1.to_path_buf(),
                tensor: tensor.name.clone(),
                reason: "its bytes are not one contiguous range, so they cannot be mapped".into(),
            });
        };
        let start = offset
            .checked_add(done)
            .ok_or_else(|| self.truncated(tensor))?;
        self.map_at(tensor, start, len)
    }

    /// Maps `len` bytes of `tensor`'s source file from byte `start` of the
    /// file (`tensor` names the file, and the tensor in messages).
    ///
    /// The file's length is checked against the header's claim right
    /// before the mapping (it was checked at open too): a file that is
    /// already shorter is an error naming the file and tensor, never a
    /// fault.
    pub fn map_at(
        &self,
        tensor: &Tensor,
        start: u64,
        len: usize,
    ) -> Result<MappedRange, FormatError> {
        let (file, path) = self.file(tensor.file);
        let io = |e| FormatError::io(path, e);
        let end = start
            .checked_add(len as u64)
            .ok_or_else(|| self.truncated(tensor))?;
        let file_len = file.metadata().map_err(io)?.len();
        if file_len < end {
            return Err(self.truncated(tensor));
        }
        // Start reading this chunk and the next as one request, so a cold
        // source streams from the disk while this one is hashed or cast.
        let ahead = (len as u64).saturating_mul(2).min(file_len - start);
        crate::platform::will_need(file, start, ahead);
        MappedRange::map(file, path, start, len).map_err(io)
    }
}
