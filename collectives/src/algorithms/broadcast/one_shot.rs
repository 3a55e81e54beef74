//! One-shot LL16 broadcast: the latency path, no barrier. The root writes its input as LL16
//! packets into its slot of every peer's packet half; every other rank acknowledges to
//! every peer (one packet: its call has started), because the alternating packet halves
//! are safe only while every rank receives from every peer (`ll16_ack` in
//! allreduce_device.hpp). Every rank then reads the root's packets into its output and
//! waits for the other acknowledgements.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::all_reduce::one_shot::ll16_plan;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{ll16_ack, ll16_read_unit, ll16_wait_ack, ll16_write_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "broadcast_oneshot_ll";

/// The one-shot LL16 broadcast.
pub const BROADCAST_ONESHOT_LL: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Broadcast,
    name: "broadcast_oneshot_ll",
    aliases: &["broadcast_oneshot"],
    code: 403,
    serves: "small broadcasts, any world size 1..=8; needs world_size * 2 * bytes of packet \
             scratch",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "broadcast_oneshot_ll (host)",
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
    ll16_plan("broadcast_oneshot_ll", KERNEL, s)
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let root = c.root()?;
    let units = c.total.div_ceil(16).max(1);
    let slot = units * 32;
    let (flag, half) = c.flagged_half(slot)?;
    let peers = || (1..c.world).map(|k| (c.me + k) % c.world);
    if c.me == root {
        let in_place = c.a.input == c.a.output.cast_const();
        for u in 0..units {
            let v = c.load_input(u * 16);
            for p in peers() {
                // SAFETY: packets 2u, 2u+1 of slot `root` of the current half of peer p's
                // packet region, which fits (checked above).
                unsafe { ll16_write_unit(&c, p, half + root * slot + u * 32, &v, flag) };
            }
            if !in_place {
                c.store_output(u * 16, &v);
            }
        }
        for p in peers() {
            // SAFETY: slot p of this rank's own current half, which fits.
            unsafe { ll16_wait_ack(&c, p, half, slot, flag)? };
        }
    } else {
        for p in peers() {
            // SAFETY: slot `me` of peer p's current half, which fits.
            unsafe { ll16_ack(&c, p, half, slot, flag) };
        }
        for u in 0..units {
            // SAFETY: slot `root` of this rank's own current half.
            let v = unsafe { ll16_read_unit(&c, half + root * slot + u * 32, root, flag)? };
            c.store_output(u * 16, &v);
        }
        for p in peers().filter(|p| *p != root) {
            // SAFETY: as above.
            unsafe { ll16_wait_ack(&c, p, half, slot, flag)? };
        }
    }
    c.finish();
    Ok(())
}
