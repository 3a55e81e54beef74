//! Staged all-to-all for buffers nobody registered: every rank pushes chunk c of its input
//! into its slot of rank c's staging (peer stores) and copies its own chunk locally, a
//! per-block barrier, then every rank copies the peers' slots from its own staging into
//! its output (local loads), and a second barrier frees the staging for the next round.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{staged_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{barrier, barrier_blocks, copy16, equal_rounds, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "alltoall_staged";

/// The staged all-to-all.
pub const ALLTOALL_STAGED: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllToAll,
    name: "alltoall_staged",
    aliases: &["alltoall_staging"],
    code: 302,
    serves: "all-to-alls of any size on buffers nobody registered, world size 1..=8",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "alltoall_staged (host)",
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
    let units = c.total.div_ceil(16);
    let cap = equal_rounds(&c, units, KERNEL)?;
    let staging = c.a.data_offset as usize;
    let mut base = 0;
    while base < units {
        let n = (units - base).min(cap);
        for j in 0..n {
            let off = (base + j) * 16;
            for k in 1..c.world {
                let p = (c.me + k) % c.world;
                let v = c.load_input_chunk(p, off);
                // SAFETY: peer p's staging holds world * cap units (equal_rounds); me <
                // world, j < cap.
                unsafe {
                    copy16(
                        v.as_ptr(),
                        c.scratch(p).add(staging + (c.me * cap + j) * 16),
                    )
                };
            }
            c.store_output_slot(c.me, off, &c.load_input_chunk(c.me, off));
        }
        barrier(&c, blocks)?;
        for r in (0..c.world).filter(|r| *r != c.me) {
            for j in 0..n {
                let mut v = [0u8; 16];
                // SAFETY: slot r of this rank's staging, written by r before the barrier.
                unsafe {
                    copy16(
                        c.scratch(c.me).add(staging + (r * cap + j) * 16),
                        v.as_mut_ptr(),
                    )
                };
                c.store_output_slot(r, (base + j) * 16, &v);
            }
        }
        barrier(&c, blocks)?;
        base += n;
    }
    c.finish();
    Ok(())
}
