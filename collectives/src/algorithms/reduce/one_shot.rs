//! One-shot LL16 reduce: the latency path, no barrier. Every other rank writes its input as
//! LL16 packets into its slot of the root's packet half and acknowledges to the other
//! non-root ranks; the root acknowledges to every peer (one packet: its call has started),
//! because the alternating packet halves are safe only while every rank receives from
//! every peer (`ll16_ack` in allreduce_device.hpp). The root reduces its input and every
//! peer's packets in rank order; the others wait for the acknowledgements.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::all_reduce::one_shot::ll16_plan;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{ll16_ack, ll16_read_unit, ll16_wait_ack, ll16_write_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "reduce_oneshot_ll";

/// The one-shot LL16 reduce.
pub const REDUCE_ONESHOT_LL: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Reduce,
    name: "reduce_oneshot_ll",
    aliases: &["reduce_oneshot"],
    code: 503,
    serves: "small reduces, any world size 1..=8; needs world_size * 2 * bytes of packet \
             scratch",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "reduce_oneshot_ll (host)",
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
    ll16_plan("reduce_oneshot_ll", KERNEL, s)
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let root = c.root()?;
    let units = c.total.div_ceil(16).max(1);
    let slot = units * 32;
    let (flag, half) = c.flagged_half(slot)?;
    let peers = || (1..c.world).map(|k| (c.me + k) % c.world);
    if c.me != root {
        for u in 0..units {
            let v = c.load_input(u * 16);
            // SAFETY: packets 2u, 2u+1 of slot `me` of the root's current half, which fits
            // (checked above).
            unsafe { ll16_write_unit(&c, root, half + c.me * slot + u * 32, &v, flag) };
        }
    }
    for p in peers().filter(|p| *p != root) {
        // SAFETY: slot `me` of peer p's current half, which fits.
        unsafe { ll16_ack(&c, p, half, slot, flag) };
    }
    if c.me != root {
        for p in peers() {
            // SAFETY: slot p of this rank's own current half.
            unsafe { ll16_wait_ack(&c, p, half, slot, flag)? };
        }
    } else {
        let mut inputs = vec![[0u8; 16]; c.world];
        for u in 0..units {
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = if r == c.me {
                    c.load_input(u * 16)
                } else {
                    // SAFETY: slot r of this rank's own current half.
                    unsafe { ll16_read_unit(&c, half + r * slot + u * 32, r, flag)? }
                };
            }
            let valid = c.total.saturating_sub(u * 16).min(16);
            c.store_output(u * 16, &c.reduce_unit(&inputs, valid)?);
        }
    }
    c.finish();
    Ok(())
}
