//! Copy-engine reduce on registered inputs ([`crate::Communicator::register`]), 2 ranks: a
//! barrier kernel (every peer's input is ready), then the root's pipeline
//! ([`CopyLane::pipeline`]): its copy engine pulls the peer's input chunk by chunk into
//! two slots of its own staging on a second stream, and as each chunk lands a local kernel
//! (`reduce_local`, no peer, no barrier) reduces it with the root's input chunk, in rank
//! order, into the output; then the barrier kernel again (the root reads the peer's input
//! no more). The other rank runs the two barriers alone.
//!
//! Why: the bytes that must cross are one rank's input, one way. The copy engine moves
//! 389-396 GB/s one way (2 H200s, ci/gpu/probe) against 362-375 for SM peer loads, and
//! `reduce_direct`'s loads reached 351 GB/s at 1 GiB (0.94x NCCL's ring).
//!
//! More ranks are refused: the root's copy engine would pull every peer's input through its
//! one link in turn.
//!
//! Measured on 2 H200s (bf16, graph replay, every size checked, NCCL in the same run):
//! 2897 us for 1 GiB against `reduce_direct`'s 3082 and NCCL's 2894 (1.00x), 1476 against
//! 1456 at 512 MiB, 764 against 737 at 256 MiB, so the selector takes it from 256 MiB on 2
//! ranks with registered inputs. A timeline (ci/gpu/probe/gpu_trace.c) shows each 32 MiB
//! pull beside the previous chunk's 39 us local reduce. Staging of 16, 32 or 128 MiB
//! (chunks of half of it) did no better over 64 MiB-1 GiB; smaller local grids were slower.
//! Before oxccl-perf allocated whole 2 MiB pages it took 4.0-4.2 ms: copy-engine copies
//! from a cudaIpc-opened block of 1 GiB + 64 bytes stalled beside SM work (see `copy_lane`).
//! The ideal pipeline in ci/gpu/probe/ce_overlap_probe.cu reaches 376-379 GB/s, 1.02x
//! NCCL's reduce: the copy engine cannot give a reduce much of a lead.

use oxccl_backend::AnyStream;
use oxccl_hal::{Device, DevicePtr, Error, HostKernelTable, LaunchConfig, Result};
use oxccl_kernels::abi;

use super::direct::reduce_into_output;
use crate::algorithms::broadcast::copy_engine::{
    barrier_plan, host_kernel as barrier_kernel, BARRIER_KERNEL,
};
use crate::algorithms::copy_lane::{Barriered, CopyLane, Span, PIPELINE_DEPTH};
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{
    grid_of, max_blocks, Algorithm, Buffers, Call, CallShape, Collective, Descriptor, Instance,
    Plan,
};
use crate::communicator::config::env_number;
use crate::host_kernels::Call as KernelCall;
use crate::scratch::FlagRegion;

/// The local reduce kernel (kernels/src/device/reduce.cu; its host stand-in below).
const LOCAL_KERNEL: &str = "reduce_local";

/// Blocks of the local reduce kernel when set (a measurement knob; default one block per
/// multiprocessor).
pub const BLOCKS_VAR: &str = "OXCCL_REDUCE_COPY_BLOCKS";

/// The copy-engine reduce.
pub const REDUCE_COPY: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Reduce,
    name: "reduce_copy",
    aliases: &["reduce_copy_engine", "reduce_ce"],
    code: 504,
    serves: "reduces on 1 or 2 ranks whose input lies in a buffer registered on every rank \
             (Communicator::register), at the same offset; the root's copy engine pulls the \
             peer's input chunk by chunk while its SMs reduce the chunks already landed",
    kernel: BARRIER_KERNEL,
    host: HostKernelTable {
        name: "reduce_copy (host)",
        kernels: &[
            (BARRIER_KERNEL, barrier_kernel),
            (LOCAL_KERNEL, host_local_kernel),
        ],
    },
    plan,
    buffers: Buffers::Registered,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| {
        if !ctx.wanted(me) {
            return Ok(None);
        }
        let max = abi::OXCCL_ALLREDUCE_MAX_BLOCKS;
        let blocks = match env_number(BLOCKS_VAR)? {
            None => max_blocks(ctx.device.capabilities()),
            Some(b) => u32::try_from(b)
                .ok()
                .filter(|b| (1..=max).contains(b))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("{BLOCKS_VAR}={b} is not in 1..={max}"))
                })?,
        };
        Ok(Some(Box::new(CopyReduce {
            lane: Barriered::load(ctx, me)?,
            local: ScratchKernel::load_named(ctx, me, LOCAL_KERNEL, FlagRegion::Packets)?
                .without_early_launch(),
            local_config: grid_of(ctx.device, blocks),
        })))
    },
});

/// The launch of each barrier, or why it cannot serve the call (input not registered,
/// more than 2 ranks).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    let name = REDUCE_COPY.descriptor().name;
    if s.world_size > 2 {
        return Err(Error::Unsupported(format!(
            "{name}: serves 1 or 2 ranks, not {} (the root would pull every peer's input \
             through its one link in turn)",
            s.world_size
        )));
    }
    crate::algorithms::require_registered(name, "the input", s)?;
    Ok(barrier_plan())
}

/// The barriers and the lane, and the local reduce kernel with its grid.
#[derive(Debug)]
struct CopyReduce {
    lane: Barriered,
    local: ScratchKernel,
    local_config: LaunchConfig,
}

impl Instance for CopyReduce {
    unsafe fn launch(&self, call: &Call, plan: &Plan, stream: &AnyStream) -> Result<()> {
        let Some(peers) = call.peers else {
            return Err(Error::InvalidArgument(format!(
                "{REDUCE_COPY}: needs inputs registered on every rank"
            )));
        };
        let (me, world) = self.lane.rank_and_world();
        let size = call.dtype.bytes(1)?;
        let bytes = call.dtype.bytes(call.count)?;
        let staging = self.lane.staging();
        // Each slot a whole number of 16-byte units (every element size divides 16).
        let slot = (staging.bytes / PIPELINE_DEPTH) / 16 * 16;
        if slot == 0 {
            return Err(Error::InvalidArgument(format!(
                "{REDUCE_COPY}: a staging of {} bytes holds no slot",
                staging.bytes
            )));
        }
        // Span i pulls bytes [i * slot, i * slot + len) of the peer's input into slot
        // i % PIPELINE_DEPTH of this rank's staging.
        let mut spans = Vec::new();
        if world == 2 && me == call.root {
            let peer = peers.inputs[((me + 1) % world) as usize];
            let landing = staging.bases[me as usize].offset(staging.offset)?;
            for (i, at) in (0..bytes).step_by(slot).enumerate() {
                spans.push(Span {
                    dst: landing.offset((i % PIPELINE_DEPTH) * slot)?,
                    src: peer.offset(at)?,
                    bytes: slot.min(bytes - at),
                });
            }
        }
        // The local reduce of `len` bytes from `at` of the call's buffers with `landed`.
        let reduce_chunk = |at: usize, len: usize, landed: DevicePtr, on: &AnyStream| {
            let part = Call {
                input: call.input.offset(at)?,
                output: call.output.offset(at)?,
                count: len / size,
                ..*call
            };
            let mut args = self.local.args(&part)?;
            // Rank order: the root's input chunk and the peer's, landed here.
            args.peer_input[me as usize] = args.input;
            args.peer_input[((me + 1) % world) as usize] =
                abi::ptr::<std::ffi::c_void>(landed).cast_const();
            let local = Plan {
                kernel: LOCAL_KERNEL,
                config: self.local_config,
            };
            // SAFETY: the block is the one `reduce_local` takes; its input and output are
            // the caller's (`len` bytes from `at`, inside the call's buffers), its other
            // input the landed chunk (`len` bytes of this rank's staging, written by the
            // lane's copy that the pipeline ordered before this launch, rewritten only
            // after it: PIPELINE_DEPTH); in place each unit is read before it is written.
            unsafe { self.local.launch_args(&args, &local, on) }
        };
        let between = |lane: &CopyLane| {
            if world == 1 {
                // One rank: the reduction of its one input, by the local kernel.
                return reduce_chunk(0, bytes, call.input, stream);
            }
            if spans.is_empty() {
                return Ok(());
            }
            let reduce_span = |i: usize, on: &AnyStream| {
                let s: &Span = &spans[i];
                reduce_chunk(i * slot, s.bytes, s.dst, on)
            };
            // SAFETY: between the barriers the peer only waits, so its registered input
            // (`bytes` at peers.inputs[p], same offset and size on every rank, checked by
            // the communicator) is not written, and no rank touches this rank's staging but
            // this pipeline; each span's destination is its slot of that staging (`slot`
            // bytes), reused PIPELINE_DEPTH spans apart.
            unsafe { lane.pipeline(stream, &spans, reduce_span) }
        };
        // SAFETY: the caller's obligations cover the call's buffers and the plan; what
        // `between` queues is sound while the peer is between its barriers (see there).
        unsafe { self.lane.around(call, plan, stream, between) }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The local reduce on the host backend: the device kernel's loop on one thread.
fn host_local_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = KernelCall::new(bytes, LOCAL_KERNEL)?;
    let ins = c.peer_inputs()?;
    // SAFETY: `reduce_local`'s launch contract: every rank's pointer holds `total` bytes
    // of this device, written by nothing else during the kernel; in place each unit is
    // read before it is written.
    unsafe { reduce_into_output(&c, &ins[..c.world]) }
}
