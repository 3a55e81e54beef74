//! IEEE binary16: conversions as the GPUs do them (`__float2half_rn`, `__half2float`).
//!
//! Encoding rounds to nearest, ties to even; overflow gives infinity; NaN stays NaN (quiet,
//! sign kept, payload truncated; payloads are not part of the contract).

/// Decodes binary16 bits to f32 (exact).
pub fn decode(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value m * 2^-24; normalise into an f32.
            let shift = m.leading_zeros() - 21; // moves the top set bit to bit 10
            let m = (m << shift) & 0x3ff;
            let e = 127 - 15 + 1 - shift;
            sign | (e << 23) | (m << 13)
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Encodes f32 to binary16 bits, rounding to nearest even.
pub fn encode(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return sign | 0x7e00 | ((abs >> 13) & 0x3ff) as u16;
    }
    if abs >= 0x4780_0000 {
        // >= 65536: beyond the rounding range of the largest finite value (65504 + half ulp
        // = 65520 already rounds up), and infinity itself.
        return sign | 0x7c00;
    }
    let exp = (abs >> 23) as i32 - 127;
    if exp >= -14 {
        // Normal range: drop 13 mantissa bits with round-to-nearest-even; a carry moves into
        // the exponent, and past 65504 into infinity, which is what IEEE wants.
        let rebased = abs - ((127 - 15) << 23);
        let half = 0x0fff + ((rebased >> 13) & 1);
        return sign | ((rebased + half) >> 13) as u16;
    }
    // Subnormal range: quanta of 2^-24.
    if exp < -25 {
        return sign;
    }
    let sig = (abs & 0x7f_ffff) | 0x80_0000; // value = sig * 2^(exp-23)
    let shift = (-exp - 1) as u32; // quanta = sig >> (exp-23 - -24 negated) = sig >> (-1-exp)
    let q = sig >> shift;
    let rem = sig & ((1 << shift) - 1);
    let halfway = 1 << (shift - 1);
    let q = if rem > halfway || (rem == halfway && q & 1 == 1) {
        q + 1
    } else {
        q
    };
    sign | q as u16
}

/// Rounds f32 to the nearest binary16 value, returned as f32.
pub fn round(x: f32) -> f32 {
    decode(encode(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_f16_round_trips_through_f32() {
        for h in 0..=u16::MAX {
            let x = decode(h);
            if x.is_nan() {
                assert!(decode(encode(x)).is_nan());
                assert_eq!(encode(x) & 0x8000, h & 0x8000);
            } else {
                assert_eq!(encode(x), h, "{h:#06x}");
            }
        }
    }

    #[test]
    fn matches_the_half_crate_on_f32_patterns() {
        // Every 2^12-th f32 pattern plus the ones around each f16 rounding boundary.
        let check = |bits: u32| {
            let x = f32::from_bits(bits);
            let want = half::f16::from_f32(x);
            let got = encode(x);
            if x.is_nan() {
                assert!(want.is_nan() && decode(got).is_nan());
            } else {
                assert_eq!(got, want.to_bits(), "{x:e} ({bits:#010x})");
                assert_eq!(decode(got).to_bits(), want.to_f32().to_bits());
            }
        };
        for bits in (0..=u32::MAX).step_by(4096) {
            check(bits);
        }
        for h in 0..=u16::MAX {
            let x = decode(h);
            if x.is_finite() {
                let b = x.to_bits();
                for d in 0..4u32 {
                    check(b.wrapping_add(0x1000).wrapping_sub(d));
                    check(b.wrapping_add(0xfff).wrapping_add(d));
                }
            }
        }
    }
}
