//! Two-shot allreduce: reduce-scatter then all-gather, through registered staging buffers.
//!
//! In rounds of the staging size: every rank copies the chunks the peers reduce into its
//! "in" staging; barrier; rank r reduces chunk r from every rank's staging (rank order,
//! peer loads over NVLink) into its "out" staging and its output; barrier; every rank
//! copies every peer's reduced chunk from the peer's "out" staging into its output.
//! Barriers are per block (block b of every rank handles the same slice of every chunk),
//! through release-add / acquire-poll counters; the next call's first barrier protects
//! the staging buffers, so no trailing barrier is needed.

use oxccl_hal::{LaunchConfig, Result};

use super::{max_blocks, CallShape, Plan, THREADS};
use crate::host_kernels::TWOSHOT;

/// The launch for a call (two-shot serves every size).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    staging_plan(TWOSHOT, s)
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
