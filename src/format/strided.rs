//! Strided PyTorch views read in row-major order.
//!
//! A view (a transpose, a slice, an `expand`) names elements of its storage
//! by strides. When the span of storage the view can reach fits the gather
//! buffer, that span is read once, in one positioned read, and every element
//! is copied from memory: an expanded (stride-0) view of a 4-byte storage
//! costs one 4-byte read however long it is, and a transposed weight one
//! read of its bytes. A larger span is read one innermost run (or one
//! element) per positioned read, as before. Every access is checked against
//! the storage's length.

use std::fs::File;
use std::io::{self, Read};
use std::sync::Arc;

pub use super::checkpoint::span;
use super::checkpoint::Tensor;

/// The most of a strided view's storage span read into memory at once, per
/// open stream: 4 MiB. The executor lends each worker with a strided view a
/// third buffer from the window for it (see
/// [`super::read::SourceReader::tensor_bytes_gathered`]).
pub const GATHER_MAX: usize = 4 << 20;

pub(crate) struct StridedReader {
    file: Arc<File>,
    /// Absolute file offset of the storage, and its length.
    storage: u64,
    storage_len: u64,
    elem_size: u64,
    shape: Vec<u64>,
    strides: Vec<u64>,
    elem_offset: u64,
    /// Row-major index of the next element to produce.
    index: Vec<u64>,
    /// Bytes of the current run already produced.
    run_done: u64,
    done: bool,
    gather_limit: usize,
    /// The reachable span, once read: bytes from `elem_offset * elem_size`.
    cache: Option<Vec<u8>>,
}

impl StridedReader {
    pub(crate) fn new(
        file: Arc<File>,
        tensor: &Tensor,
        storage: u64,
        storage_len: u64,
        elem_offset: u64,
        strides: Vec<u64>,
        gather_limit: usize,
    ) -> StridedReader {
        StridedReader {
            file,
            storage,
            storage_len,
            elem_size: (tensor.dtype.bits() / 8).max(1),
            index: vec![0; tensor.shape.len()],
            done: tensor.shape.contains(&0),
            shape: tensor.shape.clone(),
            strides,
            elem_offset,
            run_done: 0,
            gather_limit,
            cache: None,
        }
    }

    /// Moves to row-major element `elem` of the view (its end when past
    /// it): random access in O(dimensions), so a reader that meets a row
    /// again (FP8 scales, one block row per weight row it covers) does not
    /// read the view again from its start.
    pub(crate) fn seek_elem(&mut self, elem: u64) {
        let mut rest = elem;
        for (i, &n) in self.index.iter_mut().zip(&self.shape).rev() {
            *i = rest % n.max(1);
            rest /= n.max(1);
        }
        self.run_done = 0;
        self.done = self.shape.contains(&0) || rest > 0 || (self.shape.is_empty() && elem > 0);
    }

    fn invalid(reason: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, reason.to_string())
    }

    /// Reads the view's whole span into memory if it fits the gather limit.
    fn load_cache(&mut self) -> io::Result<()> {
        if self.cache.is_some() {
            return Ok(());
        }
        let Some(span) = span(&self.shape, &self.strides, self.elem_size) else {
            return Err(Self::invalid("view offset overflows"));
        };
        let len = match usize::try_from(span) {
            Ok(n) if n <= self.gather_limit => n,
            _ => return Ok(()),
        };
        let start = self
            .elem_offset
            .checked_mul(self.elem_size)
            .filter(|s| s.checked_add(span).is_some_and(|e| e <= self.storage_len))
            .ok_or_else(|| Self::invalid("strided view reaches past the end of its storage"))?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        bytes.resize(len, 0);
        crate::platform::read_exact_at(&self.file, &mut bytes, self.storage + start)?;
        self.cache = Some(bytes);
        Ok(())
    }

    /// Length in elements of the contiguous run starting at the current index.
    fn run_elems(&self) -> u64 {
        match (self.shape.last(), self.strides.last()) {
            (Some(&n), Some(&1)) => n - self.index[self.index.len() - 1],
            _ => 1,
        }
    }

    fn advance(&mut self, elems: u64) {
        let Some(last) = self.index.len().checked_sub(1) else {
            self.done = true; // a scalar has one element
            return;
        };
        self.index[last] += elems;
        let mut d = last;
        while self.index[d] >= self.shape[d] {
            self.index[d] = 0;
            if d == 0 {
                self.done = true;
                return;
            }
            d -= 1;
            self.index[d] += 1;
        }
    }

    /// Element offset, from the start of the view's span, of the current
    /// index.
    fn element_offset(&self) -> Option<u64> {
        self.index
            .iter()
            .zip(&self.strides)
            .try_fold(0u64, |acc, (&i, &s)| acc.checked_add(i.checked_mul(s)?))
    }

    /// Copies as much of the current run as fits into `buf`; returns the
    /// bytes copied.
    fn copy_run(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let run_bytes = self.run_elems() * self.elem_size;
        let from_span = self
            .element_offset()
            .and_then(|o| o.checked_mul(self.elem_size))
            .and_then(|o| o.checked_add(self.run_done))
            .ok_or_else(|| Self::invalid("view offset overflows"))?;
        let want = (buf.len() as u64).min(run_bytes - self.run_done);
        let n = match &self.cache {
            Some(cache) => {
                let src = usize::try_from(from_span)
                    .ok()
                    .and_then(|at| cache.get(at..at.checked_add(want as usize)?))
                    .ok_or_else(|| Self::invalid("strided view leaves its span"))?;
                buf[..src.len()].copy_from_slice(src);
                src.len()
            }
            None => {
                let at = self
                    .elem_offset
                    .checked_mul(self.elem_size)
                    .and_then(|s| s.checked_add(from_span))
                    .filter(|s| s.checked_add(want).is_some_and(|e| e <= self.storage_len))
                    .ok_or_else(|| {
                        Self::invalid("strided view reaches past the end of its storage")
                    })?;
                let n = crate::platform::read_at(
                    &self.file,
                    &mut buf[..want as usize],
                    self.storage + at,
                )?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                n
            }
        };
        self.run_done += n as u64;
        if self.run_done == run_bytes {
            self.run_done = 0;
            let elems = self.run_elems();
            self.advance(elems);
        }
        Ok(n)
    }
}

impl Read for StridedReader {
    /// From memory, fills `buf` (many runs a call); from the file, one run
    /// (one positioned read) a call.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        self.load_cache()?;
        if self.cache.is_none() {
            return self.copy_run(buf);
        }
        let mut filled = 0;
        while filled < buf.len() && !self.done {
            filled += self.copy_run(&mut buf[filled..])?;
        }
        Ok(filled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DataRef, Dtype};

    /// Row-major elements of a view, computed in memory.
    fn reference(storage: &[u8], elem_offset: u64, shape: &[u64], strides: &[u64]) -> Vec<u8> {
        let numel: u64 = shape.iter().product();
        let mut out = Vec::new();
        for flat in 0..numel {
            let (mut rest, mut at) = (flat, elem_offset);
            for (&n, &s) in shape.iter().zip(strides).rev() {
                at += (rest % n) * s;
                rest /= n;
            }
            out.extend_from_slice(&storage[at as usize * 2..at as usize * 2 + 2]);
        }
        out
    }

    #[test]
    fn gathered_and_run_by_run_reads_agree_with_the_view() {
        let storage: Vec<u8> = (0..64u16).flat_map(|i| i.to_le_bytes()).collect();
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[9; 10]).unwrap();
        std::io::Write::write_all(&mut file, &storage).unwrap();
        let file = Arc::new(file);
        let views: [(u64, &[u64], &[u64]); 6] = [
            (0, &[3, 4], &[1, 3]),       // transpose
            (2, &[5, 3], &[0, 1]),       // expand of a row
            (7, &[6], &[0]),             // one element repeated
            (1, &[2, 3, 4], &[1, 8, 2]), // a permuted 3-D view
            (5, &[], &[]),               // a scalar
            (4, &[4, 4], &[8, 1]),       // rows of a wider matrix
        ];
        for (offset, shape, strides) in views {
            let want = reference(&storage, offset, shape, strides);
            let tensor = Tensor {
                name: "v".into(),
                dtype: Dtype::F16,
                shape: shape.to_vec(),
                len: want.len() as u64,
                file: 0,
                data: DataRef::Contiguous { offset: 0 },
            };
            for gather in [0, GATHER_MAX] {
                for chunk in [1, 3, 7, 64] {
                    let mut r = StridedReader::new(
                        Arc::clone(&file),
                        &tensor,
                        10,
                        storage.len() as u64,
                        offset,
                        strides.to_vec(),
                        gather,
                    );
                    let mut got = Vec::new();
                    let mut buf = vec![0; chunk];
                    loop {
                        let n = r.read(&mut buf).unwrap();
                        if n == 0 {
                            break;
                        }
                        got.extend_from_slice(&buf[..n]);
                    }
                    assert_eq!(
                        got, want,
                        "{shape:?} {strides:?} gather {gather} chunk {chunk}"
                    );
                    assert_eq!(gather > 0, r.cache.is_some());
                }
                // Entered at any element (and past the end): the rest of
                // the same bytes, whether or not something was read before.
                let numel = want.len() as u64 / 2;
                for start in 0..=numel + 1 {
                    let mut r = StridedReader::new(
                        Arc::clone(&file),
                        &tensor,
                        10,
                        storage.len() as u64,
                        offset,
                        strides.to_vec(),
                        gather,
                    );
                    let mut first = [0; 2];
                    let _ = r.read(&mut first).unwrap();
                    r.seek_elem(start);
                    let mut got = Vec::new();
                    r.read_to_end(&mut got).unwrap();
                    let from = (2 * start as usize).min(want.len());
                    assert_eq!(got, want[from..], "{shape:?} {strides:?} from {start}");
                }
            }
        }
    }

    #[test]
    fn a_view_past_its_storage_is_an_error_either_way() {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[0; 16]).unwrap();
        let tensor = Tensor {
            name: "v".into(),
            dtype: Dtype::F32,
            shape: vec![4],
            len: 16,
            file: 0,
            data: DataRef::Contiguous { offset: 0 },
        };
        for gather in [0, GATHER_MAX] {
            let mut r = StridedReader::new(
                Arc::new(file.try_clone().unwrap()),
                &tensor,
                0,
                8,
                0,
                vec![1],
                gather,
            );
            let mut buf = [0; 16];
            let mut total = 0;
            let err = loop {
                match r.read(&mut buf) {
                    Ok(0) => panic!("read past the storage"),
                    Ok(n) => total += n,
                    Err(e) => break e,
                }
            };
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "gather {gather}");
            assert!(total <= 8);
        }
    }

    #[test]
    fn spans_cover_first_to_last_element() {
        assert_eq!(span(&[3, 2], &[1, 3], 4), Some(24));
        assert_eq!(span(&[1 << 50], &[0], 4), Some(4));
        assert_eq!(span(&[4, 0], &[1, 1], 4), Some(0));
        assert_eq!(span(&[], &[], 2), Some(2));
        assert_eq!(span(&[u64::MAX, 2], &[2, 1], 4), None);
    }
}
