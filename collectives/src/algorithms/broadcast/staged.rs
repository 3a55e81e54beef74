//! Staged broadcast for buffers nobody registered: the root pushes its input into every
//! peer's staging (peer stores), a per-block barrier, every peer copies its staging into
//! its output (local loads), and a second barrier frees the staging for the next round.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{staged_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{barrier, barrier_blocks, copy16, equal_rounds, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "broadcast_staged";

/// The staged broadcast.
pub const BROADCAST_STAGED: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Broadcast,
    name: "broadcast_staged",
    aliases: &["broadcast_staging"],
    code: 401,
    serves: "broadcasts of any size on buffers nobody registered, world size 1..=8",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "broadcast_staged (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Packets),
});

/// The launch: see [`staged_plan`].
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    Ok(staged_plan(KERNEL, s))
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let blocks = barrier_blocks(config);
    let root = c.root()?;
    let units = c.total.div_ceil(16);
    let cap = equal_rounds(&c, units, KERNEL)?;
    let staging = c.a.data_offset as usize;
    let in_place = c.a.input == c.a.output.cast_const();
    let mut base = 0;
    while base < units {
        let n = (units - base).min(cap);
        if c.me == root {
            for j in 0..n {
                let off = (base + j) * 16;
                let v = c.load_input(off);
                for k in 1..c.world {
                    let p = (c.me + k) % c.world;
                    // SAFETY: peer p's staging holds world * cap units (equal_rounds); j < cap.
                    unsafe { copy16(v.as_ptr(), c.scratch(p).add(staging + j * 16)) };
                }
                if !in_place {
                    c.store_output(off, &v);
                }
            }
        }
        barrier(&c, blocks)?;
        if c.me != root {
            for j in 0..n {
                let mut v = [0u8; 16];
                // SAFETY: this rank's staging, written by the root before the barrier.
                unsafe { copy16(c.scratch(c.me).add(staging + j * 16), v.as_mut_ptr()) };
                c.store_output((base + j) * 16, &v);
            }
        }
        barrier(&c, blocks)?;
        base += n;
    }
    c.finish();
    Ok(())
}
