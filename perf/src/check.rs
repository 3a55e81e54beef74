//! Inputs and the host reference of `oxccl-perf`.
//!
//! Inputs are a pure function of (seed, rank, index), so every rank computes the reference
//! for every element without exchanging data: random non-zero values near ±1 (never 0),
//! rounded to the element type.
//!
//! Two references: the exact one (the kernels' reduction in rank order with the
//! accumulation type, `oxccl_kernels::reduce::reduce_element`), which oxccl must match bit
//! for bit on every checked element; and an f64 one (the inputs combined in f64, rounded
//! once to the element type), against which the maximum error is reported for oxccl and
//! NCCL alike.

use oxccl_collectives::hal::{AccumType, DataType, ReduceOp};
use oxccl_collectives::kernels::{formats, reduce};

/// Most elements checked per size; above it a deterministic stride samples the buffer
/// (plus its last 4096 elements, where the tails are).
pub const FULL_CHECK_LIMIT: usize = 1 << 24;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Element `i` of `rank`'s input, as its bit pattern.
pub fn element(dtype: DataType, seed: u64, rank: u32, i: usize) -> u32 {
    let h = mix(seed ^ (u64::from(rank) << 48) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mag = 0.25 + (h % 4096) as f32 / 4096.0;
    let v = if h & (1 << 40) != 0 { -mag } else { mag };
    let bits = formats::encode(dtype, v);
    if formats::decode(dtype, bits) == 0.0 {
        formats::encode(dtype, 0.5)
    } else {
        bits
    }
}

/// `rank`'s whole input.
pub fn fill(dtype: DataType, seed: u64, rank: u32, out: &mut [u8]) {
    let size = dtype.size();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let per = (out.len() / size).div_ceil(threads).max(1) * size;
    std::thread::scope(|s| {
        for (t, chunk) in out.chunks_mut(per).enumerate() {
            s.spawn(move || {
                let first = t * per / size;
                for j in 0..chunk.len() / size {
                    let _ = formats::write_element(
                        dtype,
                        chunk,
                        j,
                        element(dtype, seed, rank, first + j),
                    );
                }
            });
        }
    });
}

/// Outcome of checking one output buffer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Verdict {
    /// Elements checked.
    pub checked: usize,
    /// Elements that differ from the exact reference.
    pub wrong: usize,
    /// Largest |out - f64 reference| / max(|reference|, 1) over checked elements (inputs are
    /// of order 1, so results that cancel to near zero are judged by absolute error).
    pub max_rel_err: f64,
    /// First wrong element (index, got bits, want bits).
    pub first_wrong: Option<(usize, u32, u32)>,
}

/// The elements checked for `count`: all, or a stride sample plus the tail.
fn checked_indices(count: usize) -> impl Iterator<Item = usize> + Clone {
    let stride = count.div_ceil(FULL_CHECK_LIMIT).max(1);
    let tail_start = count.saturating_sub(4096);
    (0..count)
        .step_by(stride)
        .filter(move |i| stride == 1 || *i < tail_start)
        .chain((if stride == 1 { count } else { tail_start })..count)
}

fn f64_reference(dtype: DataType, op: ReduceOp, seed: u64, world: u32, i: usize) -> f64 {
    let mut acc = f64::from(formats::decode(dtype, element(dtype, seed, 0, i)));
    for r in 1..world {
        let x = f64::from(formats::decode(dtype, element(dtype, seed, r, i)));
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + x,
            ReduceOp::Prod => acc * x,
            ReduceOp::Min => acc.min(x),
            ReduceOp::Max => acc.max(x),
        };
    }
    if op == ReduceOp::Avg {
        acc /= f64::from(world);
    }
    f64::from(formats::round(dtype, acc as f32))
}

/// Checks `out` (the allreduce result on this rank). `exact`: count elements that differ
/// from the rank-order reference as wrong (oxccl); otherwise only the error is measured.
#[allow(clippy::too_many_arguments)]
pub fn check(
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    seed: u64,
    world: u32,
    out: &[u8],
    count: usize,
    exact: bool,
) -> Verdict {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let idx: Vec<usize> = checked_indices(count).collect();
    let per = idx.len().div_ceil(threads).max(1);
    let parts: Vec<Verdict> = std::thread::scope(|s| {
        let handles: Vec<_> = idx
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    let mut v = Verdict::default();
                    let mut bits = vec![0u32; world as usize];
                    for &i in part {
                        let got = formats::read_element(dtype, out, i).unwrap_or_default();
                        v.checked += 1;
                        if exact {
                            for (r, b) in bits.iter_mut().enumerate() {
                                *b = element(dtype, seed, r as u32, i);
                            }
                            let want =
                                reduce::reduce_element(dtype, op, accum, &bits).unwrap_or(!got);
                            if !formats::same_bits(dtype, got, want) {
                                v.wrong += 1;
                                v.first_wrong.get_or_insert((i, got, want));
                            }
                        }
                        let r = f64_reference(dtype, op, seed, world, i);
                        let g = f64::from(formats::decode(dtype, got));
                        let e = if g.is_nan() || r.is_nan() {
                            if g.is_nan() && r.is_nan() {
                                0.0
                            } else {
                                f64::INFINITY
                            }
                        } else {
                            (g - r).abs() / r.abs().max(1.0)
                        };
                        v.max_rel_err = v.max_rel_err.max(e);
                    }
                    v
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    parts.into_iter().fold(Verdict::default(), |mut a, p| {
        a.checked += p.checked;
        a.wrong += p.wrong;
        a.max_rel_err = a.max_rel_err.max(p.max_rel_err);
        if a.first_wrong.is_none() {
            a.first_wrong = p.first_wrong;
        }
        a
    })
}

/// This rank's result at the elements [`check`] looks at, in its order: what
/// [`check_repeated`] starts from.
pub fn checked_values(dtype: DataType, out: &[u8], count: usize) -> Vec<u32> {
    checked_indices(count)
        .map(|i| formats::read_element(dtype, out, i).unwrap_or_default())
        .collect()
}

/// Checks `out` after `calls` more in-place allreduces of a result whose checked elements
/// were `first` ([`checked_values`]): every rank held the same `first`, so each call
/// reduces `world` copies of the previous value (rank order, the accumulation type).
/// Returns the wrong elements and the first of them (index, got bits, want bits).
#[allow(clippy::too_many_arguments)]
pub fn check_repeated(
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    world: u32,
    first: &[u32],
    out: &[u8],
    count: usize,
    calls: usize,
) -> (usize, Option<(usize, u32, u32)>) {
    let mut wrong = 0;
    let mut first_wrong = None;
    let mut copies = vec![0u32; world as usize];
    for (i, &start) in checked_indices(count).zip(first) {
        let mut want = start;
        for _ in 0..calls {
            copies.fill(want);
            want = reduce::reduce_element(dtype, op, accum, &copies).unwrap_or(!want);
        }
        let got = formats::read_element(dtype, out, i).unwrap_or(!want);
        if !formats::same_bits(dtype, got, want) {
            wrong += 1;
            first_wrong.get_or_insert((i, got, want));
        }
    }
    (wrong, first_wrong)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_never_zero_and_differ_per_rank() {
        for d in DataType::ALL {
            for i in 0..1000 {
                assert_ne!(formats::decode(d, element(d, 1, 0, i)), 0.0, "{d}");
            }
            assert_ne!(
                (0..64).map(|i| element(d, 1, 0, i)).collect::<Vec<_>>(),
                (0..64).map(|i| element(d, 1, 1, i)).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn repeated_calls_reduce_copies_of_the_last_result() {
        let (d, op, acc) = (DataType::Bf16, ReduceOp::Sum, AccumType::Auto);
        let count = 1003;
        let mut y1 = vec![0u8; count * 2];
        fill(d, 7, 0, &mut y1);
        let first = checked_values(d, &y1, count);
        assert_eq!(first.len(), count);
        // Two more calls on 4 ranks: every element times 16 (exact in bf16).
        let mut y3 = y1.clone();
        for i in 0..count {
            let v = formats::decode(d, formats::read_element(d, &y1, i).unwrap());
            formats::write_element(d, &mut y3, i, formats::encode(d, v * 16.0)).unwrap();
        }
        assert_eq!(check_repeated(d, op, acc, 4, &first, &y3, count, 2).0, 0);
        // One call short, or the first result unchanged: every element is wrong.
        assert_eq!(
            check_repeated(d, op, acc, 4, &first, &y3, count, 1).0,
            count
        );
        let (wrong, at) = check_repeated(d, op, acc, 4, &first, &y1, count, 2);
        assert_eq!(wrong, count);
        assert_eq!(at.map(|(i, ..)| i), Some(0));
    }

    #[test]
    fn sampling_covers_the_tail() {
        assert_eq!(checked_indices(10).count(), 10);
        let big = FULL_CHECK_LIMIT * 3 + 5;
        let v: Vec<usize> = checked_indices(big).collect();
        assert!(v.len() <= FULL_CHECK_LIMIT + 4096 + 1);
        assert_eq!(v.last(), Some(&(big - 1)));
    }

    #[test]
    fn exact_reference_accepts_itself_and_flags_a_flip() {
        let d = DataType::Bf16;
        let (world, count) = (3, 100);
        let mut out = vec![0u8; d.bytes(count).unwrap()];
        for i in 0..count {
            let bits: Vec<u32> = (0..world).map(|r| element(d, 7, r, i)).collect();
            let r = reduce::reduce_element(d, ReduceOp::Sum, AccumType::Auto, &bits).unwrap();
            formats::write_element(d, &mut out, i, r).unwrap();
        }
        let v = check(
            d,
            ReduceOp::Sum,
            AccumType::Auto,
            7,
            world,
            &out,
            count,
            true,
        );
        assert_eq!((v.checked, v.wrong), (100, 0));
        assert!(v.max_rel_err < 0.05, "{}", v.max_rel_err);
        out[10] ^= 1;
        let v = check(
            d,
            ReduceOp::Sum,
            AccumType::Auto,
            7,
            world,
            &out,
            count,
            true,
        );
        assert_eq!(v.wrong, 1);
        assert_eq!(v.first_wrong.map(|w| w.0), Some(5));
    }
}
