//! Two-shot allreduce: reduce-scatter then all-gather, through registered staging buffers.
//!
//! In rounds of the staging size: every rank copies the chunks the peers reduce into its
//! "in" staging; barrier; rank r reduces chunk r from every rank's staging (rank order,
//! peer loads over NVLink) into its "out" staging and its output; barrier; every rank
//! copies every peer's reduced chunk from the peer's "out" staging into its output.
//! Barriers are per block (block b of every rank handles the same slice of every chunk),
//! through release-add / acquire-poll counters; the next call's first barrier protects
//! the staging buffers, so no trailing barrier is needed.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{
    max_blocks, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan, Tuning, THREADS,
};
use crate::host_kernels::{barrier, barrier_blocks, copy16, rounds, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "allreduce_twoshot";

/// The staging two-shot allreduce.
pub const TWOSHOT: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllReduce,
    name: "twoshot",
    aliases: &["two_shot"],
    code: 2,
    serves: "medium and large messages, world size 1..=8; any size (processed in rounds \
             of the staging buffer)",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "twoshot (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: Some(Tuning {
        threads: &[128, 256, 512],
        work: chunk_units,
        one_block: false,
        on_registered: false,
    }),
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Packets),
});

/// The launch for a call (two-shot serves every size).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    staging_plan(KERNEL, s)
}

/// 16-byte units of the chunk each rank reduces: what a two-shot's threads spread over.
pub(crate) fn chunk_units(s: &CallShape<'_>) -> usize {
    s.bytes
        .div_ceil(16)
        .max(1)
        .div_ceil(s.world_size.max(1) as usize)
}

/// The launch of a staging kernel (two-shot, push two-shot): one block of 512 threads per
/// 512 units of a rank's chunk, up to the whole chip; one host thread on the host backend.
pub(crate) fn staging_plan(kernel: &'static str, s: &CallShape<'_>) -> Result<Plan> {
    if s.host {
        return Ok(Plan {
            kernel,
            config: LaunchConfig::linear(1, 32),
        });
    }
    let units = s.bytes.div_ceil(16).max(1);
    let chunk = units.div_ceil(s.world_size.max(1) as usize);
    let blocks = chunk
        .div_ceil(THREADS as usize)
        .clamp(1, max_blocks(s.caps) as usize) as u32;
    Ok(Plan {
        kernel,
        config: LaunchConfig::linear(blocks, THREADS),
    })
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let blocks = barrier_blocks(config);
    let (cap, round) = rounds(&c, KERNEL)?;
    let in_off = c.a.data_offset as usize;
    let out_off = in_off + c.a.data_bytes as usize;
    let mut inputs = vec![[0u8; 16]; c.world];
    let mut base = 0usize;
    while base < c.total {
        let len = (c.total - base).min(round);
        let units = len.div_ceil(16);
        let chunk = units.div_ceil(c.world);
        let range = |r: usize| (0..chunk).filter(move |j| r * chunk + j < units);
        for r in (0..c.world).filter(|r| *r != c.me) {
            for j in range(r) {
                let v = c.load_input(base + (r * chunk + j) * 16);
                // SAFETY: staging "in" of this rank holds world * cap units; r < world, j < cap.
                unsafe { copy16(v.as_ptr(), c.scratch(c.me).add(in_off + (r * cap + j) * 16)) };
            }
        }
        barrier(&c, blocks)?;
        for j in range(c.me) {
            let u = c.me * chunk + j;
            let pos = (c.me * cap + j) * 16;
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = if r == c.me {
                    c.load_input(base + u * 16)
                } else {
                    let mut v = [0u8; 16];
                    // SAFETY: rank r's staging "in", written before its barrier signal,
                    // which this rank acquired.
                    unsafe { copy16(c.scratch(r).add(in_off + pos), v.as_mut_ptr()) };
                    v
                };
            }
            let valid = (c.total - base).saturating_sub(u * 16).min(16);
            let v = c.reduce_unit(&inputs, valid)?;
            // SAFETY: this rank's staging "out", inside the allocation.
            unsafe { copy16(v.as_ptr(), c.scratch(c.me).add(out_off + pos)) };
            c.store_output(base + u * 16, &v);
        }
        barrier(&c, blocks)?;
        for k in 1..c.world {
            let r = (c.me + k) % c.world;
            for j in range(r) {
                let mut v = [0u8; 16];
                // SAFETY: rank r's staging "out", written before its second barrier signal.
                unsafe {
                    copy16(
                        c.scratch(r).add(out_off + (r * cap + j) * 16),
                        v.as_mut_ptr(),
                    )
                };
                c.store_output(base + (r * chunk + j) * 16, &v);
            }
        }
        base += len;
    }
    c.finish();
    Ok(())
}
