//! Direct all-gather on registered outputs ([`crate::Communicator::register`]): a
//! per-block barrier (every peer's call has started, so its output is free), every rank
//! stores its input into its slot of every rank's output (peer stores over NVLink), and a
//! second barrier (every peer's slot has arrived). No staging, each byte crosses once.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use super::copy_own_slot;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{direct_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{barrier, barrier_blocks, write_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "allgather_direct";

/// The direct all-gather.
pub const ALLGATHER_DIRECT: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllGather,
    name: "allgather_direct",
    aliases: &["allgather_zc", "allgather_zero_copy"],
    code: 103,
    serves: "all-gathers whose output lies 16-byte aligned in a buffer registered on every \
             rank (Communicator::register), at the same offset; world size 1..=8",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "allgather_direct (host)",
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
    let outs = c.peer_outputs()?;
    barrier(&c, blocks)?;
    for u in 0..c.total.div_ceil(16) {
        let v = c.load_input(u * 16);
        for k in 1..c.world {
            let p = (c.me + k) % c.world;
            // SAFETY: every rank's registered output holds world * total bytes at outs[p];
            // only this rank writes slot `me` of it during the call.
            unsafe {
                write_unit(
                    outs[p].cast::<u8>().add(c.me * c.total).cast(),
                    c.total,
                    u * 16,
                    &v,
                )
            };
        }
    }
    copy_own_slot(&c);
    barrier(&c, blocks)?;
    c.finish();
    Ok(())
}
