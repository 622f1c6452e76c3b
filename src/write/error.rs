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
    #[error("shard header for {}: {reason}", .path.display())]
    Header { path: PathBuf, reason: String },
}

impl WriteError {
    pub fn io(path: &Path, source: io::Error) -> WriteError {
        WriteError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
