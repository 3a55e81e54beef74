//! The algorithm collection: one descriptor per algorithm, each in its own file, holding
//! everything about it (name, code, kernel, plan, buffers, tuning, host stand-in, setup).
//! The communicator, the selector and the tuner only iterate [`ALGORITHMS`] and read
//! descriptors; none of them matches on an algorithm. Adding an algorithm is one new file
//! in its collective's module (its descriptor and host stand-in), its device kernel, and
//! one line in [`ALGORITHMS`] (and, to be chosen without being forced, in its
//! collective's policy in [`crate::selector`]).
//!
//! | name | collective | kernel | serves |
//! |---|---|---|---|
//! | `oneshot_ll` | allreduce | `allreduce_oneshot_ll` | small messages (latency): every rank writes its input as LL16 packets into every peer's scratch, then reduces all ranks' packets locally; one kernel, no barrier |
//! | `oneshot_ll128` | allreduce | `allreduce_oneshot_ll128` (bf16, f16 and f32 sums: `allreduce_oneshot_ll128_{bf16,f16,f32}_sum`) | the one-shot with 128-byte lines (7 data units + a flag) instead of 16-byte packets: 1.75x less NVLink traffic, CUDA only |
//! | `twoshot` | allreduce | `allreduce_twoshot` | medium and large on unregistered buffers: reduce-scatter then all-gather through the staging buffers, per-block barriers between the phases |
//! | `twoshot_zc` | allreduce | `allreduce_twoshot_zc` | medium and large on registered buffers ([`crate::Communicator::register`]): reduce-scatter reads the peers' inputs, all-gather stores into the peers' outputs; no staging copy, one pass |
//! | `twoshot_push` | allreduce | `allreduce_twoshot_push` | medium and large, registered or not: the two-shot with peer stores only (inputs pushed into the owner's staging, results pushed into the peers' outputs or staging) |
//! | `nvls` | allreduce | (not built) | NVLink SHARP multicast reduce; gated by `OXCCL_NVLS` and never run on the lent machines |
//! | `port_channel` | allreduce | `allreduce_port` | multi-node: every byte that leaves a rank is moved by its proxy (IPC copies, TCP, InfiniBand); set up where the ranks are on several nodes (or `OXCCL_SEPARATE_HOSTS=1`), or when forced |
//! | `allgather_oneshot_ll` | all-gather | `allgather_oneshot_ll` | small messages: LL16 packets into every peer's packet half, no barrier |
//! | `allgather_staged` | all-gather | `allgather_staged` | any size on unregistered buffers: pushed into the peers' staging, copied out locally |
//! | `allgather_direct` | all-gather | `allgather_direct` | registered outputs: stored straight into every peer's output between two barriers |
//! | `allgather_port` | all-gather | `allgather_port` | multi-node: the PortChannel machinery of `port_channel`, every input copied into its output slot |
//! | `reducescatter_oneshot_ll` | reduce-scatter | `reducescatter_oneshot_ll` | small messages: every peer's chunk as LL16 packets, reduced locally, no barrier |
//! | `reducescatter_staged` | reduce-scatter | `reducescatter_staged` | any size on unregistered buffers: chunks pushed into their owners' staging, reduced locally (the first half of the push two-shot) |
//! | `reducescatter_direct` | reduce-scatter | `reducescatter_direct` | registered inputs: every rank's chunk read straight from the peers' inputs between two barriers |
//! | `reducescatter_port` | reduce-scatter | `reducescatter_port` | multi-node: the PortChannel machinery of `port_channel`, chunk p to rank p, reduced there |
//! | `alltoall_oneshot_ll` | all-to-all | `alltoall_oneshot_ll` | small messages: every chunk as LL16 packets into its owner's packet half, no barrier |
//! | `alltoall_staged` | all-to-all | `alltoall_staged` | any size on unregistered buffers: chunks pushed into their owners' staging, copied out locally |
//! | `alltoall_direct` | all-to-all | `alltoall_direct` | registered outputs: every chunk stored straight into its owner's output between two barriers |
//! | `alltoall_copy` | all-to-all | `broadcast_barrier` | registered outputs, large messages: the copy engine copies each chunk into its owner's output (a second stream) while the caller's stream copies the own chunk, between two barrier kernels |
//! | `alltoallv_oneshot_ll` | all-to-all-v | `alltoallv_oneshot_ll` | small calls: every chunk as LL16 packets into a fixed-size slot of its owner's packet half (an acknowledgement where empty), no barrier |
//! | `alltoallv_direct` | all-to-all-v | `alltoallv_direct` | outputs every rank reaches (registered or auto-mapped): every chunk stored straight into its place in the peer's output between two barriers |
//! | `alltoallv_copy` | all-to-all-v | `broadcast_barrier` | outputs every rank reaches (registered or auto-mapped): the copy engine copies each chunk into its place in the peer's output between two barrier kernels |
//! | `alltoallv_staged` | all-to-all-v | `broadcast_barrier` | any buffers: the copy engine moves each chunk through its owner's staging, in rounds, between barrier kernels |
//! | `broadcast_oneshot_ll` | broadcast | `broadcast_oneshot_ll` | small messages: the root's LL16 packets into every peer's packet half, acknowledgements back, no barrier |
//! | `broadcast_staged` | broadcast | `broadcast_staged` | any size on unregistered buffers: the root pushes into the peers' staging, they copy out |
//! | `broadcast_direct` | broadcast | `broadcast_direct` | registered outputs: the root stores into every rank's output between two barriers |
//! | `broadcast_relay` | broadcast | `broadcast_relay` | registered outputs, 3 or more ranks: the root stores one chunk into each peer's output, each peer stores its chunk on into the others', in pipelined rounds |
//! | `broadcast_copy` | broadcast | `broadcast_barrier` | registered outputs, large messages: the root's copy engine copies into the peers' outputs (a second stream) while the caller's stream copies its own, between two barrier kernels |
//! | `reduce_oneshot_ll` | reduce | `reduce_oneshot_ll` | small messages: every rank's LL16 packets into the root's mailbox; no barrier, and the senders wait only for the root's previous call |
//! | `reduce_staged` | reduce | `reduce_staged` | any size on unregistered buffers: the other ranks push into the root's staging, the root reduces locally |
//! | `reduce_direct` | reduce | `reduce_direct` | registered inputs: the root reduces straight from every rank's input between two barriers |
//! | `reduce_relay` | reduce | `reduce_relay` | registered inputs, 3 or more ranks: each non-root rank reduces its chunk from every input into the root's staging, the root copies it out a round later |
//! | `reduce_copy` | reduce | `broadcast_barrier`, `reduce_local` | registered inputs, 1-2 ranks: the root's copy engine pulls the peer's input in chunks (out of place into the output, shrinking to a tail), a local kernel reduces each as it lands |
//!
//! Each collective's algorithms live in their own module ([`all_reduce`], [`all_gather`],
//! [`reduce_scatter`], [`all_to_all`], [`all_to_all_v`], [`broadcast`], [`reduce`]);
//! what several share lives beside them: the scratch-protocol launch ([`scratch_kernel`]),
//! the PortChannel machinery ([`port_channel`]).
//!
//! Ranks on several nodes (gathered at setup; `OXCCL_SEPARATE_HOSTS=1` makes every process
//! its own node): no algorithm that maps peer memory ([`Descriptor::maps_peers`]) is set
//! up, the selector takes each collective's PortChannel algorithm, and a collective
//! without one (all-to-all, all-to-all-v, broadcast, reduce) is refused with [`Error::Unsupported`].

pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all;
pub mod all_to_all_v;
pub mod broadcast;
pub(crate) mod copy_lane;
pub mod port_channel;
pub mod reduce;
pub mod reduce_scatter;
pub mod scratch_kernel;

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use oxccl_backend::{AnyDevice, AnyKernel, AnyModule, AnyStream};
use oxccl_channels::bootstrap::Bootstrap;
use oxccl_channels::hosts::Hosts;
use oxccl_hal::{
    AccumType, BackendKind, Capabilities, DataType, Device, DevicePtr, Error, HostKernelTable,
    LaunchConfig, Module, ModuleImage, ReduceOp, Result,
};
use oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS;

use all_gather::{
    direct::ALLGATHER_DIRECT, one_shot::ALLGATHER_ONESHOT_LL, port_channel::ALLGATHER_PORT,
    staged::ALLGATHER_STAGED,
};
use all_reduce::port_channel::PORT_CHANNEL;
use all_reduce::{nvls, one_shot, one_shot_ll128, two_shot, two_shot_push, two_shot_zc};
use all_to_all::{
    copy_engine::ALLTOALL_COPY, direct::ALLTOALL_DIRECT, one_shot::ALLTOALL_ONESHOT_LL,
    staged::ALLTOALL_STAGED,
};
use all_to_all_v::{
    copy::ALLTOALLV_COPY, direct::ALLTOALLV_DIRECT, one_shot::ALLTOALLV_ONESHOT_LL,
    staged::ALLTOALLV_STAGED,
};
use broadcast::{
    copy_engine::BROADCAST_COPY, direct::BROADCAST_DIRECT, one_shot::BROADCAST_ONESHOT_LL,
    relay::BROADCAST_RELAY, staged::BROADCAST_STAGED,
};
use reduce::{
    copy::REDUCE_COPY, direct::REDUCE_DIRECT, one_shot::REDUCE_ONESHOT_LL, relay::REDUCE_RELAY,
    staged::REDUCE_STAGED,
};
use reduce_scatter::{
    direct::REDUCESCATTER_DIRECT, one_shot::REDUCESCATTER_ONESHOT_LL,
    port_channel::REDUCESCATTER_PORT, staged::REDUCESCATTER_STAGED,
};

use crate::scratch::{ScratchLayout, SharedScratch};

/// Every algorithm of every collective, each collective's in the selector's order of
/// preference for small messages. The one list to extend when an algorithm is added.
pub const ALGORITHMS: &[Algorithm] = &[
    one_shot::ONESHOT_LL,
    one_shot_ll128::ONESHOT_LL128,
    two_shot::TWOSHOT,
    two_shot_zc::TWOSHOT_ZC,
    two_shot_push::TWOSHOT_PUSH,
    nvls::NVLS,
    PORT_CHANNEL,
    ALLGATHER_ONESHOT_LL,
    ALLGATHER_STAGED,
    ALLGATHER_DIRECT,
    ALLGATHER_PORT,
    REDUCESCATTER_ONESHOT_LL,
    REDUCESCATTER_STAGED,
    REDUCESCATTER_DIRECT,
    REDUCESCATTER_PORT,
    ALLTOALL_ONESHOT_LL,
    ALLTOALL_STAGED,
    ALLTOALL_DIRECT,
    ALLTOALL_COPY,
    ALLTOALLV_ONESHOT_LL,
    ALLTOALLV_STAGED,
    ALLTOALLV_DIRECT,
    ALLTOALLV_COPY,
    BROADCAST_ONESHOT_LL,
    BROADCAST_STAGED,
    BROADCAST_DIRECT,
    BROADCAST_RELAY,
    BROADCAST_COPY,
    REDUCE_ONESHOT_LL,
    REDUCE_STAGED,
    REDUCE_DIRECT,
    REDUCE_RELAY,
    REDUCE_COPY,
];

/// The collective operations algorithms serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Collective {
    /// Every rank gets the reduction of every rank's input.
    AllReduce = 0,
    /// Every rank gets every rank's input, in rank order.
    AllGather = 1,
    /// Rank r gets the reduction of chunk r of every rank's input.
    ReduceScatter = 2,
    /// Rank p gets chunk p of every rank's input, in rank order.
    AllToAll = 3,
    /// Every rank gets the root's input.
    Broadcast = 4,
    /// The root gets the reduction of every rank's input, in rank order.
    Reduce = 5,
    /// Rank p gets every rank's chunk for it, each rank's chunks of their own sizes and at
    /// their own displacements (MPI's `Alltoallv`).
    AllToAllV = 6,
}

impl Collective {
    /// Every collective, in declaration order (index = `as usize`).
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAllV,
    ];

    /// Bytes of one rank's input and output buffers for a call of `bytes` (`count`
    /// elements of the call's type, NCCL's count: an all-gather's send count, a
    /// reduce-scatter's receive count; all-to-all-v: the larger of one rank's send and
    /// receive extents).
    pub fn buffer_bytes(self, bytes: usize, world: u32) -> Result<(usize, usize)> {
        let all = || {
            bytes.checked_mul(world as usize).ok_or_else(|| {
                Error::InvalidArgument(format!("{self}: {bytes} bytes x {world} ranks overflow"))
            })
        };
        match self {
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::AllToAllV => Ok((bytes, bytes)),
            Collective::AllGather => Ok((bytes, all()?)),
            Collective::ReduceScatter => Ok((all()?, bytes)),
            Collective::AllToAll => Ok((all()?, all()?)),
        }
    }

    /// Where the input lies when the call is in place (NCCL's rules): the output itself
    /// (allreduce, broadcast, reduce), the output's slot `rank` (all-gather:
    /// `input == output + rank * count`),
    /// or where the output is the input's chunk `rank` (reduce-scatter:
    /// `output == input + rank * count`); none for all-to-all, which NCCL does not define
    /// in place.
    pub fn in_place_input(self, output: DevicePtr, bytes: usize, rank: u32) -> Option<DevicePtr> {
        let slot = bytes.checked_mul(rank as usize)? as u64;
        match self {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => Some(output),
            Collective::AllGather => output.0.checked_add(slot).map(DevicePtr),
            Collective::ReduceScatter => output.0.checked_sub(slot).map(DevicePtr),
            Collective::AllToAll | Collective::AllToAllV => None,
        }
    }

    /// Which buffers its zero-copy algorithms reach on the peers (and so must be
    /// registered): (inputs, outputs).
    pub fn peer_views(self) -> (bool, bool) {
        match self {
            Collective::AllReduce => (true, true),
            Collective::AllGather => (false, true),
            Collective::ReduceScatter | Collective::Reduce => (true, false),
            Collective::AllToAll | Collective::AllToAllV | Collective::Broadcast => (false, true),
        }
    }

    /// Whether calls reduce (take an op and an accumulation type).
    pub fn reduces(self) -> bool {
        match self {
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce => true,
            Collective::AllGather
            | Collective::AllToAll
            | Collective::AllToAllV
            | Collective::Broadcast => false,
        }
    }

    /// Whether calls name a root rank.
    pub fn has_root(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }

    /// The (input, output) a rank's call of a rooted collective actually uses, NCCL's
    /// semantics: a broadcast reads only the root's input (the others' may be anything,
    /// null included, and become their output: in place), a reduce writes only the root's
    /// output (the others' may be anything, null included, and become their input: in
    /// place, never written). Other collectives use both as given.
    pub fn used_buffers(
        self,
        input: DevicePtr,
        output: DevicePtr,
        root: u32,
        rank: u32,
    ) -> (DevicePtr, DevicePtr) {
        match self {
            Collective::Broadcast if rank != root => (output, output),
            Collective::Reduce if rank != root => (input, input),
            _ => (input, output),
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAllV => "all_to_all_v",
        })
    }
}

/// The algorithms `OXCCL_ALGO` forces: at most one per collective, each serving every
/// call of its collective; the collectives without one choose as usual.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forced([Option<Algorithm>; Collective::ALL.len()]);

impl Forced {
    /// Nothing forced.
    pub const NONE: Forced = Forced([None; Collective::ALL.len()]);

    /// The algorithm forced for `collective`, if any.
    pub fn of(&self, collective: Collective) -> Option<Algorithm> {
        self.0[collective as usize]
    }

    /// Whether some algorithm is forced for `collective` and it is not `algorithm`.
    pub fn excludes(&self, algorithm: Algorithm) -> bool {
        self.of(algorithm.collective())
            .is_some_and(|f| f != algorithm)
    }

    /// Whether `algorithm` is the one forced for its collective.
    pub fn is(&self, algorithm: Algorithm) -> bool {
        self.of(algorithm.collective()) == Some(algorithm)
    }

    /// Whether nothing is forced.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// The forced algorithms.
    pub fn iter(&self) -> impl Iterator<Item = Algorithm> + '_ {
        self.0.iter().flatten().copied()
    }
}

impl From<Algorithm> for Forced {
    fn from(algorithm: Algorithm) -> Forced {
        let mut f = Forced::NONE;
        f.0[algorithm.collective() as usize] = Some(algorithm);
        f
    }
}

impl From<Option<Algorithm>> for Forced {
    fn from(algorithm: Option<Algorithm>) -> Forced {
        algorithm.map_or(Forced::NONE, Forced::from)
    }
}

impl FromStr for Forced {
    type Err = Error;

    /// A comma-separated list of algorithm names, at most one per collective; empty or
    /// `auto`: nothing forced.
    fn from_str(s: &str) -> Result<Forced> {
        let mut f = Forced::NONE;
        for name in s.split(',').map(str::trim) {
            if name.is_empty() || name.eq_ignore_ascii_case("auto") {
                continue;
            }
            let a: Algorithm = name.parse()?;
            if let Some(other) = f.of(a.collective()) {
                return Err(Error::InvalidArgument(format!(
                    "'{s}' forces two {} algorithms ({other} and {a}); at most one per \
                     collective",
                    a.collective()
                )));
            }
            f.0[a.collective() as usize] = Some(a);
        }
        Ok(f)
    }
}

/// How an algorithm uses buffers registered on every rank ([`crate::Communicator::register`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffers {
    /// Only its own buffers and the communicator's scratch.
    Own,
    /// Writes the peers' outputs directly when they are registered, else goes through
    /// staging.
    PeerOutputsIfRegistered,
    /// Reads the peers' inputs and writes their outputs: needs both registered.
    Registered,
}

/// The launches the tuner tries for an algorithm.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// Threads per block tried (never more than one pass of the work needs).
    pub threads: &'static [u32],
    /// Work items (16-byte units, or lanes of lines) one launch spreads over its threads.
    pub work: fn(&CallShape<'_>) -> usize,
    /// Also try one block that covers the whole work in one pass (no count across blocks).
    pub one_block: bool,
    /// Competes for calls on registered buffers too (the staging two-shot does not: the
    /// zero-copy one is never slower there).
    pub on_registered: bool,
}

/// An algorithm's setup: its state in a communicator, or `None` where it is not set up
/// there (see [`Descriptor::setup`]).
pub type SetupFn = fn(&SetupContext<'_>, Algorithm) -> Result<Option<Box<dyn Instance>>>;

/// Everything about one algorithm. See the module docs.
pub struct Descriptor {
    /// The collective it serves.
    pub collective: Collective,
    /// Name as `OXCCL_ALGO` takes it.
    pub name: &'static str,
    /// Other names `OXCCL_ALGO` accepts.
    pub aliases: &'static [&'static str],
    /// Stable code, unique across collectives (exchanged between ranks to detect
    /// mismatched calls; stored in tune tables by name).
    pub code: u32,
    /// Where it wins and what it needs.
    pub serves: &'static str,
    /// Kernel symbol in the device image (and in [`Descriptor::host`]).
    pub kernel: &'static str,
    /// The host stand-in: the kernel as a host function, same name and argument block.
    pub host: HostKernelTable,
    /// The launch for a call, or why the algorithm cannot serve it.
    pub plan: fn(&CallShape<'_>) -> Result<Plan>,
    /// How it uses registered buffers.
    pub buffers: Buffers,
    /// Whether its setup maps the peers' memory (IPC: the shared scratch, or multicast),
    /// which needs every rank on one host. The algorithms that do not (PortChannel) reach
    /// peers through a proxy, also on other hosts.
    pub maps_peers: bool,
    /// What the tuner tries; `None`: never tuned.
    pub tuning: Option<Tuning>,
    /// Makes its per-communicator state at setup (collective: every rank calls it in the
    /// same order); `None` when it is not set up in this communicator.
    pub setup: SetupFn,
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("collective", &self.collective)
            .field("name", &self.name)
            .field("code", &self.code)
            .field("kernel", &self.kernel)
            .field("buffers", &self.buffers)
            .finish_non_exhaustive()
    }
}

/// One algorithm: a handle on its [`Descriptor`]. Equal when the codes are.
#[derive(Clone, Copy)]
pub struct Algorithm(&'static Descriptor);

impl Algorithm {
    /// The handle of a descriptor.
    pub const fn new(descriptor: &'static Descriptor) -> Algorithm {
        Algorithm(descriptor)
    }

    /// Its descriptor.
    pub fn descriptor(self) -> &'static Descriptor {
        self.0
    }

    /// The algorithm's name (as `OXCCL_ALGO` takes it).
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// Stable code (exchanged between ranks to detect mismatched calls).
    pub fn code(self) -> u32 {
        self.0.code
    }

    /// The collective it serves.
    pub fn collective(self) -> Collective {
        self.0.collective
    }

    /// The launch of this algorithm for a call, or why it cannot serve it.
    pub fn plan(self, shape: &CallShape<'_>) -> Result<Plan> {
        (self.0.plan)(shape)
    }

    /// Whether calls pass it every rank's view of registered buffers.
    pub fn uses_registered(self) -> bool {
        self.0.buffers != Buffers::Own
    }

    /// The algorithm of a stable code.
    pub fn from_code(code: u32) -> Option<Algorithm> {
        ALGORITHMS.iter().copied().find(|a| a.code() == code)
    }

    /// Every algorithm of one collective, in [`ALGORITHMS`] order.
    pub fn of(collective: Collective) -> impl Iterator<Item = Algorithm> {
        ALGORITHMS
            .iter()
            .copied()
            .filter(move |a| a.collective() == collective)
    }
}

impl PartialEq for Algorithm {
    fn eq(&self, other: &Self) -> bool {
        self.code() == other.code()
    }
}

impl Eq for Algorithm {}

impl Hash for Algorithm {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.code().hash(state);
    }
}

impl fmt::Debug for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = Error;

    /// By name or alias, case-insensitive.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        ALGORITHMS
            .iter()
            .copied()
            .find(|a| a.name() == s || a.0.aliases.contains(&s.as_str()))
            .ok_or_else(|| {
                let names: Vec<&str> = ALGORITHMS.iter().map(|a| a.name()).collect();
                Error::InvalidArgument(format!(
                    "unknown algorithm '{s}'; known: {}",
                    names.join(", ")
                ))
            })
    }
}

/// What an algorithm needs to know to decide whether it can serve a call and how to
/// launch it.
#[derive(Debug, Clone, Copy)]
pub struct CallShape<'a> {
    /// The collective.
    pub collective: Collective,
    /// Elements (of one rank's input).
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Bytes of one rank's input (an all-gather's output holds `world_size` times as many).
    pub bytes: usize,
    /// Ranks.
    pub world_size: u32,
    /// The device's capabilities.
    pub caps: &'a Capabilities,
    /// Bytes of one parity half of the packet region.
    pub packet_half_bytes: usize,
    /// Bytes of one parity half of the LL128 line region.
    pub ll128_half_bytes: usize,
    /// Every pair of ranks is connected by NVLink (agreed at setup; LL128 needs it).
    pub nvlink: bool,
    /// The ranks are not all on one node (agreed at setup; `OXCCL_SEPARATE_HOSTS=1` says
    /// so on one machine): only algorithms that map no peer memory can serve the call.
    pub multi_node: bool,
    /// Whether the kernels run as host functions (host backend).
    pub host: bool,
    /// Whether the call's buffers are 16-byte aligned inside buffers registered on every
    /// rank, at the same offsets (the zero-copy algorithms can serve the call): input and
    /// output where the collective reads the peers' inputs, else the output.
    pub zero_copy: bool,
}

/// A launch plan: which kernel and which grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Kernel name in the module.
    pub kernel: &'static str,
    /// Grid and block.
    pub config: LaunchConfig,
}

/// Every rank's input and output of one call on registered buffers (index = rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerBuffers {
    /// Every rank's input as mapped here.
    pub inputs: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// Every rank's output as mapped here.
    pub outputs: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// Offsets of input and output in their registered buffers (the same on every rank).
    pub offsets: (u64, u64),
}

/// One call as an algorithm's launch receives it, checked by the communicator.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// This rank's input.
    pub input: DevicePtr,
    /// This rank's output (`== input`: in place).
    pub output: DevicePtr,
    /// Elements.
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction.
    pub op: ReduceOp,
    /// Accumulation type.
    pub accum: AccumType,
    /// The root rank (broadcast, reduce; 0 for the collectives without one).
    pub root: u32,
    /// Every rank's buffers, when registered and the algorithm uses them.
    pub peers: Option<PeerBuffers>,
}

/// An algorithm's state in one communicator: its kernel and whatever resources of its own
/// it made at setup.
pub trait Instance: fmt::Debug + Send + Sync {
    /// Queues one call on `stream`: one kernel launch, no host synchronization.
    ///
    /// # Safety
    /// `call`'s buffers must be device memory of the communicator's device holding `count`
    /// elements, live until the work queued on `stream` completes, written by nothing
    /// else meanwhile; `plan` came from this algorithm's plan for this call, and every
    /// rank launches the same algorithm and plan in the same order.
    unsafe fn launch(&self, call: &Call, plan: &Plan, stream: &AnyStream) -> Result<()>;

    /// The failure its own device state records, if any (the communicator's shared
    /// scratch is checked by the communicator). `stream` is synchronized already.
    fn check_error(&self, _stream: &AnyStream) -> Result<()> {
        Ok(())
    }

    /// The instance as [`std::any::Any`], for callers that know its type (tests and tools
    /// reading what an algorithm reports about itself).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// What an algorithm's setup gets from the communicator being built.
#[derive(Debug)]
pub struct SetupContext<'a> {
    /// The job's bootstrap (setup exchanges are collective).
    pub bootstrap: &'a Bootstrap,
    /// This rank's device.
    pub device: &'a AnyDevice,
    /// The algorithms forced per collective.
    pub forced: Forced,
    /// Bound of every wait inside a kernel.
    pub timeout: Duration,
    /// The communicator's abort word as the device sees it (8 bytes of host memory mapped
    /// for the device): every kernel with bounded waits gets it in its argument block and
    /// ends its waits once it is non-zero.
    pub abort_flag: DevicePtr,
    /// Launch kernels early where the device can ([`oxccl_hal::LaunchConfig::early_launch`]).
    pub early_launch: bool,
    /// The last chunk of `reduce_copy`'s out-of-place pull ([`CommConfig::reduce_copy_tail_bytes`]).
    ///
    /// [`CommConfig::reduce_copy_tail_bytes`]: crate::CommConfig::reduce_copy_tail_bytes
    pub reduce_copy_tail: usize,
    /// The layout of the shared scratch, made on the first [`SetupContext::shared_scratch`].
    layout: ScratchLayout,
    /// The shared scratch, once some setup asked for it.
    scratch: std::cell::RefCell<Option<Arc<SharedScratch>>>,
    /// Settings of the PortChannel algorithms.
    pub port: &'a port_channel::PortConfig,
    /// Every rank's node (gathered once at setup).
    pub hosts: &'a Hosts,
    /// The PortChannel machinery, once some setup asked for it.
    port_state: std::cell::RefCell<Option<Arc<port_channel::PortState>>>,
    /// The device image, loaded once for every algorithm (GPU backends).
    image: &'a Option<AnyModule>,
    /// Host stand-in modules loaded so far (kept alive by the communicator).
    host_modules: std::cell::RefCell<Vec<AnyModule>>,
}

impl<'a> SetupContext<'a> {
    /// A context over the communicator's pieces. On GPU backends, `image` is the loaded
    /// device image of [`oxccl_kernels::module_image`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        bootstrap: &'a Bootstrap,
        device: &'a AnyDevice,
        forced: Forced,
        (timeout, abort_flag): (Duration, DevicePtr),
        (early_launch, reduce_copy_tail): (bool, usize),
        layout: ScratchLayout,
        (port, hosts): (&'a port_channel::PortConfig, &'a Hosts),
        image: &'a Option<AnyModule>,
    ) -> SetupContext<'a> {
        SetupContext {
            bootstrap,
            device,
            forced,
            timeout,
            abort_flag,
            early_launch,
            reduce_copy_tail,
            layout,
            scratch: std::cell::RefCell::new(None),
            port,
            hosts,
            port_state: std::cell::RefCell::new(None),
            image,
            host_modules: std::cell::RefCell::new(Vec::new()),
        }
    }

    /// The kernel of `algorithm`: from the device image, or its host stand-in on the
    /// host backend.
    pub fn kernel(&self, algorithm: Algorithm) -> Result<AnyKernel> {
        self.kernel_named(algorithm, algorithm.descriptor().kernel)
    }

    /// Another kernel of `algorithm` (one its host table also holds, e.g. `reduce_copy`'s
    /// local reduce beside its barrier): from the device image, or the host table.
    pub(crate) fn kernel_named(&self, algorithm: Algorithm, name: &str) -> Result<AnyKernel> {
        let d = algorithm.descriptor();
        match self.image {
            Some(module) => module.kernel(name),
            None => {
                let module = self.device.load_module(&ModuleImage::Host(&d.host))?;
                let kernel = module.kernel(name)?;
                self.host_modules.borrow_mut().push(module);
                Ok(kernel)
            }
        }
    }

    /// A kernel of the kernels crate itself (not an algorithm's, e.g. `oxccl_copy`): from
    /// the device image, or the kernels crate's host table on the host backend.
    pub(crate) fn own_kernel(&self, name: &str) -> Result<AnyKernel> {
        match self.image {
            Some(module) => module.kernel(name),
            None => {
                let image = oxccl_kernels::module_image(oxccl_hal::BackendKind::Host)?;
                let module = self.device.load_module(&image)?;
                let kernel = module.kernel(name)?;
                self.host_modules.borrow_mut().push(module);
                Ok(kernel)
            }
        }
    }

    /// Whether the ranks are not all on one node ([`Hosts`]; `OXCCL_SEPARATE_HOSTS=1`
    /// makes every process its own node).
    pub fn multi_node(&self) -> bool {
        !self.hosts.single_node()
    }

    /// Whether `algorithm` should be set up.
    /// - Ranks on several nodes: exactly the algorithms that map no peer memory (the
    ///   PortChannel ones), unless another algorithm of their collective is forced (a
    ///   forced algorithm that maps peer memory is set up nowhere; the selector refuses it).
    /// - One node: the algorithms that map peer memory, of those only the forced one where
    ///   a collective has one (a forced algorithm serves every call of its collective, so
    ///   the others would only take memory). Forcing one that maps none (`port_channel`)
    ///   says the ranks may be on different hosts: then the PortChannel algorithms serve
    ///   every collective that has no forced algorithm.
    pub fn wanted(&self, algorithm: Algorithm) -> bool {
        let maps_peers = algorithm.descriptor().maps_peers;
        let unforced_port = !maps_peers && !self.forced.excludes(algorithm);
        if self.multi_node() {
            unforced_port
        } else if self.forced.iter().any(|f| !f.descriptor().maps_peers) {
            self.forced.is(algorithm) || unforced_port
        } else {
            self.forced.is(algorithm) || (maps_peers && !self.forced.excludes(algorithm))
        }
    }

    /// The PortChannel machinery, made on the first request (collective: every rank's
    /// setups ask in the same order, as they run in [`ALGORITHMS`] order with the same
    /// configuration).
    pub fn port_state(&self) -> Result<Arc<port_channel::PortState>> {
        if let Some(s) = self.port_state.borrow().as_ref() {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(port_channel::PortState::new(
            self.bootstrap,
            self.device,
            self.hosts,
            self.port,
            (self.timeout, self.abort_flag),
        )?);
        *self.port_state.borrow_mut() = Some(Arc::clone(&s));
        Ok(s)
    }

    /// The communicator's shared scratch, made on the first request (collective: every
    /// rank's setups ask in the same order, as they run in [`ALGORITHMS`] order with the
    /// same configuration).
    pub fn shared_scratch(&self) -> Result<Arc<SharedScratch>> {
        if let Some(s) = self.scratch.borrow().as_ref() {
            return Ok(Arc::clone(s));
        }
        let s = Arc::new(SharedScratch::create(
            self.bootstrap,
            self.device,
            self.layout,
            "OXCCL_STAGING_MB, OXCCL_ONESHOT_MAX_BYTES",
        )?);
        *self.scratch.borrow_mut() = Some(Arc::clone(&s));
        Ok(s)
    }

    /// Whether the device runs kernels as host functions.
    pub fn host(&self) -> bool {
        Device::backend(self.device) == BackendKind::Host
    }

    /// What setup made that the communicator keeps: the host modules loaded (as long as
    /// the kernels) and the shared scratch, if some algorithm asked for it.
    pub(crate) fn into_parts(self) -> (Vec<AnyModule>, Option<Arc<SharedScratch>>) {
        (self.host_modules.into_inner(), self.scratch.into_inner())
    }
}

/// Threads per block of the device kernels.
pub(crate) const THREADS: u32 = 512;

/// The grid of a grid-stride kernel with `blocks` blocks of [`THREADS`] threads (one block
/// of 32 on the host backend, whose stand-ins run on one thread).
pub(crate) fn grid_of(device: &AnyDevice, blocks: u32) -> LaunchConfig {
    if oxccl_hal::Device::backend(device) == oxccl_hal::BackendKind::Host {
        LaunchConfig::linear(1, 32)
    } else {
        LaunchConfig::linear(blocks, THREADS)
    }
}

/// Blocks the device kernels may use: the multiprocessor count, at most the sync area's
/// per-block slots (every block must be resident: blocks spin on each other across GPUs).
pub(crate) fn max_blocks(caps: &Capabilities) -> u32 {
    caps.multiprocessors
        .clamp(1, oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_BLOCKS)
}

/// The launch of a kernel that moves one rank's `bytes` through the staging in blocks of
/// [`THREADS`] threads, one block per 512 units up to the whole chip (every block copies
/// its share of every slot); one host thread on the host backend.
pub(crate) fn staged_plan(kernel: &'static str, s: &CallShape<'_>) -> Plan {
    if s.host {
        return Plan {
            kernel,
            config: LaunchConfig::linear(1, 32),
        };
    }
    let units = s.bytes.div_ceil(16).max(1);
    let blocks = units
        .div_ceil(THREADS as usize)
        .clamp(1, max_blocks(s.caps) as usize) as u32;
    Plan {
        kernel,
        config: LaunchConfig::linear(blocks, THREADS),
    }
}

/// Fewest 16-byte units per block of a direct kernel before another block is added.
const DIRECT_UNITS_PER_BLOCK: usize = 256;

/// Why an algorithm that reaches the peers' buffers cannot serve a call whose buffers
/// (`needs`) are not registered on every rank, or `Ok`.
pub(crate) fn require_registered(name: &str, needs: &str, s: &CallShape<'_>) -> Result<()> {
    if !s.zero_copy {
        return Err(Error::Unsupported(format!(
            "{name}: {needs} must lie 16-byte aligned inside buffers registered on every \
             rank (Communicator::register), at the same offset"
        )));
    }
    Ok(())
}

/// The launch of a direct (zero-copy) kernel over one rank's `bytes`, or why it cannot
/// serve the call (`needs`: which buffers must be registered). Many SMs reach the peers
/// (each SM's NVLink throughput is limited): one block per 256 units up to the chip,
/// threads sized to about one pass.
pub(crate) fn direct_plan(kernel: &'static str, needs: &str, s: &CallShape<'_>) -> Result<Plan> {
    require_registered(kernel, needs, s)?;
    if s.host {
        return Ok(Plan {
            kernel,
            config: LaunchConfig::linear(1, 32),
        });
    }
    let units = s.bytes.div_ceil(16).max(1);
    let blocks = units
        .div_ceil(DIRECT_UNITS_PER_BLOCK)
        .clamp(1, max_blocks(s.caps) as usize);
    let threads =
        (units.div_ceil(blocks).next_multiple_of(32) as u32).clamp(64.max(s.world_size), THREADS);
    Ok(Plan {
        kernel,
        config: LaunchConfig::linear(blocks as u32, threads),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_codes_and_aliases_are_unique_and_round_trip() {
        for (i, a) in ALGORITHMS.iter().enumerate() {
            assert_eq!(a.name().parse::<Algorithm>().ok(), Some(*a));
            assert_eq!(Algorithm::from_code(a.code()), Some(*a));
            for alias in a.descriptor().aliases {
                assert_eq!(alias.parse::<Algorithm>().ok(), Some(*a), "{alias}");
            }
            for b in &ALGORITHMS[..i] {
                assert_ne!(a.code(), b.code(), "{a} and {b} share a code");
                assert_ne!(a.name(), b.name());
                assert!(!b.descriptor().aliases.contains(&a.name()));
            }
            // NVLS has no kernel yet: its plan always refuses, and it is never set up.
            if *a != nvls::NVLS {
                let d = a.descriptor();
                assert!(d.host.kernels.iter().any(|(n, _)| *n == d.kernel), "{a}");
            }
        }
        assert_eq!(
            "ONESHOT".parse::<Algorithm>().ok(),
            Some(one_shot::ONESHOT_LL)
        );
        let e = "ring".parse::<Algorithm>().unwrap_err().to_string();
        assert!(
            e.contains("oneshot_ll, oneshot_ll128, twoshot, twoshot_zc, twoshot_push"),
            "{e}"
        );
        assert_eq!(
            Collective::ALL
                .iter()
                .map(|c| Algorithm::of(*c).count())
                .sum::<usize>(),
            ALGORITHMS.len()
        );
        for (i, c) in Collective::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }

    #[test]
    fn forced_holds_one_algorithm_per_collective() {
        let f: Forced = "twoshot, allgather_direct".parse().unwrap();
        assert_eq!(f.of(Collective::AllReduce), Some(two_shot::TWOSHOT));
        assert_eq!(f.of(Collective::AllGather), Some(ALLGATHER_DIRECT));
        assert!(f.excludes(one_shot::ONESHOT_LL) && f.is(ALLGATHER_DIRECT));
        let one: Forced = "oneshot_ll".parse().unwrap();
        assert_eq!(one.of(Collective::AllGather), None);
        assert!(!one.excludes(ALLGATHER_STAGED));
        assert!("auto".parse::<Forced>().unwrap().is_empty());
        assert!("".parse::<Forced>().unwrap().is_empty());
        let e = "twoshot,oneshot_ll"
            .parse::<Forced>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("two all_reduce algorithms"), "{e}");
        assert!("twoshot,ring".parse::<Forced>().is_err());
    }

    #[test]
    fn kernels_are_in_the_device_source() {
        let cu = concat!(
            include_str!("../../../kernels/src/device/allgather.cu"),
            include_str!("../../../kernels/src/device/allreduce.cu"),
            include_str!("../../../kernels/src/device/allreduce_port.cu"),
            include_str!("../../../kernels/src/device/alltoall.cu"),
            include_str!("../../../kernels/src/device/broadcast.cu"),
            include_str!("../../../kernels/src/device/reduce.cu"),
            include_str!("../../../kernels/src/device/reducescatter.cu")
        );
        for a in ALGORITHMS {
            let k = a.descriptor().kernel;
            if *a != nvls::NVLS {
                assert!(
                    cu.contains(&format!(" void {k}(")),
                    "{k} not in the .cu files"
                );
            }
        }
    }
}
