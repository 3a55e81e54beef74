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
        // SAFETY: every rank's registered input holds `total` bytes at ins[r]; it is not
        // written during the call (its owner passed the first barrier and only reads it,
        // or, in place on the root, each unit is written after it was read).
        unsafe { reduce_into_output(&c, &ins[..c.world])? };
    }
    barrier(&c, blocks)?;
    c.finish();
    Ok(())
}

/// Stores into `c`'s output the reduction, in rank order, of `ins` (one pointer per rank),
/// unit by unit (shared with `reduce_copy`'s local reduce).
///
/// # Safety
/// Every pointer must be readable for `c.total` bytes and not written during the call but
/// by this function, which writes each output unit after reading that unit of every input.
pub(crate) unsafe fn reduce_into_output(c: &Call, ins: &[*const std::ffi::c_void]) -> Result<()> {
    let mut inputs = vec![[0u8; 16]; ins.len()];
    for u in 0..c.total.div_ceil(16) {
        // SAFETY: the caller's obligations.
        let v = unsafe { reduce_unit_of(c, ins, u, &mut inputs)? };
        c.store_output(u * 16, &v);
    }
    Ok(())
}

/// The reduction, in rank order, of 16-byte unit `u` of `ins` (one pointer per rank, each
/// `c.total` bytes), read through `inputs` (one unit per rank; shared with `reduce_relay`).
///
/// # Safety
/// Every pointer must be readable for `c.total` bytes.
pub(crate) unsafe fn reduce_unit_of(
    c: &Call,
    ins: &[*const std::ffi::c_void],
    u: usize,
    inputs: &mut [[u8; 16]],
) -> Result<[u8; 16]> {
    for (input, &at) in inputs.iter_mut().zip(ins) {
        // SAFETY: the caller's obligations: `at` holds `total` readable bytes.
        *input = unsafe { read_unit(at, c.total, u * 16) };
    }
    let valid = c.total.saturating_sub(u * 16).min(16);
    c.reduce_unit(inputs, valid)
}
