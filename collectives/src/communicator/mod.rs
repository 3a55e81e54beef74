//! The communicator: one per rank, one GPU per process.
//!
//! Setup (collective, every rank calls it): open the device (`LOCAL_RANK`), load the
//! kernels, allocate one scratch region in coherent memory (sync counters, LL packet
//! halves, two-shot staging; layout in `kernels/include/oxccl/abi_allreduce.h`), zero the
//! parts that must start at zero, export it, exchange the handles through the bootstrap,
//! import every peer's (through the IPC handle cache), and barrier so no rank writes into
//! a peer's scratch before the peer zeroed it.
//!
//! Steady state ([`Communicator::all_reduce`]): choose the algorithm, fill the argument
//! block (peer pointers were resolved at setup), one kernel launch. No host
//! synchronization, no host-side counter that advances per call (the epoch lives in device
//! memory and the kernel advances it), so calls can be captured into a CUDA graph and
//! replayed any number of times.
//!
//! Mismatched calls: the first call with a given (count, dtype, op, accum, algorithm) is
//! checked against every rank through the bootstrap (one all-gather, host side only, so
//! also fine while capturing); later calls with a signature already seen are not checked.
//! A rank that then calls with a different count, or skips a call, makes its peers' waits
//! time out (`timeout`, default 30 s): the kernel records the failure in device memory
//! ([`Communicator::check_error`]) on GPUs, and the host backend's stream reports it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxccl_backend::{AnyBackend, AnyDevice, AnyImported, AnyKernel, AnyMemory, AnyStream};
use oxccl_channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_hal::{
    AccumType, Backend, BackendKind, DataType, Device, DeviceId, DevicePtr, Error, IpcHandle,
    Memory, MemoryKind, Module, ModuleImage, ReduceOp, Result, Stream,
};
use oxccl_kernels::abi::{
    OxcclAllreduceArgs, OXCCL_ALLREDUCE_ERR_ARGS, OXCCL_ALLREDUCE_ERR_TIMEOUT,
    OXCCL_ALLREDUCE_MAX_RANKS, OXCCL_ALLREDUCE_SYNC_BYTES, OXCCL_ALLREDUCE_SYNC_ERROR,
};

use crate::algorithms::port_channel::{PortAllreduce, PortAllreduceConfig};
use crate::algorithms::{one_shot, one_shot_ll128, Algorithm, CallShape, Plan};
use crate::host_kernels::{
    self, args_bytes, void_ptr, ONESHOT_LL, ONESHOT_LL128, TWOSHOT, TWOSHOT_PUSH, TWOSHOT_ZC,
};
use crate::selector::{
    default_oneshot_max, default_zc_threshold, Choice, Selector, ALGO_VAR, ONESHOT_MAX_VAR,
    ZC_THRESHOLD_VAR,
};
use crate::tuner::{
    self, TuneMode, TuneSource, TuneTable, DEFAULT_TUNE_MAX, TUNE_DTYPES_VAR, TUNE_MAX_VAR,
    TUNE_VAR,
};

/// Environment variable: bound of every device wait, in milliseconds (0 = forever).
pub const TIMEOUT_VAR: &str = "OXCCL_TIMEOUT_MS";
/// Environment variable: bytes of each two-shot staging buffer, in MiB.
pub const STAGING_VAR: &str = "OXCCL_STAGING_MB";
/// Environment variable: `0` launches every allreduce kernel only after the previous
/// kernel on its stream has finished ([`CommConfig::early_launch`]).
pub const EARLY_LAUNCH_VAR: &str = "OXCCL_EARLY_LAUNCH";

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_STAGING: usize = 64 << 20;
/// One-shot packet scratch is sized for at least this many bytes per rank, so that
/// `OXCCL_ALGO=oneshot_ll` can be forced up to it.
const MIN_ONESHOT_CAPACITY: usize = 1 << 20;

/// Settings of a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommConfig {
    /// Bound of every wait inside a kernel (a dead or diverged peer becomes an error).
    pub timeout: Duration,
    /// Bytes of each two-shot staging buffer (rounded up to a multiple of 4 KiB).
    pub staging_bytes: usize,
    /// Algorithm every call must use.
    pub forced: Option<Algorithm>,
    /// Largest message (bytes per rank) the selector sends through one-shot; `None`: the
    /// world-size default ([`default_oneshot_max`]).
    pub oneshot_max_bytes: Option<usize>,
    /// On registered buffers, messages above this take the zero-copy two-shot; `None`:
    /// the world-size default ([`default_zc_threshold`]).
    pub zc_threshold_bytes: Option<usize>,
    /// Whether to tune at creation ([`crate::tuner`]).
    pub tune: TuneMode,
    /// Data types tuned at creation.
    pub tune_dtypes: Vec<DataType>,
    /// Largest size tuned (bytes per rank).
    pub tune_max_bytes: usize,
    /// Directory of cached tune tables; `None`: [`tuner::cache_dir`] (`OXCCL_TUNE_DIR`, ...).
    pub tune_dir: Option<std::path::PathBuf>,
    /// Launch the allreduce kernels early where the device can
    /// ([`oxccl_hal::LaunchConfig::early_launch`]): each is scheduled while the kernel before
    /// it on the stream finishes and waits for it on the GPU, which takes the launch
    /// latency off the time of small calls. The result is the same either way.
    pub early_launch: bool,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            timeout: DEFAULT_TIMEOUT,
            staging_bytes: DEFAULT_STAGING,
            forced: None,
            oneshot_max_bytes: None,
            zc_threshold_bytes: None,
            tune: TuneMode::Off,
            tune_dtypes: vec![DataType::Bf16],
            tune_max_bytes: DEFAULT_TUNE_MAX,
            tune_dir: None,
            early_launch: true,
        }
    }
}

fn env_number(var: &str) -> Result<Option<u64>> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<u64>().map(Some).map_err(|_| {
            Error::InvalidArgument(format!("{var}='{v}' is not a non-negative integer"))
        }),
        _ => Ok(None),
    }
}

/// An on/off variable: `1` or `0` (unset or empty: `None`).
fn env_switch(var: &str) -> Result<Option<bool>> {
    match env_number(var)? {
        None => Ok(None),
        Some(v @ (0 | 1)) => Ok(Some(v == 1)),
        Some(v) => Err(Error::InvalidArgument(format!("{var}={v} is not 0 or 1"))),
    }
}

impl CommConfig {
    /// From the environment: `OXCCL_ALGO`, `OXCCL_TIMEOUT_MS`, `OXCCL_STAGING_MB`,
    /// `OXCCL_ONESHOT_MAX_BYTES`, `OXCCL_ZC_THRESHOLD_BYTES`, `OXCCL_TUNE`,
    /// `OXCCL_TUNE_DTYPES`, `OXCCL_TUNE_MAX_BYTES`, `OXCCL_EARLY_LAUNCH`.
    pub fn from_env() -> Result<Self> {
        let mut c = CommConfig::default();
        if let Ok(name) = std::env::var(ALGO_VAR) {
            if !name.trim().is_empty() && name.trim() != "auto" {
                c.forced = Some(name.parse()?);
            }
        }
        if let Some(ms) = env_number(TIMEOUT_VAR)? {
            c.timeout = Duration::from_millis(ms);
        }
        if let Some(mb) = env_number(STAGING_VAR)? {
            if mb == 0 || mb > 4096 {
                return Err(Error::InvalidArgument(format!(
                    "{STAGING_VAR}={mb} is not in 1..=4096"
                )));
            }
            c.staging_bytes = (mb as usize) << 20;
        }
        if let Some(b) = env_number(ONESHOT_MAX_VAR)? {
            c.oneshot_max_bytes = Some(usize::try_from(b).unwrap_or(usize::MAX));
        }
        if let Some(b) = env_number(ZC_THRESHOLD_VAR)? {
            c.zc_threshold_bytes = Some(usize::try_from(b).unwrap_or(usize::MAX));
        }
        if let Ok(v) = std::env::var(TUNE_VAR) {
            c.tune = v.parse()?;
        }
        if let Ok(v) = std::env::var(TUNE_DTYPES_VAR) {
            c.tune_dtypes = v
                .split(',')
                .filter(|d| !d.trim().is_empty())
                .map(|d| d.trim().parse::<DataType>())
                .collect::<Result<_>>()?;
        }
        if let Some(b) = env_number(TUNE_MAX_VAR)? {
            c.tune_max_bytes = usize::try_from(b).unwrap_or(usize::MAX);
        }
        if let Some(on) = env_switch(EARLY_LAUNCH_VAR)? {
            c.early_launch = on;
        }
        Ok(c)
    }
}

/// Byte offsets of the scratch layout (the same on every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    packet_offset: usize,
    packet_half: usize,
    ll128_offset: usize,
    ll128_half: usize,
    data_offset: usize,
    staging: usize,
    total: usize,
}

impl Layout {
    fn new(world: u32, oneshot_capacity: usize, staging: usize) -> Result<Layout> {
        let page = 4096usize;
        let overflow = || Error::InvalidArgument("allreduce scratch size overflows".into());
        let packet_half = one_shot::slot_bytes(oneshot_capacity)
            .checked_mul(world.max(1) as usize)
            .ok_or_else(overflow)?
            .next_multiple_of(page);
        let ll128_half = one_shot_ll128::slot_bytes(oneshot_capacity)
            .checked_mul(world.max(1) as usize)
            .ok_or_else(overflow)?
            .next_multiple_of(page);
        let staging = staging.max(page).next_multiple_of(page);
        let packet_offset = OXCCL_ALLREDUCE_SYNC_BYTES as usize;
        let ll128_offset = packet_offset + 2 * packet_half;
        let data_offset = ll128_offset + 2 * ll128_half;
        let total = staging
            .checked_mul(2)
            .and_then(|s| s.checked_add(data_offset))
            .ok_or_else(overflow)?;
        Ok(Layout {
            packet_offset,
            packet_half,
            ll128_offset,
            ll128_half,
            data_offset,
            staging,
            total,
        })
    }
}

/// What the first call of a signature checks across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Signature {
    count: u64,
    dtype: u32,
    op: u32,
    accum: u32,
    algorithm: u32,
    /// Blocks and threads (a tuned table that differs between ranks shows up here).
    launch: (u32, u32),
    /// Zero-copy: offsets of input and output in their registered buffers (ranks must
    /// agree); `u64::MAX` otherwise.
    zc_offsets: (u64, u64),
}

impl Signature {
    fn to_bytes(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(40);
        for x in [self.count, self.zc_offsets.0, self.zc_offsets.1] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        for x in [
            self.dtype,
            self.op,
            self.accum,
            self.algorithm,
            self.launch.0,
            self.launch.1,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }
}

/// The kernels of the allreduce module.
#[derive(Debug)]
struct Kernels {
    oneshot: AnyKernel,
    oneshot_ll128: AnyKernel,
    twoshot: AnyKernel,
    twoshot_zc: AnyKernel,
    twoshot_push: AnyKernel,
}

/// A user buffer registered on every rank ([`Communicator::register`]).
#[derive(Debug)]
struct Registered {
    /// Bytes of this rank's buffer.
    len: usize,
    /// Every rank's buffer as mapped here (index = rank; this rank's own at `rank`).
    bases: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// Every rank's buffer length.
    lens: [u64; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// The peers' mappings (kept while registered).
    _imports: Vec<AnyImported>,
}

/// One call's buffers and types.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) input: DevicePtr,
    pub(crate) output: DevicePtr,
    pub(crate) count: usize,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    pub(crate) accum: AccumType,
}

/// Every rank's view of one call's buffers for the zero-copy kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ZeroCopy {
    inputs: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    outputs: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    offsets: (u64, u64),
}

/// An allreduce communicator of one rank. See the module docs for the protocol.
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
    layout: Layout,
    /// Every rank's device reaches its peers over NVLink (agreed at setup).
    nvlink: bool,
    kernels: Kernels,
    /// Every rank's scratch base as mapped here (index = rank).
    scratch_ptrs: [DevicePtr; OXCCL_ALLREDUCE_MAX_RANKS as usize],
    /// Signatures already checked across ranks.
    seen: Mutex<HashSet<Signature>>,
    /// Registered user buffers by base address on this rank.
    registered: Mutex<BTreeMap<u64, Registered>>,
    /// Tuned tables by data type ([`Communicator::tune`]).
    tuned: Mutex<HashMap<DataType, Arc<TuneTable>>>,
    /// The PortChannel allreduce (its own scratch, channels and proxy thread); built when
    /// `port_channel` is forced (`OXCCL_ALGO=port_channel`). Dropped before the scratch
    /// and the device (the proxy thread stops first).
    port: Option<PortAllreduce>,
    // Drop order matters: peers' mappings (registered buffers above, scratch here), then
    // our scratch, then the module and device.
    peers: Vec<Option<AnyImported>>,
    scratch: AnyMemory,
    _module: oxccl_backend::AnyModule,
    bootstrap: Bootstrap,
    device: AnyDevice,
}

impl Communicator {
    /// Joins the job described by the launcher environment (torchrun, mpirun, srun, or
    /// `oxccl-perf -N`): rank and world size from `RANK`/`WORLD_SIZE`, the device from
    /// `LOCAL_RANK`, the backend from `OXCCL_BACKEND` (else the first GPU backend built).
    pub fn from_env() -> Result<Communicator> {
        let (bootstrap, info) = Bootstrap::from_env(&BootstrapConfig::from_env()?)?;
        let kind = oxccl_backend::chosen()?;
        let device = AnyDevice::open_with(kind, DeviceId(info.local_rank))?;
        Communicator::new(bootstrap, device, CommConfig::from_env()?)
    }

    /// Joins the job named by a unique id (made by one rank with [`UniqueId::create`] and
    /// handed to the others), on `device`.
    pub fn with_unique_id(
        id: &UniqueId,
        rank: u32,
        world_size: u32,
        device: AnyDevice,
        config: CommConfig,
    ) -> Result<Communicator> {
        let bootstrap = Bootstrap::new(id, rank, world_size, &BootstrapConfig::from_env()?)?;
        Communicator::new(bootstrap, device, config)
    }

    /// Builds the communicator over an existing bootstrap (collective).
    pub fn new(
        bootstrap: Bootstrap,
        device: AnyDevice,
        config: CommConfig,
    ) -> Result<Communicator> {
        let rank = bootstrap.rank();
        let world = bootstrap.world_size();
        let at = |e: Error| e.at_rank(rank);
        let _span = tracing::info_span!("communicator", rank, world).entered();
        if world > OXCCL_ALLREDUCE_MAX_RANKS {
            return Err(at(Error::Unsupported(format!(
                "world size {world}: the allreduce serves 1..={OXCCL_ALLREDUCE_MAX_RANKS} ranks \
                 (one node)"
            ))));
        }
        let backend = Device::backend(&device);
        let image = match backend {
            BackendKind::Host => ModuleImage::Host(&host_kernels::TABLE),
            other => oxccl_kernels::module_image(other).map_err(at)?,
        };
        let module = device.load_module(&image).map_err(at)?;
        let kernels = Kernels {
            oneshot: module.kernel(ONESHOT_LL).map_err(at)?,
            oneshot_ll128: module.kernel(ONESHOT_LL128).map_err(at)?,
            twoshot: module.kernel(TWOSHOT).map_err(at)?,
            twoshot_zc: module.kernel(TWOSHOT_ZC).map_err(at)?,
            twoshot_push: module.kernel(TWOSHOT_PUSH).map_err(at)?,
        };
        let oneshot_max = config
            .oneshot_max_bytes
            .unwrap_or_else(|| default_oneshot_max(world));
        let layout = Layout::new(
            world,
            oneshot_max.max(MIN_ONESHOT_CAPACITY),
            config.staging_bytes,
        )
        .map_err(at)?;
        let scratch = device
            .alloc(layout.total, MemoryKind::Coherent)
            .map_err(at)?;
        // Sync words, packets and LL128 lines must start at zero (flag 0 never matches); the staging
        // buffers need no initial value. Host-backend memory is zero-filled already.
        if backend != BackendKind::Host {
            let stream = device.create_stream().map_err(at)?;
            // SAFETY: the range is inside the allocation just made, which outlives the
            // fill (synchronized right below).
            unsafe { stream.fill(scratch.ptr(), 0, layout.data_offset) }.map_err(at)?;
            stream.synchronize().map_err(at)?;
        }
        let handle = device.export_memory(&scratch).map_err(at)?;
        let all = bootstrap.all_gather(&handle.to_bytes()).map_err(at)?;
        let mut peers = Vec::with_capacity(world as usize);
        let mut scratch_ptrs = [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        for (r, bytes) in all.iter().enumerate() {
            if r == rank as usize {
                peers.push(None);
                scratch_ptrs[r] = scratch.ptr();
                continue;
            }
            let h = IpcHandle::from_bytes(bytes).map_err(at)?;
            if h.len < layout.total as u64 {
                return Err(at(Error::InvalidArgument(format!(
                    "rank {r}'s scratch is {} bytes, this rank's layout needs {}: the ranks \
                     were configured differently ({STAGING_VAR}, {ONESHOT_MAX_VAR})",
                    h.len, layout.total
                ))));
            }
            let imported = device.import_memory(&h).map_err(at)?;
            scratch_ptrs[r] = imported.ptr();
            peers.push(Some(imported));
        }
        // Every rank's view of its links, gathered: LL128 needs NVLink between every pair.
        // The gather is also the barrier that keeps anybody from writing into a peer's
        // scratch before every peer has zeroed its own.
        let links = bootstrap
            .all_gather(&[u8::from(device.capabilities().peers_over_nvlink)])
            .map_err(at)?;
        let nvlink = links.iter().all(|l| l.as_slice() == [1]);
        let port = if config.forced == Some(Algorithm::PortChannel) {
            let mut pc = PortAllreduceConfig::from_env().map_err(at)?;
            pc.timeout = config.timeout;
            Some(PortAllreduce::new(&bootstrap, &device, pc)?)
        } else {
            None
        };
        tracing::info!(
            rank,
            world,
            backend = %backend,
            scratch_bytes = layout.total,
            nvlink,
            "communicator ready"
        );
        let comm = Communicator {
            rank,
            world,
            selector: Selector {
                forced: config.forced,
                oneshot_max_bytes: oneshot_max,
                zc_threshold_bytes: config
                    .zc_threshold_bytes
                    .unwrap_or_else(|| default_zc_threshold(world)),
            },
            config,
            layout,
            nvlink,
            kernels,
            scratch_ptrs,
            seen: Mutex::new(HashSet::new()),
            registered: Mutex::new(BTreeMap::new()),
            tuned: Mutex::new(HashMap::new()),
            port,
            peers,
            scratch,
            _module: module,
            bootstrap,
            device,
        };
        if comm.config.tune != TuneMode::Off {
            let dtypes = comm.config.tune_dtypes.clone();
            comm.tune(
                &dtypes,
                comm.config.tune_max_bytes,
                comm.config.tune == TuneMode::Force,
            )?;
        }
        Ok(comm)
    }

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

    /// The algorithm and launch a call on unregistered buffers would use (no launch).
    pub fn choose(&self, count: usize, dtype: DataType) -> Result<Choice> {
        let bytes = dtype.bytes(count)?;
        self.select(&self.shape(count, dtype, bytes, false))
    }

    /// The algorithm and launch a call on these buffers would use (no launch).
    pub fn choose_for(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
    ) -> Result<Choice> {
        let bytes = dtype.bytes(count)?;
        let zc = self.zero_copy(input, output, bytes).is_some();
        self.select(&self.shape(count, dtype, bytes, zc))
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

    /// Tunes the selector for `dtypes` (collective: every rank calls it with the same
    /// arguments; no other work of this communicator may be in flight). Per data type:
    /// loads the cached table unless `force`, checks every rank loaded the same one, and
    /// otherwise measures every candidate up to `max_bytes` per rank ([`crate::tuner`])
    /// and caches the result. Returns the tables now in use and where each came from.
    pub fn tune(
        &self,
        dtypes: &[DataType],
        max_bytes: usize,
        force: bool,
    ) -> Result<Vec<(Arc<TuneTable>, TuneSource)>> {
        let at = |e: Error| e.at_rank(self.rank);
        let dir = self.config.tune_dir.clone().or_else(tuner::cache_dir);
        let mut out = Vec::with_capacity(dtypes.len());
        for &dtype in dtypes {
            let key = tuner::key_of(&self.device, self.world, dtype);
            let loaded = match (&dir, force) {
                (Some(d), false) => tuner::load(d, &key),
                _ => None,
            };
            // Use a cached table only if every rank has the very same one.
            let mine = loaded.as_ref().map_or(0, TuneTable::fingerprint);
            let all = self.bootstrap.all_gather(&mine.to_le_bytes()).map_err(at)?;
            let same = all.iter().all(|b| b.as_slice() == mine.to_le_bytes());
            let (table, source) = match loaded {
                Some(t) if same => (t, TuneSource::Cache),
                _ => {
                    let t = tuner::measure(self, dtype, max_bytes).map_err(at)?;
                    if let Some(d) = &dir {
                        if let Err(e) = tuner::store(d, &t) {
                            tracing::warn!(rank = self.rank, error = %e, "tune table not cached");
                        }
                    }
                    (t, TuneSource::Measured)
                }
            };
            tracing::info!(
                rank = self.rank,
                %dtype,
                entries = table.entries.len(),
                ?source,
                "tune table in use"
            );
            let table = Arc::new(table);
            self.tuned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(dtype, Arc::clone(&table));
            out.push((table, source));
        }
        Ok(out)
    }

    /// Registers a user buffer for zero-copy allreduce (collective: every rank calls it,
    /// in the same order, with its own buffer of the same role). Exports the allocation,
    /// exchanges the handles and maps every peer's (IPC handle cache). Calls whose input
    /// and output lie 16-byte aligned inside registered buffers, at the same offsets on
    /// every rank, then use the zero-copy two-shot above the zero-copy threshold. Cached
    /// by (pointer, length): registering the same buffer again does nothing.
    ///
    /// The buffer must stay allocated until [`Communicator::deregister`] or the
    /// communicator is dropped (peers map it).
    pub fn register(&self, memory: &AnyMemory) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        let (base, len) = (memory.ptr(), memory.len());
        {
            let reg = self.registered.lock().unwrap_or_else(|p| p.into_inner());
            if reg.get(&base.0).is_some_and(|r| r.len == len) {
                return Ok(());
            }
        }
        let handle = self.device.export_memory(memory).map_err(at)?;
        let all = self.bootstrap.all_gather(&handle.to_bytes()).map_err(at)?;
        let mut bases = [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut lens = [0u64; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut imports = Vec::with_capacity(all.len().saturating_sub(1));
        for (r, bytes) in all.iter().enumerate() {
            if r == self.rank as usize {
                bases[r] = base;
                lens[r] = len as u64;
                continue;
            }
            let h = IpcHandle::from_bytes(bytes).map_err(at)?;
            let imported = self.device.import_memory(&h).map_err(at)?;
            bases[r] = imported.ptr();
            lens[r] = h.len;
            imports.push(imported);
        }
        tracing::debug!(rank = self.rank, base = %base, len, "registered buffer");
        let mut reg = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        reg.insert(
            base.0,
            Registered {
                len,
                bases,
                lens,
                _imports: imports,
            },
        );
        Ok(())
    }

    /// Releases a registration (collective). Every stream that used the buffer in an
    /// allreduce must be synchronized first; after it returns, every rank may free its
    /// buffer.
    pub fn deregister(&self, memory: &AnyMemory) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        self.bootstrap.barrier().map_err(at)?;
        let removed = {
            let mut reg = self.registered.lock().unwrap_or_else(|p| p.into_inner());
            reg.remove(&memory.ptr().0)
        };
        drop(removed);
        // No rank frees its buffer before every peer dropped its mapping.
        self.bootstrap.barrier().map_err(at)
    }

    /// Number of registered buffers.
    pub fn registered_buffers(&self) -> usize {
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Every rank's input and output for a zero-copy call, when both lie 16-byte aligned
    /// inside registered buffers that are long enough on every rank.
    fn zero_copy(&self, input: DevicePtr, output: DevicePtr, bytes: usize) -> Option<ZeroCopy> {
        if !input.is_aligned(16) || !output.is_aligned(16) {
            return None;
        }
        let reg = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        let find = |p: DevicePtr| {
            let (base, r) = reg.range(..=p.0).next_back()?;
            let off = p.0 - base;
            let end = off.checked_add(bytes as u64)?;
            (end <= r.len as u64 && r.lens[..self.world as usize].iter().all(|l| end <= *l))
                .then_some((r, off))
        };
        let (ri, oi) = find(input)?;
        let (ro, oo) = find(output)?;
        let mut z = ZeroCopy {
            inputs: [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize],
            outputs: [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize],
            offsets: (oi, oo),
        };
        for r in 0..self.world as usize {
            z.inputs[r] = DevicePtr(ri.bases[r].0.checked_add(oi)?);
            z.outputs[r] = DevicePtr(ro.bases[r].0.checked_add(oo)?);
        }
        Some(z)
    }

    fn shape(&self, count: usize, dtype: DataType, bytes: usize, zero_copy: bool) -> CallShape<'_> {
        CallShape {
            count,
            dtype,
            bytes,
            world_size: self.world,
            caps: self.device.capabilities(),
            packet_half_bytes: self.layout.packet_half,
            ll128_half_bytes: self.layout.ll128_half,
            nvlink: self.nvlink,
            host: Device::backend(&self.device) == BackendKind::Host,
            zero_copy,
        }
    }

    /// Allreduce of `count` elements: `output[i] = op(input_0[i], ..., input_{n-1}[i])` on
    /// every rank, reduced in rank order with the accumulation type (so every rank gets
    /// the same bits). In place when `input == output`. `count == 0` does nothing.
    ///
    /// Errors (before any launch): overflowing sizes, null or element-misaligned pointers,
    /// partially overlapping buffers, unsupported type combinations (f32 data with an f16
    /// accumulator), a forced algorithm that cannot serve the call, and, on the first call
    /// of a signature, a different call on another rank. Non-16-byte-aligned buffers are
    /// served (the kernels fall back to byte accesses for those units), only slower.
    ///
    /// # Safety
    /// `input` and `output` must be device memory of this communicator's device holding
    /// `count` elements of `dtype`, live until the work queued on `stream` completes; no
    /// other work may write them meanwhile. Every rank must make the same sequence of
    /// calls, ordered on one stream per rank.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        accum: AccumType,
        stream: &AnyStream,
    ) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        if count == 0 {
            return Ok(());
        }
        let bytes = check_call(input, output, count, dtype, accum).map_err(at)?;
        let zc = self.zero_copy(input, output, bytes);
        let choice = self
            .select(&self.shape(count, dtype, bytes, zc.is_some()))
            .map_err(at)?;
        // Registered buffers: zero-copy reads the peers' inputs and writes their outputs,
        // push writes their outputs.
        let zc = zc.filter(|_| {
            matches!(
                choice.algorithm,
                Algorithm::TwoShotZc | Algorithm::TwoShotPush
            )
        });
        self.check_signature(Signature {
            count: count as u64,
            dtype: dtype.code(),
            op: op.code(),
            accum: accum.code(),
            algorithm: choice.algorithm.code(),
            launch: (choice.plan.config.grid[0], choice.plan.config.block[0]),
            zc_offsets: zc.map_or((u64::MAX, u64::MAX), |z| z.offsets),
        })?;
        if choice.algorithm == Algorithm::PortChannel {
            let port = self.port.as_ref().ok_or_else(|| {
                at(Error::Unsupported(
                    "port_channel: built only when forced at creation (OXCCL_ALGO=port_channel)"
                        .into(),
                ))
            })?;
            // SAFETY: the caller's obligations (this function's contract).
            return unsafe { port.launch(input, output, count, dtype, op, accum, stream) };
        }
        // SAFETY: the caller's obligations (this function's contract); the plan came from
        // the selector for this call.
        unsafe {
            self.launch(
                choice.algorithm,
                &choice.plan,
                Call {
                    input,
                    output,
                    count,
                    dtype,
                    op,
                    accum,
                },
                zc.as_ref(),
                stream,
            )
        }
    }

    /// Every rank's view of registered `input`/`output` for a zero-copy call of `bytes`
    /// (`None` when they are not registered, aligned and long enough on every rank).
    pub(crate) fn zero_copy_view(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        bytes: usize,
    ) -> Option<ZeroCopy> {
        self.zero_copy(input, output, bytes)
    }

    /// The call shape the selector and the tuner see.
    pub(crate) fn call_shape(
        &self,
        count: usize,
        dtype: DataType,
        zero_copy: bool,
    ) -> Result<CallShape<'_>> {
        Ok(self.shape(count, dtype, dtype.bytes(count)?, zero_copy))
    }

    /// One launch of `algorithm` with `plan` (no selection, no cross-rank check).
    ///
    /// # Safety
    /// As [`Communicator::all_reduce`]; besides, every rank must launch the same algorithm
    /// and plan, and `zc` must be this call's view when the algorithm is `twoshot_zc`.
    pub(crate) unsafe fn launch(
        &self,
        algorithm: Algorithm,
        plan: &Plan,
        call: Call,
        zc: Option<&ZeroCopy>,
        stream: &AnyStream,
    ) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        let Call {
            input,
            output,
            count,
            dtype,
            op,
            accum,
        } = call;
        if algorithm == Algorithm::TwoShotZc && zc.is_none() {
            return Err(at(Error::InvalidArgument(
                "twoshot_zc needs registered buffers".into(),
            )));
        }
        let mut peer_input = [std::ptr::null(); OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut peer_output = [std::ptr::null_mut(); OXCCL_ALLREDUCE_MAX_RANKS as usize];
        if let Some(z) = zc {
            for r in 0..self.world as usize {
                peer_input[r] = void_ptr(z.inputs[r]).cast_const();
                peer_output[r] = void_ptr(z.outputs[r]);
            }
        }
        let mut scratch = [std::ptr::null_mut(); OXCCL_ALLREDUCE_MAX_RANKS as usize];
        for (slot, p) in scratch.iter_mut().zip(self.scratch_ptrs) {
            *slot = void_ptr(p);
        }
        // LL128 lines have their own region: an LL16 reader must never meet user data
        // where it expects a flag.
        let (flag_offset, flag_half) = if algorithm == Algorithm::OneShotLl128 {
            (self.layout.ll128_offset, self.layout.ll128_half)
        } else {
            (self.layout.packet_offset, self.layout.packet_half)
        };
        let args = OxcclAllreduceArgs {
            input: void_ptr(input),
            output: void_ptr(output),
            scratch,
            count: count as u64,
            packet_offset: flag_offset as u64,
            packet_half_bytes: flag_half as u64,
            data_offset: self.layout.data_offset as u64,
            data_bytes: self.layout.staging as u64,
            timeout_ns: u64::try_from(self.config.timeout.as_nanos()).unwrap_or(u64::MAX),
            rank: self.rank,
            world_size: self.world,
            dtype: dtype.code(),
            op: op.code(),
            accum: accum.code(),
            _pad0: 0,
            peer_input,
            peer_output,
        };
        let kernel = match algorithm {
            Algorithm::OneShotLl => &self.kernels.oneshot,
            Algorithm::OneShotLl128 => &self.kernels.oneshot_ll128,
            Algorithm::TwoShot => &self.kernels.twoshot,
            Algorithm::TwoShotZc => &self.kernels.twoshot_zc,
            Algorithm::TwoShotPush => &self.kernels.twoshot_push,
            other => {
                return Err(at(Error::Unsupported(format!(
                    "{other}: no kernel in this build"
                ))))
            }
        };
        // Asked for as configured: the backend launches as usual where the device cannot.
        let config = plan.config.with_early_launch(self.config.early_launch);
        // SAFETY: the argument block matches the kernel (abi_allreduce.h); the scratch
        // pointers are this communicator's live mappings (kept until drop); input and
        // output are the caller's obligation (this function's contract). Every allreduce
        // kernel waits for the previous grid before it touches memory (`run_allreduce` in
        // allreduce.cu), which an early launch requires.
        unsafe { stream.launch(kernel, &config, args_bytes(&args)) }.map_err(at)
    }

    fn check_signature(&self, sig: Signature) -> Result<()> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(&sig) {
            return Ok(());
        }
        let all = self
            .bootstrap
            .all_gather(&sig.to_bytes())
            .map_err(|e| e.at_rank(self.rank))?;
        let mine = sig.to_bytes();
        let differing: Vec<usize> = all
            .iter()
            .enumerate()
            .filter(|(_, b)| **b != mine)
            .map(|(r, _)| r)
            .collect();
        if !differing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "mismatched all_reduce calls: ranks {differing:?} called with a different \
                 (count, dtype, op, accum, algorithm, grid x block) than this rank's ({}, {}, \
                 {}, {}, {}, {} x {}); with a tuned table, every rank must use the same one",
                sig.count,
                DataType::from_code(sig.dtype).map_or("?".into(), |d| d.to_string()),
                sig.op,
                sig.accum,
                sig.algorithm,
                sig.launch.0,
                sig.launch.1
            ))
            .at_rank(self.rank));
        }
        seen.insert(sig);
        Ok(())
    }

    /// Reads the failure word the kernels leave in device memory (a wait that timed out,
    /// a bad argument block). Synchronizes `stream` first; not allowed while capturing.
    /// After a failure the communicator must be dropped: its counters no longer agree.
    pub fn check_error(&self, stream: &AnyStream) -> Result<()> {
        stream.synchronize().map_err(|e| e.at_rank(self.rank))?;
        if let Some(port) = &self.port {
            port.check_error(stream)?;
        }
        let ptr = self
            .scratch
            .ptr()
            .offset(OXCCL_ALLREDUCE_SYNC_ERROR as usize)?;
        let mut word = [0u8; 8];
        stream
            .read(ptr, &mut word)
            .map_err(|e| e.at_rank(self.rank))?;
        let w = u64::from_le_bytes(word);
        let (code, peer) = ((w & 0xffff_ffff) as u32, (w >> 32) as u32);
        match code {
            0 => Ok(()),
            c if c == OXCCL_ALLREDUCE_ERR_TIMEOUT => Err(Error::Timeout {
                what: format!(
                    "an allreduce kernel's wait for rank {peer} (dead, slow, or a mismatched \
                     call)"
                ),
                waited: self.config.timeout,
            }
            .at_rank(self.rank)),
            c if c == OXCCL_ALLREDUCE_ERR_ARGS => Err(Error::InvalidArgument(
                "an allreduce kernel rejected its argument block".into(),
            )
            .at_rank(self.rank)),
            other => Err(
                Error::InvalidArgument(format!("allreduce kernel failure code {other}"))
                    .at_rank(self.rank),
            ),
        }
    }

    /// Tears down collectively: waits until every rank got here (so no peer still reads
    /// this rank's scratch), then releases imports, scratch, module and device in order.
    /// Streams that ran this communicator's work must be synchronized first.
    pub fn destroy(self) -> Result<()> {
        let rank = self.rank;
        self.bootstrap.barrier().map_err(|e| e.at_rank(rank))?;
        drop(self);
        Ok(())
    }

    /// Imported peer scratch regions (for tests: how many live mappings this rank holds).
    pub fn peer_mappings(&self) -> usize {
        self.peers.iter().flatten().count()
    }
}

/// Checks pointers for a call of `bytes` bytes.
/// The checks of every allreduce entry point (the communicator's and the port
/// allreduce's, so both refuse the same calls): the bytes of one rank's buffer, or why the
/// call is refused.
pub(crate) fn check_call(
    input: DevicePtr,
    output: DevicePtr,
    count: usize,
    dtype: DataType,
    accum: AccumType,
) -> Result<usize> {
    let bytes = dtype.bytes(count)?;
    check_buffers(input, output, bytes, dtype)?;
    check_types(dtype, accum)?;
    Ok(bytes)
}

pub(crate) fn check_buffers(
    input: DevicePtr,
    output: DevicePtr,
    bytes: usize,
    dtype: DataType,
) -> Result<()> {
    if input.is_null() || output.is_null() {
        return Err(Error::InvalidArgument(
            "all_reduce: null input or output".into(),
        ));
    }
    let align = dtype.size() as u64;
    if !input.is_aligned(align) || !output.is_aligned(align) {
        return Err(Error::InvalidArgument(format!(
            "all_reduce: input {input} / output {output} not aligned to the {align}-byte {dtype} \
             element"
        )));
    }
    input.offset(bytes)?;
    output.offset(bytes)?;
    let (i, o, n) = (input.0, output.0, bytes as u64);
    if i != o && i < o + n && o < i + n {
        return Err(Error::InvalidArgument(format!(
            "all_reduce: input {input} and output {output} overlap without being the same \
             buffer ({bytes} bytes)"
        )));
    }
    Ok(())
}

/// Type combinations the kernels serve: every data type with `Auto`, `Native`, `F32`;
/// `F16` accumulation for everything narrower than f32 (refused for f32 data, which it
/// would silently truncate).
pub(crate) fn check_types(dtype: DataType, accum: AccumType) -> Result<()> {
    if dtype == DataType::F32 && accum == AccumType::F16 {
        return Err(Error::Unsupported(
            "all_reduce: f32 data with an f16 accumulator (narrower than the data)".into(),
        ));
    }
    Ok(())
}

/// The HAL backend type the communicator dispatches through (for generic callers).
pub type CommBackend = AnyBackend;

#[allow(dead_code)]
fn _assert_backend(_: <AnyBackend as Backend>::Device) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_sized() {
        let l = Layout::new(4, 1 << 20, 64 << 20).unwrap();
        assert_eq!(l.packet_offset, 65536);
        assert_eq!(l.packet_half % 4096, 0);
        assert!(l.packet_half >= 4 * 2 * (1 << 20));
        assert_eq!(l.ll128_offset, l.packet_offset + 2 * l.packet_half);
        assert!(l.ll128_half >= 4 * one_shot_ll128::slot_bytes(1 << 20));
        assert_eq!(l.data_offset, l.ll128_offset + 2 * l.ll128_half);
        assert_eq!(l.total, l.data_offset + 2 * l.staging);
        assert!(Layout::new(8, usize::MAX / 4, 1).is_err());
    }

    #[test]
    fn switches_take_only_zero_or_one() {
        // A variable of this test alone: tests run in parallel in one process.
        const VAR: &str = "OXCCL_TEST_SWITCH_ONLY_IN_THIS_TEST";
        std::env::remove_var(VAR);
        assert_eq!(env_switch(VAR).unwrap(), None);
        std::env::set_var(VAR, "0");
        assert_eq!(env_switch(VAR).unwrap(), Some(false));
        std::env::set_var(VAR, " 1 ");
        assert_eq!(env_switch(VAR).unwrap(), Some(true));
        std::env::set_var(VAR, "2");
        let e = env_switch(VAR).unwrap_err().to_string();
        assert!(e.contains("is not 0 or 1"), "{e}");
        std::env::set_var(VAR, "yes");
        assert!(env_switch(VAR).is_err());
        std::env::remove_var(VAR);
        assert!(CommConfig::default().early_launch);
    }

    #[test]
    fn buffers_and_types_are_checked() {
        let p = DevicePtr(0x1000);
        assert!(check_buffers(p, p, 100, DataType::F32).is_ok());
        assert!(check_buffers(DevicePtr::NULL, p, 4, DataType::F32).is_err());
        assert!(check_buffers(DevicePtr(0x1002), p, 4, DataType::F32).is_err());
        assert!(check_buffers(DevicePtr(0x1001), DevicePtr(0x2001), 4, DataType::Fp8E4m3).is_ok());
        assert!(check_buffers(p, DevicePtr(0x1004), 8, DataType::F32).is_err());
        assert!(check_buffers(DevicePtr(u64::MAX - 4), p, 8, DataType::F32).is_err());
        assert!(check_types(DataType::F32, AccumType::F16).is_err());
        assert!(check_types(DataType::Bf16, AccumType::F16).is_ok());
    }
}
