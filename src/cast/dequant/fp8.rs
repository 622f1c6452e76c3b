//! FP8 codes times block, channel or tensor scales.
//!
//! The weight is walked in row-major order in runs that share one scale
//! (at most one block wide); each run goes through [`scaled_run`], which
//! decodes the F8 code through a 256-entry f32 table, multiplies by the
//! scale in f32 and rounds with the cast kernels.

use super::{Chunk, DequantError, DequantStream, Scheme};
use crate::cast::f8;
use crate::cast::kernels::{self as k, drive, Flags};
use crate::cast::{CastStats, OverflowPolicy};
use crate::format::Dtype;

/// F8_E8M0 (UE8M0) bits -> f32: `2^(e - 127)`, 255 is NaN. Exponent 0 is
/// 2^-127, an f32 subnormal, exact.
pub fn e8m0_to_f32(e: u8) -> f32 {
    match e {
        255 => f32::NAN,
        0 => f32::from_bits(0x0040_0000),
        e => f32::from_bits(u32::from(e) << 23),
    }
}

/// Bytes per scale element, and its decoder from little-endian bytes.
pub(super) type ScaleDecoder = (usize, fn(&[u8]) -> f32);

/// The [`ScaleDecoder`] of a scale dtype.
pub(super) fn scale_decoder(d: Dtype) -> Option<ScaleDecoder> {
    fn f32le(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn bf16le(b: &[u8]) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)
    }
    fn f16le(b: &[u8]) -> f32 {
        f32::from_bits(k::f16_to_f32(u16::from_le_bytes([b[0], b[1]])).0)
    }
    fn e8m0(b: &[u8]) -> f32 {
        e8m0_to_f32(b[0])
    }
    Some(match d {
        Dtype::F32 => (4, f32le as fn(&[u8]) -> f32),
        Dtype::BF16 => (2, bf16le),
        Dtype::F16 => (2, f16le),
        Dtype::F8_E8M0 => (1, e8m0),
        _ => return None,
    })
}

/// The f32 value of every F8 code.
pub(super) fn code_table(d: Dtype) -> [f32; 256] {
    let decode = if d == Dtype::F8_E5M2 {
        f8::e5m2_to_f32
    } else {
        f8::e4m3_to_f32
    };
    let mut t = [0f32; 256];
    for (b, v) in (0..=255u8).zip(t.iter_mut()) {
        *v = f32::from_bits(decode(b));
    }
    t
}

/// `w * s` in f32, with a finite product too large for f32 counted as an
/// overflow (and clamped under saturation, so the target saturates too).
#[inline(always)]
pub(super) fn product<const SAT: bool>(w: f32, s: f32) -> (u32, bool) {
    let p = w * s;
    let overflow = p.is_infinite() & w.is_finite() & s.is_finite();
    let p = if SAT && overflow {
        f32::MAX.copysign(p)
    } else {
        p
    };
    (p.to_bits(), overflow)
}

#[inline(always)]
fn with_overflow<T>((bits, mut f): (T, Flags), overflow: bool) -> (T, Flags) {
    f.overflow |= overflow;
    (bits, f)
}

/// Dequantizes one run of codes sharing scale `s` into `to`.
fn scaled_run<const SAT: bool>(
    table: &[f32; 256],
    s: f32,
    to: Dtype,
    input: &[u8],
    out: &mut [u8],
) -> CastStats {
    let code = |b: u8| product::<SAT>(table[usize::from(b)], s);
    match to {
        Dtype::BF16 => drive(input, out, |b: u8| {
            let (p, o) = code(b);
            with_overflow(k::f32_to_bf16::<SAT>(p), o)
        }),
        Dtype::F16 => drive(input, out, |b: u8| {
            let (p, o) = code(b);
            with_overflow(k::f32_to_f16::<SAT>(p), o)
        }),
        Dtype::F64 => drive(input, out, |b: u8| {
            let (p, o) = code(b);
            with_overflow(k::f32_to_f64(p), o)
        }),
        _ => drive(input, out, |b: u8| {
            let (p, o) = code(b);
            with_overflow(k::same_f32(p), o)
        }),
    }
}

/// Dispatches [`scaled_run`] on the overflow policy.
pub(super) fn run(
    table: &[f32; 256],
    s: f32,
    to: Dtype,
    policy: OverflowPolicy,
    input: &[u8],
    out: &mut [u8],
) -> CastStats {
    match policy {
        OverflowPolicy::Saturate => scaled_run::<true>(table, s, to, input, out),
        OverflowPolicy::Error | OverflowPolicy::Inf => {
            scaled_run::<false>(table, s, to, input, out)
        }
    }
}

impl DequantStream<'_> {
    pub(super) fn fill_fp8(&mut self, buf: &mut [u8]) -> Result<Chunk, DequantError> {
        let Scheme::Blocks {
            cols,
            block_rows,
            block_cols,
            ..
        } = self.scheme
        else {
            unreachable!("fill_fp8 on a blocks scheme only");
        };
        let (block_rows, block_cols, cols) = (block_rows.max(1), block_cols.max(1), cols.max(1));
        let osz = (self.to.bits() / 8) as usize;
        let left = self.units() - self.done;
        let n = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .min(buf.len() / (1 + osz));
        let (input, rest) = buf.split_at_mut(n);
        self.reader
            .read_chunk(self.weight, &mut self.weights, input)?;
        let out = &mut rest[..n * osz];
        let table = code_table(self.weight.dtype);
        let mut at = 0usize;
        while at < n {
            let pos = self.done + at as u64;
            let (r, c) = (pos / cols, pos % cols);
            let scale_row = r / block_rows;
            if self.row != Some(scale_row) {
                self.load_scale_row(scale_row)?;
            }
            let run_len = (block_cols - c % block_cols).min(cols - c);
            let run_len = usize::try_from(run_len).unwrap_or(usize::MAX).min(n - at);
            let s = self.row_values[usize::try_from(c / block_cols).unwrap_or(usize::MAX)];
            self.stats += run(
                &table,
                s,
                self.to,
                self.policy,
                &input[at..at + run_len],
                &mut out[at * osz..(at + run_len) * osz],
            );
            at += run_len;
        }
        self.done += n as u64;
        Ok(Chunk {
            start: n,
            len: n * osz,
            read: n as u64,
        })
    }

    /// Reads scale rows up to `row` (the stream moves forward only: rows of
    /// a row-major weight meet their scale rows in order).
    fn load_scale_row(&mut self, row: u64) -> Result<(), DequantError> {
        let Some((size, decode)) = scale_decoder(self.scale.dtype) else {
            return Err(DequantError::ScaleDtype {
                tensor: self.weight.name.clone(),
                scale: self.scale.name.clone(),
                dtype: self.scale.dtype,
            });
        };
        let per_row = usize::try_from(self.scheme.scale_row()).unwrap_or(usize::MAX);
        let mut bytes = vec![0u8; per_row * size];
        let mut next = self.row.map_or(0, |r| r + 1);
        while next <= row {
            self.read_scales(&mut bytes)?;
            next += 1;
        }
        self.row_values = bytes.chunks_exact(size).map(decode).collect();
        self.row = Some(row);
        Ok(())
    }
}
