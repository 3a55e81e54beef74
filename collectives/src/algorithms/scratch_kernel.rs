//! The launch shared by the algorithms whose kernels work through the communicator's
//! scratch ([`crate::scratch`]): one-shots (in their flag region) and two-shots. Their
//! kernels take one argument block, [`OxcclAllreduceArgs`] (all_to_all_v's SM kernels a
//! block that begins with it), filled here from the call, the plan and every rank's
//! scratch; their device state (epoch, counters, error word) lives in the shared scratch,
//! which the communicator checks.

use std::sync::Arc;

use oxccl_backend::{AnyKernel, AnyStream};
use oxccl_hal::{AccumType, DataType, DevicePtr, Error, ReduceOp, Result, Stream};
use oxccl_kernels::abi::{self, KernelArgs, OxcclAllreduceArgs, OXCCL_ALLREDUCE_MAX_RANKS};
use oxccl_kernels::reduce::Accumulator;

use super::{Algorithm, Buffers, Call, Instance, Plan, SetupContext};
use crate::scratch::{FlagRegion, SharedScratch};

/// A scratch-protocol algorithm set up in one communicator: its kernel and where it finds
/// everything else.
#[derive(Debug)]
pub struct ScratchKernel {
    algorithm: Algorithm,
    kernel: AnyKernel,
    /// Kernels of the same algorithm for one element type, op and accumulator each, taken
    /// for the calls they match instead of `kernel` (which dispatches over all of them).
    typed: Vec<(TypedKernel, AnyKernel)>,
    region: FlagRegion,
    scratch: Arc<SharedScratch>,
    timeout_ns: u64,
    /// The communicator's abort word as the device sees it.
    abort_flag: DevicePtr,
    early_launch: bool,
}

impl ScratchKernel {
    /// The setup of every scratch-protocol algorithm, unless another one is forced: load
    /// its kernel and take the shared scratch. `region` is the flag region its one-shot
    /// packets or lines use (two-shots ignore it).
    pub fn setup(
        ctx: &SetupContext<'_>,
        algorithm: Algorithm,
        region: FlagRegion,
    ) -> Result<Option<Box<dyn Instance>>> {
        Self::setup_typed(ctx, algorithm, region, &[])
    }

    /// The instance itself, for an algorithm whose own instance launches this kernel among
    /// other work (the copy-engine broadcast's barriers).
    pub(crate) fn load(
        ctx: &SetupContext<'_>,
        algorithm: Algorithm,
        region: FlagRegion,
    ) -> Result<ScratchKernel> {
        Self::load_named(ctx, algorithm, algorithm.descriptor().kernel, region)
    }

    /// As [`ScratchKernel::load`], for another kernel of the algorithm
    /// ([`SetupContext::kernel_named`]) that takes the same argument block.
    pub(crate) fn load_named(
        ctx: &SetupContext<'_>,
        algorithm: Algorithm,
        kernel: &str,
        region: FlagRegion,
    ) -> Result<ScratchKernel> {
        Ok(ScratchKernel {
            algorithm,
            kernel: ctx.kernel_named(algorithm, kernel)?,
            typed: Vec::new(),
            region,
            scratch: ctx.shared_scratch()?,
            timeout_ns: u64::try_from(ctx.timeout.as_nanos()).unwrap_or(u64::MAX),
            abort_flag: ctx.abort_flag,
            early_launch: ctx.early_launch,
        })
    }

    /// As [`ScratchKernel::setup`], with the algorithm's kernels for single types (`typed`,
    /// from the same image or host table) loaded beside its generic one.
    pub fn setup_typed(
        ctx: &SetupContext<'_>,
        algorithm: Algorithm,
        region: FlagRegion,
        typed: &[TypedKernel],
    ) -> Result<Option<Box<dyn Instance>>> {
        if !ctx.wanted(algorithm) {
            return Ok(None);
        }
        let mut instance = Self::load(ctx, algorithm, region)?;
        for t in typed {
            instance
                .typed
                .push((*t, ctx.kernel_named(algorithm, t.kernel)?));
        }
        Ok(Some(Box::new(instance)))
    }

    /// The kernel for `call`: the first typed kernel that matches it, else the generic one.
    fn kernel_for(&self, call: &Call) -> &AnyKernel {
        self.typed
            .iter()
            .find(|(t, _)| t.matches(call.dtype, call.op, call.accum))
            .map_or(&self.kernel, |(_, kernel)| kernel)
    }

    /// This rank and the world size of the communicator.
    pub(crate) fn rank_and_world(&self) -> (u32, u32) {
        (self.scratch.rank, self.scratch.world)
    }

    /// Every rank's staging region ("in", the one the copy-engine algorithms use) as
    /// mapped here.
    pub(crate) fn staging(&self) -> Staging {
        Staging {
            bases: self.scratch.bases,
            offset: self.scratch.layout.data_offset,
            bytes: self.scratch.layout.staging,
        }
    }

    /// Launches are never early: the kernel follows copies, not a kernel that lets it start.
    pub(crate) fn without_early_launch(mut self) -> ScratchKernel {
        self.early_launch = false;
        self
    }
}

/// Every rank's staging region as mapped in this process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Staging {
    /// Every rank's scratch (index = rank).
    pub(crate) bases: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// Where the region starts in every scratch.
    pub(crate) offset: usize,
    /// Its bytes.
    pub(crate) bytes: usize,
}

/// A kernel of an algorithm built for one element type, op and accumulator: the generic
/// kernel's body without its dispatch over every reducer (a smaller kernel that starts
/// sooner). The device kernel refuses any other call as a bad argument block, so a call
/// takes it only when [`TypedKernel::matches`] says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypedKernel {
    /// Kernel symbol (device image and host table).
    pub kernel: &'static str,
    /// The element type it reduces.
    pub dtype: DataType,
    /// The op.
    pub op: ReduceOp,
    /// The accumulator the call's accumulation type resolves to
    /// ([`Accumulator::new`], as the device's `resolve_accum`).
    pub accumulator: Accumulator,
}

impl TypedKernel {
    /// Whether a call of `dtype` and `op` with accumulation type `accum` is this kernel's
    /// (`accum` resolved for `dtype` as the device's `resolve_accum` does).
    pub fn matches(&self, dtype: DataType, op: ReduceOp, accum: AccumType) -> bool {
        self.dtype == dtype && self.op == op && self.accumulator == Accumulator::new(dtype, accum)
    }
}

impl ScratchKernel {
    /// The argument block of `call`: the call's buffers (every rank's where the algorithm
    /// uses registered ones), every rank's scratch and this communicator's state.
    pub(crate) fn args(&self, call: &Call) -> Result<OxcclAllreduceArgs> {
        let peers = match (self.algorithm.descriptor().buffers, call.peers) {
            (Buffers::Registered, None) => {
                return Err(Error::InvalidArgument(format!(
                    "{}: needs buffers registered on every rank",
                    self.algorithm
                )))
            }
            (Buffers::Own, _) => None,
            (_, peers) => peers,
        };
        let s = &*self.scratch;
        let mut peer_input = [std::ptr::null(); OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut peer_output = [std::ptr::null_mut(); OXCCL_ALLREDUCE_MAX_RANKS as usize];
        if let Some(p) = peers {
            for r in 0..s.world as usize {
                peer_input[r] = abi::ptr::<std::ffi::c_void>(p.inputs[r]).cast_const();
                peer_output[r] = abi::ptr(p.outputs[r]);
            }
        }
        let (flag_offset, flag_half) = s.layout.flag_region(self.region);
        Ok(OxcclAllreduceArgs {
            input: abi::ptr::<std::ffi::c_void>(call.input).cast_const(),
            output: abi::ptr(call.output),
            scratch: s.bases.map(abi::ptr),
            count: call.count as u64,
            packet_offset: flag_offset as u64,
            packet_half_bytes: flag_half as u64,
            data_offset: s.layout.data_offset as u64,
            data_bytes: s.layout.staging as u64,
            timeout_ns: self.timeout_ns,
            abort_flag: abi::ptr::<u64>(self.abort_flag).cast_const(),
            rank: s.rank,
            world_size: s.world,
            dtype: call.dtype.code(),
            op: call.op.code(),
            accum: call.accum.code(),
            root: call.root,
            peer_input,
            peer_output,
        })
    }

    /// Launches this kernel with `args` (its argument block: [`OxcclAllreduceArgs`], or a
    /// block that begins with one) on the plan's grid.
    ///
    /// # Safety
    /// As [`Instance::launch`]; `args` is the block this kernel takes, built by
    /// [`ScratchKernel::args`] (plus what the kernel reads beyond it).
    pub(crate) unsafe fn launch_args<A: KernelArgs>(
        &self,
        args: &A,
        plan: &Plan,
        stream: &AnyStream,
    ) -> Result<()> {
        // SAFETY: the caller's obligations, passed on; `self.kernel` takes the block.
        unsafe { self.launch_kernel(&self.kernel, args, plan, stream) }
    }

    /// As [`ScratchKernel::launch_args`], with `kernel` (this instance's generic kernel or
    /// one of its typed ones: all take the same argument block).
    ///
    /// # Safety
    /// As [`ScratchKernel::launch_args`].
    unsafe fn launch_kernel<A: KernelArgs>(
        &self,
        kernel: &AnyKernel,
        args: &A,
        plan: &Plan,
        stream: &AnyStream,
    ) -> Result<()> {
        // Asked for as configured: the backend launches as usual where the device cannot.
        let config = plan.config.with_early_launch(self.early_launch);
        // SAFETY: the argument block matches the kernel (abi_allreduce.h; the caller's
        // obligation); the scratch pointers are the communicator's live mappings and the
        // abort word its live host-mapped allocation (both kept until it drops, after this
        // instance); input, output and the plan are the caller's obligation. Every scratch kernel waits for the previous grid before it
        // touches memory (`run_call` in allreduce_device.hpp), which an early launch requires.
        unsafe { stream.launch(kernel, &config, args.as_bytes()) }
    }
}

impl Instance for ScratchKernel {
    unsafe fn launch(&self, call: &Call, plan: &Plan, stream: &AnyStream) -> Result<()> {
        let args = self.args(call)?;
        // SAFETY: the caller's obligations (this trait method's contract); the block is
        // the one every scratch kernel takes, typed ones included.
        unsafe { self.launch_kernel(self.kernel_for(call), &args, plan, stream) }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
