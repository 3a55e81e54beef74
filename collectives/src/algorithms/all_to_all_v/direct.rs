//! Direct all_to_all_v on outputs every rank reaches (registered at the same offset on
//! every rank, or mapped by auto-registration): a per-block barrier (every peer's output is
//! free), every block stores its share of every chunk, all chunks in one pass (the remote
//! stores to every peer in flight together, this rank's own local copy among them), with SM
//! stores straight into its place in the peer's output, and a second barrier (every chunk
//! has arrived). No staging, no copy engine; each byte crosses once.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use super::kernel::{VCall, VKernel};
use crate::algorithms::{direct_plan, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{barrier, barrier_blocks, write_unit};

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "alltoallv_direct";

/// The direct all_to_all_v.
pub const ALLTOALLV_DIRECT: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllToAllV,
    name: "alltoallv_direct",
    aliases: &["alltoallv_zc", "alltoallv_zero_copy"],
    code: 354,
    serves: "all_to_all_v calls whose outputs every rank reaches (registered at the same \
             offset on every rank, or mapped by auto-registration); world size 1..=8",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "alltoallv_direct (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Registered,
    maps_peers: true,
    tuning: None,
    setup: VKernel::setup,
});

/// The launch for a call, or why it cannot serve it (outputs not reachable). `s.bytes` is
/// the layout's largest chunk, the same on every rank: the per-block barriers need the same
/// grid everywhere.
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    direct_plan(KERNEL, "the output", s)
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let vc = VCall::new(bytes, KERNEL)?;
    let c = &vc.c;
    let blocks = barrier_blocks(config);
    // Stores go through the layout's remote addresses (`vc.remote`), built from these.
    c.peer_outputs()?;
    barrier(c, blocks)?;
    for k in 1..=c.world {
        let p = (c.me + k) % c.world;
        let n = vc.send_bytes(p);
        for u in 0..n.div_ceil(16) {
            let x = vc.load_send(p, u * 16);
            if p == c.me {
                vc.store_recv(p, u * 16, &x);
            } else {
                // SAFETY: rank p's output as mapped here holds its receive range for this
                // rank, `n` bytes at remote_offset[p] (every rank's layout checked against
                // the others'); between the barriers only this rank writes it.
                unsafe { write_unit(vc.remote(p), n, u * 16, &x) };
            }
        }
    }
    barrier(c, blocks)?;
    c.finish();
    Ok(())
}
