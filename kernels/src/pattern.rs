//! Test data. The pattern written and checked by `oxccl_test_fill_pattern` /
//! `oxccl_test_check_pattern`: a cheap integer hash of (seed, index), the same on the host
//! and the device. And [`allreduce_input`]: a rank's non-zero allreduce input.

use oxccl_hal::{DataType, Error, Result};

use crate::formats;

/// The pattern's value at `index` for `seed`.
///
/// A murmur3-style finaliser of `index * golden + seed`: every bit of the index and the seed
/// affects the result, and it is a few integer instructions on a GPU. Only the low 32 bits
/// of the index take part beyond the first multiply, which is plenty for test buffers.
pub const fn value(seed: u32, index: u64) -> u32 {
    let lo = index as u32;
    let hi = (index >> 32) as u32;
    let mut x = lo.wrapping_mul(0x9e37_79b9) ^ hi.wrapping_mul(0x85eb_ca6b) ^ seed;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// Fills `data` with the pattern for `seed`.
pub fn fill(data: &mut [u32], seed: u32) {
    for (i, d) in data.iter_mut().enumerate() {
        *d = value(seed, i as u64);
    }
}

/// Counts the elements of `data` that differ from the pattern for `seed`.
pub fn mismatches(data: &[u32], seed: u32) -> u64 {
    data.iter()
        .enumerate()
        .filter(|&(i, &d)| d != value(seed, i as u64))
        .count() as u64
}

/// Deterministic non-zero inputs of `rank` for an allreduce of `count` elements (a zero
/// would hide a missing contribution of a rank in a sum), different per rank and per
/// `salt`: for floats, values near ±1 rounded to `dtype`; for f64 the same with every
/// mantissa bit used (an f32 path would lose them); for integers, random bits over the
/// whole range (sums and products wrap, min and max see both signs).
pub fn allreduce_input(dtype: DataType, rank: u32, count: usize, salt: u64) -> Result<Vec<u8>> {
    let mut out = vec![0u8; dtype.bytes(count)?];
    let mut s = 0x9e37_79b9_7f4a_7c15u64
        ^ (u64::from(rank) << 32)
        ^ salt.wrapping_mul(0x1234_5678_9abc_def1);
    for i in 0..count {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let negative = s & (1 << 20) != 0;
        let bits = if dtype.is_integer() {
            let b = s.rotate_left(23) & formats::mask(dtype);
            if b == 0 {
                1
            } else {
                b
            }
        } else if dtype == DataType::F64 {
            let mag = 0.25 + (s >> 11) as f64 / (1u64 << 53) as f64;
            (if negative { -mag } else { mag }).to_bits()
        } else {
            let mag = 0.25 + (s % 1000) as f32 / 1000.0;
            let bits = formats::encode(dtype, if negative { -mag } else { mag });
            if formats::decode(dtype, bits) == 0.0 {
                formats::encode(dtype, 0.5)
            } else {
                bits
            }
        };
        formats::write_element(dtype, &mut out, i, bits)
            .ok_or_else(|| Error::InvalidArgument("allreduce input buffer too short".into()))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_and_spread() {
        // Pinned: the device implementation in test_kernels.cu must give the same.
        assert_eq!(value(0, 0), 0);
        assert_ne!(value(1, 0), value(0, 1));
        let mut v = vec![0u32; 1000];
        fill(&mut v, 7);
        assert_eq!(mismatches(&v, 7), 0);
        assert_eq!(mismatches(&v, 8), 1000);
        let distinct: std::collections::HashSet<_> = v.iter().collect();
        assert_eq!(distinct.len(), 1000);
    }

    #[test]
    fn inputs_are_never_zero_and_use_every_type_range() {
        for dtype in DataType::ALL {
            let count = 4000;
            let data = allreduce_input(dtype, 1, count, 3).unwrap();
            let bits: Vec<u64> = (0..count)
                .map(|i| formats::read_element(dtype, &data, i).unwrap())
                .collect();
            assert!(
                bits.iter().all(|&b| b & formats::mask(dtype) != 0),
                "{dtype}"
            );
            if dtype.is_integer() {
                // Both halves of the range (the sign bit set and clear).
                let top = 1u64 << (8 * dtype.size() - 1);
                assert!(bits.iter().any(|&b| b & top != 0), "{dtype}");
                assert!(bits.iter().any(|&b| b & top == 0), "{dtype}");
            }
            if dtype == DataType::F64 {
                // Not all f32 values: some use mantissa bits below f32's.
                assert!(bits.iter().any(|&b| b & 0x1fff_ffff != 0));
            }
        }
    }
}
