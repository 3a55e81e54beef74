//! What the PortChannel algorithms share: the multi-node machinery. Every byte that leaves
//! a rank is moved by its proxy thread (IPC copies within a node, TCP or InfiniBand across
//! nodes), so nothing needs a load/store path between GPUs or a mapping of peer memory.
//!
//! One [`PortState`] per communicator serves every PortChannel algorithm (allreduce
//! `port_channel`, `allgather_port`, `reducescatter_port`): one scratch registered for the
//! transports, one PortChannel per peer through one proxy, the channels' device handles.
//! It is made by the first of their setups that runs ([`SetupContext::port_state`]); each
//! algorithm's instance ([`PortAlgorithm`]) is its kernel and a reference to it. The
//! kernels (`kernels/src/device/allreduce_port.cu`) and their host stand-ins ([`host`])
//! share one round counter in the scratch, so calls of different collectives follow each
//! other as one sequence of rounds (every rank makes the same calls in the same order).
//!
//! Setup (collective, at communicator creation): the transport to each peer comes from
//! every rank's node ([`oxccl_channels::hosts::Hosts`], gathered once by the communicator:
//! IPC on one node, else InfiniBand where both ends have it, else TCP;
//! `OXCCL_PORT_TRANSPORT` or [`PortConfig::transport`] forces one). The algorithms are set
//! up where the ranks are not all on one node (several nodes, or
//! `OXCCL_SEPARATE_HOSTS=1`), or when one of them is forced (`OXCCL_ALGO`): within a node
//! the NVLink algorithms are faster and the proxy thread costs a core.
//!
//! Protocol (three slots of `chunk_bytes`, rounds of at most a slot, `round_bytes`;
//! layout, steps and why three slots suffice in `abi_allreduce.h`): stage what leaves this
//! rank in `send[slot]`, `put_with_signal` it into this rank's slot of every peer's
//! `recv[slot]`; per round, stage the next round, wait for every peer's signal, push the
//! next round to each peer whose data landed, then reduce (allreduce, reduce-scatter) or
//! copy (all-gather) every rank's chunk of this round into the output. So the next round is
//! on the wire while this one is reduced. Flow control needs no extra signals: a peer sends
//! round g only after it reduced round g - 2 and received this rank's round g - 1. Every
//! wait is bounded (the call's timeout, the communicator's abort word and the semaphores'
//! spin limit); a timeout or an abort is recorded in the sync area's error word
//! ([`PortAlgorithm::check_error`]) and, on the host backend, returned by the stream.
//!
//! Serves any count and world sizes 1..=8 (one GPU per rank, any number of nodes among
//! them).

pub mod config;
pub mod host;

use std::sync::Arc;
use std::time::Duration;

use oxccl_backend::{AnyDevice, AnyKernel, AnyMemory, AnyStream};
use oxccl_channels::backing::Backing;
use oxccl_channels::bootstrap::Bootstrap;
use oxccl_channels::connection::{Connection, Transport, TransportSet};
use oxccl_channels::hosts::Hosts;
use oxccl_channels::port_channel::PortChannel;
use oxccl_channels::proxy::{Proxy, ProxyBuilder};
use oxccl_channels::registered_memory::RegisteredMemory;
use oxccl_hal::{
    AccumType, Device, DevicePtr, Error, HostKernelTable, LaunchConfig, Memory, MemoryKind,
    ReduceOp, Result, Stream,
};
use oxccl_kernels::abi::{
    self, KernelArgs, OxcclPortAllreduceArgs, OxcclPortChannel, OXCCL_ALLREDUCE_MAX_RANKS,
    OXCCL_PORT_ALLREDUCE_SYNC_BYTES, OXCCL_PORT_ALLREDUCE_SYNC_ERROR, OXCCL_PORT_ROUND_SLOTS,
};

use crate::algorithms::{
    Algorithm, Buffers, Call, CallShape, Collective, Descriptor, Instance, Plan, SetupContext,
    THREADS,
};
pub use config::{
    parse_transport, PortAllreduceConfig, PortConfig, CHUNK_VAR, DEFAULT_CHUNK, TRANSPORT_VAR,
};

/// First bootstrap user tag of the setup (connections and channels, per peer pair).
const TAG_BASE: u32 = 0x5041_5200;

/// The descriptor of a PortChannel algorithm: everything but its identity is shared.
pub(crate) const fn descriptor(
    collective: Collective,
    (name, aliases, code): (&'static str, &'static [&'static str], u32),
    serves: &'static str,
    kernel: &'static str,
    host: HostKernelTable,
    plan: fn(&CallShape<'_>) -> Result<Plan>,
) -> Descriptor {
    Descriptor {
        collective,
        name,
        aliases,
        code,
        serves,
        kernel,
        host,
        plan,
        buffers: Buffers::Own,
        maps_peers: false,
        tuning: None,
        setup,
    }
}

/// The setup of every PortChannel algorithm: its kernel and the shared machinery, where it
/// is wanted ([`SetupContext::wanted`]).
fn setup(ctx: &SetupContext<'_>, me: Algorithm) -> Result<Option<Box<dyn Instance>>> {
    if !ctx.wanted(me) {
        return Ok(None);
    }
    let state = ctx.port_state()?;
    let kernel = ctx.kernel(me).map_err(|e| e.at_rank(state.rank))?;
    Ok(Some(Box::new(PortAlgorithm {
        collective: me.collective(),
        kernel,
        state,
    })))
}

/// The launch of a PortChannel kernel: one block (thread p drives the channel to peer p;
/// every thread copies and reduces), one thread on the host backend.
pub(crate) fn plan(kernel: &'static str, s: &CallShape<'_>) -> Result<Plan> {
    if s.world_size == 0 || s.world_size > OXCCL_ALLREDUCE_MAX_RANKS {
        return Err(Error::Unsupported(format!(
            "{kernel}: world size {}, it serves 1..={OXCCL_ALLREDUCE_MAX_RANKS}",
            s.world_size
        )));
    }
    let config = if s.host {
        LaunchConfig::linear(1, 32)
    } else {
        LaunchConfig::linear(1, THREADS)
    };
    Ok(Plan { kernel, config })
}

/// Rounds a call is cut into, at least, where a round stays above [`MIN_ROUND`]: with
/// fewer, a call of one or two slots would leave the wire idle while it stages and reduces.
const PIPELINE_ROUNDS: usize = 8;
/// Smallest round of a call that has several: each round pays a trigger, a signal and
/// their wake-ups (tens of microseconds over TCP).
const MIN_ROUND: usize = 256 << 10;

/// Bytes of one round of a call that sends `total` bytes to each peer, with slots of
/// `slot` bytes: about `total / PIPELINE_ROUNDS`, at least [`MIN_ROUND`], at most a slot,
/// a multiple of 16.
pub(crate) fn round_bytes(total: usize, slot: usize) -> usize {
    (total / PIPELINE_ROUNDS)
        .max(MIN_ROUND)
        .next_multiple_of(16)
        .min(slot)
}

/// Byte offsets of the scratch (the same on every rank; see `abi_allreduce.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Bytes of one round (one slot).
    pub(crate) chunk: usize,
    /// `send[OXCCL_PORT_ROUND_SLOTS][world]`.
    pub(crate) send: usize,
    /// `recv[OXCCL_PORT_ROUND_SLOTS][world]`.
    pub(crate) recv: usize,
    /// Bytes of the whole scratch.
    pub(crate) total: usize,
}

impl Layout {
    pub(crate) fn new(world: u32, chunk: usize) -> Result<Layout> {
        let chunk = chunk.max(16).next_multiple_of(16);
        let send = OXCCL_PORT_ALLREDUCE_SYNC_BYTES as usize;
        let overflow = || Error::InvalidArgument(format!("PortChannel: chunk {chunk} too big"));
        let region = chunk
            .checked_mul(OXCCL_PORT_ROUND_SLOTS as usize * world.max(1) as usize)
            .ok_or_else(overflow)?;
        let recv = send.checked_add(region).ok_or_else(overflow)?;
        let total = recv.checked_add(region).ok_or_else(overflow)?;
        // Trigger offsets are 32 bits.
        if total > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "PortChannel: {total} bytes of scratch ({world} ranks x chunk {chunk}); a \
                 PortChannel reaches 4 GiB: lower {CHUNK_VAR}"
            )));
        }
        Ok(Layout {
            chunk,
            send,
            recv,
            total,
        })
    }
}

/// The PortChannel machinery of one communicator, shared by its PortChannel algorithms
/// (see the module docs).
#[derive(Debug)]
pub struct PortState {
    rank: u32,
    world: u32,
    layout: Layout,
    timeout: Duration,
    /// The communicator's abort word as the device sees it.
    abort_flag: DevicePtr,
    transports: Vec<Option<Transport>>,
    // Drop order: the proxy first (stops its thread, then releases channels, semaphores
    // and connections), then the handles, the registration and the scratch.
    proxy: Option<Proxy>,
    handles: Option<AnyMemory>,
    registration: RegisteredMemory,
    scratch: Backing,
    /// The kernels' round counter (`OxcclPortAllreduceArgs::rounds`), device memory.
    rounds: Backing,
}

impl PortState {
    /// Sets the machinery up (collective: every rank calls it with the same
    /// configuration). World sizes 1..=8. The kernels' waits are bounded by `timeout` and
    /// end when the abort word at `abort_flag` is set.
    pub(crate) fn new(
        bootstrap: &Bootstrap,
        device: &AnyDevice,
        hosts: &Hosts,
        config: &PortConfig,
        (timeout, abort_flag): (Duration, DevicePtr),
    ) -> Result<PortState> {
        let rank = bootstrap.rank();
        let world = bootstrap.world_size();
        let at = |e: Error| e.at_rank(rank);
        let _span = tracing::info_span!("port_channel", rank, world).entered();
        if world == 0 || world > OXCCL_ALLREDUCE_MAX_RANKS {
            return Err(at(Error::Unsupported(format!(
                "PortChannel: world size {world}, it serves 1..={OXCCL_ALLREDUCE_MAX_RANKS}"
            ))));
        }
        let layout = Layout::new(world, config.chunk_bytes).map_err(at)?;
        let transports = hosts.transports(config.transport);
        let set = transports
            .iter()
            .flatten()
            .fold(TransportSet::EMPTY, |s, t| s.with(*t));
        // World size 1 has no peer; registration needs one transport all the same.
        let set = if set.is_empty() {
            TransportSet::of(&[Transport::Tcp])
        } else {
            set
        };
        // Where only TCP peers read and write the scratch, it lives in pinned host memory
        // that the kernels reach through its device mapping: the sockets then move it in
        // place, with no bounce copies and no stream synchronization per put or signal.
        // IPC needs device memory (a copy engine writes it), InfiniBand writes GPU memory.
        let host_mapped = world > 1 && set == TransportSet::of(&[Transport::Tcp]);
        // The sync area must start at zero. The slots need no value, but the proxy's copies
        // (host API calls) read send slots only kernels wrote, which compute-sanitizer's
        // initcheck counted as uninitialized (2 H100s, every byte of every put): zeroing
        // them once here costs one memset at setup.
        let scratch =
            Backing::zeroed(device, layout.total, MemoryKind::Coherent, host_mapped).map_err(at)?;
        let registration = RegisteredMemory::new(device, rank, scratch.clone(), set).map_err(at)?;
        let rounds = Backing::zeroed(device, 8, MemoryKind::Coherent, false).map_err(at)?;
        let mut proxy = None;
        let mut handles = None;
        if world > 1 {
            let mut builder = ProxyBuilder::new(device, config.fifo_size).map_err(at)?;
            let mut chans = vec![OxcclPortChannel::default(); world as usize];
            // Ascending peer order: every rank meets its pairs in the same global order.
            for (peer, t) in transports.iter().enumerate() {
                let Some(t) = *t else { continue };
                let conn =
                    Connection::connect(bootstrap, device, peer as u32, t, TAG_BASE).map_err(at)?;
                chans[peer] = PortChannel::connect(
                    bootstrap,
                    device,
                    &mut builder,
                    Arc::new(conn),
                    &registration,
                    TAG_BASE + 2,
                )
                .map_err(at)?;
            }
            let p = builder.start().map_err(at)?;
            let bytes: Vec<u8> = chans
                .iter()
                .flat_map(|c| c.as_bytes().iter().copied())
                .collect();
            let mem = device.alloc(bytes.len(), MemoryKind::Plain).map_err(at)?;
            let stream = device.create_stream().map_err(at)?;
            stream.write(mem.ptr(), &bytes).map_err(at)?;
            stream.synchronize().map_err(at)?;
            proxy = Some(p);
            handles = Some(mem);
        }
        // No rank's kernel signals before every peer's proxy runs.
        bootstrap.barrier().map_err(at)?;
        tracing::info!(
            rank,
            world,
            ?transports,
            chunk = layout.chunk,
            host_mapped,
            "PortChannel machinery ready"
        );
        Ok(PortState {
            rank,
            world,
            layout,
            timeout,
            abort_flag,
            transports,
            proxy,
            handles,
            registration,
            scratch,
            rounds,
        })
    }

    /// The transport to each rank (`None` at this rank's index).
    pub fn transports(&self) -> &[Option<Transport>] {
        &self.transports
    }

    /// Bytes of one round.
    pub fn chunk_bytes(&self) -> usize {
        self.layout.chunk
    }

    /// Bytes of this rank's scratch allocation.
    pub fn scratch_bytes(&self) -> usize {
        self.registration.len()
    }

    /// Whether the scratch is pinned host memory (every peer is a TCP peer) rather than
    /// device memory.
    pub fn scratch_in_host_memory(&self) -> bool {
        matches!(self.scratch, Backing::HostMapped(_))
    }

    /// The argument block of one call.
    fn args(&self, call: &Call, op: ReduceOp, accum: AccumType) -> Result<OxcclPortAllreduceArgs> {
        // Bytes each rank sends each peer: the input (all-gather, allreduce) or one chunk
        // of it (reduce-scatter), `count` elements either way.
        let total = call.dtype.bytes(call.count)?;
        let round = round_bytes(total, self.layout.chunk);
        let round_bytes = u32::try_from(round).map_err(|_| {
            Error::InvalidArgument(format!(
                "PortChannel round of {round} bytes: lower {CHUNK_VAR}"
            ))
        })?;
        let channels = self.handles.as_ref().map_or(std::ptr::null(), |m| {
            abi::ptr::<OxcclPortChannel>(m.ptr()).cast_const()
        });
        Ok(OxcclPortAllreduceArgs {
            input: abi::ptr::<std::ffi::c_void>(call.input).cast_const(),
            output: abi::ptr(call.output),
            scratch: abi::ptr(self.scratch.ptr()),
            channels,
            count: call.count as u64,
            chunk_bytes: self.layout.chunk as u64,
            send_offset: self.layout.send as u64,
            recv_offset: self.layout.recv as u64,
            timeout_ns: u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX),
            abort_flag: abi::ptr::<u64>(self.abort_flag).cast_const(),
            rank: self.rank,
            world_size: self.world,
            dtype: call.dtype.code(),
            op: op.code(),
            accum: accum.code(),
            round_bytes,
            rounds: abi::ptr(self.rounds.ptr()),
        })
    }
}

/// A PortChannel algorithm in one communicator: its kernel and the shared machinery.
/// Reached through [`crate::Communicator::instance`] for what it reports about itself.
#[derive(Debug)]
pub struct PortAlgorithm {
    collective: Collective,
    kernel: AnyKernel,
    state: Arc<PortState>,
}

/// The name the instance had when only the allreduce had one.
pub type PortAllreduce = PortAlgorithm;

impl PortAlgorithm {
    /// The shared machinery.
    pub fn state(&self) -> &PortState {
        &self.state
    }

    /// The transport to each rank (`None` at this rank's index).
    pub fn transports(&self) -> &[Option<Transport>] {
        self.state.transports()
    }

    /// Bytes of one round.
    pub fn chunk_bytes(&self) -> usize {
        self.state.chunk_bytes()
    }

    /// Bytes of this rank's scratch allocation (shared by the PortChannel algorithms).
    pub fn scratch_bytes(&self) -> usize {
        self.state.scratch_bytes()
    }

    /// Whether the shared scratch is pinned host memory (every peer is a TCP peer).
    pub fn scratch_in_host_memory(&self) -> bool {
        self.state.scratch_in_host_memory()
    }
}

impl Instance for PortAlgorithm {
    unsafe fn launch(&self, call: &Call, plan: &Plan, stream: &AnyStream) -> Result<()> {
        // Data movement has no op: the kernels' argument check wants a valid one all the same.
        let (op, accum) = if self.collective.reduces() {
            (call.op, call.accum)
        } else {
            (ReduceOp::Sum, AccumType::Auto)
        };
        let args = self.state.args(call, op, accum)?;
        // SAFETY: the block matches the kernel (abi_allreduce.h); scratch and channel
        // handles are the shared state's live allocations (the proxy and its FIFO and
        // semaphores live as long as `self.state`), the abort word the communicator's
        // (dropped after its instances); input, output and plan are the caller's
        // obligation (the trait method's contract).
        unsafe { stream.launch(&self.kernel, &plan.config, args.as_bytes()) }
    }

    /// The error word the kernels leave in the shared scratch (a wait that timed out, a bad
    /// argument block), then the proxy's first failure. Every PortChannel algorithm reads
    /// the same word: the first failure names the PortChannel kernels, whichever ran.
    fn check_error(&self, stream: &AnyStream) -> Result<()> {
        let s = &self.state;
        let word = s
            .scratch
            .ptr()
            .offset(OXCCL_PORT_ALLREDUCE_SYNC_ERROR as usize)?;
        let proxy = s.proxy.as_ref().and_then(Proxy::error);
        let what = match &proxy {
            Some(p) => format!("the PortChannel kernels (proxy: {p})"),
            None => "the PortChannel kernels".into(),
        };
        crate::device_error::read(stream, word, &what, s.timeout)?;
        proxy.map_or(Ok(()), Err)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let l = Layout::new(8, 1000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l.chunk, 1008);
        assert_eq!(l.send, 4096);
        assert_eq!(l.recv, 4096 + 24 * 1008);
        assert_eq!(l.total, l.recv + 24 * 1008);
        assert!(Layout::new(8, 1 << 30).is_err());
    }

    #[test]
    fn rounds_pipeline_calls_of_a_few_slots() {
        let slot = DEFAULT_CHUNK;
        // Small calls: one round of MIN_ROUND bytes at most (the kernel trims the last).
        assert_eq!(round_bytes(1000, slot), MIN_ROUND);
        // 4 MiB (one slot): eight rounds of 512 KiB, not one.
        assert_eq!(round_bytes(4 << 20, slot), 512 << 10);
        assert_eq!((4usize << 20).div_ceil(round_bytes(4 << 20, slot)), 8);
        // Large calls: whole slots.
        assert_eq!(round_bytes(1 << 30, slot), slot);
        // Never more than a slot, always a multiple of 16.
        assert_eq!(round_bytes(1 << 20, 1008), 1008);
        assert_eq!(round_bytes((3 << 20) + 8, slot) % 16, 0);
    }
}
