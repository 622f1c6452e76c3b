//! `validate`: prove that a checkpoint is intact and that it loads, on a
//! given device, within a given memory commit budget.
//!
//! The steps, in the order [`validate`] runs them:
//!
//! 1. Integrity ([`integrity`]): headers (via [`crate::format::open`]), the
//!    index maps every tensor exactly once, and, when `reshard.json` is
//!    present, every shard's sha256 and every tensor's xxh3 match it. The
//!    hashes are computed on the bytes as step 2 streams them: each file is
//!    read once.
//! 2. Load ([`own`]): shard by shard in layer order, every tensor goes
//!    through one bounded staging buffer into a device allocation
//!    ([`device`]: the CPU stand-in or CUDA), is read back and compared. Or, with
//!    [`ValidateOptions::emulate`], another loader's mapping pattern is
//!    reproduced instead ([`emulate`]).
//! 3. Commit ([`ledger`]): the process's commit charge is sampled at every
//!    allocation and mapping; [`budget`] enforces a budget for real by
//!    running the load in a child process under a commit limit
//!    ([`crate::platform::CommitLimit`]: `RLIMIT_DATA`, or a Job Object).
//! 4. Against ([`against`]): every tensor equals the source's, bit for bit
//!    or as the documented cast of it.
//!
//! The files form layers, each using only those below it: [`ledger`],
//! [`options`] and [`report`] (plain data) at the bottom; [`device`] and
//! [`integrity`] in the middle; the ways of loading ([`own`], [`emulate`],
//! [`against`], and a real loader in the user's Python, [`python`]) and the
//! budget child ([`budget`]) on top, [`sets`] (a folder of several weight
//! sets, each validated on its own) over them, and this file,
//! which runs them in order. `scripts/check-architecture.py` keeps it so.
//!
//! A check that ran and failed is a [`Failure`] in the report (exit 1 at the
//! CLI); a check that could not run is a [`ValidateError`] (exit 2). Nothing
//! here prints.

// Bottom layer: plain data, depending on nothing above it.
pub(crate) mod ledger;
pub(crate) mod options;
pub(crate) mod report;
// Middle: what a load checks, and where it puts tensors.
pub mod device;
pub(crate) mod error;
pub(crate) mod integrity;
// Top: the ways of loading, each over the same ledger, and the budget child.
pub(crate) mod against;
mod against_fp8;
mod against_gguf;
mod against_gguf_out;
mod against_quantized;
pub mod budget;
mod compare;
pub(crate) mod emulate;
mod load;
pub(crate) mod own;
pub mod python;
mod relay;
mod sets;

pub use self::budget::validate_with_budget;
pub use self::error::ValidateError;
pub use self::ledger::{CommitFigures, CommitLedger};
pub use self::load::validate;
pub use self::options::{Cancel, DeviceSpec, Loader, Progress, ValidateOptions, DEFAULT_STAGING};
pub use self::own::shard_order;
pub use self::report::{Failure, Placement, ShardTiming, ValidateReport};
pub use self::sets::{validate_sets, SetReport};
