//! fp8 e4m3b15: sign 1, exponent 4, mantissa 3, exponent bias 15; defined in software so it
//! runs on every GPU, and bit-compatible with MSCCL++'s `__fp8_e4m3b15` (the Triton-derived
//! bit tricks, which this module follows exactly).
//!
//! - **Decode**: put the byte in the upper byte of an f16 pattern, shift exponent and
//!   mantissa right by one (the sign stays), read as f16. Every code is finite: no NaN, no
//!   infinity; 0x7f / 0xff are +/-1.875, 0x80 is -0.
//! - **Encode**: f32 -> f16 (round to nearest even), clamp the magnitude to 1.875 (f16
//!   0x3F80), double it, add 0x80 and keep the upper byte (round half up on the magnitude,
//!   i.e. ties away from zero), restore the sign. NaN and +/-infinity therefore saturate to
//!   +/-1.875 (the NaN's sign bit decides), negative values that round to zero give 0x80.
//!
//! Note: an MSCCL++ PR description gives the largest finite value as 0.9375; its code
//! saturates at 1.875, and so do we.

use super::f16;

/// Largest finite magnitude.
pub const MAX: f32 = 1.875;
/// f16 pattern of [`MAX`]: the clamp bound of the encoder.
pub const MAX_F16_BITS: u16 = 0x3f80;

/// Decodes a code to f32 (exact).
pub fn decode(code: u8) -> f32 {
    f16::decode(decode_to_f16_bits(code))
}

/// Decodes a code to the f16 bit pattern of its value (exact).
pub fn decode_to_f16_bits(code: u8) -> u16 {
    let h = u16::from(code) << 8;
    (h & 0x8000) | ((h & 0x7f00) >> 1)
}

/// Encodes f32 (rounded to f16 first, then to e4m3b15; see the module doc).
pub fn encode(x: f32) -> u8 {
    encode_f16_bits(f16::encode(x))
}

/// Encodes an f16 bit pattern.
pub fn encode_f16_bits(h: u16) -> u8 {
    let sign = h & 0x8000;
    // NaN and infinity patterns are larger than the clamp bound, so they saturate.
    let magnitude = (h & 0x7fff).min(MAX_F16_BITS);
    let rounded = magnitude * 2 + 0x80; // at most 0x7f80: no overflow
    ((sign | rounded) >> 8) as u8
}

/// The 256-code table as Markdown (the table in `docs/number-formats.md`).
pub fn markdown_table() -> String {
    let mut t = String::from(
        "| code | bits (s eeee mmm) | f16 bits | value | exact |\n\
         |------|-------------------|----------|-------|-------|\n",
    );
    for code in 0..=255u8 {
        let h = decode_to_f16_bits(code);
        let v = f16::decode(h);
        let bits = format!("{} {:04b} {:03b}", code >> 7, (code >> 3) & 0xf, code & 7);
        t.push_str(&format!(
            "| {code:#04x} | {bits} | {h:#06x} | {v:e} | {} |\n",
            exact(v)
        ));
    }
    t
}

/// `v` as an exact `m*2^e` with m odd (every e4m3b15 value is a multiple of 2^-17).
fn exact(v: f32) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let mut m = (v.abs() * 131072.0) as u32;
    let mut e = -17;
    while m % 2 == 0 {
        m /= 2;
        e += 1;
    }
    let s = if v < 0.0 { "-" } else { "" };
    format!("{s}{m}*2^{e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The value of a code from the field definitions (bias 15, subnormals, all finite).
    fn spec_value(code: u8) -> f64 {
        let s = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = i32::from((code >> 3) & 0xf);
        let m = f64::from(code & 7) / 8.0;
        if e == 0 {
            s * m * 2f64.powi(1 - 15)
        } else {
            s * (1.0 + m) * 2f64.powi(e - 15)
        }
    }

    /// All 256 values, positive codes only, ascending (codes 0..=0x7f are ascending).
    fn positive_values() -> Vec<f64> {
        (0..=0x7fu8).map(spec_value).collect()
    }

    /// The spec's encode of a finite or special f16 value, from values: clamp the magnitude
    /// to 1.875 (NaN too), round to the nearest code with ties away from zero.
    fn spec_encode_f16(h: u16) -> u8 {
        let x = f64::from(f16::decode(h));
        let sign = if h & 0x8000 != 0 { 0x80 } else { 0 };
        let mag = if x.is_nan() {
            1.875
        } else {
            x.abs().min(1.875)
        };
        let values = positive_values();
        let mut code = 0u8;
        for (c, &v) in values.iter().enumerate() {
            if v <= mag {
                code = c as u8;
            }
        }
        // code is the largest value <= mag; go up when at or past the midpoint.
        if let Some(&next) = values.get(usize::from(code) + 1) {
            let mid = (values[usize::from(code)] + next) / 2.0;
            if mag >= mid {
                code += 1;
            }
        }
        sign | code
    }

    #[test]
    fn every_code_decodes_per_spec() {
        for code in 0..=255u8 {
            let got = decode(code);
            assert!(got.is_finite());
            assert_eq!(
                f64::from(got).to_bits(),
                spec_value(code).to_bits(),
                "{code:#04x}"
            );
        }
        assert_eq!(decode(0x7f), 1.875);
        assert_eq!(decode(0xff), -1.875);
        assert_eq!(decode(0x01), 2f32.powi(-17));
        assert_eq!(decode(0x08), 2f32.powi(-14));
        assert_eq!(decode(0x78), 1.0);
        assert!(decode(0x80) == 0.0 && decode(0x80).is_sign_negative());
    }

    #[test]
    fn encode_of_every_f16_matches_spec() {
        for h in 0..=u16::MAX {
            assert_eq!(encode_f16_bits(h), spec_encode_f16(h), "f16 {h:#06x}");
            // Through f32 too: f16 -> f32 is exact and f32 -> f16 gives h back (NaN aside).
            let x = f16::decode(h);
            if !x.is_nan() {
                assert_eq!(encode(x), spec_encode_f16(h), "f32 {x:e}");
            }
        }
    }

    #[test]
    fn every_code_round_trips() {
        // Including 0x80: it decodes to -0.0, whose f16 pattern is 0x8000, which encodes
        // back to 0x80. +0 and -0 are distinct codes that compare equal as values.
        for code in 0..=255u8 {
            assert_eq!(encode(decode(code)), code, "{code:#04x}");
        }
    }

    #[test]
    fn docs_table_is_generated_from_this_code() {
        let doc = include_str!("../../../docs/number-formats.md");
        assert!(
            doc.contains(&markdown_table()),
            "regenerate: cargo run -p oxccl-kernels --example e4m3b15_table"
        );
    }

    #[test]
    fn specials_saturate() {
        assert_eq!(encode(f32::NAN), 0x7f);
        assert_eq!(encode(-f32::NAN), 0xff);
        assert_eq!(encode(f32::INFINITY), 0x7f);
        assert_eq!(encode(f32::NEG_INFINITY), 0xff);
        assert_eq!(encode(2.0), 0x7f);
        assert_eq!(encode(-1e30), 0xff);
        assert_eq!(encode(0.0), 0x00);
        assert_eq!(encode(-0.0), 0x80);
        assert_eq!(encode(-1e-30), 0x80);
        // Ties go away from zero: 1.0 + half an ulp (1/16) is between 0x78 and 0x79.
        assert_eq!(encode(1.0625), 0x79);
        assert_eq!(encode(-1.0625), 0xf9);
    }

    proptest! {
        #[test]
        fn encode_is_monotonic(a in -4f32..4.0, b in -4f32..4.0) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(decode(encode(lo)) <= decode(encode(hi)));
        }

        #[test]
        fn encode_saturates(x in 1.9375f32..f32::MAX) {
            prop_assert_eq!(encode(x), 0x7f);
            prop_assert_eq!(encode(-x), 0xff);
        }

        #[test]
        fn encode_is_within_half_an_ulp_after_f16(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            prop_assume!(x.is_finite() && x.abs() <= MAX);
            let h = f64::from(f16::round(x));
            let y = f64::from(decode(encode(x)));
            let code = encode(x) & 0x7f;
            let ulp = if code < 8 { 2f64.powi(-17) } else { 2f64.powi(i32::from(code >> 3) - 15 - 3) };
            prop_assert!((h - y).abs() <= ulp / 2.0 + ulp / 2.0 * f64::EPSILON, "{} -> {}", x, y);
        }
    }
}
