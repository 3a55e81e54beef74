//! Property test of the zero-copy cache for buffers nobody registered
//! (`communicator/auto_register.rs`): random sequences of allocations, frees, allocations
//! again (often at a freed address, with a new identity) and allreduce calls on buffers
//! inside them, run the same on two ranks of the host backend. Every call is checked bit
//! for bit against the host reference, so a call served through a stale mapping (a peer's
//! freed allocation) fails; the cache stays within its bound after every call, so entries
//! are never leaked.

// Helpers outside #[test] functions unwrap and panic too: a failed step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use oxccl_collectives::backend::AnyMemory;
use oxccl_collectives::hal::{AccumType, DataType, Device, Memory, MemoryKind, ReduceOp};
use oxccl_collectives::CommConfig;
use proptest::prelude::*;

mod common;
use common::{all_reduce_and_read, expected, same_bits, stage, threads_with};

/// Allocations each rank juggles.
const SLOTS: usize = 3;
/// The cache bound under test: smaller than the allocations a sequence touches.
const MAX_ENTRIES: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    /// (Re)allocate a slot: the old allocation is freed first, so the new one may take
    /// its address.
    Alloc {
        slot: usize,
        kib: usize,
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

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..SLOTS, 64usize..320).prop_map(|(slot, kib)| Op::Alloc { slot, kib }),
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
        let mut slots: Vec<Option<AnyMemory>> = (0..SLOTS).map(|_| None).collect();
        for (step, op) in ops.iter().enumerate() {
            match *op {
                Op::Alloc { slot, kib } => {
                    slots[slot] = None;
                    slots[slot] = Some(dev.alloc(kib << 10, MemoryKind::Plain).unwrap());
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
                    let salt = 7_000 + step as u64;
                    stage(
                        &r.stream,
                        (inp, out),
                        DataType::F32,
                        r.comm.rank(),
                        count,
                        salt,
                    );
                    // SAFETY: both ranges lie inside `mem`, which outlives the call.
                    let got = unsafe {
                        all_reduce_and_read(r, (inp, out), count, DataType::F32, ReduceOp::Sum)
                    };
                    let want = expected(
                        DataType::F32,
                        ReduceOp::Sum,
                        AccumType::Auto,
                        2,
                        count,
                        salt,
                    );
                    if let Err(d) = same_bits(DataType::F32, &got, &want, count) {
                        panic!("rank {} step {step} {op:?}: {d}", r.comm.rank());
                    }
                    // Both ranks' allocations are in the cache (the call went zero-copy),
                    // and no more than the bound stays mapped.
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
