//! Direct reduce on registered inputs ([`crate::Communicator::register`]): a per-block
//! barrier (every peer's input is ready), the root reduces straight from every rank's input
//! (peer loads over NVLink) in rank order into its output, and a second barrier (the root
//! reads no peer's input any more). No staging, each byte crosses once.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{direct_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{barrier, barrier_blocks, read_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "reduce_direct";

/// The direct reduce.
pub const REDUCE_DIRECT: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Reduce,
    name: "reduce_direct",
    aliases: &["reduce_zc", "reduce_zero_copy"],
    code: 502,
    serves: "reduces whose input lies 16-byte aligned in a buffer registered on every rank \
             (Communicator::register), at the same offset; world size 1..=8",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "reduce_direct (host)",
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

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let blocks = barrier_blocks(config);
    let root = c.root()?;
    let ins = c.peer_inputs()?;
    barrier(&c, blocks)?;
    if c.me == root {
        let mut inputs = vec![[0u8; 16]; c.world];
        for u in 0..c.total.div_ceil(16) {
            for (r, input) in inputs.iter_mut().enumerate() {
                // SAFETY: every rank's registered input holds `total` bytes at ins[r]; it is
                // not written during the call (its owner passed the first barrier and only
                // reads it, or, in place on the root, this loop writes each unit after
                // reading it).
                *input = unsafe { read_unit(ins[r], c.total, u * 16) };
            }
            let valid = c.total.saturating_sub(u * 16).min(16);
            c.store_output(u * 16, &c.reduce_unit(&inputs, valid)?);
        }
    }
    barrier(&c, blocks)?;
    c.finish();
    Ok(())
}
