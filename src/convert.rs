//! The convert job: plan, execute, commit. This module owns the DST folder's
//! life cycle: refusing a DST that holds something else, resuming a killed
//! run, copying the model's other files, and writing the index and manifest
//! last, which is the commit point.
//!
//! What it may touch is decided before anything is written: the paths by
//! [`OutputScope`], the names inside DST by [`DstInventory`] (only what
//! reshard's own manifests record is ever removed), one run at a time by
//! [`DstLock`], and the free space by [`dst::check_space`].
//!
//! [`ConvertSource`] is what both `convert` and `batch` run: a folder
//! converted by its layout (every weight set, the rest of its tree), a file
//! as one checkpoint.
//!
//! [`convert_gated`] lets a caller hold the commit: `batch --verify-source`
//! hashes the source on its own threads while the shards are written, and
//! the output is committed only once that check has passed.

mod dst;
mod error;
mod file_dst;
pub mod fit;
mod gguf;
mod layout;
mod options;
mod other;
mod run;
mod source;
pub mod split;

pub use self::error::{ConvertError, GateError};
pub use self::file_dst::{
    convert_to_file, file_options, gguf_options, split_name, staging_dir, DstKind,
};
pub use self::layout::{convert_layout, convert_split, plan_layout, plan_split};
pub use self::options::{
    BeforeCommit, ComponentSummary, ConvertOptions, ConvertSummary, KeepPreset,
};
pub use self::other::{SkippedFile, Walk};
pub use self::run::{convert, convert_gated, convert_with_pool, plan_for};
pub use self::source::ConvertSource;
