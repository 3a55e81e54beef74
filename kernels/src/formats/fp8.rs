//! The hardware fp8 formats, one parameterised codec: OCP E4M3 and E5M2 (native on sm_90)
//! and the FNUZ variants E4M3FNUZ and E5M2FNUZ (native on gfx942).
//!
//! Encoding (from f32) rounds once to nearest, ties to even, and saturates: a finite value
//! or an infinity beyond the largest finite magnitude becomes that magnitude with its sign
//! (`__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)` on NVIDIA, `__HIP_SATFINITE` on AMD).
//! NaN becomes the format's NaN code: 0x7f for OCP, 0x80 for FNUZ. FNUZ has no negative
//! zero, so negative values that round to zero become +0 (0x00).

/// How a format spends its top codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Specials {
    /// OCP E4M3 ("fn"): S.1111.111 is NaN, no infinities.
    OcpE4m3,
    /// IEEE-like (OCP E5M2): exponent all ones is infinity (mantissa 0) or NaN.
    Ieee,
    /// FNUZ: 0x80 is the only NaN, no infinities, no negative zero.
    Fnuz,
}

/// An fp8 format: field widths, bias, special-value convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Format {
    /// Exponent bits.
    pub exp_bits: u32,
    /// Mantissa bits (`7 - exp_bits`).
    pub man_bits: u32,
    /// Exponent bias.
    pub bias: i32,
    /// Special values.
    pub specials: Specials,
}

/// OCP fp8 E4M3 (bias 7, max 448).
pub const E4M3: Fp8Format = Fp8Format {
    exp_bits: 4,
    man_bits: 3,
    bias: 7,
    specials: Specials::OcpE4m3,
};
/// OCP fp8 E5M2 (bias 15, max 57344, infinities).
pub const E5M2: Fp8Format = Fp8Format {
    exp_bits: 5,
    man_bits: 2,
    bias: 15,
    specials: Specials::Ieee,
};
/// FNUZ fp8 E4M3 (bias 8, max 240).
pub const E4M3_FNUZ: Fp8Format = Fp8Format {
    exp_bits: 4,
    man_bits: 3,
    bias: 8,
    specials: Specials::Fnuz,
};
/// FNUZ fp8 E5M2 (bias 16, max 57344).
pub const E5M2_FNUZ: Fp8Format = Fp8Format {
    exp_bits: 5,
    man_bits: 2,
    bias: 16,
    specials: Specials::Fnuz,
};

impl Fp8Format {
    /// The code (without sign) of the largest finite magnitude.
    pub const fn max_code(&self) -> u8 {
        match self.specials {
            Specials::OcpE4m3 => 0x7e,
            Specials::Ieee => {
                (((1u32 << self.exp_bits) - 2) << self.man_bits) as u8
                    | ((1u8 << self.man_bits) - 1)
            }
            Specials::Fnuz => 0x7f,
        }
    }

    /// The code an encoded NaN gets.
    pub const fn nan_code(&self) -> u8 {
        match self.specials {
            Specials::OcpE4m3 | Specials::Ieee => 0x7f,
            Specials::Fnuz => 0x80,
        }
    }

    /// The largest finite value.
    pub fn max_value(&self) -> f32 {
        self.decode(self.max_code())
    }

    /// Decodes a code to f32 (exact; NaN codes give a quiet NaN, infinities infinity).
    pub fn decode(&self, code: u8) -> f32 {
        let negative = code & 0x80 != 0;
        let mag = code & 0x7f;
        let exp_field = i32::from(mag >> self.man_bits);
        let man = u32::from(mag) & ((1 << self.man_bits) - 1);
        let exp_max = (1i32 << self.exp_bits) - 1;
        match self.specials {
            Specials::Fnuz if code == 0x80 => return f32::NAN,
            Specials::OcpE4m3 if mag == 0x7f => return f32::NAN,
            Specials::Ieee if exp_field == exp_max => {
                if man != 0 {
                    return f32::NAN;
                }
                return if negative {
                    f32::NEG_INFINITY
                } else {
                    f32::INFINITY
                };
            }
            _ => {}
        }
        if mag == 0 {
            return if negative { -0.0 } else { 0.0 };
        }
        // value = significand * 2^(e - man_bits) with e the unbiased exponent (subnormals use
        // the minimum exponent and no implicit bit). Both factors are exact in f32.
        let (sig, e) = if exp_field == 0 {
            (man, 1 - self.bias)
        } else {
            (man | (1 << self.man_bits), exp_field - self.bias)
        };
        let magnitude = sig as f32 * pow2(e - self.man_bits as i32);
        if negative {
            -magnitude
        } else {
            magnitude
        }
    }

    /// Encodes f32 with round-to-nearest-even and saturation (see the module doc).
    pub fn encode(&self, x: f32) -> u8 {
        let bits = x.to_bits();
        let sign = ((bits >> 24) & 0x80) as u8;
        let abs = bits & 0x7fff_ffff;
        if abs > 0x7f80_0000 {
            return self.nan_code();
        }
        let max = self.max_code();
        let mag = if abs == 0x7f80_0000 {
            max
        } else {
            self.round_magnitude(abs).min(max)
        };
        match self.specials {
            Specials::Fnuz if mag == 0 => 0,
            _ => sign | mag,
        }
    }

    /// The code of |x| (f32 bits without sign, finite), rounded to nearest even; may exceed
    /// the largest code (the caller saturates). Never overflows: huge inputs return 0xff.
    fn round_magnitude(&self, abs: u32) -> u8 {
        let exp_field = (abs >> 23) as i32;
        if exp_field == 0 {
            // f32 zero or subnormal: far below half the smallest fp8 subnormal.
            return 0;
        }
        let e = exp_field - 127;
        let min_exp = 1 - self.bias;
        if e > (1 << self.exp_bits) - self.bias {
            return 0xff;
        }
        let sig = (abs & 0x7f_ffff) | 0x80_0000; // value = sig * 2^(e - 23)
        let target_exp = e.max(min_exp);
        // Quanta of 2^(target_exp - man_bits): sig >> shift, shift >= 23 - man_bits.
        let shift = (23 - self.man_bits as i32 + (target_exp - e)) as u32;
        if shift > 24 {
            return 0; // below a quarter of the smallest subnormal
        }
        let q = sig >> shift;
        let rem = sig & ((1u32 << shift) - 1);
        let halfway = 1u32 << (shift - 1);
        let q = if rem > halfway || (rem == halfway && q & 1 == 1) {
            q + 1
        } else {
            q
        };
        // q counts quanta including the implicit bit, so adding the exponent field below
        // the implicit bit's position gives the code; a rounding carry bumps the exponent.
        let code = (((target_exp - min_exp) as u32) << self.man_bits) + q;
        code.min(0xff) as u8
    }
}

/// 2^e as an f32, for e in the normal or subnormal range of f32.
fn pow2(e: i32) -> f32 {
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [(&str, Fp8Format); 4] = [
        ("e4m3", E4M3),
        ("e5m2", E5M2),
        ("e4m3fnuz", E4M3_FNUZ),
        ("e5m2fnuz", E5M2_FNUZ),
    ];

    /// The standard's value of a code, computed with f64 arithmetic from the field
    /// definitions, independent of the codec above.
    fn spec_value(f: &Fp8Format, code: u8) -> f64 {
        let s = if code >> 7 == 1 { -1.0 } else { 1.0 };
        let ebits = f.exp_bits;
        let mbits = 7 - ebits;
        let e = (code >> mbits) & ((1 << ebits) - 1);
        let m = code & ((1 << mbits) - 1);
        match f.specials {
            Specials::Fnuz if code == 0x80 => return f64::NAN,
            Specials::OcpE4m3 if code & 0x7f == 0x7f => return f64::NAN,
            Specials::Ieee if u32::from(e) == (1 << ebits) - 1 => {
                return if m == 0 { s * f64::INFINITY } else { f64::NAN };
            }
            _ => {}
        }
        let frac = f64::from(m) / f64::from(1u32 << mbits);
        if e == 0 {
            s * frac * 2f64.powi(1 - f.bias)
        } else {
            s * (1.0 + frac) * 2f64.powi(i32::from(e) - f.bias)
        }
    }

    #[test]
    fn every_code_decodes_per_standard() {
        for (name, f) in ALL {
            for code in 0..=255u8 {
                let want = spec_value(&f, code);
                let got = f.decode(code);
                if want.is_nan() {
                    assert!(got.is_nan(), "{name} {code:#04x}");
                } else {
                    assert_eq!(
                        f64::from(got).to_bits(),
                        want.to_bits(),
                        "{name} {code:#04x}"
                    );
                }
            }
        }
    }

    #[test]
    fn well_known_values() {
        assert_eq!(E4M3.max_value(), 448.0);
        assert_eq!(E5M2.max_value(), 57344.0);
        assert_eq!(E4M3_FNUZ.max_value(), 240.0);
        assert_eq!(E5M2_FNUZ.max_value(), 57344.0);
        assert_eq!(E4M3.decode(0x01), 2f32.powi(-9));
        assert_eq!(E5M2.decode(0x01), 2f32.powi(-16));
        assert_eq!(E4M3_FNUZ.decode(0x01), 2f32.powi(-10));
        assert_eq!(E5M2_FNUZ.decode(0x01), 2f32.powi(-17));
        assert_eq!(E4M3.encode(1.0), 0x38);
        assert_eq!(E4M3_FNUZ.encode(1.0), 0x40);
        assert_eq!(E5M2.encode(1.0), 0x3c);
        assert_eq!(E5M2_FNUZ.encode(1.0), 0x40);
    }

    #[test]
    fn every_non_nan_code_round_trips() {
        for (name, f) in ALL {
            for code in 0..=255u8 {
                let x = f.decode(code);
                if x.is_nan() {
                    assert_eq!(f.encode(x), f.nan_code(), "{name}");
                } else if x.is_infinite() {
                    // Saturating conversion: infinity becomes the largest finite value.
                    assert_eq!(f.encode(x), (code & 0x80) | f.max_code(), "{name}");
                } else {
                    assert_eq!(f.encode(x), code, "{name} {code:#04x}");
                }
            }
        }
    }

    #[test]
    fn specials_and_saturation() {
        for (name, f) in ALL {
            let max = f.max_code();
            assert_eq!(f.encode(f32::NAN), f.nan_code(), "{name}");
            assert_eq!(f.encode(-f32::NAN), f.nan_code(), "{name}");
            assert_eq!(f.encode(f32::INFINITY), max, "{name}");
            assert_eq!(f.encode(f32::NEG_INFINITY), 0x80 | max, "{name}");
            assert_eq!(f.encode(1e30), max, "{name}");
            assert_eq!(f.encode(-1e30), 0x80 | max, "{name}");
            assert_eq!(f.encode(f32::MAX), max, "{name}");
            assert_eq!(f.encode(0.0), 0, "{name}");
            let neg_zero = if f.specials == Specials::Fnuz {
                0x00
            } else {
                0x80
            };
            assert_eq!(f.encode(-0.0), neg_zero, "{name}");
            assert_eq!(f.encode(-1e-30), neg_zero, "{name}");
        }
    }

    /// Nearest-value oracle: the finite code closest to x (ties to the even code), with
    /// saturation, found by scanning all codes.
    fn oracle(f: &Fp8Format, x: f32) -> u8 {
        if x.is_nan() {
            return f.nan_code();
        }
        let x = f64::from(x);
        let mut best: Option<(f64, u8)> = None;
        for code in 0..=0x7fu8 {
            let v = spec_value(f, code);
            if !v.is_finite() {
                continue;
            }
            let d = (x.abs() - v).abs();
            best = match best {
                None => Some((d, code)),
                Some((bd, bc)) if d < bd || (d == bd && code & 1 == 0 && bc & 1 == 1) => {
                    Some((d, code))
                }
                keep => keep,
            };
        }
        let mag = best.map_or(0, |(_, c)| c);
        let mag = if x.abs() > f64::from(f.max_value()) {
            f.max_code()
        } else {
            mag
        };
        if x.is_sign_negative() && !(f.specials == Specials::Fnuz && mag == 0) {
            0x80 | mag
        } else {
            mag
        }
    }

    #[test]
    fn encode_of_every_f16_matches_nearest_even_oracle() {
        for (name, f) in ALL {
            for h in 0..=u16::MAX {
                let x = super::super::f16::decode(h);
                assert_eq!(f.encode(x), oracle(&f, x), "{name} f16 {h:#06x} = {x:e}");
            }
        }
    }

    proptest! {
        #[test]
        fn encode_matches_oracle(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            for (name, f) in ALL {
                prop_assert_eq!(f.encode(x), oracle(&f, x), "{} {:e}", name, x);
            }
        }

        #[test]
        fn encode_is_monotonic(a in -1e6f32..1e6, b in -1e6f32..1e6) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            for (name, f) in ALL {
                let (dl, dh) = (f.decode(f.encode(lo)), f.decode(f.encode(hi)));
                prop_assert!(dl <= dh, "{} {} -> {} > {} -> {}", name, lo, dl, hi, dh);
            }
        }

        #[test]
        fn encode_saturates(x in 1e5f32..f32::MAX) {
            for (name, f) in ALL {
                if x > f.max_value() {
                    prop_assert_eq!(f.encode(x), f.max_code(), "{}", name);
                    prop_assert_eq!(f.encode(-x), 0x80 | f.max_code(), "{}", name);
                }
            }
        }
    }
}
