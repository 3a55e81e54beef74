//! Direct broadcast on registered outputs ([`crate::Communicator::register`]): a per-block
//! barrier (every peer's output is free), the root stores its input into every rank's
//! output (peer stores over NVLink), and a second barrier (every output is complete).

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{direct_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{barrier, barrier_blocks, write_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "broadcast_direct";

/// The direct broadcast.
pub const BROADCAST_DIRECT: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Broadcast,
    name: "broadcast_direct",
    aliases: &["broadcast_zc", "broadcast_zero_copy"],
    code: 402,
    serves: "broadcasts whose output lies 16-byte aligned in a buffer registered on every rank \
             (Communicator::register), at the same offset; world size 1..=8",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "broadcast_direct (host)",
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
    barrier(&c, blocks)?;
    if c.me == root {
        let in_place = c.a.input == c.a.output.cast_const();
        for u in 0..c.total.div_ceil(16) {
            let v = c.load_input(u * 16);
            for k in 1..c.world {
                let p = (c.me + k) % c.world;
                // SAFETY: every rank's registered output holds `total` bytes at outs[p];
                // only the root writes it during the call.
                unsafe { write_unit(outs[p], c.total, u * 16, &v) };
            }
            if !in_place {
                c.store_output(u * 16, &v);
            }
        }
    }
    barrier(&c, blocks)?;
    c.finish();
    Ok(())
}
