//! Staged all_to_all_v for outputs no peer can reach: in rounds of one slot of every rank's
//! staging region (its size divided by the world size), every rank copies the round's part
//! of its chunk for rank p into its slot of p's staging (the copy engine, through p's
//! scratch as mapped here), a barrier kernel, every rank copies each peer's slot of its
//! own staging into its output, and a second barrier frees the staging (as every kernel
//! that reads its staging does before the next call). Every rank runs the same number of
//! rounds: the layout's largest chunk, the same on every rank, sets it.

use oxccl_backend::AnyStream;
use oxccl_hal::{HostKernelTable, Result, Stream};

use super::{barrier_plan, needs_layout, VInstance, VLayout, BARRIER_KERNEL};
use crate::algorithms::broadcast::copy_engine::host_kernel;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{
    Algorithm, Buffers, Call, CallShape, Collective, Descriptor, Instance, Plan,
};

/// The staged all_to_all_v.
pub const ALLTOALLV_STAGED: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllToAllV,
    name: "alltoallv_staged",
    aliases: &["alltoallv_staging"],
    code: 352,
    serves: "all_to_all_v calls on any buffers, through every rank's staging; world size 1..=8",
    kernel: BARRIER_KERNEL,
    host: HostKernelTable {
        name: "alltoallv barrier (host)",
        kernels: &[(BARRIER_KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| super::setup(ctx, me, |barriers| Box::new(StagedAllToAllV { barriers })),
});

/// The launch of each barrier.
pub fn plan(_: &CallShape<'_>) -> Result<Plan> {
    Ok(barrier_plan())
}

/// The barrier kernel and the staging it copies through.
#[derive(Debug)]
pub(crate) struct StagedAllToAllV {
    barriers: ScratchKernel,
}

/// Bytes of one rank's slot in a staging region of `staging` bytes shared by `world`
/// ranks: a multiple of 16 (the device kernels' units), at least 16.
pub fn slot_bytes(staging: usize, world: u32) -> usize {
    (staging / world.max(1) as usize / 16 * 16).max(16)
}

/// The part of a chunk of `bytes` that round `round` moves, as (offset in the chunk,
/// bytes), with slots of `slot` bytes.
fn part(bytes: usize, round: usize, slot: usize) -> (usize, usize) {
    let lo = round.saturating_mul(slot).min(bytes);
    (lo, (bytes - lo).min(slot))
}

impl Instance for StagedAllToAllV {
    unsafe fn launch(&self, call: &Call, _: &Plan, _: &AnyStream) -> Result<()> {
        Err(needs_layout(call, ALLTOALLV_STAGED.name()))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl VInstance for StagedAllToAllV {
    unsafe fn launch_v(
        &self,
        call: &Call,
        _: &Plan,
        layout: &VLayout,
        stream: &AnyStream,
    ) -> Result<()> {
        let plan = barrier_plan();
        let (me, world) = self.barriers.rank_and_world();
        let staging = self.barriers.staging();
        let slot = slot_bytes(staging.bytes, world);
        let mine = me as usize;
        let (from, bytes) = layout.send[mine];
        if bytes > 0 {
            // SAFETY: this rank's own chunk, inside its input and output (checked by the
            // communicator); input and output do not overlap (checked).
            unsafe {
                stream.copy(
                    call.output.offset(layout.recv[mine].0)?,
                    call.input.offset(from)?,
                    bytes,
                )?
            };
        }
        let rounds = layout.max_chunk.div_ceil(slot);
        for round in 0..rounds {
            for k in 1..world {
                let p = ((me + k) % world) as usize;
                let (at, n) = part(layout.send[p].1, round, slot);
                if n == 0 {
                    continue;
                }
                let dst = staging.bases[p].offset(staging.offset + mine * slot)?;
                // SAFETY: slot `me` of rank p's staging as mapped here (world slots of
                // `slot` bytes fit its region); the barrier that ended p's last use of its
                // staging came before (every user of the staging ends with one). The
                // source is inside this rank's input (checked).
                unsafe { stream.copy(dst, call.input.offset(layout.send[p].0 + at)?, n)? };
            }
            // SAFETY: the call's buffers are the caller's obligations; the barrier kernel
            // reads nothing else from the argument block.
            unsafe { self.barriers.launch(call, &plan, stream)? };
            for k in 1..world {
                let q = ((me + k) % world) as usize;
                let (at, n) = part(layout.recv[q].1, round, slot);
                if n == 0 {
                    continue;
                }
                let src = staging.bases[mine].offset(staging.offset + q * slot)?;
                // SAFETY: slot q of this rank's staging, written by q before the barrier;
                // the destination is inside this rank's output (checked).
                unsafe { stream.copy(call.output.offset(layout.recv[q].0 + at)?, src, n)? };
            }
            // SAFETY: as above; the staging is free again once every rank passed it.
            unsafe { self.barriers.launch(call, &plan, stream)? };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_parts() {
        assert_eq!(slot_bytes(1 << 20, 3), 349_520);
        assert_eq!(slot_bytes(16, 8), 16);
        // A chunk of 50 bytes in slots of 16: 16, 16, 16, 2, then nothing.
        let parts: Vec<_> = (0..6).map(|r| part(50, r, 16)).collect();
        assert_eq!(
            parts,
            [(0, 16), (16, 16), (32, 16), (48, 2), (50, 0), (50, 0)]
        );
        assert_eq!(part(0, 0, 16), (0, 0));
    }
}
