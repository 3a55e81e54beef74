//! The test pattern written and checked by `oxccl_test_fill_pattern` /
//! `oxccl_test_check_pattern`: a cheap integer hash of (seed, index), the same on the host
//! and the device.

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
