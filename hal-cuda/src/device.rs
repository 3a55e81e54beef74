//! [`CudaBackend`] and [`CudaDevice`]: primary contexts, capabilities, allocation, IPC and
//! multicast entry points.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::sys;
use oxccl_hal::{
    multicast_gate, Backend, BackendKind, CachePolicy, Capabilities, Device, DeviceId, DevicePtr,
    Error, ForeignAllocation, IpcCache, IpcHandle, IpcHandleKind, MemoryKind, ModuleImage,
    MulticastSupport, Result,
};

use crate::foreign::ForeignExports;
use crate::ipc::{CudaImported, CudaOpener};
use crate::memory::{CudaHostMemory, CudaMemory};
use crate::module::CudaModule;
use crate::multicast::CudaMulticast;
use crate::stream::{CudaEvent, CudaStream};
use crate::{loader, result};

/// How long an importer waits for an owner's descriptor server to hand over a file
/// descriptor.
pub(crate) const FD_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The CUDA backend: NVIDIA GPUs through the driver API, loaded at run time.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaBackend;

impl CudaBackend {
    /// Number of CUDA devices visible to this process.
    ///
    /// Fails with [`Error::RuntimeMissing`] ("no CUDA driver found ...") on a machine
    /// without the driver; a driver without devices gives `Ok(0)`.
    pub fn device_count() -> Result<u32> {
        if !loader::init()? {
            return Ok(0);
        }
        result::device_count()
    }
}

impl Backend for CudaBackend {
    const KIND: BackendKind = BackendKind::Cuda;
    type Device = CudaDevice;
    type Memory = CudaMemory;
    type HostMemory = CudaHostMemory;
    type Imported = CudaImported;
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Module = CudaModule;
    type Kernel = crate::module::CudaKernel;
    type Multicast = CudaMulticast;

    fn device_count() -> Result<u32> {
        CudaBackend::device_count()
    }

    fn open_device(id: DeviceId) -> Result<CudaDevice> {
        CudaDevice::open(id)
    }
}

/// A retained primary context and the device it belongs to. Shared by everything made on
/// the device, so that the context outlives every allocation, stream and module.
pub(crate) struct Context {
    ordinal: u32,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Peer devices whose primary contexts were retained for peer access, released on drop.
    peers: Mutex<HashMap<u32, sys::CUdevice>>,
    /// Launches may ask to overlap the previous kernel (compute capability 9.0 on, and a
    /// driver that has cuLaunchKernelEx and captures the dependency into graphs: 12.3).
    early_launch: bool,
}

// SAFETY: a CUcontext is a driver handle usable from any thread (the driver API is
// thread-safe); this type never hands out thread-bound state.
unsafe impl Send for Context {}
// SAFETY: as above; shared access only makes thread-safe driver calls.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock_mutex<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a single insert/remove/take, so a poisoned lock is consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Context {
    fn retain(ordinal: u32) -> Result<Context> {
        let device = result::device_get(ordinal)?;
        let major = result::device_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )?;
        let early_launch = major >= 9
            && loader::has_symbol("cuLaunchKernelEx")
            && result::driver_version()? >= 12030;
        let ctx = result::primary_ctx_retain(device)?;
        Ok(Context {
            ordinal,
            device,
            ctx,
            peers: Mutex::new(HashMap::new()),
            early_launch,
        })
    }

    /// Whether launches on this device honour [`oxccl_hal::LaunchConfig::early_launch`].
    pub(crate) fn early_launch(&self) -> bool {
        self.early_launch
    }

    /// Makes this context current on the calling thread (a no-op when it already is).
    pub(crate) fn bind(&self) -> Result<()> {
        if result::ctx_get_current()? != self.ctx {
            // SAFETY: `self.ctx` is retained for as long as `self` lives.
            unsafe { result::ctx_set_current(self.ctx) }?;
        }
        Ok(())
    }

    /// The driver's device handle.
    pub(crate) fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// The device ordinal.
    pub(crate) fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The raw context (for identity comparisons).
    pub(crate) fn raw(&self) -> sys::CUcontext {
        self.ctx
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let peers = std::mem::take(&mut *lock_mutex(&self.peers));
        for (ordinal, dev) in peers {
            if let Err(e) = result::primary_ctx_release(dev) {
                tracing::warn!(peer = ordinal, error = %e, "releasing a peer's primary context");
            }
        }
        if let Err(e) = result::primary_ctx_release(self.device) {
            tracing::warn!(device = self.ordinal, error = %e, "releasing the primary context");
        }
    }
}

/// An opened CUDA device: its retained primary context, capabilities and IPC caches.
///
/// Every method makes the device's context current on the calling thread first, so a device
/// can be used from any thread.
#[derive(Debug)]
pub struct CudaDevice {
    ctx: Arc<Context>,
    caps: Capabilities,
    /// Devices granted access to this device's physical allocations: itself and every
    /// device of this process that can access it as a peer.
    access: Arc<[sys::CUdevice]>,
    granularity: usize,
    /// Legacy IPC imports: the driver counts references and returns one address per handle.
    legacy_imports: IpcCache<CudaOpener>,
    /// VMM imports: one mapping per distinct handle, shared and counted here, because every
    /// driver-level import of a descriptor would reserve and map a new address range.
    vmm_imports: IpcCache<CudaOpener>,
    /// Exports of callers' allocations (zero-copy on memory oxccl did not allocate).
    foreign: ForeignExports,
}

fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    result::device_attribute(dev, a)
}

fn read_capabilities(dev: sys::CUdevice) -> Result<(Capabilities, usize)> {
    use sys::CUdevice_attribute as A;
    let major = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sms = attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let vmm = attr(
        dev,
        A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    )? != 0;
    let posix_fd = attr(
        dev,
        A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    )? != 0;
    let fabric = attr(dev, A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)? != 0;
    let multicast = attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED)? != 0;
    let rdma = attr(dev, A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED)? != 0;
    let granularity = if vmm {
        result::mem_granularity(&result::device_alloc_prop(dev, false))?
    } else {
        0
    };
    let caps = Capabilities {
        backend: Some(BackendKind::Cuda),
        name: result::device_name(dev)?,
        arch: format!("sm_{major}{minor}"),
        multiprocessors: u32::try_from(sms).unwrap_or(0),
        total_memory: result::device_total_mem(dev)?,
        vmm,
        posix_fd_handles: posix_fd,
        fabric_handles: fabric,
        legacy_ipc: true,
        multicast: if multicast {
            MulticastSupport::Hardware
        } else {
            MulticastSupport::None
        },
        gpu_direct_rdma: rdma,
        // NVIDIA device memory is coherent for system-scope atomics from peers; `Coherent`
        // is served by the same physical allocations as `Physical`.
        fine_grained_memory: vmm,
        allocation_granularity: granularity as u64,
        // Set once the peers are known (`open_device`).
        peers_over_nvlink: false,
        // Set from the context (`open_device`).
        early_launch: false,
    };
    Ok((caps, granularity))
}

/// Runs `create` only when the multicast gate (`decision`) is open. Every path that creates
/// or imports a multicast object goes through here, with the gate decided before any driver
/// call.
pub(crate) fn gated<T>(decision: Result<()>, create: impl FnOnce() -> Result<T>) -> Result<T> {
    decision?;
    create()
}

/// Rounds `bytes` up to a multiple of `granularity` (non-zero).
pub(crate) fn round_up(bytes: usize, granularity: usize) -> Result<usize> {
    if granularity == 0 {
        return Err(Error::Unsupported("allocation granularity is zero".into()));
    }
    bytes
        .div_ceil(granularity)
        .checked_mul(granularity)
        .ok_or_else(|| Error::InvalidArgument(format!("{bytes} bytes overflow when rounded")))
}

impl CudaDevice {
    /// Opens device `id`: retains its primary context, makes it current on this thread and
    /// reads its capabilities.
    pub fn open(id: DeviceId) -> Result<CudaDevice> {
        let _span = tracing::info_span!("cuda.open_device", device = id.0).entered();
        let count = CudaBackend::device_count()?;
        if id.0 >= count {
            return Err(Error::InvalidArgument(format!(
                "CUDA {id} does not exist ({count} devices visible)"
            )));
        }
        let ctx = Arc::new(Context::retain(id.0)?);
        ctx.bind()?;
        let (mut caps, granularity) = read_capabilities(ctx.device())?;
        let mut access = vec![ctx.device()];
        let mut all_native_atomics = true;
        for other in 0..count {
            if other == id.0 {
                continue;
            }
            let peer = result::device_get(other)?;
            if result::device_can_access_peer(peer, ctx.device())? {
                access.push(peer);
                // Native peer atomics: NVLink yes, PCIe no (the driver's only link hint).
                all_native_atomics &= result::device_p2p_native_atomics(ctx.device(), peer)?;
            }
        }
        caps.peers_over_nvlink = access.len() > 1 && all_native_atomics;
        caps.early_launch = ctx.early_launch();
        let access: Arc<[sys::CUdevice]> = access.into();
        let opener = CudaOpener::new(Arc::clone(&ctx), granularity);
        tracing::debug!(device = id.0, name = %caps.name, arch = %caps.arch, peers = access.len() - 1, nvlink = caps.peers_over_nvlink, "CUDA device opened");
        Ok(CudaDevice {
            legacy_imports: IpcCache::new(opener.clone(), CachePolicy::PassThrough),
            vmm_imports: IpcCache::new(opener, CachePolicy::Shared { max_live: None }),
            foreign: ForeignExports::default(),
            ctx,
            caps,
            access,
            granularity,
        })
    }

    /// Makes this device's primary context current on the calling thread.
    pub fn bind_to_thread(&self) -> Result<()> {
        self.ctx.bind()
    }

    /// Wraps a stream another library made (a `cudaStream_t` is a `CUstream`; `NULL` is
    /// the legacy default stream) so oxccl work can be queued on it. The wrapper never
    /// destroys the stream.
    ///
    /// # Safety
    /// `raw` must be a live stream of this device's primary context (or `NULL`, or one of
    /// the per-thread/legacy special handles) for as long as the returned value is used;
    /// its owner destroys it, after the last use.
    pub unsafe fn borrow_stream(&self, raw: sys::CUstream) -> CudaStream {
        CudaStream::borrowed_in(Arc::clone(&self.ctx), raw)
    }

    /// Minimum granularity of physical allocations on this device, in bytes.
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// Creates a multicast object without consulting the gate. Only [`gated`] calls this.
    fn create_multicast_ungated(&self, bytes: usize, members: u32) -> Result<CudaMulticast> {
        if self.caps.multicast != MulticastSupport::Hardware {
            return Err(Error::Unsupported(format!(
                "CUDA device {} does not support multicast objects",
                self.ctx.ordinal()
            )));
        }
        CudaMulticast::create(Arc::clone(&self.ctx), bytes, members)
    }

    fn import_multicast_ungated(&self, handle: &IpcHandle) -> Result<CudaMulticast> {
        CudaMulticast::import(Arc::clone(&self.ctx), handle)
    }
}

impl Device<CudaBackend> for CudaDevice {
    fn id(&self) -> DeviceId {
        DeviceId(self.ctx.ordinal())
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<CudaMemory> {
        let _span =
            tracing::info_span!("cuda.alloc", device = self.ctx.ordinal(), bytes, ?kind).entered();
        if bytes == 0 {
            return Err(Error::InvalidArgument("cannot allocate zero bytes".into()));
        }
        self.bind_to_thread()?;
        match kind {
            MemoryKind::Plain => CudaMemory::plain(Arc::clone(&self.ctx), bytes),
            MemoryKind::Physical | MemoryKind::Coherent => {
                if !self.caps.vmm || !self.caps.posix_fd_handles {
                    return Err(Error::Unsupported(format!(
                        "CUDA device {} lacks VMM with POSIX file-descriptor handles",
                        self.ctx.ordinal()
                    )));
                }
                CudaMemory::physical(
                    Arc::clone(&self.ctx),
                    bytes,
                    self.granularity,
                    &self.access,
                    self.caps.gpu_direct_rdma,
                )
            }
        }
    }

    fn alloc_host(&self, bytes: usize) -> Result<CudaHostMemory> {
        let _span =
            tracing::info_span!("cuda.alloc_host", device = self.ctx.ordinal(), bytes).entered();
        if bytes == 0 {
            return Err(Error::InvalidArgument("cannot allocate zero bytes".into()));
        }
        self.bind_to_thread()?;
        CudaHostMemory::new(Arc::clone(&self.ctx), bytes)
    }

    fn create_stream(&self) -> Result<CudaStream> {
        self.bind_to_thread()?;
        CudaStream::new(Arc::clone(&self.ctx))
    }

    fn create_event(&self) -> Result<CudaEvent> {
        self.bind_to_thread()?;
        CudaEvent::new(Arc::clone(&self.ctx), true)
    }

    fn create_sync_event(&self) -> Result<CudaEvent> {
        self.bind_to_thread()?;
        CudaEvent::new(Arc::clone(&self.ctx), false)
    }

    fn load_module(&self, image: &ModuleImage<'_>) -> Result<CudaModule> {
        let _span = tracing::info_span!("cuda.load_module", device = self.ctx.ordinal()).entered();
        let ModuleImage::Cuda(bytes) = image else {
            return Err(Error::InvalidArgument(format!(
                "the CUDA backend loads CUDA fatbins, not {image:?}"
            )));
        };
        self.bind_to_thread()?;
        CudaModule::load(Arc::clone(&self.ctx), bytes)
    }

    fn export_memory(&self, memory: &CudaMemory) -> Result<IpcHandle> {
        let _span = tracing::info_span!(
            "cuda.export",
            device = self.ctx.ordinal(),
            bytes = memory.requested_len()
        )
        .entered();
        if !Arc::ptr_eq(memory.context(), &self.ctx) {
            return Err(Error::InvalidArgument(format!(
                "memory of CUDA device {} exported through device {}",
                memory.context().ordinal(),
                self.ctx.ordinal()
            )));
        }
        self.bind_to_thread()?;
        memory.export()
    }

    fn import_memory(&self, handle: &IpcHandle) -> Result<CudaImported> {
        let _span = tracing::info_span!(
            "cuda.import",
            device = self.ctx.ordinal(),
            owner = handle.owner_pid,
            id = handle.id
        )
        .entered();
        crate::ipc::validate_memory_handle(handle)?;
        let cache = match handle.kind {
            IpcHandleKind::CudaLegacy => &self.legacy_imports,
            IpcHandleKind::CudaPosixFd => &self.vmm_imports,
            other => {
                return Err(Error::Ipc(format!(
                "a {other:?} handle is not CUDA device memory (expected CudaLegacy or CudaPosixFd)"
            )))
            }
        };
        self.bind_to_thread()?;
        CudaImported::new(cache.import(handle)?, handle.len)
    }

    fn find_allocation(&self, ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation> {
        self.foreign.find(&self.ctx, ptr, bytes)
    }

    fn export_allocation(&self, allocation: &ForeignAllocation) -> Result<IpcHandle> {
        let _span = tracing::info_span!(
            "cuda.export_allocation",
            device = self.ctx.ordinal(),
            bytes = allocation.len
        )
        .entered();
        self.foreign.export(&self.ctx, allocation)
    }

    fn release_export(&self, allocation: &ForeignAllocation) {
        self.foreign.release(allocation);
    }

    fn enable_peer_access(&self, peer: DeviceId) -> Result<()> {
        if peer.0 == self.ctx.ordinal() {
            return Ok(());
        }
        self.bind_to_thread()?;
        let peer_dev = result::device_get(peer.0)?;
        if !result::device_can_access_peer(self.ctx.device(), peer_dev)? {
            return Err(Error::Unsupported(format!(
                "CUDA device {} cannot access {peer} as a peer",
                self.ctx.ordinal()
            )));
        }
        let mut peers = lock_mutex(&self.ctx.peers);
        let newly_retained = !peers.contains_key(&peer.0);
        let peer_ctx = result::primary_ctx_retain(peer_dev)?;
        // SAFETY: `peer_ctx` was just retained and stays retained (kept in `peers`, or
        // released below when it already was).
        let enabled = unsafe { result::ctx_enable_peer_access(peer_ctx) };
        if newly_retained {
            peers.insert(peer.0, peer_dev);
        } else {
            // One retain per peer is kept; drop this call's extra one.
            result::primary_ctx_release(peer_dev)?;
        }
        match enabled {
            Err(e)
                if result::is_code(&e, sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) =>
            {
                Ok(())
            }
            other => other,
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.bind_to_thread()?;
        result::ctx_synchronize()
    }

    fn create_multicast(&self, bytes: usize, members: u32) -> Result<CudaMulticast> {
        gated(multicast_gate::check(), || {
            let _span = tracing::info_span!(
                "cuda.multicast_create",
                device = self.ctx.ordinal(),
                bytes,
                members
            )
            .entered();
            self.bind_to_thread()?;
            self.create_multicast_ungated(bytes, members)
        })
    }

    fn export_multicast(&self, multicast: &CudaMulticast) -> Result<IpcHandle> {
        let _span =
            tracing::info_span!("cuda.multicast_export", device = self.ctx.ordinal()).entered();
        self.bind_to_thread()?;
        multicast.export()
    }

    fn import_multicast(&self, handle: &IpcHandle) -> Result<CudaMulticast> {
        gated(multicast_gate::check(), || {
            let _span = tracing::info_span!(
                "cuda.multicast_import",
                device = self.ctx.ordinal(),
                owner = handle.owner_pid
            )
            .entered();
            self.bind_to_thread()?;
            self.import_multicast_ungated(handle)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn closed_gate_refuses_before_any_driver_call() {
        let called = Cell::new(false);
        let r: Result<()> = gated(multicast_gate::decide(None, None), || {
            called.set(true);
            Ok(())
        });
        assert!(matches!(r, Err(Error::MulticastGated(_))), "{r:?}");
        assert!(
            !called.get(),
            "the creation path ran although the gate was closed"
        );

        let r: Result<()> = gated(multicast_gate::decide(Some("1"), Some("0")), || {
            called.set(true);
            Ok(())
        });
        assert!(matches!(r, Err(Error::MulticastGated(_))));
        assert!(!called.get());

        let r: Result<u32> = gated(multicast_gate::decide(Some("1"), None), || {
            called.set(true);
            Ok(7)
        });
        assert_eq!(r.ok(), Some(7));
        assert!(called.get());
    }

    #[test]
    fn default_environment_keeps_the_gate_closed() {
        // The test environment never sets OXCCL_NVLS; if someone did, say so instead of
        // silently testing nothing.
        if std::env::var(multicast_gate::OPT_IN_VAR).is_ok() {
            println!("skipped: OXCCL_NVLS is set in this environment");
            return;
        }
        let r: Result<()> = gated(multicast_gate::check(), || {
            Err(Error::Unsupported("must not be reached".into()))
        });
        assert!(matches!(r, Err(Error::MulticastGated(_))), "{r:?}");
    }

    #[test]
    fn rounding_to_granularity() {
        assert_eq!(round_up(1, 2 << 20).ok(), Some(2 << 20));
        assert_eq!(round_up(2 << 20, 2 << 20).ok(), Some(2 << 20));
        assert_eq!(round_up((2 << 20) + 1, 2 << 20).ok(), Some(4 << 20));
        assert!(round_up(usize::MAX, 2 << 20).is_err());
        assert!(round_up(5, 0).is_err());
    }

    #[test]
    fn device_count_without_a_driver_is_runtime_missing() {
        match CudaBackend::device_count() {
            Err(Error::RuntimeMissing(msg)) => {
                assert!(msg.starts_with("no CUDA driver found"), "{msg}");
                println!("skipped: {msg}");
            }
            Ok(n) => println!("CUDA driver present with {n} devices"),
            Err(e) => panic!("unexpected error from device_count: {e}"),
        }
    }
}
