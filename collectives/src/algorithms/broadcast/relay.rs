//! Relayed broadcast on registered outputs ([`crate::Communicator::register`]), for 3 or
//! more ranks: the direct broadcast's root stores every byte once per peer, so on 4 ranks
//! its link carries three times the message (a third of NCCL's speed on 4 H200s). Here the
//! data is split into one chunk per other rank; the root stores chunk k into the output of
//! the k-th rank after it, and that rank stores it on into every other rank's output. In
//! rounds, so that one round's second hop overlaps the next round's first; a barrier
//! between rounds (every block with the same block of every peer), one before (every
//! output is free) and the last after (every output is complete).

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{direct_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{
    barrier, barrier_blocks, read_unit, relay_chunk, relay_rank, write_unit, Call, RelayRounds,
};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "broadcast_relay";

/// The relayed broadcast.
pub const BROADCAST_RELAY: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Broadcast,
    name: "broadcast_relay",
    aliases: &["broadcast_scatter_allgather", "broadcast_pipelined"],
    code: 405,
    serves: "broadcasts whose output lies 16-byte aligned in a buffer registered on every rank \
             (Communicator::register), at the same offset; world size 1..=8 (chosen on 3 \
             or more)",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "broadcast_relay (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Registered,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Packets),
});

/// The launch for a call, or why it cannot serve it (output not registered).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    direct_plan(KERNEL, "the output", s)
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let blocks = barrier_blocks(config);
    let root = c.root()?;
    let outs = c.peer_outputs()?;
    let g = RelayRounds::new(&c, KERNEL)?;
    let in_place = c.a.input == c.a.output.cast_const();
    barrier(&c, blocks)?;
    for r in 0..=g.rounds {
        if c.me == root && r < g.rounds {
            // One rank: the root relays chunk 0 to itself.
            for i in 0..g.chunks {
                let to = relay_rank(i, root, c.world);
                for j in g.round(i, r) {
                    let v = c.load_input(j * 16);
                    // SAFETY: every rank's registered output holds `total` bytes at outs[to];
                    // only the root writes this chunk's round there, before the barrier.
                    unsafe { write_unit(outs[to], c.total, j * 16, &v) };
                    if !in_place {
                        c.store_output(j * 16, &v);
                    }
                }
            }
        } else if c.me != root && r > 0 {
            for j in g.round(relay_chunk(c.me, root, c.world), r - 1) {
                // SAFETY: this rank's output holds `total` bytes; the root wrote this round
                // of the chunk before the last barrier and nothing writes it now.
                let v = unsafe { read_unit(c.a.output.cast_const(), c.total, j * 16) };
                for q in (0..c.world).filter(|q| *q != root && *q != c.me) {
                    // SAFETY: rank q's registered output holds `total` bytes; only this rank
                    // writes this chunk there.
                    unsafe { write_unit(outs[q], c.total, j * 16, &v) };
                }
            }
        }
        barrier(&c, blocks)?;
    }
    c.finish();
    Ok(())
}
