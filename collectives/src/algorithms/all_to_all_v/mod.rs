//! All-to-all with per-peer counts and displacements ([`crate::Communicator::all_to_all_v`],
//! MPI's `Alltoallv`). Every rank's chunks have their own sizes, so the call's layout is
//! exchanged once per call on the host ([`VLayout`]). The SM kernels
//! (`kernels/src/device/alltoall.cu`) read it from their argument block
//! ([`kernel`]: `OxcclAlltoallvArgs`); the copy-engine algorithms move the data between
//! one-block barrier kernels that read no layout.
//!
//! | algorithm | buffers | how |
//! |---|---|---|
//! | `alltoallv_oneshot_ll` | any | small calls: every chunk as LL16 packets into a fixed-size slot of its owner's packet half (an acknowledgement where empty), no barrier |
//! | `alltoallv_direct` | outputs registered, or mapped by auto-registration | barrier; every block stores its share of every chunk straight into the peer's output; barrier |
//! | `alltoallv_copy` | outputs registered, or mapped by auto-registration | barrier; each chunk copied straight into its place in the peer's output; barrier |
//! | `alltoallv_staged` | any | in rounds of a slot of every peer's staging: chunks into the slots, barrier, slots into the output, barrier |

pub mod copy;
pub mod direct;
pub(crate) mod kernel;
pub mod one_shot;
pub mod staged;

use oxccl_hal::{Error, Result};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{broadcast::copy_engine, Algorithm, Call, Instance, Plan, SetupContext};
use crate::scratch::FlagRegion;

/// The barrier kernel (the copy-engine broadcast's: one block, one barrier over the
/// shared scratch, nothing else read from the argument block).
pub(crate) const BARRIER_KERNEL: &str = copy_engine::BARRIER_KERNEL;

/// One call as its algorithms launch it, in bytes; every rank holds the same `max_chunk`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VLayout {
    /// Index p: what this rank sends to rank p, as (offset in its input, bytes).
    pub send: Vec<(usize, usize)>,
    /// Index p: what this rank receives from rank p, as (offset in its output, bytes).
    pub recv: Vec<(usize, usize)>,
    /// Index p: where this rank's chunk for p lands in p's output (p's receive offset for
    /// this rank).
    pub remote: Vec<usize>,
    /// The largest chunk any rank sends to another rank (the staged rounds).
    pub max_chunk: usize,
    /// The largest chunk of the call, a rank's chunk to itself included: the same on every
    /// rank, the call's size for the selector and the SM kernels' plans (their grids must
    /// match across ranks).
    pub largest: usize,
}

/// The launch of each barrier: one block (a barrier needs a thread per rank).
pub(crate) use copy_engine::barrier_plan;

/// The setup of the staged algorithm, unless another one is forced: its barrier kernel
/// (never launched early: it follows copies), wrapped by `make`.
pub(crate) fn setup(
    ctx: &SetupContext<'_>,
    me: Algorithm,
    make: fn(ScratchKernel) -> Box<dyn Instance>,
) -> Result<Option<Box<dyn Instance>>> {
    if !ctx.wanted(me) {
        return Ok(None);
    }
    let barriers = ScratchKernel::load(ctx, me, FlagRegion::Packets)?.without_early_launch();
    Ok(Some(make(barriers)))
}

/// What the generic launch of an all_to_all_v algorithm answers: its calls come with a
/// layout, through [`crate::Communicator::all_to_all_v`].
pub(crate) fn needs_layout(call: &Call, name: &str) -> Error {
    Error::InvalidArgument(format!(
        "{name}: an all_to_all_v algorithm is launched with its per-peer layout \
         (Communicator::all_to_all_v), not as a call of {} elements",
        call.count
    ))
}

/// An all_to_all_v algorithm set up in a communicator.
pub(crate) trait VInstance: Instance {
    /// Queues one call: the layout's chunks of `call.input` into the peers' outputs
    /// (`call.peers` where the algorithm uses them); `plan` is the selector's for the call
    /// (the copy-engine algorithms launch their barrier plan instead).
    ///
    /// # Safety
    /// As [`Instance::launch`], with `layout` checked by the communicator against every
    /// rank's (the same `max_chunk` and matching chunk sizes everywhere), its ranges inside
    /// `call.input` and `call.output`.
    unsafe fn launch_v(
        &self,
        call: &Call,
        plan: &Plan,
        layout: &VLayout,
        stream: &oxccl_backend::AnyStream,
    ) -> Result<()>;
}

/// The [`VInstance`] behind an instance of an all_to_all_v algorithm.
pub(crate) fn as_v(instance: &dyn Instance) -> Option<&dyn VInstance> {
    let any = instance.as_any();
    if let Some(c) = any.downcast_ref::<copy::CopyAllToAllV>() {
        return Some(c);
    }
    if let Some(k) = any.downcast_ref::<kernel::VKernel>() {
        return Some(k);
    }
    any.downcast_ref::<staged::StagedAllToAllV>()
        .map(|s| s as &dyn VInstance)
}
