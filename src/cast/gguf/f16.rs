//! Half-precision fields of GGUF blocks, widened to f32 exactly.

/// f16 bits widened to f32 exactly, as numpy's `astype(np.float32)`: NaN
/// payloads kept (a signalling NaN stays signalling), subnormals exact.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = h & 0x7c00;
    let man = u32::from(h & 0x03ff);
    let bits = match exp {
        0x7c00 => sign | 0x7f80_0000 | (man << 13),
        0 if man == 0 => sign,
        0 => {
            // man * 2^-24, exact: normalize the leading one into bit 10.
            let shift = man.leading_zeros() - 21;
            let e = 127 - 15 + 1 - shift;
            sign | (e << 23) | (((man << shift) & 0x03ff) << 13)
        }
        _ => sign | ((u32::from(h & 0x7fff) + 0x1_c000) << 13),
    };
    f32::from_bits(bits)
}

/// The f16 at `b[0..2]`, widened.
#[inline(always)]
pub(super) fn f16_at(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}
