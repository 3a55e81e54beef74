//! Property test of the zero-copy cache for buffers nobody registered
//! (`communicator/auto_register.rs`): random sequences of allocations, frees, allocations
//! again (often at a freed address, with a new identity) and allreduce calls on buffers
//! inside them, run the same on two ranks of the host backend. Every call is checked bit
//! for bit against the host reference, so a call served through a stale mapping (a peer's
//! freed allocation) fails; the cache stays within its bound after every call, so entries
//! are never leaked. Allocations are plain ones or pieces mapped side by side (the host
//! stand-in for PyTorch's expandable segments), where buffers run across pieces.

// Helpers outside #[test] functions unwrap and panic too: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use oxccl_collectives::backend::AnyMemory;
use oxccl_collectives::hal::host::{page_size, HostChunks};
use oxccl_collectives::hal::{
    AccumType, DataType, Device, DevicePtr, Memory, MemoryKind, ReduceOp,
};
use oxccl_collectives::{BufferPath, CommConfig};
use proptest::prelude::*;

mod common;
use common::{all_reduce_and_read, expected, same_bits, stage, threads_with, Rank};

/// Allocations each rank juggles.
const SLOTS: usize = 3;
/// The cache bound under test: smaller than the allocations a sequence touches.
const MAX_ENTRIES: usize = 4;
/// Pieces side by side: smaller than a call's buffers, so calls cross pieces.
const PIECE_KIB: usize = 48;

/// What a slot holds.
enum Held {
    Plain(AnyMemory),
    Pieces(HostChunks),
}

impl Held {
    fn ptr(&self) -> DevicePtr {
        match self {
            Held::Plain(m) => m.ptr(),
            Held::Pieces(c) => c.ptr(),
        }
    }
    fn len(&self) -> usize {
        match self {
            Held::Plain(m) => m.len(),
            Held::Pieces(c) => c.len(),
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// (Re)allocate a slot: the old allocation is freed first, so the new one may take
    /// its address.
    Alloc {
        slot: usize,
        kib: usize,
    },
    /// (Re)allocate a slot as `pieces` pieces of [`PIECE_KIB`] side by side.
    AllocPieces {
        slot: usize,
        pieces: usize,
    },
    Free {
        slot: usize,
    },
    /// Allreduce `count` f32 at `offset` inside the slot (in place, or output right after).
    Call {
        slot: usize,
        offset16: usize,
        in_place: bool,
    },
}

/// Sums `count` f32 from `input` into `output` on both ranks (staged with `salt`), checks
/// the result bit for bit against the host reference, and that the call went zero-copy on
/// the callers' allocations; `what` names the step in a failure.
///
/// # Safety
/// `count` f32 from `input` and from `output` must lie inside memory that outlives the call.
unsafe fn sum_zero_copy(
    r: &Rank,
    (input, output): (DevicePtr, DevicePtr),
    count: usize,
    salt: u64,
    what: &str,
) {
    stage(
        &r.stream,
        (input, output),
        DataType::F32,
        r.comm.rank(),
        count,
        salt,
    );
    // SAFETY: the caller's obligation.
    let got =
        unsafe { all_reduce_and_read(r, (input, output), count, DataType::F32, ReduceOp::Sum) };
    let want = expected(
        DataType::F32,
        ReduceOp::Sum,
        AccumType::Auto,
        2,
        count,
        salt,
    );
    if let Err(d) = same_bits(DataType::F32, &got, &want, count) {
        panic!("rank {} {what}: {d}", r.comm.rank());
    }
    let path = r.comm.last_call().map(|c| (c.path, c.staged));
    assert!(
        matches!(path, Some((BufferPath::Mapped, None))),
        "rank {} {what}: {path:?}",
        r.comm.rank()
    );
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..SLOTS, 64usize..320).prop_map(|(slot, kib)| Op::Alloc { slot, kib }),
        (0..SLOTS, 2usize..5).prop_map(|(slot, pieces)| Op::AllocPieces { slot, pieces }),
        (0..SLOTS).prop_map(|slot| Op::Free { slot }),
        (0..SLOTS, 0usize..64, any::<bool>()).prop_map(|(slot, offset16, in_place)| Op::Call {
            slot,
            offset16,
            in_place
        }),
        (0..SLOTS, 0usize..64, any::<bool>()).prop_map(|(slot, offset16, in_place)| Op::Call {
            slot,
            offset16,
            in_place
        }),
    ]
}

fn run(ops: Vec<Op>) {
    let ops = Arc::new(ops);
    let cfg = |_| CommConfig {
        timeout: Duration::from_secs(10),
        staging_bytes: 64 << 10,
        zc_threshold_bytes: Some(4096),
        oneshot_max_bytes: Some(4096),
        auto_register_max: MAX_ENTRIES,
        auto_register_min_bytes: Some(4096),
        ..CommConfig::default()
    };
    threads_with(2, cfg, move |r| {
        let dev = r.comm.device();
        let mut slots: Vec<Option<Held>> = (0..SLOTS).map(|_| None).collect();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { slot, kib } => {
                    slots[slot] = None;
                    slots[slot] = Some(Held::Plain(
                        dev.alloc(kib << 10, MemoryKind::Plain).unwrap(),
                    ));
                }
                Op::AllocPieces { slot, pieces } => {
                    slots[slot] = None;
                    let piece = (PIECE_KIB << 10).next_multiple_of(page_size());
                    slots[slot] = Some(Held::Pieces(HostChunks::allocate(piece, pieces).unwrap()));
                }
                Op::Free { slot } => slots[slot] = None,
                Op::Call {
                    slot,
                    offset16,
                    in_place,
                } => {
                    let Some(mem) = &slots[slot] else { continue };
                    let offset = 16 * offset16;
                    // Above the zero-copy threshold; the output (out of place) at the next
                    // 16-byte boundary after the input (an unaligned buffer is never
                    // shared), both inside the allocation.
                    let room = (mem.len() - offset - 16) / 4 / if in_place { 1 } else { 2 };
                    let count = room.min(20_011);
                    let inp = mem.ptr().offset(offset).unwrap();
                    let out = if in_place {
                        inp
                    } else {
                        inp.offset(DataType::F32.bytes(count).unwrap().next_multiple_of(16))
                            .unwrap()
                    };
                    // SAFETY: both ranges lie inside the slot's memory, which outlives the call.
                    unsafe {
                        sum_zero_copy(
                            r,
                            (inp, out),
                            count,
                            7_000 + step as u64,
                            &format!("step {step} {op:?}"),
                        );
                    }
                    // Both ranks' allocations are in the cache, and no more than the bound
                    // stays mapped.
                    let n = r.comm.auto_registered();
                    assert!(
                        (2..=MAX_ENTRIES).contains(&n),
                        "rank {} step {step}: {n} cached allocations (bound {MAX_ENTRIES})",
                        r.comm.rank()
                    );
                }
            }
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn never_a_stale_mapping_never_past_the_bound(ops in prop::collection::vec(op(), 1..28)) {
        run(ops);
    }
}

/// The sequence that reaches the stale case for certain: a call maps both ranks'
/// allocations, both are freed, allocated again at (most likely) the same addresses, and
/// called on again.
#[test]
fn freed_and_allocated_again_is_a_new_mapping() {
    let mut ops = Vec::new();
    for _ in 0..3 {
        ops.push(Op::Alloc { slot: 0, kib: 128 });
        ops.push(Op::Call {
            slot: 0,
            offset16: 3,
            in_place: true,
        });
        ops.push(Op::Free { slot: 0 });
    }
    run(ops);
}

/// Two tensors of one expandable segment that each cross pieces, and share one: both stay
/// mapped while both live (an overlap alone does not mean the other was freed), so calls
/// alternating between them map nothing again. When the shared piece is unmapped and
/// another mapped in its place (as PyTorch does with a segment's chunk), both ranges are
/// stale: the next call retires them on every rank and is served from new mappings.
#[test]
fn ranges_across_pieces_that_share_a_piece_stay_mapped_together() {
    let cfg = |_| CommConfig {
        timeout: Duration::from_secs(10),
        staging_bytes: 64 << 10,
        zc_threshold_bytes: Some(4096),
        oneshot_max_bytes: Some(4096),
        auto_register_min_bytes: Some(4096),
        ..CommConfig::default()
    };
    threads_with(2, cfg, |r| {
        let piece = (PIECE_KIB << 10).next_multiple_of(page_size());
        let count = piece / 4;
        let mut chunks = HostChunks::allocate(piece, 3).unwrap();
        for round in 0..6 {
            if round == 4 {
                // The shared piece unmapped, and a new one mapped at its address.
                chunks.remap(1).unwrap();
            }
            // Pieces 0-1, then 1-2: each call's buffer crosses one boundary.
            let first = round % 2;
            let at = chunks.ptr().offset(first * piece + piece / 2).unwrap();
            // SAFETY: `count` f32 from `at` lie inside `chunks`, which outlives the call.
            unsafe {
                sum_zero_copy(
                    r,
                    (at, at),
                    count,
                    9_000 + round as u64,
                    &format!("round {round}"),
                )
            };
            // Both ranks' two ranges stay in the cache together: 2 after the first call, 4
            // from the second; after the shared piece was mapped again, the stale two go.
            let want_entries = match round {
                0 => 2,
                4 => 2,
                _ => 4,
            };
            assert_eq!(
                r.comm.auto_registered(),
                want_entries,
                "rank {} round {round}",
                r.comm.rank()
            );
        }
    });
}
