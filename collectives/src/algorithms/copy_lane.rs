//! A second stream for the copy-engine algorithms: the copies to the peers run on it, by
//! the copy engine or by the SMs (`oxccl_copy`, kernels/src/device/copy.cu, storing into
//! the peers' mapped buffers), while the SMs copy this rank's own data on the caller's
//! stream; the two streams join before the closing barrier.
//!
//! The copy engine moves 389-396 GB/s to a peer on 2 H200s, SM stores 361-370, and it
//! keeps that rate beside SM work on either GPU (ci/gpu/probe/bandwidth_probe.cu,
//! `ce+local`, `ce+busy`), so by default it moves the peers' data ([`PEERS_BY_VAR`]). It did
//! not in oxccl-perf until 2026-11-27: its buffers were cudaMalloc blocks of the size plus
//! 64 bytes, and a copy engine's copies to or from such a block opened through cudaIpc ran
//! at 240-300 GB/s while the SMs worked (2 H200s, ci/gpu/probe/ce_overlap_probe.cu, mode
//! `oxccl-perf`: reduce_copy's pipeline 3.9 ms against 2.85 for the same block rounded to
//! 64 KiB; cudaMalloc, VMM and the RDMA flag, one process or two, made no difference).
//!
//! [`Barriered`] queues a whole call of such an algorithm: its one-block barrier kernel
//! (every peer's destination is free), the copies, the barrier kernel again (every copy has
//! landed); the algorithms only say what goes where ([`Span`]).
//!
//! The fork and the join are an event record and a wait each, so a graph capture of the
//! caller's stream takes the lane's copies in as a parallel branch, and every fork is
//! joined even when a copy fails to queue (a capture with an unjoined branch cannot end).

use std::sync::{Mutex, MutexGuard};

use oxccl_backend::{AnyDevice, AnyEvent, AnyKernel, AnyStream};
use oxccl_hal::{Device, DevicePtr, Error, LaunchConfig, Result, Stream};
use oxccl_kernels::abi::{self, KernelArgs, OxcclCopyArgs};

use super::broadcast::copy_engine::barrier_plan;
use super::scratch_kernel::{ScratchKernel, Staging};
use super::{
    grid_of, max_blocks, require_registered, Algorithm, Call, CallShape, Instance, Plan,
    SetupContext,
};
use crate::scratch::FlagRegion;

/// The local copy kernel (kernels/src/device/copy.cu; its host stand-in in the kernels
/// crate's table).
const COPY_KERNEL: &str = "oxccl_copy";

/// Environment variable: what moves a copy-lane algorithm's data to the peers when the
/// rank also copies its own: `ce` (the copy engine, the default) or `sm` (the copy kernel
/// on the lane). Read at setup.
pub const PEERS_BY_VAR: &str = "OXCCL_COPY_LANE_PEERS";

/// The engine [`PEERS_BY_VAR`] names.
fn peers_by_from_env() -> Result<Engine> {
    parse_peers_by(std::env::var(PEERS_BY_VAR).ok().as_deref())
}

/// The engine a value of [`PEERS_BY_VAR`] names (unset or empty: the copy engine).
fn parse_peers_by(value: Option<&str>) -> Result<Engine> {
    match value.map(str::trim) {
        None | Some("" | "ce") => Ok(Engine::CopyEngine),
        Some("sm") => Ok(Engine::Sm),
        Some(other) => Err(Error::InvalidArgument(format!(
            "{PEERS_BY_VAR}='{other}' is neither 'ce' (copy engine) nor 'sm' (copy kernel)"
        ))),
    }
}

/// The barrier plan of the copy-lane algorithms (one block: a barrier needs a thread per
/// rank, nothing more), or why one cannot serve the call (`name`'s output not reachable).
pub(crate) fn plan(name: &str, s: &CallShape<'_>) -> Result<Plan> {
    require_registered(name, "the output", s)?;
    Ok(barrier_plan())
}

/// The setup of a copy-lane algorithm, unless another one is forced: its barrier kernel
/// (never launched early: the second barrier follows copies) and a lane, wrapped by `make`.
pub(crate) fn setup(
    ctx: &SetupContext<'_>,
    me: Algorithm,
    make: fn(Barriered) -> Box<dyn Instance>,
) -> Result<Option<Box<dyn Instance>>> {
    if !ctx.wanted(me) {
        return Ok(None);
    }
    Ok(Some(make(Barriered::load(ctx, me)?)))
}

/// A copy-lane algorithm's state: its one-block barrier kernel, its lane, and what moves
/// the peers' data beside a local copy ([`PEERS_BY_VAR`]).
#[derive(Debug)]
pub(crate) struct Barriered {
    barriers: ScratchKernel,
    lane: CopyLane,
    peers_by: Engine,
}

impl Barriered {
    /// The barrier kernel of `me` (never launched early: the second barrier follows
    /// copies) and a lane.
    pub(crate) fn load(ctx: &SetupContext<'_>, me: Algorithm) -> Result<Barriered> {
        Ok(Barriered {
            barriers: ScratchKernel::load(ctx, me, FlagRegion::Packets)?.without_early_launch(),
            lane: CopyLane::new(ctx)?,
            peers_by: peers_by_from_env()?,
        })
    }

    /// Every rank's staging region as mapped here (free between the two barriers: no
    /// algorithm but the running one touches a staging then).
    pub(crate) fn staging(&self) -> Staging {
        self.barriers.staging()
    }

    /// What moves the peers' data when this rank also copies its own ([`PEERS_BY_VAR`]).
    pub(crate) fn peers_by(&self) -> Engine {
        self.peers_by
    }

    /// This rank and the world size of the communicator.
    pub(crate) fn rank_and_world(&self) -> (u32, u32) {
        self.barriers.rank_and_world()
    }

    /// Queues one call on `stream`: the barrier kernel (every peer's destination is free),
    /// the copies ([`CopyLane::copy`]; nothing where there are none), and the barrier kernel
    /// again after the join (every copy has landed).
    ///
    /// # Safety
    /// [`Instance::launch`]'s obligations for `call` and `plan` (the barrier plan), and
    /// [`CopyLane::copy`]'s for the spans, with every peer's destination written by this
    /// rank alone between the two barriers.
    pub(crate) unsafe fn run(
        &self,
        call: &Call,
        plan: &Plan,
        stream: &AnyStream,
        to_peers: &[Span],
        peers_by: Engine,
        own: Option<Span>,
    ) -> Result<()> {
        let copies = |lane: &CopyLane| {
            if to_peers.is_empty() && own.is_none() {
                return Ok(());
            }
            // SAFETY: the caller's obligations cover the spans; the second barrier is
            // queued after the join, so no peer touches its destination before then.
            unsafe { lane.copy(stream, to_peers, peers_by, own) }
        };
        // SAFETY: the caller's obligations cover the call's buffers, the plan and the spans.
        unsafe { self.around(call, plan, stream, copies) }
    }

    /// Queues one call on `stream`: the barrier kernel (every peer's call has started),
    /// what `between` queues (given the lane, joined to `stream` before it returns), and
    /// the barrier kernel again (this rank's work between is done).
    ///
    /// # Safety
    /// [`Instance::launch`]'s obligations for `call` and `plan` (the barrier plan); what
    /// `between` queues must be sound while every peer is between its own two barriers.
    pub(crate) unsafe fn around(
        &self,
        call: &Call,
        plan: &Plan,
        stream: &AnyStream,
        between: impl FnOnce(&CopyLane) -> Result<()>,
    ) -> Result<()> {
        // SAFETY: the caller's obligations cover the call's buffers and the plan; the
        // barrier kernel reads nothing else from the argument block.
        unsafe { self.barriers.launch(call, plan, stream)? };
        between(&self.lane)?;
        // SAFETY: as the first launch; it runs after the work `between` queued.
        unsafe { self.barriers.launch(call, plan, stream) }
    }
}

/// What moves a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// `cuMemcpyAsync`: no SM involved.
    CopyEngine,
    /// The `oxccl_copy` kernel (to a peer: SM stores over NVLink).
    Sm,
}

/// One copy: `bytes` from `src` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub dst: DevicePtr,
    pub src: DevicePtr,
    pub bytes: usize,
}

/// How many destinations a [`CopyLane::pipeline`] keeps in use at once: the copy of one
/// while the caller's stream consumes the other.
pub(crate) const PIPELINE_DEPTH: usize = 2;

/// Where a [`CopyLane::pipeline`]'s copies land.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Landing {
    /// [`PIPELINE_DEPTH`] slots, reused: a copy waits for the consumer of its slot's last
    /// span.
    Slots,
    /// Every span its own destination: no copy waits for a consumer.
    Distinct,
}

/// The lane's stream, its fork and join events, and a pipeline's per-slot events.
#[derive(Debug)]
struct Lane {
    stream: AnyStream,
    forked: AnyEvent,
    joined: AnyEvent,
    /// Recorded on the lane when a slot's copy has been queued.
    copied: [AnyEvent; PIPELINE_DEPTH],
    /// Recorded on the caller's stream when a slot's consumer has been queued.
    consumed: [AnyEvent; PIPELINE_DEPTH],
}

/// A stream beside the caller's and the local copy kernel (see the module docs). One call
/// at a time uses the stream.
#[derive(Debug)]
pub(crate) struct CopyLane {
    lane: Mutex<Lane>,
    copy: AnyKernel,
    /// The copy kernel's grid: one block per multiprocessor (one on the host backend).
    copy_config: LaunchConfig,
}

impl CopyLane {
    /// A lane on the device being set up.
    pub(crate) fn new(ctx: &SetupContext<'_>) -> Result<Self> {
        Self::with_kernel(ctx.device, ctx.own_kernel(COPY_KERNEL)?)
    }

    fn with_kernel(device: &AnyDevice, copy: AnyKernel) -> Result<Self> {
        let copy_config = grid_of(device, max_blocks(device.capabilities()));
        Ok(Self {
            lane: Mutex::new(Lane {
                stream: device.create_stream()?,
                forked: device.create_sync_event()?,
                joined: device.create_sync_event()?,
                copied: [device.create_sync_event()?, device.create_sync_event()?],
                consumed: [device.create_sync_event()?, device.create_sync_event()?],
            }),
            copy,
            copy_config,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Lane> {
        // The lane holds no state between calls that a panic could leave half-made.
        self.lane.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `side` on the lane and `main` on `stream`, both after everything queued on
    /// `stream` so far and running at the same time; work queued on `stream` afterwards
    /// waits for both. The first error is returned, after the join is queued.
    pub(crate) fn fork_join(
        &self,
        stream: &AnyStream,
        side: impl FnOnce(&AnyStream) -> Result<()>,
        main: impl FnOnce(&AnyStream) -> Result<()>,
    ) -> Result<()> {
        self.forked(stream, |lane| {
            let sided = side(&lane.stream);
            sided.and(main(stream))
        })
    }

    /// Queues a pipeline beside `stream`: span i's copy by the copy engine on the lane,
    /// then `consume(i, stream)` on `stream` once it has landed, while the lane copies span
    /// i + 1. With [`Landing::Slots`], span i + [`PIPELINE_DEPTH`]'s copy waits for the
    /// work `consume(i)` queued, so spans that many apart may share a destination; with
    /// [`Landing::Distinct`] the copies never wait for a consumer. Work queued on `stream`
    /// afterwards waits for all of it; the first error is returned, after the join is
    /// queued.
    ///
    /// # Safety
    /// As [`CopyLane::copy`] for every span, with destinations reused only
    /// [`PIPELINE_DEPTH`] spans apart ([`Landing::Slots`]) or never ([`Landing::Distinct`]).
    pub(crate) unsafe fn pipeline(
        &self,
        stream: &AnyStream,
        spans: &[Span],
        landing: Landing,
        mut consume: impl FnMut(usize, &AnyStream) -> Result<()>,
    ) -> Result<()> {
        self.forked(stream, |lane| {
            for (i, span) in spans.iter().enumerate() {
                let slot = i % PIPELINE_DEPTH;
                if landing == Landing::Slots && i >= PIPELINE_DEPTH {
                    lane.stream.wait_event(&lane.consumed[slot])?;
                }
                // SAFETY: the caller's obligations cover the span; its destination's last
                // consumer (PIPELINE_DEPTH spans back) is done (the wait above).
                unsafe { self.queue(&lane.stream, span, Engine::CopyEngine)? };
                lane.stream.record(&lane.copied[slot])?;
                stream.wait_event(&lane.copied[slot])?;
                consume(i, stream)?;
                stream.record(&lane.consumed[slot])?;
            }
            Ok(())
        })
    }

    /// Forks the lane from `stream`, runs `body` (which queues on both), and joins the lane
    /// back whatever `body` returned: the fork already put the lane in a capture, which
    /// cannot end with a branch unjoined.
    fn forked(&self, stream: &AnyStream, body: impl FnOnce(&Lane) -> Result<()>) -> Result<()> {
        let lane = self.lock();
        stream.record(&lane.forked)?;
        lane.stream.wait_event(&lane.forked)?;
        let done = body(&lane);
        let joined = lane
            .stream
            .record(&lane.joined)
            .and_then(|()| stream.wait_event(&lane.joined));
        done.and(joined)
    }

    /// Queues the copies to the peers on the lane, one after another, by `peers_by`, and
    /// this rank's own copy on `stream` beside them by the SMs ([`CopyLane::fork_join`]).
    /// Empty spans queue nothing.
    ///
    /// # Safety
    /// Every span's ranges must be device memory reachable here (peers' through their
    /// mappings) of at least `bytes`, not overlapping, live and written by nothing else
    /// until the work queued on `stream` after this call has completed.
    pub(crate) unsafe fn copy(
        &self,
        stream: &AnyStream,
        to_peers: &[Span],
        peers_by: Engine,
        own: Option<Span>,
    ) -> Result<()> {
        let queue = |on: &AnyStream, s: &Span, by: Engine| {
            // SAFETY: the caller's obligations cover every span; the join orders the
            // lane's copies before whatever `stream` queues next.
            unsafe { self.queue(on, s, by) }
        };
        self.fork_join(
            stream,
            |side| to_peers.iter().try_for_each(|s| queue(side, s, peers_by)),
            |main| own.as_ref().map_or(Ok(()), |s| queue(main, s, Engine::Sm)),
        )
    }

    /// Queues one span's copy on `on`.
    ///
    /// # Safety
    /// As [`CopyLane::copy`].
    unsafe fn queue(&self, on: &AnyStream, s: &Span, by: Engine) -> Result<()> {
        if s.bytes == 0 {
            return Ok(());
        }
        match by {
            // SAFETY: the span's ranges, which the caller's obligations cover.
            Engine::CopyEngine => unsafe { on.copy(s.dst, s.src, s.bytes) },
            Engine::Sm => {
                let args = OxcclCopyArgs {
                    dst: abi::ptr(s.dst),
                    src: abi::ptr::<std::ffi::c_void>(s.src).cast_const(),
                    bytes: s.bytes as u64,
                };
                // SAFETY: the argument block is the one `oxccl_copy` takes; its ranges are
                // the span's, which the caller's obligations cover.
                unsafe { on.launch(&self.copy, &self.copy_config, args.as_bytes()) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_hal::{BackendKind, DeviceId, Memory, MemoryKind, Module};

    #[test]
    fn peers_by_names_an_engine_or_is_refused() {
        for (value, engine) in [
            (None, Engine::CopyEngine),
            (Some(""), Engine::CopyEngine),
            (Some(" ce "), Engine::CopyEngine),
            (Some("sm"), Engine::Sm),
        ] {
            assert_eq!(parse_peers_by(value).unwrap(), engine, "{value:?}");
        }
        let e = parse_peers_by(Some("dma")).unwrap_err().to_string();
        assert!(e.contains(PEERS_BY_VAR) && e.contains("'dma'"), "{e}");
    }

    fn host_lane(device: &AnyDevice) -> Result<CopyLane> {
        // The host module's table is static: its kernels outlive the module handle.
        let module = device.load_module(&oxccl_kernels::module_image(BackendKind::Host)?)?;
        CopyLane::with_kernel(device, module.kernel(COPY_KERNEL)?)
    }

    /// Both branches run after the work before the fork, and the work after the join sees
    /// both: a fill, then the lane copies one half while the caller's stream copies the
    /// other, then a read of the whole.
    #[test]
    fn both_branches_run_between_the_fork_and_the_join() -> Result<()> {
        let device = AnyDevice::open_with(BackendKind::Host, DeviceId(0))?;
        let stream = device.create_stream()?;
        let lane = host_lane(&device)?;
        let n = 1 << 20;
        let src = device.alloc(n, MemoryKind::Plain)?;
        let dst = device.alloc(n, MemoryKind::Plain)?;
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
        stream.write(src.ptr(), &data)?;
        // SAFETY: both allocations hold `n` bytes and live to the end of the test, which
        // synchronizes the stream (and through the join, the lane) before dropping them.
        unsafe { stream.fill(dst.ptr(), 0xEE, n)? };
        let half = n / 2;
        lane.fork_join(
            &stream,
            // SAFETY: the second halves of the two allocations (see above).
            |side| unsafe { side.copy(dst.ptr().offset(half)?, src.ptr().offset(half)?, half) },
            // SAFETY: the first halves.
            |main| unsafe { main.copy(dst.ptr(), src.ptr(), half) },
        )?;
        let mut out = vec![0u8; n];
        stream.read(dst.ptr(), &mut out)?;
        assert!(out == data, "the copies did not both land before the read");
        Ok(())
    }

    /// `copy`: the peers' spans on the lane's copy engine and the own span by the copy
    /// kernel, at an odd length and offset, every byte checked, nothing past the spans
    /// touched.
    #[test]
    fn copies_land_whole_and_nothing_else_changes() -> Result<()> {
        let device = AnyDevice::open_with(BackendKind::Host, DeviceId(0))?;
        let stream = device.create_stream()?;
        let lane = host_lane(&device)?;
        let n = 100_003;
        let src = device.alloc(n, MemoryKind::Plain)?;
        let dst = device.alloc(3 * n, MemoryKind::Plain)?;
        let data: Vec<u8> = (0..n).map(|i| (i * 13 + 5) as u8).collect();
        stream.write(src.ptr(), &data)?;
        // SAFETY: `dst` holds 3 * n bytes, `src` n; both live past the synchronizing read.
        unsafe { stream.fill(dst.ptr(), 0xEE, 3 * n)? };
        let span = |at: usize, bytes: usize| -> Result<Span> {
            Ok(Span {
                dst: dst.ptr().offset(at)?,
                src: src.ptr().offset(1)?,
                bytes,
            })
        };
        let peers = [span(3, n - 1)?, span(n + 7, 0)?];
        let check = |by: &str| -> Result<()> {
            let mut out = vec![0u8; 3 * n];
            stream.read(dst.ptr(), &mut out)?;
            assert!(out[..3].iter().all(|&b| b == 0xEE), "{by}: before the span");
            assert!(out[3..n + 2] == data[1..], "{by}: the lane's copy");
            let gap = &out[n + 2..2 * n + 1];
            assert!(gap.iter().all(|&b| b == 0xEE), "{by}: the empty span wrote");
            assert!(
                out[2 * n + 1..3 * n] == data[1..],
                "{by}: the local copy kernel"
            );
            Ok(())
        };
        // SAFETY: every span lies inside `dst` and `src` (see above), none overlapping.
        unsafe {
            lane.copy(
                &stream,
                &peers,
                Engine::CopyEngine,
                Some(span(2 * n + 1, n - 1)?),
            )?
        };
        check("copy engine")?;
        // The peers' spans again, by the copy kernel, over a fresh poison.
        // SAFETY: as above.
        unsafe { stream.fill(dst.ptr(), 0xEE, n + 2)? };
        // SAFETY: as above.
        unsafe { lane.copy(&stream, &peers, Engine::Sm, None)? };
        check("copy kernel")
    }

    /// An error on the lane's branch is returned, and the caller's stream stays usable
    /// (the join was queued).
    #[test]
    fn an_error_in_a_branch_is_returned_after_the_join() -> Result<()> {
        let device = AnyDevice::open_with(BackendKind::Host, DeviceId(0))?;
        let stream = device.create_stream()?;
        let lane = host_lane(&device)?;
        let failed = lane.fork_join(
            &stream,
            |_| Err(oxccl_hal::Error::InvalidArgument("refused".into())),
            |_| Ok(()),
        );
        assert!(matches!(failed, Err(oxccl_hal::Error::InvalidArgument(m)) if m == "refused"));
        stream.synchronize()?;
        Ok(())
    }
}
