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

/// Deterministic non-zero inputs of `rank` for an allreduce of `count` elements: values
/// near ±1 rounded to `dtype` (a zero would hide a missing contribution of a rank in a
/// sum), different per rank and per `salt`.
pub fn allreduce_input(dtype: DataType, rank: u32, count: usize, salt: u64) -> Result<Vec<u8>> {
    let mut out = vec![0u8; dtype.bytes(count)?];
    let mut s = 0x9e37_79b9_7f4a_7c15u64
        ^ (u64::from(rank) << 32)
        ^ salt.wrapping_mul(0x1234_5678_9abc_def1);
    for i in 0..count {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let mag = 0.25 + (s % 1000) as f32 / 1000.0;
        let v = if s & (1 << 20) != 0 { -mag } else { mag };
        let mut bits = formats::encode(dtype, v);
        if formats::decode(dtype, bits) == 0.0 {
            bits = formats::encode(dtype, 0.5);
        }
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
}
