//! `--against SRC` on a weight `convert --quantize fp8|fp8-e5m2` wrote:
//! FP8 codes with no scale, each the source value clamped to the format's
//! largest finite value and rounded to nearest even (`cast`'s F8 kernels,
//! the ones convert ran). The output must hold exactly those bytes; the
//! error of the codes against the source makes the quality report.
//!
//! Such an output is recognised by its dtypes alone (an FP8 tensor where
//! the source has a 16-, 32- or 64-bit float), so a single-file output,
//! which has no manifest, is compared too: there is one way to write it.

use super::compare::{first_unequal, Buffers};
use super::ValidateError;
use crate::cast::quantize::QuantQuality;
use crate::cast::{self, OverflowPolicy};
use crate::format::read::{SourceReader, TensorBytes};
use crate::format::{Dtype, Tensor};
use crate::plan::quantize::QuantizeScheme;

/// Elements decoded at once for the error figures (two stack buffers of
/// f32s).
const QUALITY_STEP: usize = 1024;

/// The plain `--quantize` scheme that writes a `from` tensor as `to`, if
/// any.
pub(super) fn plain_scheme(from: Dtype, to: Dtype) -> Option<QuantizeScheme> {
    let float = matches!(from, Dtype::F64 | Dtype::F32 | Dtype::F16 | Dtype::BF16);
    match to {
        Dtype::F8_E4M3 if float => Some(QuantizeScheme::Fp8),
        Dtype::F8_E5M2 if float => Some(QuantizeScheme::Fp8E5m2),
        _ => None,
    }
}

/// Why `out` is not the plain FP8 quantization of `theirs`, or the codes'
/// error figures when it is, bit for bit.
pub(super) fn plain_difference(
    src_reader: &SourceReader,
    theirs: &Tensor,
    out_reader: &SourceReader,
    out: &Tensor,
    bufs: &mut Buffers,
) -> Result<Result<QuantQuality, String>, ValidateError> {
    let in_elem = (theirs.dtype.bits() / 8) as usize;
    let per_chunk = bufs.source.len() / in_elem;
    let numel = out.numel();
    let mut src_stream: TensorBytes = src_reader.tensor_bytes(theirs);
    let mut out_stream: TensorBytes = out_reader.tensor_bytes(out);
    let mut quality = QuantQuality::default();
    let mut done = 0u64;
    while done < numel {
        bufs.poll(out_reader, out)?;
        let n = usize::try_from(numel - done)
            .unwrap_or(usize::MAX)
            .min(per_chunk);
        let input = &mut bufs.source[..n * in_elem];
        src_reader.read_chunk(theirs, &mut src_stream, input)?;
        // The F8 kernels clamp whatever the policy: the policy only
        // decides what the other targets do with overflow.
        let expected = &mut bufs.cast[..n];
        cast::cast_parallel(
            theirs.dtype,
            out.dtype,
            input,
            expected,
            OverflowPolicy::Saturate,
        );
        let got = &mut bufs.output[..n];
        out_reader.read_chunk(out, &mut out_stream, got)?;
        if let Some(at) = first_unequal(expected, got, 1) {
            return Ok(Err(format!(
                "differs from the source's {} quantized to {} at element {}",
                theirs.dtype,
                out.dtype,
                done + at as u64
            )));
        }
        add_errors(&mut quality, theirs.dtype, input, out.dtype, got);
        done += n as u64;
    }
    Ok(Ok(quality))
}

/// Adds the error of each code in `codes` (of dtype `to`) against its
/// source value in `source` (of dtype `from`).
fn add_errors(quality: &mut QuantQuality, from: Dtype, source: &[u8], to: Dtype, codes: &[u8]) {
    let in_elem = (from.bits() / 8) as usize;
    let mut x = [0u8; QUALITY_STEP * 4];
    let mut y = [0u8; QUALITY_STEP * 4];
    for (src, got) in source
        .chunks(QUALITY_STEP * in_elem)
        .zip(codes.chunks(QUALITY_STEP))
    {
        let n = got.len();
        let (x, y) = (&mut x[..n * 4], &mut y[..n * 4]);
        cast::cast_slice(from, Dtype::F32, src, x, OverflowPolicy::Inf);
        cast::cast_slice(to, Dtype::F32, got, y, OverflowPolicy::Inf);
        for (a, b) in x.chunks_exact(4).zip(y.chunks_exact(4)) {
            let a = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
            let b = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            quality.add(f64::from(a), f64::from(b));
        }
    }
}
