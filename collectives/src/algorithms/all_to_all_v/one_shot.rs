//! One-shot LL16 all_to_all_v: the latency path. Every rank has a slot of the same size in
//! every peer's packet half (the half split evenly, whatever the chunks); each rank writes
//! its chunk for p as LL16 packets into its slot of p's current half, or an
//! acknowledgement packet where the chunk is empty, copies its own chunk locally, then
//! polls its own half for every peer's chunk (or acknowledgement). No barrier: hearing
//! from every peer every call is what keeps the epoch-parity halves safe.

use oxccl_hal::{Error, HostKernelTable, LaunchConfig, Result};

use super::kernel::{VCall, VKernel};
use crate::algorithms::all_reduce::one_shot::ll16_plan;
use crate::algorithms::{Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{ll16_ack, ll16_read_unit, ll16_wait_ack, ll16_write_unit};

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "alltoallv_oneshot_ll";

/// The one-shot LL16 all_to_all_v.
pub const ALLTOALLV_ONESHOT_LL: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllToAllV,
    name: "alltoallv_oneshot_ll",
    aliases: &["alltoallv_oneshot"],
    code: 353,
    serves: "small all_to_all_v calls, any world size 1..=8; every chunk between two ranks \
             must fit 2 * bytes of packets in a slot of packet_half / world_size",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "alltoallv_oneshot_ll (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: None,
    setup: VKernel::setup,
});

/// The launch for a call, or why one-shot cannot serve it: `s.bytes` is the layout's
/// largest chunk (the same on every rank), and world slots of its packets must fit a half
/// (the allreduce one-shot's check, which is the kernel's fixed slot stride).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    ll16_plan("alltoallv_oneshot_ll", KERNEL, s)
}

/// Bytes of every rank's slot in a packet half of `half` bytes (the device's
/// `v_slot_bytes`).
fn slot_bytes(half: u64, world: usize) -> usize {
    (half as usize / world.max(1)) / 16 * 16
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let vc = VCall::new(bytes, KERNEL)?;
    let (c, v) = (&vc.c, &vc.v);
    let slot = slot_bytes(c.a.packet_half_bytes, c.world);
    let need = |b: u64| (b as usize).div_ceil(16) * 32;
    let peers = (0..c.world).filter(|p| *p != c.me);
    if slot < 32
        || peers
            .clone()
            .any(|p| need(v.send_bytes[p]) > slot || need(v.recv_bytes[p]) > slot)
    {
        return Err(Error::InvalidArgument(format!(
            "{KERNEL}: a chunk does not fit a slot of {slot} bytes of packets"
        )));
    }
    let (flag, half) = c.flagged_half(slot)?;
    for k in 1..c.world {
        let p = (c.me + k) % c.world;
        if vc.send_bytes(p) == 0 {
            // SAFETY: slot `me` of the current half of p's packet region, which fits.
            unsafe { ll16_ack(c, p, half, slot, flag) };
        }
        for u in 0..vc.send_bytes(p).div_ceil(16) {
            // SAFETY: packets 2u, 2u+1 of slot `me` of p's current half (the chunk fits).
            unsafe {
                ll16_write_unit(
                    c,
                    p,
                    half + c.me * slot + u * 32,
                    &vc.load_send(p, u * 16),
                    flag,
                )
            };
        }
    }
    for u in 0..vc.send_bytes(c.me).div_ceil(16) {
        vc.store_recv(c.me, u * 16, &vc.load_send(c.me, u * 16));
    }
    for r in peers {
        if vc.recv_bytes(r) == 0 {
            // SAFETY: slot r of this rank's own current half.
            unsafe { ll16_wait_ack(c, r, half, slot, flag)? };
        }
        for u in 0..vc.recv_bytes(r).div_ceil(16) {
            // SAFETY: as above, unit u of slot r of this rank's own current half.
            let x = unsafe { ll16_read_unit(c, half + r * slot + u * 32, r, flag)? };
            vc.store_recv(r, u * 16, &x);
        }
    }
    c.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_16_byte_multiples_of_the_half() {
        assert_eq!(slot_bytes(1 << 20, 3), 349_520);
        assert_eq!(slot_bytes(1000, 8), 112);
    }
}
