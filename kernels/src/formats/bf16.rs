//! bfloat16: the upper half of an f32, rounded to nearest even (`__float2bfloat16_rn`).
//!
//! Overflow gives infinity; NaN stays NaN (quiet, sign kept; payloads are not part of the
//! contract).

/// Decodes bfloat16 bits to f32 (exact).
pub fn decode(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// Encodes f32 to bfloat16 bits, rounding to nearest even.
pub fn encode(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let half = 0x7fff + ((bits >> 16) & 1);
    // Cannot overflow u32: the largest non-NaN pattern 0xff80_0000 plus 0x8000 stays below.
    ((bits + half) >> 16) as u16
}

/// Rounds f32 to the nearest bfloat16 value, returned as f32.
pub fn round(x: f32) -> f32 {
    decode(encode(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_half_crate() {
        for bits in (0..=u32::MAX).step_by(997) {
            let x = f32::from_bits(bits);
            let want = half::bf16::from_f32(x);
            if x.is_nan() {
                assert!(decode(encode(x)).is_nan());
            } else {
                assert_eq!(encode(x), want.to_bits(), "{x:e}");
            }
        }
    }

    #[test]
    fn every_bf16_round_trips() {
        for b in 0..=u16::MAX {
            let x = decode(b);
            if !x.is_nan() {
                assert_eq!(encode(x), b);
            }
        }
    }
}
