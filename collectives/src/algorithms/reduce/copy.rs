//! Copy-engine reduce on registered inputs ([`crate::Communicator::register`]), 2 ranks: a
//! barrier kernel (every peer's input is ready), then the root's pipeline
//! ([`CopyLane::pipeline`]): its copy engine pulls the peer's input chunk by chunk on a
//! second stream, and as each chunk lands a local kernel (`reduce_local`, no peer, no
//! barrier) reduces it with the root's input chunk, in rank order, into the output; then
//! the barrier kernel again (the root reads the peer's input no more). The other rank runs
//! the two barriers alone.
//!
//! Where the chunks land:
//! - **out of place**, in the root's output itself, where the local reduce adds the root's
//!   input to them. No landing is reused, so the chunks shrink towards the end
//!   ([`tail_schedule`]: 512, 256, ..., 16, 8, 8 MiB for 1 GiB): few chunk boundaries, and
//!   only the last small chunk's reduce follows the last copy;
//! - **in place** (the output holds the root's input), in two slots of the root's staging
//!   (half of it each, 32 MiB by default), reused every other chunk: chunks of a slot,
//!   shrinking to the same tail at the end.
//!
//! Why: the bytes that must cross are one rank's input, one way. The copy engine moves
//! 389-396 GB/s one way (2 H200s, ci/gpu/probe) against 362-375 for SM peer loads, and
//! `reduce_direct`'s loads reached 351 GB/s at 1 GiB (0.94x NCCL's ring). Each chunk
//! boundary costs about 4.4 us (ce_overlap_probe `pulls-K`: 1 GiB in one copy 2705 us, in
//! 8 copies 2737, in 32 copies 2840; a timeline of oxccl's graph shows 2.5-4.3 us between
//! consecutive copies, and an 8 MiB copy moving 335 GB/s against 388 for 64 MiB).
//!
//! More ranks are refused: the root's copy engine would pull every peer's input through its
//! one link in turn.
//!
//! Measured on 2 H200s (bf16, graph replay, every size checked, NCCL in the same run), out
//! of place with the shrinking chunks: 2769-2776 us for 1 GiB against NCCL's 2891-2896
//! (1.04-1.05x; 2897 with 32 MiB slots, `reduce_direct` 3085), 1413-1420 against 1454 at
//! 512 MiB (1.03x), 731-737 against 735-737 at 256 MiB (1.00-1.01x), 388-394 against
//! `reduce_direct`'s 390 and NCCL's 375 at 128 MiB. Tails of 4 or 8 MiB did best, 16 and
//! 32 MiB worse. In place (slots): 2908 us at 1 GiB (0.99x), 767 at 256 MiB (0.96x).
//! Before oxccl-perf allocated whole 2 MiB pages it took 4.0-4.2 ms: copy-engine copies
//! from a cudaIpc-opened block of 1 GiB + 64 bytes stalled beside SM work (see `copy_lane`).

use oxccl_backend::AnyStream;
use oxccl_hal::{Device, DevicePtr, Error, HostKernelTable, LaunchConfig, Result};
use oxccl_kernels::abi;

use super::direct::reduce_into_output;
use crate::algorithms::broadcast::copy_engine::{
    barrier_plan, host_kernel as barrier_kernel, BARRIER_KERNEL,
};
use crate::algorithms::copy_lane::{Barriered, CopyLane, Landing, Span, PIPELINE_DEPTH};
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

/// Environment variable: the last chunk of an out-of-place pull, in KiB (a measurement
/// knob; default [`DEFAULT_TAIL`]; `CommConfig::reduce_copy_tail_bytes`).
pub const TAIL_VAR: &str = "OXCCL_REDUCE_COPY_TAIL_KB";

/// The last chunk of an out-of-place pull: its reduce is all that follows the last copy,
/// while every chunk boundary costs the copy engine about 4.4 us (2 H200s,
/// ce_overlap_probe `pulls-K`: 2840 us for 1 GiB in 32 MiB copies, 2737 in 128 MiB ones,
/// 2705 in one). 8 MiB: a local reduce of about 6 us, 8 chunks for 1 GiB.
pub const DEFAULT_TAIL: usize = 8 << 20;

/// The chunks `(offset, bytes)` of a pull of `bytes`: from the end, `tail`, `tail`, then
/// each as large as all that follow it (at most `cap`), and the rest first, so every chunk
/// but the last lands while the ones after it are still being copied, and a chunk's reduce
/// (several times faster than its copy) is done before the copies after it are. Every
/// chunk starts 16-byte aligned and holds at most `cap` bytes (`tail` is kept at most half
/// of it); the bytes past the last 16-byte unit go to the last one.
///
/// Chunks up to three times all that follow them (fewer boundaries: 512, 384, 96, 24, 8 MiB
/// for 1 GiB) were tried on 2 H200s and lost: 2984 us against 2764-2766 at 1 GiB, 432
/// against 388-389 at 128 MiB, 1626-1629 against 1410-1412 at 512 MiB. The local reduce of a
/// large chunk beside the copy engine's writes does not end within the copies after it.
///
/// Two copy streams at once, each pulling half of the input in these chunks down to half the
/// tail (to hide one stream's gap between copies behind the other's), lost more: 3194-3223
/// us against 2769-2770 at 1 GiB, 482-487 against 389 at 128 MiB (2 H200s, 2026-11-28).
pub(crate) fn tail_schedule(bytes: usize, tail: usize, cap: usize) -> Vec<(usize, usize)> {
    let cap = cap.max(32) / 16 * 16;
    let tail = tail.clamp(16, cap / 2) / 16 * 16;
    let whole = bytes / 16 * 16;
    let mut sizes = Vec::new();
    let mut after = 0usize;
    let mut next = tail;
    while whole - after > next {
        sizes.push(next);
        after += next;
        next = after.min(cap);
    }
    let head = whole - after;
    match sizes.last_mut() {
        // A first chunk smaller than the tail is not worth a copy of its own.
        Some(last) if head < tail && *last + head <= cap => *last += head,
        _ => sizes.push(head),
    }
    let mut chunks = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for len in sizes.into_iter().rev().filter(|&l| l > 0) {
        chunks.push((at, len));
        at += len;
    }
    match chunks.last_mut() {
        Some(last) => last.1 += bytes - whole,
        None if bytes > 0 => chunks.push((0, bytes)),
        None => {}
    }
    chunks
}

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
            tail_bytes: ctx.reduce_copy_tail,
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
    /// The last chunk of an out-of-place pull (`CommConfig::reduce_copy_tail_bytes`).
    tail_bytes: usize,
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
        // Out of place the peer's chunks land in the root's output, where the local
        // reduce adds the root's input to them: no slot is reused, so the chunks may
        // shrink towards the end (`tail_schedule`) and only the last, small one's reduce
        // follows the last copy. In place the output holds the root's input: the chunks
        // land in two slots of the staging.
        let out_of_place = call.input != call.output;
        let mut spans = Vec::new();
        let mut chunks = Vec::new();
        if world == 2 && me == call.root {
            let peer = peers.inputs[((me + 1) % world) as usize];
            // Out of place chunk i lands at its own offset of the output; in place, in slot
            // i % PIPELINE_DEPTH of this rank's staging (`Some(slot bytes)`).
            let (landing, slot) = if out_of_place {
                chunks = tail_schedule(bytes, self.tail_bytes, usize::MAX);
                (call.output, None)
            } else {
                let staging = self.lane.staging();
                // Each slot a whole number of 16-byte units (every element size divides 16).
                let slot = (staging.bytes / PIPELINE_DEPTH) / 16 * 16;
                if slot == 0 {
                    return Err(Error::InvalidArgument(format!(
                        "{REDUCE_COPY}: a staging of {} bytes holds no slot",
                        staging.bytes
                    )));
                }
                // Chunks of at most a slot, shrinking to the tail at the end.
                chunks = tail_schedule(bytes, self.tail_bytes, slot);
                (
                    staging.bases[me as usize].offset(staging.offset)?,
                    Some(slot),
                )
            };
            for (i, &(at, len)) in chunks.iter().enumerate() {
                let dst = match slot {
                    None => landing.offset(at)?,
                    Some(slot) => landing.offset((i % PIPELINE_DEPTH) * slot)?,
                };
                spans.push(Span {
                    dst,
                    src: peer.offset(at)?,
                    bytes: len,
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
            // input the landed chunk (`len` bytes of this rank's staging or of the output
            // itself, written by the lane's copy that the pipeline ordered before this
            // launch, rewritten only after it); each unit is read before it is written.
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
                reduce_chunk(chunks[i].0, s.bytes, s.dst, on)
            };
            let landing = if out_of_place {
                Landing::Distinct
            } else {
                Landing::Slots
            };
            // SAFETY: between the barriers the peer only waits, so its registered input
            // (`bytes` at peers.inputs[p], same offset and size on every rank, checked by
            // the communicator) is not written. Out of place each span lands in its own
            // range of the root's output (the caller's, disjoint from its input), read and
            // written by that span's reduce alone; in place each lands in its slot of this
            // rank's staging (touched by no rank but this pipeline between the barriers),
            // reused PIPELINE_DEPTH spans apart.
            unsafe { lane.pipeline(stream, &spans, landing, reduce_span) }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunks tile the message in order, start 16-byte aligned, shrink towards the
    /// end down to the tail, and each chunk's reduce has the copies after it to hide in.
    #[test]
    fn tail_schedule_tiles_the_message_and_shrinks_to_the_tail() {
        const MIB: usize = 1 << 20;
        let check = |bytes: usize, tail: usize, cap: usize| {
            let chunks = tail_schedule(bytes, tail, cap);
            let mut at = 0;
            for &(offset, len) in &chunks {
                assert_eq!(offset, at, "{bytes}/{tail}: a gap or an overlap");
                assert_eq!(offset % 16, 0, "{bytes}/{tail}: unaligned chunk");
                assert!(len > 0, "{bytes}/{tail}: an empty chunk");
                assert!(
                    len <= cap.max(32) / 16 * 16,
                    "{bytes}/{tail}/{cap}: over the cap"
                );
                at += len;
            }
            assert_eq!(at, bytes, "{bytes}/{tail}: not the whole message");
            // From the second chunk on they never grow (the last may carry up to 15 odd
            // bytes); the first takes what the doubling left, at least a tail.
            let whole = |l: usize| l / 16 * 16;
            for w in chunks.iter().skip(1).collect::<Vec<_>>().windows(2) {
                assert!(whole(w[0].1) >= whole(w[1].1), "{chunks:?}");
            }
            if chunks.len() > 1 && cap == usize::MAX {
                assert!(chunks[0].1 >= tail.max(16) / 16 * 16, "{chunks:?}");
            }
            chunks
        };
        let sizes = |c: Vec<(usize, usize)>| c.iter().map(|&(_, l)| l / MIB).collect::<Vec<_>>();
        let free = usize::MAX;
        assert_eq!(
            sizes(check(1 << 30, 8 * MIB, free)),
            [512, 256, 128, 64, 32, 16, 8, 8]
        );
        assert_eq!(sizes(check(128 * MIB, 8 * MIB, free)), [64, 32, 16, 8, 8]);
        // 100 MiB: the doubling reaches 64, the rest (36) goes first.
        assert_eq!(sizes(check(100 * MIB, 8 * MIB, free)), [36, 32, 16, 8, 8]);
        // A remainder smaller than the tail joins the first chunk.
        assert_eq!(
            tail_schedule(64 * MIB + 4096, 8 * MIB, free)[0],
            (0, 32 * MIB + 4096)
        );
        // Capped (in place: the staging's 32 MiB slots): slots, then the shrinking tail;
        // a remainder that does not fit the first slot is a chunk of its own.
        assert_eq!(
            sizes(check(200 * MIB, 8 * MIB, 32 * MIB)),
            [8, 32, 32, 32, 32, 32, 16, 8, 8]
        );
        assert_eq!(
            tail_schedule(64 * MIB + 4096, 8 * MIB, 32 * MIB)[0],
            (0, 4096)
        );
        for bytes in [0, 1, 15, 16, 17, 1000, 12_345, (1 << 20) + 7, 300_000_002] {
            for tail in [16, 1000, MIB, 8 * MIB] {
                for cap in [32, 1024, 32 << 10, 32 * MIB, free] {
                    check(bytes, tail, cap);
                }
            }
        }
        assert!(tail_schedule(0, 8 * MIB, free).is_empty());
        assert_eq!(tail_schedule(5, 8 * MIB, free), [(0, 5)]);
        // Odd bytes past the last unit ride on the last chunk.
        let c = check(256 * MIB + 6, 8 * MIB, free);
        assert_eq!(c.last().map(|&(_, l)| l), Some(8 * MIB + 6));
    }
}
