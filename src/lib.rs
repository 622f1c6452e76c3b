//! reshard: make downloaded model checkpoints load on real machines.
//!
//! The library is the pipeline; the `reshard` binary is a thin CLI over it.
//!
//! ```text
//! format (read) -> quant (schemes) -> cast (kernels) -> plan (order, pack)
//!   -> write (output format, atomic shards, manifest) -> fit (will it load)
//!   -> exec (windows, dequant, cast, hash) -> validate -> convert -> batch
//! ```
//!
//! That is also the stage order: a module may use earlier stages only
//! (`scripts/check-architecture.py` enforces it; docs/architecture.md
//! explains the seams). Each stage takes plain data and returns plain data;
//! nothing here prints. Beneath every stage, [`platform`] is the one module
//! that knows which operating system it runs on, and [`units`] and [`names`]
//! hold the rules every stage shares.
//!
//! ```no_run
//! let ck = reshard::format::open(std::path::Path::new("examples/tiny-llama"))?;
//! println!("{} tensors, {} bytes", ck.tensors.len(), ck.total_bytes());
//! # Ok::<(), reshard::format::FormatError>(())
//! ```

#![deny(unsafe_code)]

pub mod batch;
pub mod cast;
pub mod convert;
pub mod exec;
pub mod fit;
pub mod format;
pub mod inspect;
pub mod names;
pub mod plan;
pub mod platform;
pub mod quant;
pub mod units;
pub mod validate;
pub mod write;

#[doc(hidden)]
pub mod fuzz;
