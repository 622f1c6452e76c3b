//! Why output could not be written. Each names the file.

use std::io;
use std::path::{Path, PathBuf};

/// Why output could not be written. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot write {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: wrote {written} bytes but the plan says {expected}; refusing to commit it", .path.display())]
    WrongLength {
        path: PathBuf,
        written: u64,
        expected: u64,
    },
    #[error(
        "{} appeared while reshard was writing the output and was left as it is; move it \
         away and run again (the run resumes)",
        .path.display()
    )]
    Appeared { path: PathBuf },
    #[error("shard header for {}: {reason}", .path.display())]
    Header { path: PathBuf, reason: String },
    #[error("shard header for {}: {len} bytes or more, over the {max} bytes reshard's reader accepts, so the output could not be read back: {what}", .path.display())]
    HeaderTooLarge {
        path: PathBuf,
        len: u64,
        max: u64,
        /// What makes it that large.
        what: String,
    },
}

impl WriteError {
    pub fn io(path: &Path, source: io::Error) -> WriteError {
        WriteError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
