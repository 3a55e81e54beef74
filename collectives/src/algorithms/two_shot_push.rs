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

use oxccl_hal::{LaunchConfig, Result};

use super::{max_blocks, CallShape, Plan, THREADS};
use crate::host_kernels::TWOSHOT_PUSH;

/// The launch for a call (push two-shot serves every size).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    if s.host {
        return Ok(Plan {
            kernel: TWOSHOT_PUSH,
            config: LaunchConfig::linear(1, 32),
        });
    }
    let units = s.bytes.div_ceil(16).max(1);
    let chunk = units.div_ceil(s.world_size.max(1) as usize);
    let blocks = chunk
        .div_ceil(THREADS as usize)
        .clamp(1, max_blocks(s.caps) as usize) as u32;
    Ok(Plan {
        kernel: TWOSHOT_PUSH,
        config: LaunchConfig::linear(blocks, THREADS),
    })
}
