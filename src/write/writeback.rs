//! Early writeback: ask the kernel to start writing a shard's pages to disk
//! as soon as a chunk is written, so the disk works while we read, cast and
//! hash the next chunk, and the final fsync has little left to do. Without
//! it every shard's bytes sit dirty in the page cache until `sync_all`, and
//! the flush serializes after all the computing.
//!
//! Linux only (`sync_file_range`); elsewhere a no-op, with `sync_all` still
//! the durability point everywhere.

#![allow(unsafe_code)]

use std::fs::File;

/// Starts (does not wait for) writeback of `len` bytes at `offset`.
#[cfg(target_os = "linux")]
pub fn start(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: sync_file_range reads no memory of ours; the descriptor is
    // owned by `file` and open for the duration of the call. A failure only
    // means the kernel will write the pages later, at fsync, so it is ignored.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
pub fn start(_file: &File, _offset: u64, _len: u64) {}
