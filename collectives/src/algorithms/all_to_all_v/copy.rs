//! Copy-engine all_to_all_v on outputs every rank can reach (registered, or mapped by
//! auto-registration): a barrier kernel (every peer's output is free), one `cuMemcpyAsync`
//! per non-empty chunk straight into its place in the peer's output (no SM involved, no
//! staging), this rank's own chunk copied locally, and a second barrier kernel (every
//! chunk has arrived).

use oxccl_backend::AnyStream;
use oxccl_hal::{Error, HostKernelTable, Result, Stream};

use super::{barrier_plan, needs_layout, VInstance, VLayout, BARRIER_KERNEL};
use crate::algorithms::broadcast::copy_engine::host_kernel;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{
    require_registered, Algorithm, Buffers, Call, CallShape, Collective, Descriptor, Instance, Plan,
};

/// The copy-engine all_to_all_v.
pub const ALLTOALLV_COPY: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllToAllV,
    name: "alltoallv_copy",
    aliases: &["alltoallv_copy_engine", "alltoallv_ce"],
    code: 351,
    serves: "all_to_all_v calls whose outputs every rank reaches (registered at the same \
             offset on every rank, or mapped by auto-registration); world size 1..=8",
    kernel: BARRIER_KERNEL,
    host: HostKernelTable {
        name: "alltoallv barrier (host)",
        kernels: &[(BARRIER_KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Registered,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| super::setup(ctx, me, |barriers| Box::new(CopyAllToAllV { barriers })),
});

/// The launch of each barrier, or why it cannot serve the call (outputs not reachable).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    require_registered(ALLTOALLV_COPY.descriptor().name, "the output", s)?;
    Ok(barrier_plan())
}

/// The barrier kernel; the copies are queued between its two launches.
#[derive(Debug)]
pub(crate) struct CopyAllToAllV {
    barriers: ScratchKernel,
}

impl Instance for CopyAllToAllV {
    unsafe fn launch(&self, call: &Call, _: &Plan, _: &AnyStream) -> Result<()> {
        Err(needs_layout(call, ALLTOALLV_COPY.name()))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl VInstance for CopyAllToAllV {
    unsafe fn launch_v(
        &self,
        call: &Call,
        _: &Plan,
        layout: &VLayout,
        stream: &AnyStream,
    ) -> Result<()> {
        let Some(peers) = call.peers else {
            return Err(Error::InvalidArgument(format!(
                "{ALLTOALLV_COPY}: needs every rank's output reachable from here"
            )));
        };
        let plan = barrier_plan();
        // SAFETY: the caller's obligations (this trait method's contract) cover the call's
        // buffers; the barrier kernel reads nothing else from the argument block.
        unsafe { self.barriers.launch(call, &plan, stream)? };
        let (me, world) = self.barriers.rank_and_world();
        for k in 1..world {
            let p = ((me + k) % world) as usize;
            let (from, bytes) = layout.send[p];
            if bytes == 0 {
                continue;
            }
            let dst = peers.outputs[p].offset(layout.remote[p])?;
            // SAFETY: rank p's output as mapped here holds its receive range for this rank,
            // `bytes` long at `remote[p]` (every rank's layout checked against the others');
            // between the barriers only this rank writes that range. The source is inside
            // this rank's input (checked).
            unsafe { stream.copy(dst, call.input.offset(from)?, bytes)? };
        }
        let (from, bytes) = layout.send[me as usize];
        if bytes > 0 {
            let to = layout.recv[me as usize].0;
            // SAFETY: this rank's own chunk, inside its input and output (checked); the
            // input and output do not overlap (checked).
            unsafe { stream.copy(call.output.offset(to)?, call.input.offset(from)?, bytes)? };
        }
        // SAFETY: as the first launch; it runs after this rank's copies (stream order).
        unsafe { self.barriers.launch(call, &plan, stream) }
    }
}
