//! Relayed reduce on registered inputs ([`crate::Communicator::register`]), for 3 or more
//! ranks. `reduce_direct`'s root loads every peer's whole input through its one link, so on
//! 4 ranks that link carries three times the message (0.32-0.37x NCCL's ring from 16 MB on
//! 4 H200s). Here the message is split into one chunk per rank other than the root: the
//! rank that owns chunk k reduces it, in rank order, from every rank's input (peer loads)
//! and stores it into the root's staging; the root copies it into its output a round later.
//! Every rank's links carry about the message once each way, as NCCL's ring does.
//!
//! The same geometry as `broadcast_relay` (`RelayRounds`: one chunk per rank but the root,
//! in rounds of half the staging over the chunks, the halves alternating by round parity);
//! a barrier before (every input is ready, the root's staging free) and one per round (the
//! owners' round r has landed, the root's copy of round r - 1 is done, so round r + 1 may
//! reuse its half). Each block of the root copies out exactly the staging positions the
//! same block of the owners wrote, so the per-block barriers order every reuse.
//!
//! In place at the root (PyTorch's `reduce` is), the root's output is its registered input,
//! which every owner maps: when a chunk takes one round, the owners store their chunks
//! straight into it between the two barriers, with no staging and no copy-out (4 H200s:
//! 1-64 MB 8-16% faster). Larger calls keep the rounds: one pass over whole chunks was 3%
//! slower at 1 GiB. Only the root knows it is in place (the others pass their input as
//! output either way), so it publishes that with the first barrier: a word of its sync area
//! (`SYNC_ROOT_IN_PLACE`) stored before its signal, which is a release on that barrier alone
//! (`start_barrier_from`), read by the owners after it.

use std::sync::atomic::Ordering;

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};
use oxccl_kernels::abi::OXCCL_ALLREDUCE_SYNC_ROOT_IN_PLACE;

use super::direct::reduce_unit_of;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{direct_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{
    barrier, barrier_blocks, copy16, relay_chunk, write_unit, Call, RelayRounds,
};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "reduce_relay";

/// The relayed reduce.
pub const REDUCE_RELAY: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Reduce,
    name: "reduce_relay",
    aliases: &["reduce_scatter_gather", "reduce_pipelined"],
    code: 505,
    serves: "reduces whose input lies 16-byte aligned in a buffer registered on every rank \
             (Communicator::register), at the same offset; world size 1..=8 (chosen on 3 \
             or more)",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "reduce_relay (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Registered,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Packets),
});

/// The launch for a call, or why it cannot serve it (input not registered).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    direct_plan(KERNEL, "the input", s)
}

/// The kernel on the host backend: the device kernel's steps on one thread (which plays
/// every block: a round's part is the whole round).
fn host_kernel(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let blocks = barrier_blocks(config);
    let root = c.root()?;
    let ins = c.peer_inputs()?;
    let g = RelayRounds::new(&c, KERNEL)?;
    let owner = c.me != root || c.world == 1;
    let mine = relay_chunk(c.me, root, c.world);
    let half = c.a.data_bytes as usize / 2;
    // Byte of unit j of chunk i's round r in the root's scratch (as the device's `at`).
    let at = |r: usize, i: usize, j: usize| {
        c.a.data_offset as usize + (r & 1) * half + (i * g.per_round + j - g.round(i, r).start) * 16
    };
    let mut inputs = vec![[0u8; 16]; c.world];
    // Whether the root's output is its input, published with the first barrier.
    let root_in_place = c.word(root, u64::from(OXCCL_ALLREDUCE_SYNC_ROOT_IN_PLACE));
    if c.me == root {
        let in_place = c.a.input == c.a.output.cast_const();
        root_in_place.store(u64::from(in_place), Ordering::Release);
    }
    barrier(&c, blocks)?;
    // In place at the root, a chunk in one round: every owner stores its chunk straight into
    // the root's output (its registered input), and the round's barrier ends the call.
    let in_place = root_in_place.load(Ordering::Acquire) != 0 && g.rounds == 1;
    for r in 0..g.rounds + usize::from(!in_place) {
        if owner && r < g.rounds {
            for j in g.round(mine, r) {
                // The reduction of unit j of every rank's input, stored as a whole unit.
                // SAFETY: every rank's registered input holds `total` bytes at ins[q], not
                // written during the call (its owner passed the first barrier; in place,
                // unit j of the root's input is read here before it is written below, and
                // only this rank touches chunk `mine` of it).
                let v = unsafe { reduce_unit_of(&c, &ins[..c.world], j, &mut inputs)? };
                if in_place {
                    // SAFETY: the root's registered input (its output, in place) holds
                    // `total` bytes; only this rank writes chunk `mine` of it during the call.
                    unsafe { write_unit(ins[root].cast_mut(), c.total, j * 16, &v) };
                } else {
                    // SAFETY: the root's staging holds both halves (relay_cap: a round of
                    // every chunk fits half of it); only this rank writes chunk `mine` there.
                    unsafe { copy16(v.as_ptr(), c.scratch(root).add(at(r, mine, j))) };
                }
            }
        }
        if c.me == root && r > 0 && !in_place {
            for i in 0..g.chunks {
                for j in g.round(i, r - 1) {
                    let mut v = [0u8; 16];
                    // SAFETY: this rank's staging, written by chunk i's owner before the
                    // last barrier and not written again before the next.
                    unsafe { copy16(c.scratch(c.me).add(at(r - 1, i, j)), v.as_mut_ptr()) };
                    c.store_output(j * 16, &v);
                }
            }
        }
        barrier(&c, blocks)?;
    }
    c.finish();
    Ok(())
}
