//! Push two-shot allreduce: the two-shot where every transfer between GPUs is a peer store.
//!
//! In rounds of the staging size: every rank stores chunk c of its input into slot `rank`
//! of rank c's "in" staging (over NVLink); barrier; rank r reduces chunk r from its own
//! staging and its input (local loads, rank order) and stores the result into every
//! rank's output: directly when the output is registered on every rank
//! ([`crate::Communicator::register`]), else into every peer's "out" staging; barrier;
//! without registration every rank copies the peers' chunks from its "out" staging into
//! its output (a local copy). Peer stores stream better over NVLink than peer loads (no
//! round trip per load), which is what the staging two-shot and the zero-copy two-shot
//! spend their time on at large sizes.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use super::two_shot::{chunk_units, staging_plan};
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{Algorithm, Buffers, CallShape, Collective, Descriptor, Plan, Tuning};
use crate::host_kernels::{barrier, barrier_blocks, copy16, rounds, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "allreduce_twoshot_push";

/// The push two-shot allreduce.
pub const TWOSHOT_PUSH: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllReduce,
    name: "twoshot_push",
    aliases: &["push", "two_shot_push"],
    code: 6,
    serves: "medium and large messages, registered or not, world size 1..=8, any size; \
             every NVLink transfer is a store (registered outputs are written directly)",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "twoshot_push (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::PeerOutputsIfRegistered,
    maps_peers: true,
    tuning: Some(Tuning {
        threads: &[128, 256, 512],
        work: chunk_units,
        one_block: false,
        on_registered: true,
    }),
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Packets),
});

/// The launch for a call (push two-shot serves every size; the staging grid of
/// [`staging_plan`]).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    staging_plan(KERNEL, s)
}

/// Push two-shot: every transfer between ranks is a store into the peer. Push my chunk c
/// into slot `me` of rank c's "in" staging; barrier; reduce my chunk from my staging and
/// store it into every peer's registered output (direct) or "out" staging; barrier;
/// without registration, copy the peers' chunks from my "out" staging.
fn host_kernel(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let blocks = barrier_blocks(config);
    let (cap, round) = rounds(&c, KERNEL)?;
    let outs = c.a.peer_output;
    let direct = !c.a.output.is_null()
        && outs[c.me] == c.a.output
        && outs[..c.world].iter().all(|p| !p.is_null());
    let in_off = c.a.data_offset as usize;
    let out_off = in_off + c.a.data_bytes as usize;
    let mut inputs = vec![[0u8; 16]; c.world];
    let mut base = 0usize;
    while base < c.total {
        let len = (c.total - base).min(round);
        let units = len.div_ceil(16);
        let chunk = units.div_ceil(c.world);
        let range = |r: usize| (0..chunk).filter(move |j| r * chunk + j < units);
        for k in 1..c.world {
            let r = (c.me + k) % c.world;
            for j in range(r) {
                let v = c.load_input(base + (r * chunk + j) * 16);
                // SAFETY: rank r's staging "in" holds world * cap units; slot `me`, j < cap.
                // Rank r reads it only after this rank's barrier signal.
                unsafe { copy16(v.as_ptr(), c.scratch(r).add(in_off + (c.me * cap + j) * 16)) };
            }
        }
        barrier(&c, blocks)?;
        for j in range(c.me) {
            let u = c.me * chunk + j;
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = if r == c.me {
                    c.load_input(base + u * 16)
                } else {
                    let mut v = [0u8; 16];
                    // SAFETY: this rank's staging "in", slot r, written by rank r before
                    // its barrier signal, which this rank acquired.
                    unsafe {
                        copy16(
                            c.scratch(c.me).add(in_off + (r * cap + j) * 16),
                            v.as_mut_ptr(),
                        )
                    };
                    v
                };
            }
            let off = base + u * 16;
            let valid = c.total.saturating_sub(off).min(16);
            let v = c.reduce_unit(&inputs, valid)?;
            for k in 1..c.world {
                let p = (c.me + k) % c.world;
                if direct {
                    // SAFETY: every rank's registered output holds `total` bytes at
                    // `outs[p]`; only this rank writes chunk `me` of it during the call.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            v.as_ptr(),
                            outs[p].cast::<u8>().add(off),
                            valid,
                        )
                    };
                } else {
                    // SAFETY: rank p's staging "out" holds world * cap units.
                    unsafe {
                        copy16(
                            v.as_ptr(),
                            c.scratch(p).add(out_off + (c.me * cap + j) * 16),
                        )
                    };
                }
            }
            c.store_output(off, &v);
        }
        barrier(&c, blocks)?;
        if !direct {
            for k in 1..c.world {
                let r = (c.me + k) % c.world;
                for j in range(r) {
                    let mut v = [0u8; 16];
                    // SAFETY: this rank's staging "out", slot r, written by rank r before
                    // its second barrier signal.
                    unsafe {
                        copy16(
                            c.scratch(c.me).add(out_off + (r * cap + j) * 16),
                            v.as_mut_ptr(),
                        )
                    };
                    c.store_output(base + (r * chunk + j) * 16, &v);
                }
            }
        }
        base += len;
    }
    c.finish();
    Ok(())
}
