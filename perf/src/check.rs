//! Inputs and the host reference of `oxccl-perf`.
//!
//! Inputs are a pure function of (seed, rank, index), so every rank computes the reference
//! for every element without exchanging data: random non-zero values near ±1 (never 0),
//! rounded to the element type (f64 with every mantissa bit used); integers are non-zero
//! in -999..=999 (8-bit: -15..=15; unsigned: positive), so sums on 8 ranks stay in range.
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

pub(crate) fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Element `i` of `rank`'s input, as its bit pattern.
pub fn element(dtype: DataType, seed: u64, rank: u32, i: usize) -> u64 {
    let h = mix(seed ^ (u64::from(rank) << 48) ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let negative = h & (1 << 40) != 0;
    if dtype.is_integer() {
        let most = if dtype.size() == 1 { 15 } else { 999 };
        let mag = 1 + (h % most) as i64;
        let v = if negative && dtype.is_signed_integer() {
            -mag
        } else {
            mag
        };
        return v as u64 & formats::mask(dtype);
    }
    if dtype == DataType::F64 {
        let mag = 0.25 + (h >> 11) as f64 / (1u64 << 53) as f64;
        return (if negative { -mag } else { mag }).to_bits();
    }
    let mag = 0.25 + (h % 4096) as f32 / 4096.0;
    let bits = formats::encode(dtype, if negative { -mag } else { mag });
    if formats::decode(dtype, bits) == 0.0 {
        formats::encode(dtype, 0.5)
    } else {
        bits
    }
}

/// The value of an element, for error measurements: exact for f64 and the 64-bit integers
/// (which `formats::decode` gives as f32), the format's decode otherwise.
pub fn value(dtype: DataType, bits: u64) -> f64 {
    match dtype {
        DataType::F64 => f64::from_bits(bits),
        DataType::I64 => bits as i64 as f64,
        DataType::U64 => bits as f64,
        d => f64::from(formats::decode(d, bits)),
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

/// What one rank's output must hold after one call on inputs made by [`fill`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    pub dtype: DataType,
    pub op: ReduceOp,
    pub accum: AccumType,
    /// The inputs' seed.
    pub seed: u64,
    pub world: u32,
    /// Elements of the call (per rank).
    pub count: usize,
    /// Slots of `count` elements in the output (allreduce: 1).
    pub slots: usize,
    /// This rank (which chunk of every input a reduce-scatter or all-to-all gets).
    pub rank: u32,
    /// The root (broadcast, reduce).
    pub root: u32,
    /// Whether the call is in place (a reduce leaves a non-root rank's buffer as it was:
    /// its input in place, else the poison).
    pub in_place: bool,
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
    /// First wrong element (index in the output, got bits, want bits).
    pub first_wrong: Option<(usize, u64, u64)>,
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

/// The output elements checked, as (slot, index in the slot): [`checked_indices`] of every
/// slot, so each slot (each rank's part of a gathered output) is covered alike.
fn output_indices(e: &Expect) -> impl Iterator<Item = (usize, usize)> + Clone {
    let count = e.count;
    (0..e.slots).flat_map(move |s| checked_indices(count).map(move |i| (s, i)))
}

fn f64_reference(dtype: DataType, op: ReduceOp, seed: u64, world: u32, i: usize) -> f64 {
    if dtype.is_integer() {
        // Integer reductions are exact in any order (wrapping, the average truncated).
        let inputs: Vec<u64> = (0..world).map(|r| element(dtype, seed, r, i)).collect();
        return reduce::reduce_element(dtype, op, AccumType::Auto, &inputs)
            .map_or(f64::NAN, |bits| value(dtype, bits));
    }
    let mut acc = value(dtype, element(dtype, seed, 0, i));
    for r in 1..world {
        let x = value(dtype, element(dtype, seed, r, i));
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
    if dtype == DataType::F64 {
        return acc;
    }
    f64::from(formats::round(dtype, acc as f32))
}

/// |got - reference| / max(|reference|, 1); NaN against NaN is no error, NaN against a
/// number an infinite one.
fn rel_err(got: f64, reference: f64) -> f64 {
    if got.is_nan() || reference.is_nan() {
        if got.is_nan() && reference.is_nan() {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (got - reference).abs() / reference.abs().max(1.0)
    }
}

/// Judges every checked element of `out`, on up to 8 threads. `want(slot, i, got,
/// scratch)` gives the element's exact bits (`None` where only the error is measured) and
/// its f64 reference; `scratch` is a buffer of the thread's to reuse.
fn judge(
    e: &Expect,
    out: &[u8],
    want: impl Fn(usize, usize, u64, &mut Vec<u64>) -> (Option<u64>, f64) + Sync,
) -> Verdict {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let idx: Vec<(usize, usize)> = output_indices(e).collect();
    let per = idx.len().div_ceil(threads).max(1);
    let want = &want;
    let parts: Vec<Verdict> = std::thread::scope(|s| {
        let handles: Vec<_> = idx
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    let mut v = Verdict::default();
                    let mut scratch = Vec::new();
                    for &(slot, i) in part {
                        let at = slot * e.count + i;
                        let got = formats::read_element(e.dtype, out, at).unwrap_or_default();
                        v.checked += 1;
                        let (bits, reference) = want(slot, i, got, &mut scratch);
                        if let Some(w) = bits {
                            if !formats::same_bits(e.dtype, got, w) {
                                v.wrong += 1;
                                v.first_wrong.get_or_insert((at, got, w));
                            }
                        }
                        let g = value(e.dtype, got);
                        v.max_rel_err = v.max_rel_err.max(rel_err(g, reference));
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

/// Checks an allreduce result: element i is the reduction of every rank's element i in
/// rank order with the accumulation type (the kernels' order, so oxccl must match it bit
/// for bit). `exact`: count elements that differ as wrong (oxccl); otherwise only the
/// error against the f64 reference is measured (NCCL reduces in its own order).
pub fn reduced(e: &Expect, out: &[u8], exact: bool) -> Verdict {
    judge(e, out, |_, i, got, inputs| {
        let bits = exact.then(|| {
            inputs.clear();
            inputs.extend((0..e.world).map(|r| element(e.dtype, e.seed, r, i)));
            // An unsupported combination never matches (the call would have been refused).
            reduce::reduce_element(e.dtype, e.op, e.accum, inputs).unwrap_or(!got)
        });
        (bits, f64_reference(e.dtype, e.op, e.seed, e.world, i))
    })
}

/// Checks a reduce-scatter result: element i is the reduction, in rank order with the
/// accumulation type, of element `rank * count + i` of every rank's input (this rank's
/// chunk). `exact` as in [`reduced`].
pub fn reduced_chunk(e: &Expect, out: &[u8], exact: bool) -> Verdict {
    let base = e.rank as usize * e.count;
    judge(e, out, |_, i, got, inputs| {
        let bits = exact.then(|| {
            inputs.clear();
            inputs.extend((0..e.world).map(|r| element(e.dtype, e.seed, r, base + i)));
            reduce::reduce_element(e.dtype, e.op, e.accum, inputs).unwrap_or(!got)
        });
        (
            bits,
            f64_reference(e.dtype, e.op, e.seed, e.world, base + i),
        )
    })
}

/// Checks an all-to-all output: slot s holds chunk `rank` of rank s's input (elements
/// `rank * count ..`), bit for bit. As in [`gathered`], NCCL's side only reports its error.
pub fn exchanged(e: &Expect, out: &[u8], exact: bool) -> Verdict {
    let base = e.rank as usize * e.count;
    judge(e, out, |slot, i, _, _| {
        let want = element(e.dtype, e.seed, slot as u32, base + i);
        (exact.then_some(want), value(e.dtype, want))
    })
}

/// Checks an all-to-all-v output: slot s holds the first
/// [`crate::collective::v_count`]`(count, s, rank)` elements of chunk `rank` of rank s's
/// input, bit for bit, and the poison after them.
pub fn exchanged_v(e: &Expect, out: &[u8], exact: bool) -> Verdict {
    let base = e.rank as usize * e.count;
    judge(e, out, |slot, i, _, _| {
        let sent = crate::collective::v_count(e.count, slot as u32, e.rank);
        let want = if i < sent {
            element(e.dtype, e.seed, slot as u32, base + i)
        } else {
            poison(e.dtype)
        };
        (exact.then_some(want), value(e.dtype, want))
    })
}

/// Checks a broadcast output: the root's input, bit for bit. As in [`gathered`], NCCL's
/// side only reports its error.
pub fn broadcasted(e: &Expect, out: &[u8], exact: bool) -> Verdict {
    judge(e, out, |_, i, _, _| {
        let want = element(e.dtype, e.seed, e.root, i);
        (exact.then_some(want), value(e.dtype, want))
    })
}

/// The bits of an element of an output poisoned before the call (every byte 0xff, as the
/// run fills it).
pub fn poison(dtype: DataType) -> u64 {
    formats::mask(dtype)
}

/// Checks a reduce output: on the root, element i is the reduction of every rank's element i
/// in rank order with the accumulation type, as [`reduced`]; on the other ranks the output
/// is not written (NCCL: recvbuff matters at the root only), so it still holds the poison,
/// or in place this rank's input. `exact` as in [`reduced`].
pub fn reduced_at_root(e: &Expect, out: &[u8], exact: bool) -> Verdict {
    if e.rank == e.root {
        return reduced(e, out, exact);
    }
    judge(e, out, |_, i, _, _| {
        let want = if e.in_place {
            element(e.dtype, e.seed, e.rank, i)
        } else {
            poison(e.dtype)
        };
        (
            exact.then_some(want),
            f64::from(formats::decode(e.dtype, want)),
        )
    })
}

/// Checks a gathered output: slot r holds rank r's input ([`fill`] with rank r) bit for
/// bit, for every r. Data only moves, so NCCL's side (`exact == false`) must match too:
/// its error against the inputs is reported, only oxccl's mismatches are counted.
pub fn gathered(e: &Expect, out: &[u8], exact: bool) -> Verdict {
    judge(e, out, |slot, i, _, _| {
        let want = element(e.dtype, e.seed, slot as u32, i);
        (exact.then_some(want), value(e.dtype, want))
    })
}

/// This rank's result at the elements the checks look at, in their order: what
/// the repeated-call checks start from.
pub fn checked_values(e: &Expect, out: &[u8]) -> Vec<u64> {
    output_indices(e)
        .map(|(s, i)| formats::read_element(e.dtype, out, s * e.count + i).unwrap_or_default())
        .collect()
}

/// Checks `out` after `calls` more in-place allreduces of a result whose checked elements
/// were `first` ([`checked_values`]): every rank held the same `first`, so each call
/// reduces `world` copies of the previous value (rank order, the accumulation type).
/// Returns the wrong elements and the first of them (index, got bits, want bits).
pub fn repeated_reduction(
    e: &Expect,
    first: &[u64],
    out: &[u8],
    calls: usize,
) -> (usize, Option<(usize, u64, u64)>) {
    let mut wrong = 0;
    let mut first_wrong = None;
    let mut copies = vec![0u64; e.world as usize];
    for ((s, i), &start) in output_indices(e).zip(first) {
        let at = s * e.count + i;
        let mut want = start;
        for _ in 0..calls {
            copies.fill(want);
            want = reduce::reduce_element(e.dtype, e.op, e.accum, &copies).unwrap_or(!want);
        }
        let got = formats::read_element(e.dtype, out, at).unwrap_or(!want);
        if !formats::same_bits(e.dtype, got, want) {
            wrong += 1;
            first_wrong.get_or_insert((at, got, want));
        }
    }
    (wrong, first_wrong)
}

/// Checks `out` after `calls` more calls that must leave a result whose checked elements
/// were `first` ([`checked_values`]) as it was: in-place all-gathers of an output that
/// already holds every rank's slot. This catches back-to-back calls that write wrong data
/// or into wrong places; one that delivered the previous call's data would go unseen (it
/// is the same data). Returns the wrong elements and the first of them (index, got bits,
/// want bits).
pub fn unchanged(
    e: &Expect,
    first: &[u64],
    out: &[u8],
    _calls: usize,
) -> (usize, Option<(usize, u64, u64)>) {
    let mut wrong = 0;
    let mut first_wrong = None;
    for ((s, i), &want) in output_indices(e).zip(first) {
        let at = s * e.count + i;
        let got = formats::read_element(e.dtype, out, at).unwrap_or(!want);
        if !formats::same_bits(e.dtype, got, want) {
            wrong += 1;
            first_wrong.get_or_insert((at, got, want));
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

    fn expect(dtype: DataType, world: u32, count: usize, slots: usize) -> Expect {
        Expect {
            dtype,
            op: ReduceOp::Sum,
            accum: AccumType::Auto,
            seed: 7,
            world,
            count,
            slots,
            rank: 0,
            root: 0,
            in_place: false,
        }
    }

    #[test]
    fn repeated_calls_reduce_copies_of_the_last_result() {
        let d = DataType::Bf16;
        let count = 1003;
        let e = expect(d, 4, count, 1);
        let mut y1 = vec![0u8; count * 2];
        fill(d, 7, 0, &mut y1);
        let first = checked_values(&e, &y1);
        assert_eq!(first.len(), count);
        // Two more calls on 4 ranks: every element times 16 (exact in bf16).
        let mut y3 = y1.clone();
        for i in 0..count {
            let v = formats::decode(d, formats::read_element(d, &y1, i).unwrap());
            formats::write_element(d, &mut y3, i, formats::encode(d, v * 16.0)).unwrap();
        }
        assert_eq!(repeated_reduction(&e, &first, &y3, 2).0, 0);
        // One call short, or the first result unchanged: every element is wrong.
        assert_eq!(repeated_reduction(&e, &first, &y3, 1).0, count);
        let (wrong, at) = repeated_reduction(&e, &first, &y1, 2);
        assert_eq!(wrong, count);
        assert_eq!(at.map(|(i, ..)| i), Some(0));
    }

    /// What every rank's all-gather output must be.
    fn gathered_output(e: &Expect) -> Vec<u8> {
        let per = e.dtype.bytes(e.count).unwrap();
        let mut out = vec![0u8; per * e.slots];
        for (r, slot) in out.chunks_mut(per).enumerate() {
            fill(e.dtype, e.seed, r as u32, slot);
        }
        out
    }

    #[test]
    fn gathered_output_is_every_rank_input_in_rank_order() {
        for d in DataType::ALL {
            let (world, count) = (3, 101);
            let e = expect(d, world, count, world as usize);
            let mut out = gathered_output(&e);
            let v = gathered(&e, &out, true);
            assert_eq!((v.checked, v.wrong, v.max_rel_err), (303, 0, 0.0), "{d}");
            // One flipped bit in another rank's slot (slot 2, element 7).
            let at = 2 * count + 7;
            out[at * d.size()] ^= 1;
            let v = gathered(&e, &out, true);
            assert_eq!(v.wrong, 1, "{d}");
            let (i, got, want) = v.first_wrong.unwrap();
            assert_eq!((i, want), (at, element(d, 7, 2, 7)), "{d}");
            assert_ne!(got, want);
            assert!(v.max_rel_err > 0.0, "{d}");
            // NCCL's side: the error shows, nothing is counted.
            let v = gathered(&e, &out, false);
            assert_eq!((v.checked, v.wrong), (303, 0), "{d}");
            assert!(v.max_rel_err > 0.0, "{d}");
        }
    }

    #[test]
    fn gathered_check_catches_swapped_slots_and_poison() {
        let d = DataType::Bf16;
        let (world, count) = (4, 50);
        let e = expect(d, world, count, world as usize);
        let good = gathered_output(&e);
        let per = d.bytes(count).unwrap();
        // Slots 1 and 3 swapped: every element of both is wrong.
        let mut swapped = good.clone();
        swapped[per..2 * per].copy_from_slice(&good[3 * per..4 * per]);
        swapped[3 * per..4 * per].copy_from_slice(&good[per..2 * per]);
        let v = gathered(&e, &swapped, true);
        assert_eq!(v.wrong, 2 * count);
        assert_eq!(v.first_wrong.map(|w| w.0), Some(count));
        // A slot left poisoned (0xff, what the run fills outputs with): all of it wrong.
        let mut poisoned = good.clone();
        poisoned[2 * per..3 * per].fill(0xff);
        assert_eq!(gathered(&e, &poisoned, true).wrong, count);
        // Another seed is another input (bf16 inputs take about 500 values, so an element
        // may coincide now and then).
        let other = Expect { seed: 8, ..e };
        assert!(gathered(&other, &good, true).wrong > world as usize * count * 9 / 10);
    }

    #[test]
    fn repeated_gathers_leave_the_output_as_it_was() {
        let d = DataType::F32;
        let e = expect(d, 2, 333, 2);
        let out = gathered_output(&e);
        let first = checked_values(&e, &out);
        assert_eq!(first.len(), 666);
        assert_eq!(unchanged(&e, &first, &out, 2), (0, None));
        let mut changed = out.clone();
        changed[4 * 400] ^= 0x80;
        let (wrong, at) = unchanged(&e, &first, &changed, 2);
        assert_eq!(wrong, 1);
        assert_eq!(at.map(|(i, ..)| i), Some(400));
    }

    #[test]
    fn sampling_covers_the_tail_of_every_slot() {
        assert_eq!(checked_indices(10).count(), 10);
        let big = FULL_CHECK_LIMIT * 3 + 5;
        let v: Vec<usize> = checked_indices(big).collect();
        assert!(v.len() <= FULL_CHECK_LIMIT + 4096 + 1);
        assert_eq!(v.last(), Some(&(big - 1)));
        let e = expect(DataType::F32, 3, 10, 3);
        let v: Vec<(usize, usize)> = output_indices(&e).collect();
        assert_eq!(v.len(), 30);
        assert_eq!((v[0], v[10], v[29]), ((0, 0), (1, 0), (2, 9)));
    }

    #[test]
    fn exact_reference_accepts_itself_and_flags_a_flip() {
        let d = DataType::Bf16;
        let (world, count) = (3, 100);
        let e = expect(d, world, count, 1);
        let mut out = vec![0u8; d.bytes(count).unwrap()];
        for i in 0..count {
            let bits: Vec<u64> = (0..world).map(|r| element(d, 7, r, i)).collect();
            let r = reduce::reduce_element(d, ReduceOp::Sum, AccumType::Auto, &bits).unwrap();
            formats::write_element(d, &mut out, i, r).unwrap();
        }
        let v = reduced(&e, &out, true);
        assert_eq!((v.checked, v.wrong), (100, 0));
        assert!(v.max_rel_err < 0.05, "{}", v.max_rel_err);
        out[10] ^= 1;
        let v = reduced(&e, &out, true);
        assert_eq!(v.wrong, 1);
        assert_eq!(v.first_wrong.map(|w| w.0), Some(5));
        // Not exact (NCCL's side): nothing counted wrong, the error measured alike.
        let v = reduced(&e, &out, false);
        assert_eq!((v.checked, v.wrong), (100, 0));
        assert_eq!(v.max_rel_err, reduced(&e, &out, true).max_rel_err);
    }

    #[test]
    fn chunked_and_broadcast_references_accept_themselves_and_catch_flips() {
        let (world, count) = (3u32, 37usize);
        for dtype in DataType::ALL {
            // Reduce-scatter, rank 2: its chunk of every rank's input, reduced.
            let e = Expect {
                rank: 2,
                ..expect(dtype, world, count, 1)
            };
            let mut out = vec![0u8; dtype.bytes(count).unwrap()];
            for i in 0..count {
                let inputs: Vec<u64> = (0..world)
                    .map(|r| element(dtype, e.seed, r, 2 * count + i))
                    .collect();
                let v = reduce::reduce_element(dtype, e.op, e.accum, &inputs).unwrap();
                formats::write_element(dtype, &mut out, i, v).unwrap();
            }
            assert_eq!(reduced_chunk(&e, &out, true).wrong, 0, "{dtype}");
            // Rank 0's chunk is not rank 2's.
            assert!(
                reduced_chunk(&Expect { rank: 0, ..e }, &out, true).wrong > count / 2,
                "{dtype}"
            );
            // All-to-all, rank 1: slot s is chunk 1 of rank s's input.
            let e = Expect {
                rank: 1,
                ..expect(dtype, world, count, world as usize)
            };
            let mut out = vec![0u8; dtype.bytes(count * world as usize).unwrap()];
            for s in 0..world as usize {
                for i in 0..count {
                    let v = element(dtype, e.seed, s as u32, count + i);
                    formats::write_element(dtype, &mut out, s * count + i, v).unwrap();
                }
            }
            assert_eq!(exchanged(&e, &out, true).wrong, 0, "{dtype}");
            let at = 2 * count + 5;
            let flipped = formats::read_element(dtype, &out, at).unwrap() ^ 1;
            formats::write_element(dtype, &mut out, at, flipped).unwrap();
            let v = exchanged(&e, &out, true);
            assert_eq!(
                (v.wrong, v.first_wrong.map(|w| w.0)),
                (1, Some(at)),
                "{dtype}"
            );
            // Broadcast from root 2.
            let e = Expect {
                root: 2,
                ..expect(dtype, world, count, 1)
            };
            let mut out = vec![0u8; dtype.bytes(count).unwrap()];
            fill(dtype, e.seed, 2, &mut out);
            assert_eq!(broadcasted(&e, &out, true).wrong, 0, "{dtype}");
            assert!(
                broadcasted(&Expect { root: 1, ..e }, &out, true).wrong > count / 2,
                "{dtype}"
            );
            // Reduce to root 1: the reduction there; the poison, or in place the rank's own
            // input, everywhere else.
            let e = Expect {
                root: 1,
                rank: 1,
                ..expect(dtype, world, count, 1)
            };
            let mut out = vec![0u8; dtype.bytes(count).unwrap()];
            for i in 0..count {
                let inputs: Vec<u64> = (0..world).map(|r| element(dtype, e.seed, r, i)).collect();
                let v = reduce::reduce_element(dtype, e.op, e.accum, &inputs).unwrap();
                formats::write_element(dtype, &mut out, i, v).unwrap();
            }
            assert_eq!(reduced_at_root(&e, &out, true).wrong, 0, "{dtype}");
            // Not every element: a sum that overflows a narrow format (e4m3b15) is a NaN,
            // which matches the poison's NaN.
            let other = Expect { rank: 2, ..e };
            assert!(
                reduced_at_root(&other, &out, true).wrong > count / 2,
                "{dtype}"
            );
            let poisoned = vec![0xffu8; out.len()];
            assert_eq!(reduced_at_root(&other, &poisoned, true).wrong, 0, "{dtype}");
            assert!(
                reduced_at_root(&e, &poisoned, true).wrong > count / 2,
                "{dtype}"
            );
            let mut own = vec![0u8; out.len()];
            fill(dtype, e.seed, 2, &mut own);
            let in_place = Expect {
                in_place: true,
                ..other
            };
            assert_eq!(reduced_at_root(&in_place, &own, true).wrong, 0, "{dtype}");
            // Every element but those of the input that happen to be the poison's bits
            // (-1 is an input of the signed integers).
            let differ = (0..count)
                .filter(|&i| element(dtype, e.seed, 2, i) != poison(dtype))
                .count();
            assert_eq!(
                reduced_at_root(&in_place, &poisoned, true).wrong,
                differ,
                "{dtype}"
            );
        }
    }
}
