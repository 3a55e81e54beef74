//! One-shot all-pairs LL16 packet allreduce: the latency path.
//!
//! Each rank writes its whole input as LL16 packets (8 data bytes + the call's flag twice
//! in one 16-byte store) into its slot of every peer's packet half, then polls its own
//! packet half for every peer's packets and reduces in rank order. No barrier: the flag
//! (derived from the epoch in device memory) says which call a packet belongs to, and the
//! two halves alternate by epoch parity, so a rank one call ahead never overwrites packets
//! a slow peer still reads (to be two calls ahead it needs that peer's packets of the
//! call in between, which the peer writes only after finishing the older call).

use oxccl_hal::{Error, HostKernelTable, LaunchConfig, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{
    max_blocks, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan, Tuning, THREADS,
};
use crate::host_kernels::{ll16_read_unit, ll16_write_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "allreduce_oneshot_ll";

/// The one-shot LL16 allreduce.
pub const ONESHOT_LL: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllReduce,
    name: "oneshot_ll",
    aliases: &["oneshot", "one_shot", "allpairs"],
    code: 1,
    serves: "small messages (up to the one-shot threshold), any world size 1..=8; needs \
             world_size * 2 * bytes of packet scratch",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "oneshot_ll (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: Some(Tuning {
        threads: &[64, 128, 256, 512],
        work: |s| s.bytes.div_ceil(16).max(1),
        one_block: true,
        on_registered: true,
    }),
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Packets),
});

/// Packet bytes one rank's input of `bytes` takes in each peer: 32 per 16-byte unit.
pub fn slot_bytes(bytes: usize) -> usize {
    bytes.div_ceil(16) * 32
}

/// The launch for a call, or why one-shot cannot serve it (packet capacity).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    ll16_plan("oneshot_ll", KERNEL, s)
}

/// The launch of any collective's LL16 one-shot kernel over `s.bytes` per rank, after its
/// packet capacity check (`name` in the error). Many small blocks: every block's packets
/// go out and come back in parallel, which is what the tuner picked on 2 H200s (64 threads
/// per block up to the whole chip, then wider blocks).
pub(crate) fn ll16_plan(name: &str, kernel: &'static str, s: &CallShape<'_>) -> Result<Plan> {
    ll16_plan_one_block(name, kernel, s, 0)
}

/// [`ll16_plan`], but one block of one thread per unit while the call has at most
/// `one_block_units` units: a single block ends without the count across blocks.
pub(crate) fn ll16_plan_one_block(
    name: &str,
    kernel: &'static str,
    s: &CallShape<'_>,
    one_block_units: usize,
) -> Result<Plan> {
    check_capacity(name, "packet", slot_bytes(s.bytes), s.packet_half_bytes, s)?;
    let units = s.bytes.div_ceil(16).max(1);
    let per_block = if units <= one_block_units {
        units
    } else {
        units.div_ceil(max_blocks(s.caps) as usize)
    };
    Ok(spread(kernel, units, per_block, s))
}

/// A one-shot's capacity: `world` slots of `slot` bytes must fit one parity half of
/// `half` bytes of its region (`what`: "packet" or "line").
pub(crate) fn check_capacity(
    name: &str,
    what: &str,
    slot: usize,
    half: usize,
    s: &CallShape<'_>,
) -> Result<()> {
    let need = slot.saturating_mul(s.world_size as usize);
    if s.world_size > 1 && need > half {
        return Err(Error::Unsupported(format!(
            "{name}: {} bytes x {} ranks need {need} bytes of {what} scratch, the communicator \
             has {half} (raise OXCCL_ONESHOT_MAX_BYTES)",
            s.bytes, s.world_size
        )));
    }
    Ok(())
}

/// The grid of a one-shot kernel over `work` items (units, or lanes of lines): blocks of
/// `per_block` threads (rounded to warps, 64..=512) up to the chip; one host thread on
/// the host backend.
pub(crate) fn spread(
    kernel: &'static str,
    work: usize,
    per_block: usize,
    s: &CallShape<'_>,
) -> Plan {
    if s.host {
        return Plan {
            kernel,
            config: LaunchConfig::linear(1, 32),
        };
    }
    let threads = (per_block.next_multiple_of(32) as u32).clamp(64, THREADS);
    let blocks = work
        .div_ceil(threads as usize)
        .clamp(1, max_blocks(s.caps) as usize) as u32;
    Plan {
        kernel,
        config: LaunchConfig::linear(blocks, threads),
    }
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let units = c.total.div_ceil(16);
    let slot = units * 32;
    let (flag, half) = c.flagged_half(slot)?;
    for u in 0..units {
        let v = c.load_input(u * 16);
        for k in 1..c.world {
            let p = (c.me + k) % c.world;
            // SAFETY: packets 2u, 2u+1 of slot `me` of the current half of peer p's packet
            // region, which fits (checked above).
            unsafe { ll16_write_unit(&c, p, half + c.me * slot + u * 32, &v, flag) };
        }
    }
    let mut inputs = vec![[0u8; 16]; c.world];
    for u in 0..units {
        for (r, input) in inputs.iter_mut().enumerate() {
            *input = if r == c.me {
                c.load_input(u * 16)
            } else {
                // SAFETY: as above, slot r of this rank's own current half.
                unsafe { ll16_read_unit(&c, half + r * slot + u * 32, r, flag)? }
            };
        }
        let valid = c.total.saturating_sub(u * 16).min(16);
        c.store_output(u * 16, &c.reduce_unit(&inputs, valid)?);
    }
    c.finish();
    Ok(())
}
