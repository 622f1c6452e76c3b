//! Whole GGML blocks to f32: the type dispatch over the kernels of
//! `legacy` and `kquants`, with the checks on lengths.

use super::{kquants, legacy};
use crate::format::gguf::ggml::GgmlType;

/// Why a slice could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    #[error("{ty} cannot be dequantized (reshard reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and MXFP4)")]
    Unsupported { ty: GgmlType },
    #[error("{bytes} bytes of {ty} are not a whole number of {block_bytes}-byte blocks")]
    PartialBlock {
        ty: GgmlType,
        bytes: usize,
        block_bytes: u64,
    },
    #[error("{bytes} bytes of {ty} hold {values} values, but the output has room for {room}")]
    OutputLength {
        ty: GgmlType,
        bytes: usize,
        values: u64,
        room: usize,
    },
}

/// Dequantizes whole blocks of bytes into their values.
type Kernel = fn(&[u8], &mut [f32]);

/// The types [`dequantize_blocks`] reads.
pub const SUPPORTED: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

/// True if [`dequantize_blocks`] reads `ty`.
pub fn supports(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// Dequantizes `src`, a whole number of `ty` blocks, into `dst`, which must
/// hold exactly the values those blocks carry.
///
/// ```
/// use reshard::cast::gguf::dequantize_blocks;
/// use reshard::format::gguf::ggml::GgmlType;
///
/// // One Q8_0 block: f16 scale 0.5, then 32 int8 codes.
/// let mut block = vec![0x00, 0x38];
/// block.extend((0..32).map(|i| (i as i8 - 16) as u8));
/// let mut out = [0f32; 32];
/// dequantize_blocks(GgmlType::Q8_0, &block, &mut out).unwrap();
/// assert_eq!((out[0], out[31]), (-8.0, 7.5));
/// ```
pub fn dequantize_blocks(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), DequantError> {
    let layout = match ty.layout() {
        Some(l) if supports(ty) => l,
        _ => return Err(DequantError::Unsupported { ty }),
    };
    let bytes = layout.bytes as usize;
    let block = layout.block as usize;
    if !src.len().is_multiple_of(bytes) {
        return Err(DequantError::PartialBlock {
            ty,
            bytes: src.len(),
            block_bytes: layout.bytes,
        });
    }
    let values = (src.len() / bytes) as u64 * layout.block;
    if values != dst.len() as u64 {
        return Err(DequantError::OutputLength {
            ty,
            bytes: src.len(),
            values,
            room: dst.len(),
        });
    }
    // One element a block: a loop over the slice, not a call per element.
    let dense: Option<Kernel> = match ty {
        GgmlType::F32 => Some(legacy::f32s),
        GgmlType::F16 => Some(legacy::f16s),
        GgmlType::BF16 => Some(legacy::bf16s),
        _ => None,
    };
    if let Some(dense) = dense {
        dense(src, dst);
        return Ok(());
    }
    let kernel: Kernel = match ty {
        GgmlType::Q4_0 => legacy::q4_0,
        GgmlType::Q4_1 => legacy::q4_1,
        GgmlType::Q5_0 => legacy::q5_0,
        GgmlType::Q5_1 => legacy::q5_1,
        GgmlType::Q8_0 => legacy::q8_0,
        GgmlType::MXFP4 => legacy::mxfp4,
        GgmlType::Q2_K => kquants::q2_k,
        GgmlType::Q3_K => kquants::q3_k,
        GgmlType::Q4_K => kquants::q4_k,
        GgmlType::Q5_K => kquants::q5_k,
        GgmlType::Q6_K => kquants::q6_k,
        _ => return Err(DequantError::Unsupported { ty }),
    };
    for (s, d) in src.chunks_exact(bytes).zip(dst.chunks_exact_mut(block)) {
        kernel(s, d);
    }
    Ok(())
}
