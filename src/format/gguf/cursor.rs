//! Bounded, positioned reads of a GGUF header.
//!
//! The header is read front to back through a 64 KiB buffer filled by
//! positioned reads ([`Source::read_at`]); nothing is mapped and the file is
//! never read whole. Every byte taken is charged to a budget
//! ([`super::MAX_HEADER`] for a real file), and so is the memory a value
//! costs beyond its file bytes, so a hostile header ends in
//! [`GgufError::HeaderTooLarge`] before it can cost more than the budget.

use std::fs::File;
use std::io;

use super::error::GgufError;

/// What the header is read from: a file, or bytes (fuzzing and tests).
pub trait Source {
    /// The length in bytes.
    fn size(&self) -> u64;
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize>;
}

impl Source for File {
    fn size(&self) -> u64 {
        self.metadata().map_or(0, |m| m.len())
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        crate::platform::read_at(self, buf, pos)
    }
}

impl Source for [u8] {
    fn size(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        let start = usize::try_from(pos).unwrap_or(usize::MAX).min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

const BUF: usize = 64 << 10;

/// A front-to-back reader over a [`Source`] with a byte budget.
pub struct Cursor<'a, S: Source + ?Sized> {
    src: &'a S,
    file_len: u64,
    pos: u64,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    buf_at: u64,
    budget: u64,
    left: u64,
}

impl<'a, S: Source + ?Sized> Cursor<'a, S> {
    pub fn new(src: &'a S, file_len: u64, budget: u64) -> Self {
        Cursor {
            src,
            file_len,
            pos: 0,
            buf: Vec::new(),
            buf_at: 0,
            budget,
            left: budget,
        }
    }

    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The whole budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Budget bytes not yet spent.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// Charges `n` bytes of memory (or file) to the budget.
    pub fn charge(&mut self, n: u64, at: &dyn Fn() -> String) -> Result<(), GgufError> {
        if n > self.left {
            return Err(GgufError::HeaderTooLarge {
                max: self.budget,
                at: at(),
            });
        }
        self.left -= n;
        Ok(())
    }

    /// Fails unless `n` more bytes are in the file and in the budget,
    /// charging them.
    pub fn reserve(&mut self, n: u64, at: &dyn Fn() -> String) -> Result<(), GgufError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.file_len => {}
            _ => {
                return Err(GgufError::Truncated {
                    file_len: self.file_len,
                    at: at(),
                })
            }
        }
        self.charge(n, at)
    }

    /// Copies the next `out.len()` bytes into `out` (already reserved).
    fn fill(&mut self, out: &mut [u8]) -> Result<(), GgufError> {
        let mut done = 0;
        while done < out.len() {
            let off = self.pos - self.buf_at;
            if off >= self.buf.len() as u64 {
                self.refill()?;
                continue;
            }
            let off = off as usize;
            let n = (out.len() - done).min(self.buf.len() - off);
            out[done..done + n].copy_from_slice(&self.buf[off..off + n]);
            done += n;
            self.pos += n as u64;
        }
        Ok(())
    }

    fn refill(&mut self) -> Result<(), GgufError> {
        let want = (self.file_len - self.pos).min(BUF as u64) as usize;
        self.buf.resize(want, 0);
        let mut got = 0;
        while got < want {
            match self
                .src
                .read_at(&mut self.buf[got..], self.pos + got as u64)
            {
                Ok(0) => return Err(GgufError::Io(io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(GgufError::Io(e)),
            }
        }
        self.buf_at = self.pos;
        Ok(())
    }

    /// Reads `N` bytes, charging them.
    pub fn array<const N: usize>(&mut self, at: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        self.reserve(N as u64, at)?;
        let mut out = [0u8; N];
        self.fill(&mut out)?;
        Ok(out)
    }

    pub fn u32(&mut self, at: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(at).map(u32::from_le_bytes)
    }

    pub fn u64(&mut self, at: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(at).map(u64::from_le_bytes)
    }

    /// Appends the next `n` bytes to `out`, charging them; `n` is checked
    /// against the file and the budget before anything is allocated.
    pub fn bytes_into(
        &mut self,
        n: u64,
        out: &mut Vec<u8>,
        at: &dyn Fn() -> String,
    ) -> Result<(), GgufError> {
        self.reserve(n, at)?;
        // n <= the budget left, which a caller sized to hold in memory.
        let n = n as usize;
        let start = out.len();
        out.try_reserve(n).map_err(|_| GgufError::HeaderTooLarge {
            max: self.budget,
            at: at(),
        })?;
        out.resize(start + n, 0);
        self.fill(&mut out[start..])
    }
}
