//! `ncclComm_t` of this library: the oxccl side (a bootstrap, and a communicator where
//! oxccl can serve) and the real NCCL's communicator, created together.

use std::collections::HashSet;
use std::ffi::{c_int, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use oxccl_collectives::backend::{AnyDevice, AnyMemory, AnyStream};
use oxccl_collectives::channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_collectives::hal::{
    AccumType, BackendKind, DataType, Device, DeviceId, DevicePtr, Memory, MemoryKind, ReduceOp,
    Stream,
};
use oxccl_collectives::kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS;
use oxccl_collectives::{Collective, CommConfig, Communicator};

use crate::error::{log_info, ApiError, ApiResult};
use crate::id::{self, PackedId};
use crate::ops::{Reduction, UserOps};
use crate::real::{real, RealNccl};
use crate::types::*;

/// First word of every live [`Comm`] (the registry in [`resolve`] decides what is ours; the
/// word tells a destroyed communicator of ours, [`DESTROYED_MAGIC`], from the real NCCL's).
pub const COMM_MAGIC: u64 = u64::from_le_bytes(*b"OXNCCLCM");

/// The backend this process runs oxccl on, chosen once (`OXCCL_BACKEND`, else the first
/// built GPU backend with a device, else the host backend in a build without GPU backends).
pub fn backend() -> ApiResult<BackendKind> {
    static KIND: OnceLock<Result<BackendKind, String>> = OnceLock::new();
    KIND.get_or_init(|| oxccl_collectives::backend::chosen().map_err(|e| e.to_string()))
        .clone()
        .map_err(|e| ApiError::invalid_usage(format!("no oxccl backend: {e}")))
}

/// The real NCCL, when this process uses one: never on the host backend (its buffers are
/// host memory, which NCCL cannot use).
pub fn real_nccl() -> Result<&'static RealNccl, String> {
    match backend() {
        Ok(BackendKind::Host) => Err(
            "the host backend (OXCCL_BACKEND=host or a build without GPU backends) never \
             uses the real NCCL"
                .into(),
        ),
        _ => real(),
    }
}

/// The oxccl side of a communicator.
#[derive(Debug)]
pub enum Oxccl {
    /// oxccl serves allreduce.
    Serving(Box<Communicator>),
    /// oxccl cannot serve (world size above one node's); the bootstrap is kept for splits.
    BootstrapOnly(Bootstrap),
}

impl Oxccl {
    fn bootstrap(&self) -> &Bootstrap {
        match self {
            Oxccl::Serving(c) => c.bootstrap(),
            Oxccl::BootstrapOnly(b) => b,
        }
    }
}

/// A real NCCL communicator handle.
#[derive(Debug, Clone, Copy)]
pub struct RealComm(pub Opaque);
// SAFETY: an NCCL communicator may be used from any thread (NCCL's own rule: one thread at
// a time per communicator, which the caller keeps, as with NCCL itself).
unsafe impl Send for RealComm {}
// SAFETY: as above.
unsafe impl Sync for RealComm {}

/// Host-backend state: the stream oxccl's host kernels run on and the staging buffer the
/// caller's host memory is copied through.
#[derive(Debug)]
struct HostState {
    stream: AnyStream,
    staging: Mutex<Option<AnyMemory>>,
}

/// A communicator of this library once its initialisation has completed: the oxccl side
/// and the real NCCL's, for one rank.
#[derive(Debug)]
pub struct Ready {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub nranks: u32,
    /// Device ordinal (CUDA) or host device number.
    pub device: i32,
    /// The backend.
    pub kind: BackendKind,
    /// The oxccl side.
    pub oxccl: Oxccl,
    /// The real NCCL's communicator, when a real NCCL is loaded.
    pub real: Option<RealComm>,
    /// Why there is no real communicator (for messages).
    pub no_real_reason: String,
    /// Sticky error of an operation that failed after it was queued.
    pub async_error: AtomicI32,
    /// The PreMulSum operators made on this communicator.
    pub ops: UserOps,
    finalized: AtomicBool,
    host: Option<HostState>,
}

/// What a `ncclComm_t` of this library points at: the handle the caller gets from the init
/// call, ready at once (a blocking init) or later (a non-blocking init, or one recorded in
/// a group and completed at `ncclGroupEnd`), or holding the failure of its initialisation.
#[derive(Debug)]
#[repr(C)]
pub struct Comm {
    magic: u64,
    /// The initialised communicator or why initialisation failed, once known here.
    ready: OnceLock<Result<Box<Ready>, ApiError>>,
    /// Where a background or grouped initialisation leaves its result (`None`: made ready).
    pending: Option<Arc<InitCell>>,
}

// `resolve` hands out `&'static Comm` to any thread (PyTorch's watchdog thread queries the
// async error while the main thread enqueues work).
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Comm>();
};

/// Where an initialisation that completes after its call (on a background thread, or at
/// `ncclGroupEnd`) leaves its result for the communicator's handle to pick up.
#[derive(Debug, Default)]
pub struct InitCell {
    slot: Mutex<Slot>,
}

#[derive(Debug, Default)]
enum Slot {
    /// Still running (or waiting for `ncclGroupEnd`).
    #[default]
    Pending,
    /// Finished; not yet picked up by the handle.
    Done(Result<Box<Ready>, ApiError>),
    /// Picked up: the handle's `ready` holds it.
    Moved,
    /// The handle was destroyed or aborted first: the result is released when it comes.
    Abandoned,
}

impl InitCell {
    /// Leaves the result of the initialisation (or releases it when the handle is gone).
    pub fn complete(&self, result: Result<Box<Ready>, ApiError>) {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*slot, Slot::Abandoned) {
            drop(slot);
            if let Ok(ready) = result {
                if let Err(e) = ready.destroy(false) {
                    log_info!("releasing an abandoned communicator: {}", e.message);
                }
            }
            return;
        }
        *slot = Slot::Done(result);
    }
}

/// The state of a communicator of this library.
#[derive(Debug)]
pub enum State<'a> {
    /// Initialised.
    Ready(&'a Ready),
    /// Its initialisation has not completed yet.
    Pending,
    /// Its initialisation failed (or was undone with the rest of its group).
    Failed(&'a ApiError),
}

impl Comm {
    /// A handle on a communicator that is ready.
    pub fn ready_now(ready: Box<Ready>) -> Box<Comm> {
        Box::new(Comm {
            magic: COMM_MAGIC,
            ready: OnceLock::from(Ok(ready)),
            pending: None,
        })
    }

    /// A handle whose communicator comes later, through the returned cell.
    pub fn pending() -> (Box<Comm>, Arc<InitCell>) {
        let cell = Arc::new(InitCell::default());
        let comm = Box::new(Comm {
            magic: COMM_MAGIC,
            ready: OnceLock::new(),
            pending: Some(Arc::clone(&cell)),
        });
        (comm, cell)
    }

    /// Where this communicator stands (picks up a finished initialisation's result).
    pub fn state(&self) -> State<'_> {
        if self.ready.get().is_none() {
            if let Some(cell) = &self.pending {
                let mut slot = cell.slot.lock().unwrap_or_else(|p| p.into_inner());
                if let Slot::Done(_) = &*slot {
                    if let Slot::Done(result) = std::mem::replace(&mut *slot, Slot::Moved) {
                        // Under the cell's lock: no other thread can be setting it.
                        let _ = self.ready.set(result);
                    }
                }
            }
        }
        match self.ready.get() {
            Some(Ok(ready)) => State::Ready(ready),
            Some(Err(e)) => State::Failed(e),
            None => State::Pending,
        }
    }

    /// The initialised communicator, or the error a call on it returns: the failure of its
    /// initialisation, or `ncclInvalidArgument` while it is still initialising (NCCL's
    /// answer to a call on a communicator whose last operation is still in progress).
    pub fn ready(&self) -> ApiResult<&Ready> {
        match self.state() {
            State::Ready(r) => Ok(r),
            State::Pending => Err(ApiError::invalid_argument(
                "the communicator is not ready: its initialisation has not completed (a \
                 non-blocking init still running, or an init inside a group before its \
                 ncclGroupEnd); poll ncclCommGetAsyncError until it is no longer \
                 ncclInProgress",
            )),
            State::Failed(e) => Err(ApiError {
                code: e.code,
                message: format!("the communicator's initialisation failed: {}", e.message),
            }),
        }
    }

    /// Releases what this communicator holds; `graceful` waits for this rank's queued work
    /// first (ncclCommDestroy), otherwise not (ncclCommAbort). One whose initialisation is
    /// still running is abandoned: what it makes is released when it finishes, so this
    /// never waits for it.
    pub fn destroy(self, graceful: bool) -> ApiResult<()> {
        if self.ready.get().is_none() {
            if let Some(cell) = &self.pending {
                let mut slot = cell.slot.lock().unwrap_or_else(|p| p.into_inner());
                match std::mem::replace(&mut *slot, Slot::Abandoned) {
                    Slot::Done(Ok(ready)) => {
                        drop(slot);
                        return ready.destroy(graceful);
                    }
                    Slot::Pending => {
                        log_info!("a communicator still initialising was released: it is dropped when its initialisation ends");
                    }
                    Slot::Done(Err(_)) | Slot::Moved | Slot::Abandoned => {}
                }
            }
        }
        match self.ready.into_inner() {
            Some(Ok(ready)) => ready.destroy(graceful),
            Some(Err(_)) | None => Ok(()),
        }
    }
}

/// What a `ncclComm_t` argument turned out to be.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// One of ours.
    Ours(&'static Comm),
    /// A real NCCL communicator (the real library calls its own exported functions through
    /// the global scope, so they arrive here with its own communicators).
    Foreign(Opaque),
}

/// First word of a destroyed [`Comm`]'s allocation, which is never freed (see [`take`]).
const DESTROYED_MAGIC: u64 = u64::from_le_bytes(*b"OXNCCLRP");

/// Addresses of this library's live communicators: what [`resolve`] trusts, so a
/// destroyed or made-up `ncclComm_t` is refused without reading through it.
fn live() -> &'static RwLock<HashSet<usize>> {
    static LIVE: OnceLock<RwLock<HashSet<usize>>> = OnceLock::new();
    LIVE.get_or_init(|| RwLock::new(HashSet::new()))
}

/// Hands a new communicator to the caller as its `ncclComm_t` (registered as live).
pub fn publish(comm: Box<Comm>) -> Opaque {
    let p = Box::into_raw(comm);
    live()
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p as usize);
    p.cast()
}

/// Takes a live communicator of this library back from its handle, once: `None` when
/// `comm` is not live (destroyed already, or never ours).
///
/// The allocation is not freed: it keeps [`DESTROYED_MAGIC`] as its first word, so a
/// later call with the stale handle is refused even where [`resolve`] must read through
/// unknown handles (a real NCCL is loaded), and the address is never reused for another
/// communicator. That costs one `Comm`'s bytes per destroyed communicator.
pub fn take(comm: Opaque) -> Option<Comm> {
    let mut live = live().write().unwrap_or_else(|e| e.into_inner());
    if !live.remove(&(comm as usize)) {
        return None;
    }
    let p = comm.cast::<Comm>();
    // SAFETY: `p` was registered by `publish`, so it is a leaked `Box<Comm>` allocation
    // holding a valid `Comm`; it left the registry just now under the lock, so this moves
    // the value out exactly once.
    let c = unsafe { p.read() };
    // SAFETY: the allocation stays leaked (never freed) and is aligned for `Comm`, whose
    // first field (`repr(C)`) is a u64; nothing reads the moved-out value through `p`.
    unsafe { p.cast::<u64>().write(DESTROYED_MAGIC) };
    drop(live);
    Some(c)
}

/// Classifies a `ncclComm_t`: null is an error, a live communicator of this library is
/// ours, a destroyed one of ours is an error, anything else is the real NCCL's when one is
/// loaded and an error otherwise (without reading through it).
///
/// # Safety
/// A non-null `comm` that is not a communicator of this library (live or destroyed) must,
/// when a real NCCL is loaded, point at readable memory of at least 8 bytes (one of the
/// real NCCL's communicators).
pub unsafe fn resolve(comm: Opaque) -> ApiResult<Target> {
    if comm.is_null() {
        return Err(ApiError::invalid_argument("comm is NULL"));
    }
    let is_live = live()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&(comm as usize));
    if is_live {
        // SAFETY: a registered address is a leaked `Box<Comm>` (publish) that stays valid
        // until ncclCommDestroy/Abort takes it; using it concurrently with its destruction
        // breaks NCCL's contract (one thread at a time per communicator, and no call after
        // destroy).
        return Ok(Target::Ours(unsafe { &*comm.cast::<Comm>() }));
    }
    if real_nccl().is_err() {
        return Err(ApiError::invalid_argument(format!(
            "comm {comm:?} is not a communicator of this library (never made by it, or \
             destroyed already)"
        )));
    }
    // SAFETY: not ours and not live: a destroyed communicator of ours (whose allocation is
    // kept, see `take`) or, by the caller's contract, one of the real NCCL's; unaligned
    // read as the latter's layout is not ours.
    let magic = unsafe { comm.cast::<u64>().read_unaligned() };
    if magic == DESTROYED_MAGIC || magic == COMM_MAGIC {
        return Err(ApiError::invalid_argument(format!(
            "comm {comm:?} is a destroyed communicator of this library"
        )));
    }
    Ok(Target::Foreign(comm))
}

/// The real NCCL communicator a forwarded call runs on.
pub fn real_comm_of(target: Target, name: &str, why: &str) -> ApiResult<Opaque> {
    match target {
        Target::Foreign(p) => Ok(p),
        Target::Ours(c) => {
            let c = c.ready()?;
            c.real.map(|r| r.0).ok_or_else(|| {
                ApiError::invalid_usage(format!(
                    "{why}, so it must be forwarded to the real NCCL, but this communicator \
                     has none ({name} on rank {}): {}",
                    c.rank, c.no_real_reason
                ))
            })
        }
    }
}

/// Turns a real NCCL result into ours, with the real library's last error as the message.
pub(crate) fn check_real(
    rc: NcclResult,
    real: &RealNccl,
    comm: Opaque,
    name: &str,
) -> ApiResult<()> {
    if rc == NCCL_SUCCESS {
        return Ok(());
    }
    let detail = real
        .fns
        .get_last_error
        .map(|f| {
            // SAFETY: NCCL returns a NUL-terminated string (or NULL) for any comm value.
            let p = unsafe { f(comm) };
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: non-null, NUL-terminated, owned by NCCL.
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            }
        })
        .unwrap_or_default();
    Err(ApiError {
        code: rc,
        message: format!(
            "the real NCCL's {name} returned {rc} ({}): {detail}",
            crate::error::error_string(rc).to_string_lossy()
        ),
    })
}

/// The calling thread's current device on a GPU backend (NCCL's and RCCL's rule: the
/// communicator lives on the current device): CUDA's context's device (0 when no context
/// is current), HIP's `hipGetDevice` (0 by default).
fn current_gpu_device(kind: BackendKind) -> ApiResult<u32> {
    match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Ok(oxccl_collectives::backend::hal_cuda::current_device()
            .ok()
            .flatten()
            .unwrap_or(0)),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            let hip = oxccl_collectives::backend::hal_rocm::Hip::global()?;
            u32::try_from(hip.current_device()?).map_err(|_| {
                ApiError::internal("hipGetDevice returned a negative device".to_string())
            })
        }
        _ => Ok(0),
    }
}

/// Runs `f` with `device` current on the calling thread, as `cudaSetDevice` would make it
/// (the real NCCL takes the current device at its init and split calls), then puts back
/// the context that was current before. Nothing to do on the host backend.
pub fn with_device_current<T>(
    kind: BackendKind,
    device: u32,
    f: impl FnOnce() -> ApiResult<T>,
) -> ApiResult<T> {
    #[cfg(feature = "cuda")]
    if kind == BackendKind::Cuda {
        use oxccl_collectives::backend::hal_cuda;
        let previous = hal_cuda::make_device_current(device)?;
        let result = f();
        // SAFETY: the context current before is the caller's, alive: `f` only begins NCCL
        // operations, which neither destroy it nor leave another one current that the
        // caller needs.
        unsafe { hal_cuda::restore_current(previous) }?;
        return result;
    }
    #[cfg(feature = "rocm")]
    if kind == BackendKind::Rocm {
        // HIP keeps one current device per thread (`hipSetDevice`), which RCCL reads at
        // its init and split calls.
        let hip = oxccl_collectives::backend::hal_rocm::Hip::global()?;
        let previous = hip.current_device()?;
        let ordinal = c_int::try_from(device)
            .map_err(|_| ApiError::invalid_argument(format!("device {device} is out of range")))?;
        hip.set_device(ordinal)?;
        let result = f();
        hip.set_device(previous)?;
        return result;
    }
    let _ = (kind, device);
    f()
}

fn blocking_copy(config: *mut NcclConfig) -> Option<Box<NcclConfig>> {
    if config.is_null() {
        return None;
    }
    // SAFETY: a non-null config points at the caller's ncclConfig_t, whose first field is
    // its size.
    let size = unsafe { config.cast::<usize>().read_unaligned() };
    let n = size.min(std::mem::size_of::<NcclConfig>());
    // SAFETY: all-zero bytes are a valid NcclConfig (integers and null pointers).
    let mut copy: Box<NcclConfig> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `n` bytes are readable at `config` (its own size says so) and writable in
    // `copy` (at most its size).
    unsafe {
        std::ptr::copy_nonoverlapping(
            config.cast::<u8>(),
            (&mut *copy as *mut NcclConfig).cast::<u8>(),
            n,
        )
    };
    if n >= CONFIG_BLOCKING_OFFSET + 4 {
        // oxccl's side is always blocking; the real side follows, so that init and every
        // call complete before returning (no ncclInProgress to poll).
        copy.blocking = 1;
    }
    Some(copy)
}

/// The checked arguments of one rank's init: what each way of completing it (at the call,
/// on a background thread, at `ncclGroupEnd`) starts from.
#[derive(Debug, Clone)]
pub struct InitSpec {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub nranks: u32,
    packed: PackedId,
    /// The backend.
    pub kind: BackendKind,
    /// The device: the caller's choice, else the calling thread's current CUDA device (the
    /// rank's host device on the host backend), read at the call.
    pub device: u32,
}

/// The oxccl side of a new communicator, made and not yet joined to its real side.
#[derive(Debug)]
pub struct OxcclSide {
    oxccl: Oxccl,
    host: Option<HostState>,
}

/// Makes the oxccl side of rank `rank` of `nranks` on the job named by `id` (collective).
fn oxccl_side(
    id: &UniqueId,
    rank: u32,
    nranks: u32,
    kind: BackendKind,
    device: u32,
) -> ApiResult<OxcclSide> {
    let bootstrap = Bootstrap::new(id, rank, nranks, &BootstrapConfig::from_env()?)?;
    let mut host = None;
    let oxccl = if nranks <= OXCCL_ALLREDUCE_MAX_RANKS {
        let dev = AnyDevice::open_with(kind, DeviceId(device))?;
        if kind == BackendKind::Host {
            host = Some(HostState {
                stream: dev.create_stream()?,
                staging: Mutex::new(None),
            });
        }
        let comm = Communicator::new(bootstrap, dev, CommConfig::from_env()?)?;
        Oxccl::Serving(Box::new(comm))
    } else {
        Oxccl::BootstrapOnly(bootstrap)
    };
    Ok(OxcclSide { oxccl, host })
}

/// Whether a config asks for a non-blocking communicator (`blocking = 0`, in a config
/// long enough to have the field).
pub fn is_nonblocking(config: *mut NcclConfig) -> bool {
    if config.is_null() {
        return false;
    }
    // SAFETY: a non-null config points at the caller's ncclConfig_t, whose first field is
    // its size.
    let size = unsafe { config.cast::<usize>().read_unaligned() };
    if size < CONFIG_BLOCKING_OFFSET + 4 {
        return false;
    }
    // SAFETY: the caller's config is at least `size` bytes, which covers the field.
    let blocking = unsafe {
        config
            .cast::<u8>()
            .add(CONFIG_BLOCKING_OFFSET)
            .cast::<c_int>()
            .read_unaligned()
    };
    blocking == 0
}

/// A copy of the caller's config that outlives the call (a non-blocking init uses it on
/// another thread): the config, made blocking for the real side, and its two strings.
#[derive(Debug)]
pub struct OwnedConfig {
    config: Box<NcclConfig>,
    _names: Vec<CString>,
}

// SAFETY: the config's string pointers point into `_names`, owned by the same value, and
// nothing else in it refers to memory of the caller's.
unsafe impl Send for OwnedConfig {}

impl OwnedConfig {
    /// Copies the caller's config (`None` for NULL).
    pub fn copy(config: *mut NcclConfig) -> Option<OwnedConfig> {
        let mut config = blocking_copy(config)?;
        let mut names = Vec::new();
        for p in [&mut config.net_name, &mut config.comm_name] {
            if p.is_null() {
                continue;
            }
            // SAFETY: NCCL's contract: a non-null name is a NUL-terminated string, readable
            // during the call.
            let name = unsafe { CStr::from_ptr(*p) }.to_owned();
            *p = name.as_ptr();
            names.push(name);
        }
        Some(OwnedConfig {
            config,
            _names: names,
        })
    }

    /// The copy, for a call that takes the caller's config.
    pub fn as_ptr(&mut self) -> *mut NcclConfig {
        &mut *self.config
    }
}

impl InitSpec {
    /// Checks an init call's arguments and picks the device (on the calling thread: the
    /// current CUDA device is the caller's).
    pub fn new(
        nranks: c_int,
        id: &NcclUniqueId,
        rank: c_int,
        device: Option<u32>,
    ) -> ApiResult<InitSpec> {
        if nranks < 1 {
            return Err(ApiError::invalid_argument(format!(
                "nranks {nranks} is not positive"
            )));
        }
        if rank < 0 || rank >= nranks {
            return Err(ApiError::invalid_argument(format!(
                "rank {rank} is not in 0..{nranks}"
            )));
        }
        let (rank, nranks) = (rank as u32, nranks as u32);
        let packed = id::unpack(&id.bytes())?;
        let kind = backend()?;
        let device = match (device, kind) {
            (Some(d), _) => d,
            (None, BackendKind::Host) => {
                rank % oxccl_collectives::backend::device_count_of(BackendKind::Host)?
            }
            (None, kind) => current_gpu_device(kind)?,
        };
        Ok(InitSpec {
            rank,
            nranks,
            packed,
            kind,
            device,
        })
    }

    /// Creates both sides now (collective over the `nranks` callers of one id): the oxccl
    /// side, then the real NCCL's.
    pub fn run(self, config: *mut NcclConfig) -> ApiResult<Box<Ready>> {
        let side = self.run_oxccl()?;
        let (real, no_real_reason) = init_real(&self.packed, self.nranks, self.rank, config)?;
        Ok(self.assemble(side, real, no_real_reason))
    }

    /// Creates both sides on a thread of this library's (a non-blocking init): the real
    /// library takes the thread's current device (CUDA context, HIP device) as its device,
    /// so the rank's device is made current first.
    pub fn run_background(self, mut config: Option<OwnedConfig>) -> ApiResult<Box<Ready>> {
        let _current = if self.kind != BackendKind::Host && self.packed.real.is_some() {
            Some(AnyDevice::open_with(self.kind, DeviceId(self.device))?)
        } else {
            None
        };
        let ptr = config
            .as_mut()
            .map_or(std::ptr::null_mut(), OwnedConfig::as_ptr);
        self.run(ptr)
    }

    /// Creates the oxccl side only (the real side of a grouped init is begun in the real
    /// NCCL's group, see [`InitSpec::begin_real`]).
    pub fn run_oxccl(&self) -> ApiResult<OxcclSide> {
        oxccl_side(
            &self.packed.oxccl,
            self.rank,
            self.nranks,
            self.kind,
            self.device,
        )
    }

    /// Begins the real communicator inside the real NCCL's open group (the calling thread's:
    /// the real library completes it at its `ncclGroupEnd`, on the device current now: see
    /// [`with_device_current`]).
    pub fn begin_real(&self, config: *mut NcclConfig) -> ApiResult<RealInit> {
        let Some(real_id) = self.packed.real else {
            return Ok(RealInit::none(no_real_id_reason()));
        };
        let real = real_for_id()?;
        let id = NcclUniqueId::from_bytes(&real_id);
        let mut begun = RealInit::begun(config);
        let (out, cfg) = begun.pointers();
        let (nranks, rank) = (self.nranks as c_int, self.rank as c_int);
        let rc = match (
            cfg.is_null(),
            real.fns.comm_init_rank_config,
            real.fns.comm_init_rank,
        ) {
            // SAFETY: `out` is a stable out-pointer and `cfg` a full-size config copy, both
            // kept until the real group ends (`RealInit` owns them).
            (false, Some(f), _) => unsafe { f(out, nranks, id, rank, cfg) },
            // SAFETY: `out` is a stable out-pointer kept until the real group ends.
            (true, _, Some(f)) => unsafe { f(out, nranks, id, rank) },
            _ => {
                return Err(ApiError::invalid_usage(
                    "the real NCCL has no ncclCommInitRank(Config)",
                ))
            }
        };
        if rc != NCCL_IN_PROGRESS {
            check_real(rc, real, std::ptr::null_mut(), "ncclCommInitRank")?;
        }
        Ok(begun)
    }

    /// Joins both sides into the communicator (and logs it).
    pub fn assemble(
        self,
        side: OxcclSide,
        real: Option<RealComm>,
        no_real_reason: String,
    ) -> Box<Ready> {
        let InitSpec {
            rank,
            nranks,
            kind,
            device,
            ..
        } = self;
        let OxcclSide { oxccl, host } = side;
        log_info!(
            "rank {rank}/{nranks} device {device} ({kind}): oxccl {}, real NCCL {}",
            match oxccl {
                Oxccl::Serving(_) => "serving allreduce".to_string(),
                Oxccl::BootstrapOnly(_) =>
                    format!("not serving (world size above {OXCCL_ALLREDUCE_MAX_RANKS})"),
            },
            if real.is_some() {
                "communicator ready".to_string()
            } else {
                format!("none ({no_real_reason})")
            }
        );
        Box::new(Ready {
            rank,
            nranks,
            device: device as i32,
            kind,
            oxccl,
            real,
            no_real_reason,
            async_error: AtomicI32::new(NCCL_SUCCESS),
            ops: UserOps::default(),
            finalized: AtomicBool::new(false),
            host,
        })
    }
}

/// A real NCCL communicator begun inside the real library's group: where the real library
/// writes its handle and the config it was given, both kept at stable addresses until
/// the real group has ended.
#[derive(Debug)]
pub struct RealInit {
    out: Option<Box<Opaque>>,
    config: Option<Box<NcclConfig>>,
    no_real_reason: String,
}

impl RealInit {
    fn none(reason: String) -> RealInit {
        RealInit {
            out: None,
            config: None,
            no_real_reason: reason,
        }
    }

    fn begun(config: *mut NcclConfig) -> RealInit {
        RealInit {
            out: Some(Box::new(std::ptr::null_mut())),
            config: blocking_copy(config),
            no_real_reason: String::new(),
        }
    }

    /// The out-pointer and the config pointer (null when the caller gave none) to hand the
    /// real library.
    fn pointers(&mut self) -> (*mut Opaque, *mut NcclConfig) {
        let out = self
            .out
            .as_deref_mut()
            .map_or(std::ptr::null_mut(), |o| o as *mut Opaque);
        let cfg = self
            .config
            .as_deref_mut()
            .map_or(std::ptr::null_mut(), |c| c as *mut NcclConfig);
        (out, cfg)
    }

    /// After the real group ended: the real communicator (none when none was begun, or the
    /// real library made none, e.g. a split's `NCCL_SPLIT_NOCOLOR`).
    pub fn finish(self) -> (Option<RealComm>, String) {
        let comm = self.out.map(|o| *o).filter(|p| !p.is_null()).map(RealComm);
        (comm, self.no_real_reason)
    }

    /// After the real group ended: releases the real communicator without waiting (its
    /// group failed on our side).
    pub fn abort(self) {
        if let (Some(comm), _) = self.finish() {
            if let Ok(Some(f)) = real_nccl().map(|r| r.fns.comm_abort) {
                // SAFETY: a live real communicator, released once here.
                let _ = unsafe { f(comm.0) };
            }
        }
    }
}

/// How a split of one rank turns out after the parent's ranks agreed: its rank and size in
/// the new communicator and the new communicator's oxccl id.
#[derive(Debug, Clone, Copy)]
pub struct SplitPlan {
    new_rank: u32,
    n: u32,
    id: UniqueId,
}

impl Ready {
    /// The oxccl communicator, when oxccl serves this communicator's calls: at most 8
    /// ranks, and a backend whose streams this build can take from the caller (CUDA's
    /// `cudaStream_t`, ROCm's `hipStream_t`), or the host backend ([`crate::serve`] says
    /// why not otherwise).
    pub fn serving(&self) -> Option<&Communicator> {
        match &self.oxccl {
            Oxccl::Serving(c) if crate::serve::backend_refusal(self.kind).is_none() => Some(c),
            _ => None,
        }
    }

    /// Refuses colors NCCL refuses.
    pub fn check_color(color: c_int) -> ApiResult<()> {
        if color < NCCL_SPLIT_NOCOLOR {
            return Err(ApiError::invalid_argument(format!(
                "color {color} is negative and not NCCL_SPLIT_NOCOLOR"
            )));
        }
        Ok(())
    }

    /// Splits now (collective over the parent's ranks): `None` for `NCCL_SPLIT_NOCOLOR`.
    pub fn split(
        &self,
        color: c_int,
        key: c_int,
        config: *mut NcclConfig,
    ) -> ApiResult<Option<Box<Ready>>> {
        Ready::check_color(color)?;
        let plan = self.split_agree(color, key)?;
        // The real side splits with the same color and key.
        let mut new_real = None;
        if let Some(rc) = self.real {
            let real = real_nccl().map_err(ApiError::internal)?;
            let f = real
                .fns
                .comm_split
                .ok_or_else(|| ApiError::invalid_usage("the real NCCL has no ncclCommSplit"))?;
            let mut out: Opaque = std::ptr::null_mut();
            let mut cfg = blocking_copy(config);
            let cfg_ptr = cfg
                .as_deref_mut()
                .map_or(std::ptr::null_mut(), |c| c as *mut NcclConfig);
            // SAFETY: `rc` is a live real communicator, `out` a valid out-pointer, `cfg_ptr`
            // null or a full-size config copy.
            let r = unsafe { f(rc.0, color, key, &mut out, cfg_ptr) };
            check_real(r, real, rc.0, "ncclCommSplit")?;
            new_real = (!out.is_null()).then_some(RealComm(out));
        }
        let Some(plan) = plan else {
            return Ok(None);
        };
        let side = self.split_oxccl(&plan)?;
        Ok(Some(self.split_assemble(&plan, side, new_real, color, key)))
    }

    /// The first half of a split's oxccl side (collective over the parent's ranks): every
    /// rank's color and key are all-gathered, the lowest (key, rank) of each color makes
    /// the new communicator's oxccl id, which a second all-gather shares. `None`: this
    /// rank gets no communicator (`NCCL_SPLIT_NOCOLOR`).
    pub fn split_agree(&self, color: c_int, key: c_int) -> ApiResult<Option<SplitPlan>> {
        let boot = self.oxccl.bootstrap();
        let mut mine = Vec::with_capacity(8);
        mine.extend_from_slice(&color.to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = boot.all_gather(&mine)?;
        let mut members: Vec<(c_int, u32)> = Vec::new();
        for (r, b) in all.iter().enumerate() {
            let (Some(c), Some(k)) = (b.get(0..4), b.get(4..8)) else {
                return Err(ApiError::internal("short split record from a peer"));
            };
            let c = c_int::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let k = c_int::from_le_bytes([k[0], k[1], k[2], k[3]]);
            if c == color && color != NCCL_SPLIT_NOCOLOR {
                members.push((k, r as u32));
            }
        }
        members.sort_unstable();
        let leader = members.first().map(|m| m.1);
        let new_rank = members.iter().position(|m| m.1 == self.rank);
        // The leader of each color makes the group's oxccl id and everyone shares theirs.
        let made = if leader == Some(self.rank) {
            UniqueId::create(&BootstrapConfig::from_env()?)?
                .to_bytes()
                .to_vec()
        } else {
            Vec::new()
        };
        let ids = boot.all_gather(&made)?;
        let (Some(leader), Some(new_rank)) = (leader, new_rank) else {
            return Ok(None);
        };
        let id_bytes = ids
            .get(leader as usize)
            .ok_or_else(|| ApiError::internal("no id from the split leader"))?;
        Ok(Some(SplitPlan {
            new_rank: new_rank as u32,
            n: members.len() as u32,
            id: UniqueId::from_bytes(id_bytes)?,
        }))
    }

    /// Begins the real side of a split inside the real NCCL's open group (the calling
    /// thread's), with the same color and key; nothing when this communicator has no real
    /// side.
    pub fn split_begin_real(
        &self,
        color: c_int,
        key: c_int,
        config: *mut NcclConfig,
    ) -> ApiResult<RealInit> {
        let Some(rc) = self.real else {
            return Ok(RealInit::none(self.no_real_reason.clone()));
        };
        let real = real_nccl().map_err(ApiError::internal)?;
        let f = real
            .fns
            .comm_split
            .ok_or_else(|| ApiError::invalid_usage("the real NCCL has no ncclCommSplit"))?;
        let mut begun = RealInit::begun(config);
        let (out, cfg) = begun.pointers();
        // SAFETY: `rc` is a live real communicator; `out` and `cfg` (null or a full-size
        // config copy) stay at their addresses until the real group ends (`RealInit` owns
        // them).
        let r = unsafe { f(rc.0, color, key, out, cfg) };
        if r != NCCL_IN_PROGRESS {
            check_real(r, real, rc.0, "ncclCommSplit")?;
        }
        Ok(begun)
    }

    /// The second half of a split's oxccl side: the new communicator's bootstrap and oxccl
    /// communicator, on this communicator's device (collective over the new ranks).
    pub fn split_oxccl(&self, plan: &SplitPlan) -> ApiResult<OxcclSide> {
        oxccl_side(
            &plan.id,
            plan.new_rank,
            plan.n,
            self.kind,
            self.device as u32,
        )
    }

    /// Joins a split's sides into the new communicator (and logs it).
    pub fn split_assemble(
        &self,
        plan: &SplitPlan,
        side: OxcclSide,
        real: Option<RealComm>,
        color: c_int,
        key: c_int,
    ) -> Box<Ready> {
        let SplitPlan { new_rank, n, .. } = *plan;
        log_info!(
            "rank {} split color {color} key {key} -> rank {new_rank}/{n}",
            self.rank
        );
        Box::new(Ready {
            rank: new_rank,
            nranks: n,
            device: self.device,
            kind: self.kind,
            oxccl: side.oxccl,
            real,
            no_real_reason: self.no_real_reason.clone(),
            async_error: AtomicI32::new(NCCL_SUCCESS),
            ops: UserOps::default(),
            finalized: AtomicBool::new(false),
            host: side.host,
        })
    }

    /// Allreduce served by oxccl (a built-in operator or PreMulSum). Returns what ran (algorithm
    /// and buffer path) for the log.
    ///
    /// # Safety
    /// NCCL's contract for ncclAllReduce: `send` and `recv` hold `count` elements on this
    /// communicator's device (host memory on the host backend), `stream` is a live stream
    /// of that device, every rank makes the same calls.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce(
        &self,
        comm: &Communicator,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: Reduction,
        stream: CudaStreamT,
    ) -> ApiResult<String> {
        if let Some(host) = &self.host {
            return self.host_all_reduce(host, comm, send, recv, count, dtype, op);
        }
        let s = self.borrow_stream(comm, stream)?;
        // SAFETY: this function's contract is all_reduce's (buffers and stream).
        unsafe { all_reduce_with(comm, send, recv, count, dtype, op, &s) }?;
        Ok(served_by(comm))
    }

    /// The caller's stream (`cudaStream_t` or `hipStream_t`: both are the runtime's opaque
    /// pointer) wrapped without ownership on the communicator's device.
    fn borrow_stream(&self, comm: &Communicator, stream: CudaStreamT) -> ApiResult<AnyStream> {
        match comm.device() {
            // SAFETY: NCCL's contract: the caller's stream is live on this device for the
            // call; the borrowed wrapper is dropped before returning and destroys nothing.
            #[cfg(feature = "cuda")]
            AnyDevice::Cuda(d) => Ok(AnyStream::Cuda(unsafe { d.borrow_stream(stream.cast()) })),
            // SAFETY: RCCL's contract (NCCL's): as above, for the caller's hipStream_t.
            #[cfg(feature = "rocm")]
            AnyDevice::Rocm(d) => Ok(AnyStream::Rocm(unsafe {
                oxccl_collectives::backend::hal_rocm::RocmStream::borrowed(d, stream.cast())
            }?)),
            other => {
                let _ = stream;
                Err(ApiError::internal(format!(
                    "a call on the caller's stream on a {} device, whose streams this build \
                     cannot wrap",
                    other.backend()
                )))
            }
        }
    }

    /// The host backend's allreduce: see [`Ready::host_call`].
    #[allow(clippy::too_many_arguments)]
    fn host_all_reduce(
        &self,
        host: &HostState,
        comm: &Communicator,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: Reduction,
    ) -> ApiResult<String> {
        // The caller's buffers are checked here: the call itself runs on staging.
        comm.check_buffers(Collective::AllReduce, send, recv, count, dtype)?;
        let bytes = dtype.bytes(count)?;
        self.host_call(host, comm, (send, bytes, 0), (recv, bytes, 0), |buf| {
            // SAFETY: the staging buffer holds `count` elements and lives until the stream
            // is synchronized (host_call); in place is allowed; a device scalar is the
            // caller's host memory, read before host_call returns.
            unsafe { all_reduce_with(comm, buf, buf, count, dtype, op, &host.stream) }
        })
    }

    /// All-gather of `count` elements of `dtype` per rank on the caller's stream (the
    /// host backend: through host memory, see [`Ready::host_call`]); returns the algorithm
    /// for the log when logging.
    ///
    /// # Safety
    /// NCCL's contract for ncclAllGather: `send` holds `count` elements and `recv`
    /// `nranks * count` on this communicator's device (host memory on the host backend),
    /// `stream` is a live stream of that device, every rank makes the same calls.
    pub unsafe fn all_gather(
        &self,
        comm: &Communicator,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        stream: CudaStreamT,
    ) -> ApiResult<String> {
        if let Some(host) = &self.host {
            // The caller's buffers are checked here: the call itself runs on staging.
            comm.check_buffers(Collective::AllGather, send, recv, count, dtype)?;
            let bytes = dtype.bytes(count)?;
            let total = bytes
                .checked_mul(self.nranks as usize)
                .ok_or_else(|| ApiError::invalid_argument("all-gather size overflows"))?;
            let slot = bytes * self.rank as usize;
            return self.host_call(host, comm, (send, bytes, slot), (recv, total, 0), |buf| {
                let own = buf.offset(slot)?;
                // SAFETY: the staging buffer holds `nranks * count` elements, the input is
                // this rank's slot of it (in place), and it lives until the stream is
                // synchronized (host_call).
                unsafe { comm.all_gather(own, buf, count, dtype, &host.stream) }
            });
        }
        let s = self.borrow_stream(comm, stream)?;
        // SAFETY: this function's contract is all_gather's (buffers and stream).
        unsafe { comm.all_gather(send, recv, count, dtype, &s) }?;
        Ok(served_by(comm))
    }

    /// Reduce-scatter of `count` output elements per rank on the caller's stream (the host
    /// backend: through host memory, see [`Ready::host_call`]); returns the algorithm for the
    /// log when logging.
    ///
    /// # Safety
    /// NCCL's contract for ncclReduceScatter: `send` holds `nranks * count` elements and
    /// `recv` `count` on this communicator's device (host memory on the host backend),
    /// `stream` is a live stream of that device, every rank makes the same calls.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_scatter(
        &self,
        comm: &Communicator,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: Reduction,
        stream: CudaStreamT,
    ) -> ApiResult<String> {
        let collective = Collective::ReduceScatter;
        if let Some(host) = &self.host {
            // The caller's buffers are checked here: the call itself runs on staging.
            comm.check_buffers(collective, send, recv, count, dtype)?;
            let bytes = dtype.bytes(count)?;
            let total = bytes
                .checked_mul(self.nranks as usize)
                .ok_or_else(|| ApiError::invalid_argument("reduce-scatter size overflows"))?;
            let slot = bytes * self.rank as usize;
            return self.host_call(host, comm, (send, total, 0), (recv, bytes, slot), |buf| {
                let own = buf.offset(slot)?;
                // SAFETY: the staging buffer holds `nranks * count` elements, the output is
                // this rank's chunk of them (in place), and it lives until the stream is
                // synchronized (host_call).
                unsafe { reduce_scatter_with(comm, buf, own, count, dtype, op, &host.stream) }
            });
        }
        let s = self.borrow_stream(comm, stream)?;
        // SAFETY: this function's contract is reduce_scatter's (buffers and stream).
        unsafe { reduce_scatter_with(comm, send, recv, count, dtype, op, &s) }?;
        Ok(served_by(comm))
    }

    /// All-to-all of `count` elements per peer on the caller's stream (the host backend:
    /// through host memory, see [`Ready::host_call`]); returns the algorithm for the log when
    /// logging.
    ///
    /// # Safety
    /// NCCL's contract for ncclAlltoAll: `send` and `recv` hold `nranks * count` elements
    /// on this communicator's device (host memory on the host backend), `stream` is a live
    /// stream of that device, every rank makes the same calls.
    pub unsafe fn all_to_all(
        &self,
        comm: &Communicator,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        stream: CudaStreamT,
    ) -> ApiResult<String> {
        let collective = Collective::AllToAll;
        if let Some(host) = &self.host {
            // The caller's buffers are checked here: the call itself runs on staging.
            comm.check_buffers(collective, send, recv, count, dtype)?;
            let total = dtype
                .bytes(count)?
                .checked_mul(self.nranks as usize)
                .ok_or_else(|| ApiError::invalid_argument("all-to-all size overflows"))?;
            return self.host_call(host, comm, (send, total, 0), (recv, total, total), |buf| {
                let out = buf.offset(total)?;
                // SAFETY: the staging buffer holds the input and then the output,
                // `nranks * count` elements each, and lives until the stream is synchronized
                // (host_call).
                unsafe { comm.all_to_all(buf, out, count, dtype, &host.stream) }
            });
        }
        let s = self.borrow_stream(comm, stream)?;
        // SAFETY: this function's contract is all_to_all's (buffers and stream).
        unsafe { comm.all_to_all(send, recv, count, dtype, &s) }?;
        Ok(served_by(comm))
    }

    /// Broadcast of `count` elements from `root` on the caller's stream (the host backend:
    /// through host memory, see [`Ready::host_call`]); returns the algorithm for the log when
    /// logging.
    ///
    /// # Safety
    /// NCCL's contract for ncclBroadcast: `recv` (and on the root `send`) holds `count`
    /// elements on this communicator's device (host memory on the host backend), `stream`
    /// is a live stream of that device, every rank makes the same calls.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn broadcast(
        &self,
        comm: &Communicator,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        root: u32,
        stream: CudaStreamT,
    ) -> ApiResult<String> {
        if let Some(host) = &self.host {
            let bytes = dtype.bytes(count)?;
            // Only the root's input is read (and checked: the call checks recv alone
            // elsewhere, as the library ignores the other ranks' input).
            let (input, send_bytes) = if root == self.rank {
                (send, bytes)
            } else {
                (recv, 0)
            };
            comm.check_buffers(Collective::Broadcast, input, recv, count, dtype)?;
            return self.host_call(
                host,
                comm,
                (input, send_bytes, 0),
                (recv, bytes, 0),
                |buf| {
                    // SAFETY: the staging buffer holds `count` elements (the root's input on
                    // the root), in place, and lives until the stream is synchronized
                    // (host_call).
                    unsafe { comm.broadcast(buf, buf, count, dtype, root, &host.stream) }
                },
            );
        }
        let s = self.borrow_stream(comm, stream)?;
        // SAFETY: this function's contract is broadcast's (buffers and stream).
        unsafe { comm.broadcast(send, recv, count, dtype, root, &s) }?;
        Ok(served_by(comm))
    }

    /// Reduce of `count` elements to `root` on the caller's stream (the host backend:
    /// through host memory, see [`Ready::host_call`]); returns the algorithm for the log when
    /// logging.
    ///
    /// # Safety
    /// NCCL's contract for ncclReduce: `send` (and on the root `recv`) holds `count`
    /// elements on this communicator's device (host memory on the host backend), `stream`
    /// is a live stream of that device, every rank makes the same calls.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &self,
        comm: &Communicator,
        send: DevicePtr,
        recv: DevicePtr,
        count: usize,
        dtype: DataType,
        op: Reduction,
        root: u32,
        stream: CudaStreamT,
    ) -> ApiResult<String> {
        let collective = Collective::Reduce;
        if let Some(host) = &self.host {
            let bytes = dtype.bytes(count)?;
            // Only the root's output is written (and checked: the library ignores the other
            // ranks' output, which may be NULL); nothing is copied back elsewhere.
            let (output, recv_bytes) = if root == self.rank {
                (recv, bytes)
            } else {
                (send, 0)
            };
            comm.check_buffers(collective, send, output, count, dtype)?;
            return self.host_call(
                host,
                comm,
                (send, bytes, 0),
                (output, recv_bytes, 0),
                |buf| {
                    // SAFETY: the staging buffer holds `count` elements (this rank's input), in
                    // place, and lives until the stream is synchronized (host_call).
                    unsafe { reduce_with(comm, (buf, buf), count, dtype, op, root, &host.stream) }
                },
            );
        }
        let s = self.borrow_stream(comm, stream)?;
        // SAFETY: this function's contract is reduce's (buffers and stream).
        unsafe { reduce_with(comm, (send, recv), count, dtype, op, root, &s) }?;
        Ok(served_by(comm))
    }

    /// A call on the host backend: the caller's host input (`send`, its bytes, and where
    /// it goes in the staging buffer) is copied into a host-backend (shared-memory)
    /// staging buffer, `run` queues the collective on it, and the output (`recv`, its
    /// bytes, and where it is in the staging buffer) is copied back to the caller; returns
    /// once done (the caller's stream is not used). A failure is kept as the
    /// communicator's async error.
    fn host_call(
        &self,
        host: &HostState,
        comm: &Communicator,
        (send, send_bytes, send_at): (DevicePtr, usize, usize),
        (recv, recv_bytes, recv_at): (DevicePtr, usize, usize),
        run: impl FnOnce(DevicePtr) -> oxccl_collectives::hal::Result<()>,
    ) -> ApiResult<String> {
        let need = recv_at
            .saturating_add(recv_bytes)
            .max(send_at.saturating_add(send_bytes));
        let mut staging = host.staging.lock().unwrap_or_else(|p| p.into_inner());
        if staging.as_ref().is_none_or(|m| m.len() < need) {
            *staging = None;
            *staging = Some(comm.device().alloc(need.max(4096), MemoryKind::Plain)?);
        }
        let mem = staging
            .as_ref()
            .ok_or_else(|| ApiError::internal("no staging buffer"))?;
        // SAFETY: NCCL's contract: `send` holds `send_bytes` readable bytes of host memory.
        let input = unsafe { std::slice::from_raw_parts(send.0 as usize as *const u8, send_bytes) };
        host.stream.write(mem.ptr().offset(send_at)?, input)?;
        let result = run(mem.ptr())
            .and_then(|()| host.stream.synchronize())
            .and_then(|()| comm.check_error(&host.stream));
        if let Err(e) = result {
            let e = ApiError::from(e);
            self.async_error.store(e.code, Ordering::Relaxed);
            return Err(e);
        }
        // SAFETY: NCCL's contract: `recv` holds `recv_bytes` writable bytes of host memory.
        let out = unsafe { std::slice::from_raw_parts_mut(recv.0 as usize as *mut u8, recv_bytes) };
        host.stream.read(mem.ptr().offset(recv_at)?, out)?;
        Ok("host".into())
    }

    /// Waits for this rank's queued oxccl work (the whole device: oxccl runs on the
    /// callers' streams). Local, like NCCL's: a program may finalize and destroy the
    /// communicators of several ranks one after the other from one thread
    /// (`ncclCommInitAll`), so no step of the teardown waits for other ranks. That is safe
    /// because every peer holds its own reference to this rank's scratch (a VMM handle on
    /// CUDA, a memfd on the host backend), which outlives this rank's release.
    pub fn finalize(&self) -> ApiResult<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Oxccl::Serving(c) = &self.oxccl {
            c.device().synchronize()?;
        }
        Ok(())
    }

    /// The first step of ncclCommAbort, taken while the handle is still live: every wait
    /// of this rank's oxccl kernels ends ([`Communicator::abort`]: a call stuck on a dead
    /// peer returns promptly instead of at its timeout, and later calls are refused), and
    /// on the host backend a call in flight on another thread (it holds the staging buffer
    /// until its stream has returned) has ended before this returns. Idempotent.
    pub fn abort(&self) {
        if let Oxccl::Serving(c) = &self.oxccl {
            c.abort();
        }
        if let Some(host) = &self.host {
            drop(host.staging.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// Releases everything; `graceful` waits for this rank's queued work first
    /// (ncclCommDestroy), otherwise not (ncclCommAbort: [`Ready::abort`] first, and the
    /// oxccl side goes once its aborted kernels have ended, [`Ready::release_aborted`]).
    pub fn destroy(mut self, graceful: bool) -> ApiResult<()> {
        let mut result = Ok(());
        if graceful {
            result = self.finalize();
        } else {
            self.abort();
        }
        if let Some(rc) = self.real.take() {
            let real = real_nccl().map_err(ApiError::internal)?;
            let f = if graceful {
                real.fns.comm_destroy
            } else {
                real.fns.comm_abort
            };
            if let Some(f) = f {
                // SAFETY: `rc` is a live real communicator, released exactly once here.
                let r = unsafe { f(rc.0) };
                result = result.and(check_real(r, real, rc.0, "ncclCommDestroy"));
            }
        }
        if graceful {
            drop(self);
        } else {
            self.release_aborted();
        }
        result
    }

    /// Drops an aborted communicator once this rank's device has finished its queued work:
    /// the aborted kernels end about a millisecond into their waits, but one still running
    /// when the communicator's memory goes would fault and leave the GPU unusable. The device is
    /// synchronized on a thread of its own, waited for at most [`ABORT_DRAIN`]: a device
    /// busier than that (another library's kernel stuck on the dead peer, say) keeps the
    /// communicator on that thread until it is idle, and ncclCommAbort returns anyway.
    /// The host backend's calls are synchronous ([`Ready::abort`] waited for them).
    fn release_aborted(self) {
        if self.host.is_some() || !matches!(self.oxccl, Oxccl::Serving(_)) {
            drop(self);
            return;
        }
        let rank = self.rank;
        // The thread takes the communicator from here; if it cannot start, this thread
        // drains and drops it instead.
        let slot = Arc::new(Mutex::new(Some(self)));
        let theirs = Arc::clone(&slot);
        let (done, finished) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("oxccl-nccl-abort-{rank}"))
            .spawn(move || {
                let ready = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(ready) = ready {
                    ready.drain_and_drop();
                }
                let _ = done.send(());
            });
        match spawned {
            Ok(_) => {
                if finished.recv_timeout(ABORT_DRAIN).is_err() {
                    log_info!(
                        "rank {rank} ncclCommAbort: the device is still busy after {ABORT_DRAIN:?}; \
                         the oxccl communicator is released once it is idle"
                    );
                }
            }
            Err(e) => {
                log_info!("rank {rank} ncclCommAbort: no release thread ({e}); draining here");
                let ready = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(ready) = ready {
                    ready.drain_and_drop();
                }
            }
        }
    }

    /// Waits for this rank's device to finish its queued work, then drops everything.
    fn drain_and_drop(self) {
        if let Oxccl::Serving(c) = &self.oxccl {
            if let Err(e) = c.device().synchronize() {
                log_info!(
                    "rank {} ncclCommAbort: synchronizing the device: {e}",
                    self.rank
                );
            }
        }
        drop(self);
    }
}

/// How long ncclCommAbort waits for the device to finish the aborted work before it returns
/// and leaves the release to a thread of its own ([`Ready::release_aborted`]).
const ABORT_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// An allreduce with a built-in operator or PreMulSum, accumulation `Auto`.
///
/// # Safety
/// [`Communicator::all_reduce`]'s contract (and [`Communicator::all_reduce_premul`]'s).
unsafe fn all_reduce_with(
    comm: &Communicator,
    send: DevicePtr,
    recv: DevicePtr,
    count: usize,
    dtype: DataType,
    op: Reduction,
    s: &AnyStream,
) -> oxccl_collectives::hal::Result<()> {
    let auto = AccumType::Auto;
    // SAFETY: this function's contract.
    unsafe {
        match op {
            Reduction::BuiltIn(op) => comm.all_reduce(send, recv, count, dtype, op, auto, s),
            Reduction::PreMul(p) => comm.all_reduce_premul(send, recv, count, dtype, p, auto, s),
        }
    }
}

/// A reduce-scatter with a built-in operator or PreMulSum, accumulation `Auto`.
///
/// # Safety
/// [`Communicator::reduce_scatter`]'s contract (and [`Communicator::reduce_scatter_premul`]'s).
unsafe fn reduce_scatter_with(
    comm: &Communicator,
    send: DevicePtr,
    recv: DevicePtr,
    count: usize,
    dtype: DataType,
    op: Reduction,
    s: &AnyStream,
) -> oxccl_collectives::hal::Result<()> {
    let auto = AccumType::Auto;
    // SAFETY: this function's contract.
    unsafe {
        match op {
            Reduction::BuiltIn(op) => comm.reduce_scatter(send, recv, count, dtype, op, auto, s),
            Reduction::PreMul(p) => {
                comm.reduce_scatter_premul(send, recv, count, dtype, p, auto, s)
            }
        }
    }
}

/// A reduce with a built-in operator or PreMulSum, accumulation `Auto`.
///
/// # Safety
/// [`Communicator::reduce`]'s contract (and [`Communicator::reduce_premul`]'s).
unsafe fn reduce_with(
    comm: &Communicator,
    (send, recv): (DevicePtr, DevicePtr),
    count: usize,
    dtype: DataType,
    op: Reduction,
    root: u32,
    s: &AnyStream,
) -> oxccl_collectives::hal::Result<()> {
    let auto = AccumType::Auto;
    // SAFETY: this function's contract.
    unsafe {
        match op {
            Reduction::BuiltIn(op) => comm.reduce(send, recv, count, dtype, op, auto, root, s),
            Reduction::PreMul(p) => comm.reduce_premul(send, recv, count, dtype, p, auto, root, s),
        }
    }
}

/// Why a communicator whose id carries no real NCCL id has no real side.
fn no_real_id_reason() -> String {
    match real_nccl() {
        Err(e) => e,
        Ok(_) => "the unique id carries no real NCCL id (it was made where no real NCCL was \
                  loaded)"
            .into(),
    }
}

/// The real NCCL, for an id that carries a real NCCL id.
fn real_for_id() -> ApiResult<&'static RealNccl> {
    real_nccl().map_err(|e| {
        ApiError::invalid_usage(format!(
            "the unique id carries a real NCCL id but this rank has no real NCCL: {e}"
        ))
    })
}

/// The real side of a new communicator, made now (none on the host backend or without
/// NCCL).
fn init_real(
    packed: &PackedId,
    nranks: u32,
    rank: u32,
    config: *mut NcclConfig,
) -> ApiResult<(Option<RealComm>, String)> {
    let Some(real_id) = packed.real else {
        return Ok((None, no_real_id_reason()));
    };
    let real = real_for_id()?;
    let id = NcclUniqueId::from_bytes(&real_id);
    let mut out: Opaque = std::ptr::null_mut();
    let mut cfg = blocking_copy(config);
    let rc = match (
        cfg.as_deref_mut(),
        real.fns.comm_init_rank_config,
        real.fns.comm_init_rank,
    ) {
        // SAFETY: valid out-pointer, the real id, a full-size config copy.
        (Some(c), Some(f), _) => unsafe { f(&mut out, nranks as c_int, id, rank as c_int, c) },
        // SAFETY: valid out-pointer and the real id.
        (None, _, Some(f)) => unsafe { f(&mut out, nranks as c_int, id, rank as c_int) },
        _ => {
            return Err(ApiError::invalid_usage(
                "the real NCCL has no ncclCommInitRank(Config)",
            ))
        }
    };
    check_real(rc, real, std::ptr::null_mut(), "ncclCommInitRank")?;
    Ok((Some(RealComm(out)), String::new()))
}

/// Makes a packed id: a fresh oxccl bootstrap id (its root thread starts in this process)
/// and the real NCCL's id when one is loaded.
pub fn new_unique_id() -> ApiResult<NcclUniqueId> {
    let oxccl = UniqueId::create(&BootstrapConfig::from_env()?)?;
    let real_id = match real_nccl() {
        Ok(real) => {
            let f = real
                .fns
                .get_unique_id
                .ok_or_else(|| ApiError::invalid_usage("the real NCCL has no ncclGetUniqueId"))?;
            let mut id = NcclUniqueId {
                internal: [0; NCCL_UNIQUE_ID_BYTES],
            };
            // SAFETY: `id` is a valid out-pointer.
            let rc = unsafe { f(&mut id) };
            check_real(rc, real, std::ptr::null_mut(), "ncclGetUniqueId")?;
            Some(id.bytes())
        }
        Err(_) => None,
    };
    let bytes = id::pack(&PackedId {
        oxccl,
        real: real_id,
    })?;
    Ok(NcclUniqueId::from_bytes(&bytes))
}

/// oxccl's type for an NCCL data type, when oxccl serves it.
pub fn served_dtype(dtype: NcclDataType) -> Option<DataType> {
    match dtype {
        NCCL_FLOAT32 => Some(DataType::F32),
        NCCL_FLOAT16 => Some(DataType::F16),
        NCCL_BFLOAT16 => Some(DataType::Bf16),
        NCCL_FLOAT8_E4M3 => Some(DataType::Fp8E4m3),
        NCCL_FLOAT8_E5M2 => Some(DataType::Fp8E5m2),
        NCCL_INT8 => Some(DataType::I8),
        NCCL_UINT8 => Some(DataType::U8),
        NCCL_INT32 => Some(DataType::I32),
        NCCL_UINT32 => Some(DataType::U32),
        NCCL_INT64 => Some(DataType::I64),
        NCCL_UINT64 => Some(DataType::U64),
        NCCL_FLOAT64 => Some(DataType::F64),
        _ => None,
    }
}

/// The oxccl type and count that move the same bytes as `count` elements of an NCCL type,
/// for collectives that only move data (every NCCL type is served): a type of the same
/// size, or f32 pairs for the 8-byte types. `None` for an unknown type.
pub fn moved_as(dtype: NcclDataType, count: usize) -> Option<(DataType, usize)> {
    Some(match crate::types::type_size(dtype)? {
        1 => (DataType::Fp8E4m3, count),
        2 => (DataType::Bf16, count),
        4 => (DataType::F32, count),
        _ => (DataType::F32, count.checked_mul(2)?),
    })
}

/// oxccl's operator for an NCCL operator, when oxccl serves it.
pub fn served_op(op: NcclRedOp) -> Option<ReduceOp> {
    match op {
        NCCL_SUM => Some(ReduceOp::Sum),
        NCCL_PROD => Some(ReduceOp::Prod),
        NCCL_MAX => Some(ReduceOp::Max),
        NCCL_MIN => Some(ReduceOp::Min),
        NCCL_AVG => Some(ReduceOp::Avg),
        _ => None,
    }
}

/// What the call that just ran on `comm` did, for the log (`OXCCL_NCCL_LOG=info`): the
/// algorithm and how it reached the buffers, as recorded by the communicator; empty with
/// logging off.
fn served_by(comm: &Communicator) -> String {
    if !crate::error::log_enabled() {
        return String::new();
    }
    comm.last_call()
        .map_or_else(|| "nothing launched".to_string(), |r| r.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(size: usize, blocking: c_int) -> NcclConfig {
        // SAFETY: all-zero bytes are a valid NcclConfig (integers and null pointers).
        let mut c: NcclConfig = unsafe { std::mem::zeroed() };
        c.size = size;
        c.blocking = blocking;
        c
    }

    #[test]
    fn blocking_is_read_only_from_configs_that_have_it() {
        let full = std::mem::size_of::<NcclConfig>();
        assert!(!is_nonblocking(std::ptr::null_mut()));
        assert!(is_nonblocking(&mut config(full, 0)));
        assert!(!is_nonblocking(&mut config(full, 1)));
        // A config too short to hold the field: blocking, as NCCL's default.
        assert!(!is_nonblocking(&mut config(CONFIG_BLOCKING_OFFSET, 0)));
        assert!(is_nonblocking(&mut config(CONFIG_BLOCKING_OFFSET + 4, 0)));
    }

    #[test]
    fn an_owned_config_is_blocking_and_keeps_its_strings() {
        let name = CString::new("job-7").unwrap();
        let mut c = config(std::mem::size_of::<NcclConfig>(), 0);
        c.comm_name = name.as_ptr();
        let mut owned = OwnedConfig::copy(&mut c).unwrap();
        drop(name);
        let p = owned.as_ptr();
        // SAFETY: the owned copy lives; its name points into its own strings.
        let (blocking, copied) = unsafe { ((*p).blocking, CStr::from_ptr((*p).comm_name)) };
        assert_eq!(blocking, 1);
        assert_eq!(copied.to_str().unwrap(), "job-7");
        assert!(OwnedConfig::copy(std::ptr::null_mut()).is_none());
    }

    #[test]
    fn a_handle_picks_up_a_later_result_and_an_abandoned_one_drops_it() {
        let (comm, cell) = Comm::pending();
        assert!(matches!(comm.state(), State::Pending));
        let e = comm.ready().unwrap_err();
        assert_eq!(e.code, NCCL_INVALID_ARGUMENT);
        assert!(e.message.contains("not ready"), "{}", e.message);
        cell.complete(Err(ApiError::invalid_usage("boom")));
        assert!(matches!(comm.state(), State::Failed(_)));
        let e = comm.ready().unwrap_err();
        assert_eq!(e.code, NCCL_INVALID_USAGE);
        assert!(
            e.message.contains("initialisation failed: boom"),
            "{}",
            e.message
        );
        assert!((*comm).destroy(true).is_ok());

        let (comm, cell) = Comm::pending();
        assert!((*comm).destroy(false).is_ok());
        assert!(matches!(*cell.slot.lock().unwrap(), Slot::Abandoned));
        cell.complete(Err(ApiError::internal("late")));
        assert!(matches!(*cell.slot.lock().unwrap(), Slot::Abandoned));
    }
}
