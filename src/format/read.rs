//! Bounded reads: the one way reshard opens a file it reads
//! ([`open_regular`], [`read_regular`]), and the reads of tensor bytes.
//!
//! Every file reshard reads (weight files, indexes, `config.json`, the HF
//! cache's `refs/main`, manifests) must be a regular file: its type is
//! checked before it is opened, so a FIFO never blocks an open and a link to
//! `/dev/zero` is refused instead of read until memory runs out. Small files
//! are read whole only under a size limit the caller names.
//!
//! Every read of tensor bytes here is a positioned read (`pread`) of a
//! caller-sized buffer from a file opened read-only: nothing is mapped,
//! nothing is read whole, and the caller's window decides how much memory is
//! in flight. (The executor's cast path may instead map one chunk of a
//! contiguous tensor at a time, read-only and shared: see [`super::mapped`].) Files are checked against the size and mtime they had when the
//! checkpoint was read, so a file that shrinks under us is an error, never
//! zeros.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;

use super::strided::{StridedReader, GATHER_MAX};
use super::{Checkpoint, DataRef, FormatError, Tensor};

/// Opens `path` read-only if it is a regular file of at most `max_len` bytes.
///
/// The type is checked (following symlinks, so Hugging Face snapshot links
/// into `blobs/` work) before the file is opened: a FIFO, socket, device or
/// folder is [`FormatError::NotRegularFile`] and is never opened, so nothing
/// blocks. A larger file is [`FormatError::FileTooLarge`]; a missing one is
/// [`FormatError::NotFound`]. The opened handle is checked again, so a file
/// swapped for another type between the two steps is refused as well. Pass
/// `u64::MAX` for files read in bounded pieces (weight files).
pub fn open_regular(path: &Path, max_len: u64) -> Result<File, FormatError> {
    let meta = std::fs::metadata(path).map_err(|e| FormatError::io(path, e))?;
    check_regular(path, &meta, max_len)?;
    let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
    let meta = file.metadata().map_err(|e| FormatError::io(path, e))?;
    check_regular(path, &meta, max_len)?;
    Ok(file)
}

/// Reads the whole regular file at `path`, refusing it (before reading) if it
/// is over `max_len` bytes; a file that grows past `max_len` while it is
/// read is refused too. See [`open_regular`] for what is refused.
pub fn read_regular(path: &Path, max_len: u64) -> Result<Vec<u8>, FormatError> {
    let file = open_regular(path, max_len)?;
    let len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
    let mut bytes = Vec::new();
    // `len <= max_len`, which the caller chose as a size it can hold.
    bytes
        .try_reserve_exact(usize::try_from(len).unwrap_or(usize::MAX))
        .map_err(|_| FormatError::OutOfMemory {
            path: path.to_path_buf(),
            bytes: len,
        })?;
    file.take(max_len.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| FormatError::io(path, e))?;
    if bytes.len() as u64 > max_len {
        return Err(FormatError::FileTooLarge {
            path: path.to_path_buf(),
            len: bytes.len() as u64,
            max: max_len,
        });
    }
    Ok(bytes)
}

/// [`read_regular`] for a text file: not UTF-8 is [`FormatError::NotUtf8`].
pub fn read_regular_string(path: &Path, max_len: u64) -> Result<String, FormatError> {
    String::from_utf8(read_regular(path, max_len)?).map_err(|_| FormatError::NotUtf8 {
        path: path.to_path_buf(),
    })
}

fn check_regular(path: &Path, meta: &std::fs::Metadata, max_len: u64) -> Result<(), FormatError> {
    if !meta.is_file() {
        return Err(FormatError::NotRegularFile {
            path: path.to_path_buf(),
            kind: if meta.is_dir() {
                "a folder"
            } else {
                "a FIFO, socket or device"
            },
        });
    }
    if meta.len() > max_len {
        return Err(FormatError::FileTooLarge {
            path: path.to_path_buf(),
            len: meta.len(),
            max: max_len,
        });
    }
    Ok(())
}

/// Open, read-only handles to every file of a checkpoint.
#[derive(Debug, Clone)]
pub struct SourceReader {
    files: Vec<Arc<File>>,
    paths: Vec<std::path::PathBuf>,
}

impl SourceReader {
    /// Opens every weight file of `checkpoint` read-only and checks each is
    /// still the file that was inspected.
    pub fn open(checkpoint: &Checkpoint) -> Result<SourceReader, FormatError> {
        checkpoint.check_unchanged()?;
        let mut files = Vec::with_capacity(checkpoint.files.len());
        for f in &checkpoint.files {
            files.push(Arc::new(open_regular(&f.path, u64::MAX)?));
        }
        Ok(SourceReader {
            files,
            paths: checkpoint.files.iter().map(|f| f.path.clone()).collect(),
        })
    }

    /// The open handle of file `index` of the checkpoint, and its path.
    pub fn file(&self, index: usize) -> (&File, &Path) {
        (&self.files[index], &self.paths[index])
    }

    /// A sequential reader over a tensor's contiguous little-endian bytes,
    /// whatever its layout on disk. Reads exactly `tensor.len` bytes.
    ///
    /// A strided view whose storage span is at most [`GATHER_MAX`] bytes is
    /// gathered in memory (see [`super::strided`]).
    pub fn tensor_bytes(&self, tensor: &Tensor) -> TensorBytes {
        self.tensor_bytes_gathered(tensor, GATHER_MAX)
    }

    /// [`SourceReader::tensor_bytes`], gathering a strided view in memory
    /// only when its span is at most `gather_limit` bytes: a caller that
    /// counts memory against a window passes what it reserved (0 reads one
    /// run at a time).
    pub fn tensor_bytes_gathered(&self, tensor: &Tensor, gather_limit: usize) -> TensorBytes {
        let file = Arc::clone(&self.files[tensor.file]);
        let inner = match &tensor.data {
            DataRef::Contiguous { offset } | DataRef::Blocks { offset, .. } => {
                Inner::Range(RangeReader {
                    file,
                    pos: *offset,
                    end: offset.saturating_add(tensor.len),
                })
            }
            DataRef::Strided {
                storage,
                storage_len,
                elem_offset,
                strides,
            } => Inner::Strided(StridedReader::new(
                file,
                tensor,
                *storage,
                *storage_len,
                *elem_offset,
                strides.clone(),
                gather_limit,
            )),
            DataRef::Deflated {
                entry,
                compressed_len,
                skip,
                ..
            } => {
                let range = RangeReader {
                    file,
                    pos: *entry,
                    end: entry.saturating_add(*compressed_len),
                };
                Inner::Deflated {
                    decoder: Box::new(flate2::read::DeflateDecoder::new(range)),
                    skip: *skip,
                }
            }
        };
        TensorBytes {
            inner,
            remaining: tensor.len,
        }
    }

    /// [`SourceReader::tensor_bytes_gathered`] from byte `pos` of the
    /// tensor's row-major bytes on, whatever its layout: a strided view
    /// starts at the element `pos` falls on (which must be a whole element),
    /// without reading what comes before; a deflated entry is inflated from
    /// its start and its first `pos` bytes dropped.
    pub fn tensor_bytes_from(
        &self,
        tensor: &Tensor,
        pos: u64,
        gather_limit: usize,
    ) -> Result<TensorBytes, FormatError> {
        let elem = (tensor.dtype.bits() / 8).max(1);
        if pos > tensor.len || !pos.is_multiple_of(elem) {
            return Err(FormatError::BadData {
                path: self.paths[tensor.file].clone(),
                tensor: tensor.name.clone(),
                reason: format!(
                    "a read from byte {pos} is not at an element of its {} bytes",
                    tensor.len
                ),
            });
        }
        let mut bytes = self.tensor_bytes_gathered(tensor, gather_limit);
        match &mut bytes.inner {
            Inner::Range(r) => r.pos += pos,
            Inner::Strided(s) => s.seek_elem(pos / elem),
            Inner::Deflated { skip, .. } => *skip += pos,
        }
        bytes.remaining -= pos;
        Ok(bytes)
    }

    /// Reads `buf.len()` bytes at byte `pos` of a tensor stored contiguously
    /// (plain or GGML blocks), naming the file and tensor when they are not
    /// there. Random access for readers that take rows out of order.
    pub fn read_tensor_at(
        &self,
        tensor: &Tensor,
        pos: u64,
        buf: &mut [u8],
    ) -> Result<(), FormatError> {
        let path = || self.paths[tensor.file].clone();
        let offset = match tensor.data {
            DataRef::Contiguous { offset } | DataRef::Blocks { offset, .. } => offset,
            DataRef::Strided { .. } | DataRef::Deflated { .. } => {
                return Err(FormatError::BadData {
                    path: path(),
                    tensor: tensor.name.clone(),
                    reason: "is not stored contiguously, so it cannot be read out of order".into(),
                })
            }
        };
        let end = pos.checked_add(buf.len() as u64);
        if end.is_none_or(|e| e > tensor.len) {
            return Err(FormatError::BadData {
                path: path(),
                tensor: tensor.name.clone(),
                reason: format!(
                    "a read of {} bytes at {pos} passes its {} bytes",
                    buf.len(),
                    tensor.len
                ),
            });
        }
        crate::platform::read_exact_at(&self.files[tensor.file], buf, offset + pos).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                self.truncated(tensor)
            } else {
                FormatError::Io {
                    path: path(),
                    source: e,
                }
            }
        })
    }

    /// The error for a source file that no longer holds `tensor`'s bytes.
    pub fn truncated(&self, tensor: &Tensor) -> FormatError {
        FormatError::BadData {
            path: self.paths[tensor.file].clone(),
            tensor: tensor.name.clone(),
            reason: "data ends early; the file was truncated or changed".into(),
        }
    }

    /// Reads `buf.len()` bytes of a tensor's stream into `buf`, naming the file
    /// and tensor when the bytes are not there.
    pub fn read_chunk(
        &self,
        tensor: &Tensor,
        stream: &mut TensorBytes,
        buf: &mut [u8],
    ) -> Result<(), FormatError> {
        stream.read_exact(buf).map_err(|e| {
            let path = self.paths[tensor.file].clone();
            if e.kind() == io::ErrorKind::UnexpectedEof {
                self.truncated(tensor)
            } else if e.kind() == io::ErrorKind::InvalidData {
                FormatError::BadData {
                    path,
                    tensor: tensor.name.clone(),
                    reason: e.to_string(),
                }
            } else {
                FormatError::Io { path, source: e }
            }
        })
    }
}

/// A tensor's bytes as a stream. Reading past the tensor's length returns EOF.
pub struct TensorBytes {
    inner: Inner,
    remaining: u64,
}

enum Inner {
    Range(RangeReader),
    Strided(StridedReader),
    Deflated {
        decoder: Box<flate2::read::DeflateDecoder<RangeReader>>,
        skip: u64,
    },
}

impl Read for TensorBytes {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let buf = &mut buf[..want];
        let n = match &mut self.inner {
            Inner::Range(r) => r.read(buf)?,
            Inner::Strided(s) => s.read(buf)?,
            Inner::Deflated { decoder, skip } => {
                if *skip > 0 {
                    let skipped = io::copy(&mut decoder.by_ref().take(*skip), &mut io::sink())?;
                    if skipped < *skip {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    *skip = 0;
                }
                decoder.read(buf)?
            }
        };
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Positioned reads of `[pos, end)` of a shared file handle.
struct RangeReader {
    file: Arc<File>,
    pos: u64,
    end: u64,
}

impl Read for RangeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        if want == 0 {
            return Ok(0);
        }
        let n = crate::platform::read_at(&self.file, &mut buf[..want], self.pos)?;
        if n == 0 {
            // The file is shorter than its header said: never pad with zeros.
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.pos += n as u64;
        Ok(n)
    }
}
