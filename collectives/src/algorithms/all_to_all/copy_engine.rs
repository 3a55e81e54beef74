//! Two-stream all-to-all on registered outputs ([`crate::Communicator::register`]): a
//! barrier kernel (every peer's output is free), the copy kernel (`oxccl_copy`) storing
//! chunk p of the input into slot `me` of rank p's output on a second stream
//! ([`CopyLane`]) while a second copy kernel moves this rank's own chunk on the caller's
//! stream, and a second barrier kernel (every chunk has arrived). Two kernels side by side
//! beat `alltoall_direct`'s one, which moves both from the same threads: 2 H100s, 1481
//! against 1610 us at 1 GiB. The copy engine for the peers' chunks was slower (2.14-2.33
//! ms): the own chunk's local copy slows it (see [`CopyLane`]).

use oxccl_backend::AnyStream;
use oxccl_hal::{Error, HostKernelTable, Result};

use crate::algorithms::all_to_all_v::{barrier_plan, BARRIER_KERNEL};
use crate::algorithms::broadcast::copy_engine::host_kernel;
use crate::algorithms::copy_lane::{self, CopyLane, Engine, Span};
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{
    require_registered, Algorithm, Buffers, Call, CallShape, Collective, Descriptor, Instance, Plan,
};

/// The copy-engine all-to-all.
pub const ALLTOALL_COPY: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllToAll,
    name: "alltoall_copy",
    aliases: &["alltoall_two_stream"],
    code: 304,
    serves: "all-to-alls whose output lies in a buffer registered on every rank \
             (Communicator::register), at the same offset; world size 1..=8; copy kernels \
             on two streams move the data",
    kernel: BARRIER_KERNEL,
    host: HostKernelTable {
        name: "alltoall barrier (host)",
        kernels: &[(BARRIER_KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Registered,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| {
        copy_lane::setup(ctx, me, |barriers, lane| {
            Box::new(CopyAllToAll { barriers, lane })
        })
    },
});

/// The launch of each barrier, or why it cannot serve the call (output not registered).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    require_registered(ALLTOALL_COPY.descriptor().name, "the output", s)?;
    Ok(barrier_plan())
}

/// The barrier kernel; the copies are queued between its two launches, the peers' on the
/// lane.
#[derive(Debug)]
struct CopyAllToAll {
    barriers: ScratchKernel,
    lane: CopyLane,
}

impl Instance for CopyAllToAll {
    unsafe fn launch(&self, call: &Call, _: &Plan, stream: &AnyStream) -> Result<()> {
        let Some(peers) = call.peers else {
            return Err(Error::InvalidArgument(format!(
                "{ALLTOALL_COPY}: needs outputs registered on every rank"
            )));
        };
        let chunk = call.dtype.bytes(call.count)?;
        let plan = barrier_plan();
        // SAFETY: the caller's obligations (this trait method's contract) cover the call's
        // buffers; the barrier kernel reads nothing else from the argument block.
        unsafe { self.barriers.launch(call, &plan, stream)? };
        let (me, world) = self.barriers.rank_and_world();
        let slot = |r: u32| chunk.checked_mul(r as usize).ok_or_else(|| overflow(chunk));
        let mut to_peers = Vec::with_capacity(world as usize);
        for k in 1..world {
            let p = (me + k) % world;
            to_peers.push(Span {
                dst: peers.outputs[p as usize].offset(slot(me)?)?,
                src: call.input.offset(slot(p)?)?,
                bytes: chunk,
            });
        }
        let own = Span {
            dst: call.output.offset(slot(me)?)?,
            src: call.input.offset(slot(me)?)?,
            bytes: chunk,
        };
        // SAFETY: every rank's registered output holds `world * chunk` bytes at
        // peers.outputs[p] (same offset and size on every rank, checked by the
        // communicator); between the barriers only this rank writes slot `me` of it, and
        // the second barrier is queued after the join. The input holds `world` chunks, and
        // input and output do not overlap (NCCL defines no in-place all-to-all; checked).
        unsafe { self.lane.copy(stream, &to_peers, Engine::Sm, Some(own))? };
        // SAFETY: as the first launch; it runs after this rank's copies (the join).
        unsafe { self.barriers.launch(call, &plan, stream) }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn overflow(chunk: usize) -> Error {
    Error::InvalidArgument(format!(
        "{ALLTOALL_COPY}: a chunk of {chunk} bytes times the world size overflows"
    ))
}
