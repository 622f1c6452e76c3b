//! Positioned reads, the one way reshard reads file data: no shared cursor,
//! so workers can read one file at once, and no mapping. `pread` on Unix,
//! `ReadFile` with an offset on Windows.

use std::fs::File;
use std::io;

/// Reads up to `buf.len()` bytes at `offset`; 0 means end of file.
pub fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::FileExt::seek_read(file, buf, offset)
    }
}

/// Reads exactly `buf.len()` bytes at `offset`, or fails with
/// `UnexpectedEof`: a short file is never padded.
pub fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match read_at(file, buf, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
