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

use oxccl_hal::Result;

use super::two_shot::staging_plan;
use super::{CallShape, Plan};
use crate::host_kernels::TWOSHOT_PUSH;

/// The launch for a call (push two-shot serves every size; the staging grid of
/// [`staging_plan`]).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    staging_plan(TWOSHOT_PUSH, s)
}
