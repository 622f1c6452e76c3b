//! The plan data of a quantized weight: how its codes map to scales
//! ([`Scheme`]).
//! Plain serde data that `convert --dry-run` prints; the arithmetic that
//! follows it is [`crate::cast::dequant`].

use serde::{Deserialize, Serialize};

use crate::format::Dtype;

/// How the codes of one quantized weight map to scales.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Scheme {
    /// F8 codes seen as a `[rows, cols]` matrix (rows = the product of the
    /// leading dims); element `(r, c)` uses scale `[r / block_rows, c /
    /// block_cols]` of a row-major `[ceil(rows / block_rows), ceil(cols /
    /// block_cols)]` scale tensor. A per-tensor scale is the one block
    /// `rows x cols`, a per-channel one `1 x cols`.
    Blocks {
        rows: u64,
        cols: u64,
        block_rows: u64,
        block_cols: u64,
    },
    /// MXFP4 as gpt-oss stores it: `*_blocks` U8 `[experts, rows, groups,
    /// 16]` (two E2M1 codes a byte, low nibble first) and `*_scales` U8
    /// `[experts, rows, groups]` (E8M0, bias 127) per 32 values. The output is
    /// transformers' dense layout, `[experts, groups * 32, rows]`.
    Mxfp4 {
        experts: u64,
        rows: u64,
        groups: u64,
    },
}

impl Scheme {
    /// The smallest buffer a [`DequantStream`] into `to` works in: one code
    /// and its value (FP8), or one expert's codes, scales and values
    /// (MXFP4).
    pub fn min_buffer(&self, to: Dtype) -> u64 {
        let out = (to.bits() / 8).max(1);
        match *self {
            Scheme::Blocks { .. } => 1 + out,
            Scheme::Mxfp4 { rows, groups, .. } => {
                let cells = rows.saturating_mul(groups);
                cells.saturating_mul(17 + 32 * out)
            }
        }
    }

    /// Scale values one row of scales holds (FP8) or one expert (MXFP4).
    pub(crate) fn scale_row(&self) -> u64 {
        match *self {
            Scheme::Blocks {
                cols, block_cols, ..
            } => cols.div_ceil(block_cols.max(1)),
            Scheme::Mxfp4 { rows, groups, .. } => rows.saturating_mul(groups),
        }
    }
}
