//! Direct all-to-all on registered outputs ([`crate::Communicator::register`]): a
//! per-block barrier (every peer's output is free), every rank stores chunk p of its input
//! into its slot of rank p's output (peer stores over NVLink), and a second barrier (every
//! peer's chunk has arrived). No staging, each byte crosses once.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{direct_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{barrier, barrier_blocks, write_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "alltoall_direct";

/// The direct all-to-all.
pub const ALLTOALL_DIRECT: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllToAll,
    name: "alltoall_direct",
    aliases: &["alltoall_zc", "alltoall_zero_copy"],
    code: 303,
    serves: "all-to-alls whose output lies 16-byte aligned in a buffer registered on every \
             rank (Communicator::register), at the same offset; world size 1..=8",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "alltoall_direct (host)",
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
        for k in 1..c.world {
            let p = (c.me + k) % c.world;
            let v = c.load_input_chunk(p, u * 16);
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
        c.store_output_slot(c.me, u * 16, &c.load_input_chunk(c.me, u * 16));
    }
    barrier(&c, blocks)?;
    c.finish();
    Ok(())
}
