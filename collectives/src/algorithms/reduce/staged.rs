//! Staged reduce for buffers nobody registered: every rank but the root pushes its input
//! into its slot of the root's staging (peer stores), a per-block barrier, the root reduces
//! its own input and every slot of its staging in rank order (local loads) into its output,
//! and a second barrier frees the staging for the next round.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{staged_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{barrier, barrier_blocks, copy16, equal_rounds, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "reduce_staged";

/// The staged reduce.
pub const REDUCE_STAGED: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Reduce,
    name: "reduce_staged",
    aliases: &["reduce_staging"],
    code: 501,
    serves: "reduces of any size on buffers nobody registered, world size 1..=8",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "reduce_staged (host)",
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
    let mut inputs = vec![[0u8; 16]; c.world];
    let mut base = 0;
    while base < units {
        let n = (units - base).min(cap);
        if c.me != root {
            for j in 0..n {
                let v = c.load_input((base + j) * 16);
                // SAFETY: the root's staging holds world * cap units (equal_rounds); me <
                // world, j < cap.
                unsafe {
                    copy16(
                        v.as_ptr(),
                        c.scratch(root).add(staging + (c.me * cap + j) * 16),
                    )
                };
            }
        }
        barrier(&c, blocks)?;
        if c.me == root {
            for j in 0..n {
                let off = (base + j) * 16;
                for (r, input) in inputs.iter_mut().enumerate() {
                    if r == c.me {
                        *input = c.load_input(off);
                    } else {
                        // SAFETY: slot r of this rank's staging, written by r before the
                        // barrier.
                        unsafe {
                            copy16(
                                c.scratch(c.me).add(staging + (r * cap + j) * 16),
                                input.as_mut_ptr(),
                            )
                        };
                    }
                }
                let valid = c.total.saturating_sub(off).min(16);
                c.store_output(off, &c.reduce_unit(&inputs, valid)?);
            }
        }
        barrier(&c, blocks)?;
        base += n;
    }
    c.finish();
    Ok(())
}
