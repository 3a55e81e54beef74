//! Copy-engine broadcast on registered outputs ([`crate::Communicator::register`]): a
//! barrier kernel (every peer's output is free), the root's copy engine moves its input into
//! every peer's registered output (`cuMemcpyAsync` between the mapped buffers, no SM
//! involved), and a second barrier kernel (every output is complete). Forced only
//! (`OXCCL_ALGO=broadcast_copy`): on 2 H100s one `cuMemcpyAsync` per peer moved 243 GB/s at
//! 1 GB against `broadcast_direct`'s 343, and was slower at every size from 1 MB.

use oxccl_backend::AnyStream;
use oxccl_hal::{Error, HostKernelTable, LaunchConfig, Result, Stream};

use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{
    require_registered, Algorithm, Buffers, Call, CallShape, Collective, Descriptor, Instance,
    Plan, SetupContext,
};
use crate::host_kernels::{barrier, Call as KernelCall};
use crate::scratch::FlagRegion;

/// Kernel symbol of the barriers (device image and host stand-in).
const KERNEL: &str = "broadcast_barrier";
/// The same barrier for the other copy-engine algorithms (all_to_all_v).
pub(crate) const BARRIER_KERNEL: &str = KERNEL;

/// The copy-engine broadcast.
pub const BROADCAST_COPY: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Broadcast,
    name: "broadcast_copy",
    aliases: &["broadcast_copy_engine", "broadcast_ce"],
    code: 404,
    serves: "broadcasts whose output lies 16-byte aligned in a buffer registered on every rank \
             (Communicator::register), at the same offset; world size 1..=8; the root's copy \
             engine moves the data",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "broadcast_barrier (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Registered,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| setup(ctx, me),
});

/// The launch of each barrier, or why it cannot serve the call (output not registered).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    require_registered(BROADCAST_COPY.descriptor().name, "the output", s)?;
    // One block: a barrier needs a thread per rank, nothing more.
    Ok(Plan {
        kernel: KERNEL,
        config: LaunchConfig::linear(1, 32),
    })
}

fn setup(ctx: &SetupContext<'_>, me: Algorithm) -> Result<Option<Box<dyn Instance>>> {
    if !ctx.wanted(me) {
        return Ok(None);
    }
    let barriers = ScratchKernel::load(ctx, me, FlagRegion::Packets)?.without_early_launch();
    Ok(Some(Box::new(CopyBroadcast { barriers })))
}

/// The barrier kernel; the copies are queued between its two launches.
#[derive(Debug)]
struct CopyBroadcast {
    barriers: ScratchKernel,
}

impl Instance for CopyBroadcast {
    unsafe fn launch(&self, call: &Call, plan: &Plan, stream: &AnyStream) -> Result<()> {
        let Some(peers) = call.peers else {
            return Err(Error::InvalidArgument(format!(
                "{BROADCAST_COPY}: needs outputs registered on every rank"
            )));
        };
        let bytes = call.dtype.bytes(call.count)?;
        // SAFETY: the caller's obligations (this trait method's contract) cover the call's
        // buffers and the plan; the barrier kernel takes the same argument block.
        unsafe { self.barriers.launch(call, plan, stream)? };
        let (me, world) = self.barriers.rank_and_world();
        if me == call.root {
            for k in 1..world {
                let p = ((me + k) % world) as usize;
                // SAFETY: peers.outputs[p] is rank p's registered output as mapped here,
                // holding `bytes` (same offset and size on every rank, checked by the
                // communicator); after the barrier no rank uses it until the next barrier.
                unsafe { stream.copy(peers.outputs[p], call.input, bytes)? };
            }
            if call.input != call.output {
                // SAFETY: the caller's input and output, `bytes` each.
                unsafe { stream.copy(call.output, call.input, bytes)? };
            }
        }
        // SAFETY: as the first launch; on the root it runs after the copies (stream order).
        unsafe { self.barriers.launch(call, plan, stream) }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The barrier kernel on the host backend: one barrier of block 0, as on the device.
pub(crate) fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = KernelCall::new(bytes, KERNEL)?;
    c.root()?;
    barrier(&c, 1)?;
    c.finish();
    Ok(())
}
