//! One-shot all-pairs LL16 packet allreduce: the latency path.
//!
//! Each rank writes its whole input as LL16 packets (8 data bytes + the call's flag twice
//! in one 16-byte store) into its slot of every peer's packet half, then polls its own
//! packet half for every peer's packets and reduces in rank order. No barrier: the flag
//! (derived from the epoch in device memory) says which call a packet belongs to, and the
//! two halves alternate by epoch parity, so a rank one call ahead never overwrites packets
//! a slow peer still reads (to be two calls ahead it needs that peer's packets of the
//! call in between, which the peer writes only after finishing the older call).

use oxccl_hal::{Error, LaunchConfig, Result};

use super::{max_blocks, CallShape, Plan, THREADS};
use crate::host_kernels::ONESHOT_LL;

/// Packet bytes one rank's input of `bytes` takes in each peer: 32 per 16-byte unit.
pub fn slot_bytes(bytes: usize) -> usize {
    bytes.div_ceil(16) * 32
}

/// The launch for a call, or why one-shot cannot serve it (packet capacity).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    let slot = slot_bytes(s.bytes);
    if s.world_size > 1 && slot.saturating_mul(s.world_size as usize) > s.packet_half_bytes {
        return Err(Error::Unsupported(format!(
            "oneshot_ll: {} bytes x {} ranks need {} bytes of packet scratch, the communicator \
             has {} (raise OXCCL_ONESHOT_MAX_BYTES)",
            s.bytes,
            s.world_size,
            slot.saturating_mul(s.world_size as usize),
            s.packet_half_bytes
        )));
    }
    if s.host {
        return Ok(Plan {
            kernel: ONESHOT_LL,
            config: LaunchConfig::linear(1, 32),
        });
    }
    // Many small blocks: every block's packets go out and come back in parallel, which is
    // what the tuner picked on 2 H200s (64 threads per block up to the whole chip, then
    // wider blocks).
    let units = s.bytes.div_ceil(16).max(1);
    let max = max_blocks(s.caps) as usize;
    let threads = (units.div_ceil(max).next_multiple_of(32) as u32).clamp(64, THREADS);
    let blocks = units.div_ceil(threads as usize).clamp(1, max) as u32;
    Ok(Plan {
        kernel: ONESHOT_LL,
        config: LaunchConfig::linear(blocks, threads),
    })
}
