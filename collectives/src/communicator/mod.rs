//! The communicator: one per rank, one GPU per process.
//!
//! Setup ([`setup`], collective: every rank calls it): open the device (`LOCAL_RANK`), load
//! the kernels, allocate one scratch region in coherent memory ([`crate::scratch`]), zero
//! the parts that must start at zero, export it, exchange the handles through the
//! bootstrap, import every peer's (through the IPC handle cache), barrier so no rank
//! writes into a peer's scratch before the peer zeroed it, then set up every algorithm of
//! [`crate::algorithms::ALGORITHMS`] through its descriptor.
//!
//! Steady state ([`Communicator::all_reduce`], [`Communicator::all_gather`],
//! [`Communicator::reduce_scatter`], [`Communicator::all_to_all`],
//! [`Communicator::broadcast`], [`Communicator::reduce`], below): check
//! the call ([`check`]), choose the algorithm ([`crate::selector`]), one launch through the
//! algorithm's instance; every collective takes the same path. No host
//! synchronization, no host-side counter that advances per call (the epoch lives in device
//! memory and the kernel advances it), so calls can be captured into a CUDA graph and
//! replayed any number of times.
//!
//! The other concerns have their own modules: settings ([`config`]), registered buffers
//! ([`registry`]), tuning on this communicator ([`tune`]), NCCL's PreMulSum operator
//! ([`premul`]: a scale kernel before the sum, on the same path).
//!
//! Mismatched calls: the first call with a given (count, dtype, op, accum, algorithm) is
//! checked against every rank through the bootstrap (one all-gather, host side only, so
//! also fine while capturing); later calls with a signature already seen are not checked.
//! A rank that then calls with a different count, or skips a call, makes its peers' waits
//! time out (`timeout`, default 30 s): the kernel records the failure in device memory
//! ([`Communicator::check_error`]) on GPUs, and the host backend's stream reports it.
//! [`Communicator::abort`] (NCCL's `ncclCommAbort`) ends such waits promptly instead
//! ([`abort`]: an abort word in host memory that the kernels' waits read).

mod abort;
pub mod all_to_all_v;
pub mod auto_register;
pub mod call_record;
pub mod calls;
pub mod check;
pub mod config;
pub mod premul;
pub mod registration;
pub mod registry;
pub mod setup;
pub mod tune;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use oxccl_backend::{AnyBackend, AnyDevice, AnyModule, AnyStream};
use oxccl_channels::bootstrap::Bootstrap;
use oxccl_channels::local_exchange::LocalExchange;
use oxccl_hal::{
    AccumType, Backend, BackendKind, DataType, Device, DevicePtr, Error, ReduceOp, Result, Stream,
};

use crate::algorithms::{Algorithm, Call, CallShape, Collective, Instance, Plan};
use crate::scratch::{ScratchLayout, SharedScratch};
use crate::selector::{Choice, Selector};
use crate::tuner::TuneTable;
use auto_register::{AutoCall, AutoRegistry};
use call_record::{BufferPath, CallRecord};
use check::{check_call, CallSite, Signature, Signatures};
pub use config::{CommConfig, EARLY_LAUNCH_VAR, STAGING_VAR, TIMEOUT_VAR};
use premul::{PreMul, PreMulState, PREMUL_SIGNATURE_OP};
use registry::Registry;

/// A communicator of one rank. See the module docs for the protocol.
///
/// ```no_run
/// # use oxccl_collectives::{Communicator, hal::{DataType, ReduceOp, AccumType, Device, Memory, MemoryKind}};
/// # fn main() -> oxccl_collectives::hal::Result<()> {
/// let comm = Communicator::from_env()?; // RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT
/// let stream = comm.device().create_stream()?;
/// let buf = comm.device().alloc(4 << 20, MemoryKind::Plain)?;
/// // SAFETY: `buf` holds 1M f32 and outlives the call's completion (synchronized below).
/// unsafe {
///     comm.all_reduce(buf.ptr(), buf.ptr(), 1 << 20, DataType::F32, ReduceOp::Sum,
///                     AccumType::Auto, &stream)?;
/// }
/// oxccl_collectives::hal::Stream::synchronize(&stream)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Communicator {
    rank: u32,
    world: u32,
    config: CommConfig,
    selector: Selector,
    /// Every rank's device reaches its peers over NVLink (agreed at setup).
    nvlink: bool,
    /// The ranks are not all on one node (agreed at setup; `OXCCL_SEPARATE_HOSTS=1` makes
    /// every process its own node): no peer memory is mapped, the PortChannel algorithms
    /// serve the collectives that have one.
    multi_node: bool,
    /// The shared scratch's layout (plans size one-shots by it).
    layout: ScratchLayout,
    /// The algorithms set up here (in [`crate::algorithms::ALGORITHMS`] order).
    // Drop order matters: instances first (a PortChannel proxy thread stops before
    // anything it uses goes), then the peers' mappings of registered buffers, then the
    // shared scratch (the last Arc: the communicator's field is declared after the
    // instances), then the modules and the device.
    instances: Vec<(Algorithm, Box<dyn Instance>)>,
    /// Signatures already checked across ranks.
    signatures: Signatures,
    /// Registered user buffers.
    registry: Registry,
    /// Callers' allocations mapped for zero-copy without registration.
    auto: AutoRegistry,
    /// The per-call exchanges of `auto` on one node, through shared host memory (`None`:
    /// through the bootstrap).
    local: Option<LocalExchange>,
    /// Tuned tables by data type ([`Communicator::tune`]).
    tuned: Mutex<HashMap<DataType, Arc<TuneTable>>>,
    /// Every rank's shared scratch as mapped here, when an algorithm set up here uses it.
    scratch: Option<Arc<SharedScratch>>,
    /// The abort word every kernel's waits read and the failure word they write ([`abort`];
    /// after the instances: their argument blocks point at it).
    abort: abort::HostWords,
    /// PreMulSum's scale kernel and the buffers it writes into ([`premul`]).
    premul: PreMulState,
    /// What the most recent call did ([`Communicator::last_call`]).
    last_call: Mutex<Option<CallRecord>>,
    _modules: Vec<AnyModule>,
    bootstrap: Bootstrap,
    device: AnyDevice,
}

impl Communicator {
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> u32 {
        self.world
    }

    /// Whether every rank reaches its peers over NVLink (agreed at setup): what
    /// `oneshot_ll128` needs.
    pub fn nvlink(&self) -> bool {
        self.nvlink
    }

    /// Whether the ranks are not all on one node (agreed at setup; also with
    /// `OXCCL_SEPARATE_HOSTS=1`): then no peer memory is mapped and only the PortChannel
    /// algorithms run.
    pub fn multi_node(&self) -> bool {
        self.multi_node
    }

    /// Whether this rank's allreduce kernels are launched early (asked for by
    /// [`CommConfig::early_launch`] and supported by the device).
    pub fn early_launch(&self) -> bool {
        self.config.early_launch && self.device.capabilities().early_launch
    }

    /// The device this rank runs on.
    pub fn device(&self) -> &AnyDevice {
        &self.device
    }

    /// The bootstrap (for exchanging setup data, e.g. another library's unique id).
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.bootstrap
    }

    /// The settings.
    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    /// The algorithm and launch an allreduce on unregistered buffers would use (no launch).
    pub fn choose(&self, count: usize, dtype: DataType) -> Result<Choice> {
        self.choose_collective(Collective::AllReduce, count, dtype)
    }

    /// The algorithm and launch a call of `collective` on unregistered buffers would use
    /// (`count`: elements of one rank's input; no launch).
    pub fn choose_collective(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
    ) -> Result<Choice> {
        let bytes = dtype.bytes(count)?;
        self.select(&self.shape(collective, count, dtype, bytes, false))
    }

    /// The algorithm and launch an allreduce on these buffers would use (no launch).
    pub fn choose_for(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
    ) -> Result<Choice> {
        self.choose_collective_for(Collective::AllReduce, input, output, count, dtype)
    }

    /// The algorithm and launch a call of `collective` on these buffers would use
    /// (registered or not, as the call would see them; `count`: elements of one rank's
    /// input; no launch).
    pub fn choose_collective_for(
        &self,
        collective: Collective,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
    ) -> Result<Choice> {
        let bytes = dtype.bytes(count)?;
        let zc = self
            .registered_view(collective, input, output, bytes)
            .is_some();
        self.select(&self.shape(collective, count, dtype, bytes, zc))
    }

    /// The state of an algorithm set up in this communicator, if it is (for what it
    /// reports about itself; e.g. downcast to
    /// [`crate::algorithms::all_reduce::port_channel::PortAllreduce`]).
    pub fn instance(&self, algorithm: Algorithm) -> Option<&dyn Instance> {
        self.instances
            .iter()
            .find(|(a, _)| *a == algorithm)
            .map(|(_, i)| i.as_ref())
    }

    /// The selector's choice with this data type's tuned table, if any.
    fn select(&self, shape: &CallShape<'_>) -> Result<Choice> {
        let table = self
            .tuned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&shape.dtype)
            .cloned();
        self.selector.choose_tuned(shape, table.as_deref())
    }

    /// The tuned table of a data type, if one is in use.
    pub fn tuned_table(&self, dtype: DataType) -> Option<Arc<TuneTable>> {
        self.tuned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&dtype)
            .cloned()
    }

    fn shape(
        &self,
        collective: Collective,
        count: usize,
        dtype: DataType,
        bytes: usize,
        zero_copy: bool,
    ) -> CallShape<'_> {
        CallShape {
            collective,
            count,
            dtype,
            bytes,
            world_size: self.world,
            caps: self.device.capabilities(),
            packet_half_bytes: self.layout.packet_half,
            ll128_half_bytes: self.layout.ll128_half,
            nvlink: self.nvlink,
            multi_node: self.multi_node,
            host: Device::backend(&self.device) == BackendKind::Host,
            zero_copy,
        }
    }

    /// The entry checks of a call of `collective` on these buffers (pointers, sizes,
    /// overlap and NCCL's in-place rule) without launching anything: for callers that
    /// stage the data elsewhere before the call (the NCCL API on the host backend).
    pub fn check_buffers(
        &self,
        collective: Collective,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
    ) -> Result<()> {
        let site = CallSite {
            collective,
            rank: self.rank,
            world: self.world,
        };
        check_call(site, input, output, count, dtype, AccumType::Auto)
            .map(|_| ())
            .map_err(|e| e.at_rank(self.rank))
    }

    /// One call of any collective: check it, choose its algorithm, check the first call
    /// of its signature across ranks, launch. With `premul` (a reducing collective whose
    /// op is the sum), the input is multiplied by the scalar first ([`premul`]).
    ///
    /// # Safety
    /// The collective's public function's contract.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        &self,
        collective: Collective,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        (op, accum, root): (ReduceOp, AccumType, u32),
        premul: Option<PreMul>,
        stream: &AnyStream,
    ) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        self.check_not_aborted()?;
        if collective.has_root() && root >= self.world {
            return Err(at(Error::InvalidArgument(format!(
                "{collective}: root {root} is not a rank of {} ranks",
                self.world
            ))));
        }
        // A broadcast reads only the root's input, a reduce writes only the root's output
        // (NCCL ignores the others' sendbuff, resp. recvbuff).
        let (input, output) = collective.used_buffers(input, output, root, self.rank);
        if count == 0 {
            return Ok(());
        }
        let site = CallSite {
            collective,
            rank: self.rank,
            world: self.world,
        };
        let bytes = check_call(site, input, output, count, dtype, accum).map_err(at)?;
        // PreMulSum: the sum runs on the products, written where `premul_buffers` says.
        let user_input = input;
        let (input, output) = match premul {
            Some(_) => self
                .premul_buffers(collective, op, output, bytes, root)
                .map_err(at)?,
            None => (input, output),
        };
        let registered = self.registered_view(collective, input, output, bytes);
        let path = if registered.is_some() {
            BufferPath::Registered
        } else {
            BufferPath::Mapped
        };
        // The peers' buffers, or why they are out of reach.
        let (peers, refused) = match registered {
            Some(p) => (Some(p), None),
            None => {
                let call = AutoCall {
                    collective,
                    count: count as u64,
                    dtype: dtype.code(),
                    op: premul.map_or(op.code(), |_| PREMUL_SIGNATURE_OP),
                    accum: accum.code(),
                    root,
                };
                match self.auto_view(call, (count, dtype), input, output, bytes, stream)? {
                    Ok(p) => (Some(p), None),
                    Err(why) => (None, Some(why)),
                }
            }
        };
        let choice = self
            .select(&self.shape(collective, count, dtype, bytes, peers.is_some()))
            .map_err(at)?;
        // Registered buffers go to the algorithms that use them (reading the peers'
        // inputs, writing their outputs).
        let peers = peers.filter(|_| choice.algorithm.uses_registered());
        self.signatures.check(
            Signature {
                collective,
                count: count as u64,
                dtype: dtype.code(),
                op: premul.map_or(op.code(), |_| PREMUL_SIGNATURE_OP),
                accum: accum.code(),
                algorithm: choice.algorithm.code(),
                launch: (choice.plan.config.grid[0], choice.plan.config.block[0]),
                zc_offsets: peers.map_or((u64::MAX, u64::MAX), |z| z.offsets),
                root,
            },
            &self.bootstrap,
        )?;
        if let Some(scalar) = premul {
            // Every element of this rank's input: one chunk per rank for a reduce-scatter.
            let (in_bytes, _) = collective.buffer_bytes(bytes, self.world).map_err(at)?;
            // SAFETY: the caller's input holds `in_bytes` (checked above); the target is the
            // output (allreduce, as large) or the communicator's buffer of at least
            // `in_bytes`, live as long as the communicator; the caller keeps its buffers
            // and stream as the collective's contract says.
            unsafe {
                self.premul.launch(
                    &self.device,
                    (user_input, input),
                    in_bytes / dtype.size(),
                    dtype,
                    scalar,
                    stream,
                )
            }
            .map_err(at)?;
        }
        let call = Call {
            input,
            output,
            count,
            dtype,
            op,
            accum,
            root,
            peers,
        };
        // SAFETY: the caller's obligations (this function's contract); the plan came from
        // the selector for this call, which every rank made alike (signature checked).
        unsafe { self.launch(choice.algorithm, &choice.plan, &call, stream) }?;
        self.note_call(collective, choice.algorithm, path, peers.is_some(), refused);
        Ok(())
    }

    /// One launch of `algorithm` with `plan` (no selection, no cross-rank check).
    ///
    /// # Safety
    /// As [`Instance::launch`].
    pub(crate) unsafe fn launch(
        &self,
        algorithm: Algorithm,
        plan: &Plan,
        call: &Call,
        stream: &AnyStream,
    ) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        self.check_not_aborted()?;
        let instance = self.instance(algorithm).ok_or_else(|| {
            at(Error::Unsupported(format!(
                "{algorithm}: not set up in this communicator ({})",
                algorithm.descriptor().serves
            )))
        })?;
        // SAFETY: the caller's obligations, which are the instance's.
        unsafe { instance.launch(call, plan, stream) }.map_err(at)
    }

    /// Reads the failure words the kernels leave in device memory (a wait that timed out
    /// or was aborted, a bad argument block): the shared scratch's, then each algorithm's
    /// own; then [`Error::Aborted`] if the communicator was aborted
    /// ([`Communicator::abort`]) even where no kernel failed. Synchronizes `stream` first;
    /// not allowed while capturing. After a failure the communicator must be dropped: its
    /// counters no longer agree.
    pub fn check_error(&self, stream: &AnyStream) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        stream.synchronize().map_err(at)?;
        if let Some(scratch) = &self.scratch {
            let word = scratch.error_word().map_err(at)?;
            crate::device_error::read(stream, word, "the allreduce kernels", self.config.timeout)
                .map_err(at)?;
        }
        for (_, instance) in &self.instances {
            instance.check_error(stream).map_err(at)?;
        }
        self.check_not_aborted()
    }

    /// Tears down collectively: waits until every rank got here (so no peer still reads
    /// this rank's scratch), then releases imports, scratch, module and device in order.
    /// Streams that ran this communicator's work must be synchronized first. An aborted
    /// communicator ([`Communicator::abort`]) is released at once, without waiting for the
    /// peers (they may be dead), as NCCL's `ncclCommAbort` does; every peer holds its own
    /// reference to the memory it mapped from this rank.
    pub fn destroy(self) -> Result<()> {
        let rank = self.rank;
        if !self.is_aborted() {
            self.bootstrap.barrier().map_err(|e| e.at_rank(rank))?;
        }
        drop(self);
        Ok(())
    }

    /// Imported peer scratch regions (for tests: how many live mappings this rank holds).
    pub fn peer_mappings(&self) -> usize {
        self.scratch.as_ref().map_or(0, |s| s.peer_mappings())
    }
}

/// The HAL backend type the communicator dispatches through (for generic callers).
pub type CommBackend = AnyBackend;

#[allow(dead_code)]
fn _assert_backend(_: <AnyBackend as Backend>::Device) {}
