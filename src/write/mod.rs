//! Writing output: shards under temporary names that are flushed and renamed
//! ([`shard`]), the index the output format has ([`format`]) and reshard's manifest
//! ([`manifest`]), which are written last and are the commit point.
//!
//! Nothing here ever writes to a final name directly: a crash leaves either
//! a complete file under its final name or a temporary one that a rerun
//! removes.

mod atomic;
pub mod capped;
pub mod digest;
mod error;
pub(crate) mod failpoint;
pub mod format;
pub mod gguf;
pub(crate) mod lock;
pub mod made;
pub mod manifest;
pub(crate) mod owned;
pub mod scope;
pub(crate) mod shard;
mod shard_format;

pub use self::atomic::{
    copy_atomic, create_temp, publish, remove_stale_temps, sync_dir, temp_path, write_atomic,
    write_atomic_as, Publish, COPY_CHUNK, TEMP_SUFFIX,
};
pub use self::error::WriteError;
