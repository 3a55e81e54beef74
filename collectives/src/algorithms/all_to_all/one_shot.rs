//! One-shot LL16 all-to-all: the latency path. Each rank writes chunk p of its input as
//! LL16 packets into its slot of peer p's packet half (the allreduce one-shot's capacity
//! and epoch-parity halves) and copies its own chunk locally, then polls its own half for
//! every peer's chunk and stores it into that peer's output slot. No barrier.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::all_reduce::one_shot::ll16_plan;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{ll16_read_unit, ll16_write_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "alltoall_oneshot_ll";

/// The one-shot LL16 all-to-all.
pub const ALLTOALL_ONESHOT_LL: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllToAll,
    name: "alltoall_oneshot_ll",
    aliases: &["alltoall_oneshot"],
    code: 301,
    serves: "small all-to-alls, any world size 1..=8; needs world_size * 2 * bytes (of one \
             chunk) of packet scratch",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "alltoall_oneshot_ll (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Packets),
});

/// The launch for a call, or why one-shot cannot serve it (packet capacity).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    ll16_plan("alltoall_oneshot_ll", KERNEL, s)
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let units = c.total.div_ceil(16);
    let slot = units * 32;
    let (flag, half) = c.flagged_half(slot)?;
    for u in 0..units {
        for k in 1..c.world {
            let p = (c.me + k) % c.world;
            let v = c.load_input_chunk(p, u * 16);
            // SAFETY: packets 2u, 2u+1 of slot `me` of the current half of peer p's packet
            // region, which fits (checked above).
            unsafe { ll16_write_unit(&c, p, half + c.me * slot + u * 32, &v, flag) };
        }
        c.store_output_slot(c.me, u * 16, &c.load_input_chunk(c.me, u * 16));
    }
    for u in 0..units {
        for r in (0..c.world).filter(|r| *r != c.me) {
            // SAFETY: as above, slot r of this rank's own current half.
            let v = unsafe { ll16_read_unit(&c, half + r * slot + u * 32, r, flag)? };
            c.store_output_slot(r, u * 16, &v);
        }
    }
    c.finish();
    Ok(())
}
