//! Device, host and imported memory: safe owners that free on drop.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use oxccl_hal::{
    fd_share, BackendKind, CachedImport, DevicePtr, Error, HostVisible, IpcHandle, IpcHandleKind,
    IpcOpener, Memory, MemoryKind, Result,
};

use crate::result::Raw;
use crate::runtime::Hip;
use crate::sys;

/// How long an importer waits for the owner's descriptor server.
const FD_FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// The allocation properties of a VMM allocation on `device` exportable as a POSIX FD,
/// in the numbering of `hip`'s generation.
pub(crate) fn vmm_prop(hip: &Hip, device: c_int) -> sys::hipMemAllocationProp {
    hip.abi().vmm_allocation_prop(device)
}

fn round_up(bytes: usize, granularity: usize) -> Result<usize> {
    let g = granularity.max(1);
    bytes
        .checked_add(g - 1)
        .map(|b| b / g * g)
        .ok_or_else(|| Error::InvalidArgument(format!("{bytes} bytes overflow when rounded")))
}

/// A physical allocation reserved, mapped and made accessible at one address.
#[derive(Debug)]
struct VmmRange {
    handle: Raw<sys::ihipMemGenericAllocationHandle>,
    base: Raw<c_void>,
    size: usize,
}

impl VmmRange {
    /// Maps `handle` (of `size` bytes, already rounded) for `device`. On failure the
    /// handle is released.
    fn map(
        hip: &Hip,
        handle: sys::hipMemGenericAllocationHandle_t,
        size: usize,
        device: c_int,
        align: usize,
    ) -> Result<VmmRange> {
        let release = |e: Error| {
            // SAFETY: the handle is live and nothing maps it.
            if let Err(r) = unsafe { hip.mem_release(handle) } {
                tracing::warn!(error = %r, "releasing a VMM handle after a failed map");
            }
            e
        };
        let base = hip.address_reserve(size, align).map_err(release)?;
        // SAFETY: `base`/`size` is the reservation just made; the handle holds `size`.
        let mapped = unsafe { hip.mem_map(base, size, handle) }
            // SAFETY: mapped just now, unused.
            .and_then(|()| unsafe { hip.mem_set_access(base, size, device) });
        if let Err(e) = mapped {
            // SAFETY: undo in reverse order; unmapping an unmapped range only errors.
            let _ = unsafe { hip.mem_unmap(base, size) };
            // SAFETY: the reservation is ours and nothing else is mapped in it.
            let _ = unsafe { hip.address_free(base, size) };
            return Err(release(e));
        }
        Ok(VmmRange {
            handle: Raw(handle),
            base: Raw(base),
            size,
        })
    }

    fn unmap(&self, hip: &Hip) -> Result<()> {
        // SAFETY: this range was mapped by `map` and its owner is being dropped.
        let a = unsafe { hip.mem_unmap(self.base.0, self.size) };
        // SAFETY: nothing is mapped in the reservation any more.
        let b = unsafe { hip.address_free(self.base.0, self.size) };
        // SAFETY: the handle's only mapping is gone.
        let c = unsafe { hip.mem_release(self.handle.0) };
        a.and(b).and(c)
    }
}

#[derive(Debug)]
enum Backing {
    /// `hipMalloc` or `hipExtMallocWithFlags`: freed with `hipFree`.
    Malloc(Raw<c_void>),
    /// `hipMemCreate` + reserve + map.
    Vmm(VmmRange),
}

/// Device memory of one of the [`MemoryKind`]s; freed on drop.
#[derive(Debug)]
pub struct RocmMemory {
    hip: Arc<Hip>,
    device: c_int,
    len: usize,
    kind: MemoryKind,
    backing: Backing,
    /// Export ids published to the descriptor server; withdrawn on drop.
    published: Mutex<Vec<u64>>,
}

impl RocmMemory {
    /// Allocates on `device`, which must be current on the calling thread.
    pub(crate) fn alloc(
        hip: &Arc<Hip>,
        device: c_int,
        bytes: usize,
        kind: MemoryKind,
        vmm: bool,
    ) -> Result<RocmMemory> {
        // Checked before any call: HIP returns success and a null pointer for zero bytes,
        // which would then look like a live allocation.
        if bytes == 0 {
            return Err(Error::InvalidArgument("cannot allocate zero bytes".into()));
        }
        let backing = match kind {
            MemoryKind::Plain => Backing::Malloc(Raw(hip.malloc(bytes)?)),
            // Flags and semaphores that other GPUs write over xGMI must not sit in a
            // cached line of this GPU's L2: on MI300X, coarse-grained memory is only made
            // coherent at kernel boundaries, and fine-grained memory may still be cached
            // (MTYPE NC) so a polling wave can read a stale value. Uncached memory (MTYPE
            // UC) sends every access to memory, so a peer's signal is seen by the next
            // load; this is what cross-GPU flags and LL packets need.
            MemoryKind::Coherent => Backing::Malloc(Raw(
                hip.ext_malloc_with_flags(bytes, hip.abi().device_malloc_uncached)?
            )),
            MemoryKind::Physical => {
                if !vmm {
                    return Err(Error::Unsupported(
                        "physical (VMM) allocation: this HIP runtime reports no virtual memory \
                         management support for the device (hipDeviceAttributeVirtualMemoryManagementSupported = 0); \
                         use MemoryKind::Plain with legacy IPC"
                            .into(),
                    ));
                }
                let prop = vmm_prop(hip, device);
                let g = hip.allocation_granularity(&prop)?;
                let size = round_up(bytes, g)?;
                let handle = hip.mem_create(size, &prop)?;
                Backing::Vmm(VmmRange::map(hip, handle, size, device, g)?)
            }
        };
        Ok(RocmMemory {
            hip: Arc::clone(hip),
            device,
            len: bytes,
            kind,
            backing,
            published: Mutex::new(Vec::new()),
        })
    }

    /// How this memory was allocated.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    fn base(&self) -> *mut c_void {
        match &self.backing {
            Backing::Malloc(p) => p.0,
            Backing::Vmm(r) => r.base.0,
        }
    }

    /// Builds the IPC handle for this allocation.
    pub(crate) fn export(&self) -> Result<IpcHandle> {
        let id = fd_share::next_export_id();
        let (kind, payload) = match &self.backing {
            Backing::Malloc(p) => {
                // SAFETY: `p` is the base of our live hipMalloc/hipExtMallocWithFlags block.
                let bytes = unsafe { self.hip.ipc_get_mem_handle(p.0) }?;
                (IpcHandleKind::RocmLegacy, bytes)
            }
            Backing::Vmm(r) => {
                // SAFETY: the handle is ours and live, created for POSIX-FD export.
                let raw = unsafe { self.hip.export_posix_fd(r.handle.0) }?;
                // SAFETY: the runtime just created this descriptor for us; we own it.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                fd_share::publish(id, fd.as_fd())?;
                self.published
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(id);
                // The importer maps the rounded size.
                (
                    IpcHandleKind::RocmPosixFd,
                    (r.size as u64).to_le_bytes().to_vec(),
                )
            }
        };
        Ok(IpcHandle {
            backend: BackendKind::Rocm,
            kind,
            owner_pid: std::process::id(),
            owner_nonce: fd_share::process_nonce(),
            id,
            len: self.len as u64,
            payload,
        })
    }
}

impl Memory for RocmMemory {
    fn ptr(&self) -> DevicePtr {
        DevicePtr(self.base() as u64)
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for RocmMemory {
    fn drop(&mut self) {
        for id in self
            .published
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            fd_share::withdraw(id);
        }
        let r = match &self.backing {
            // SAFETY: we own the allocation and nothing uses it after drop.
            Backing::Malloc(p) => unsafe { self.hip.free(p.0) },
            Backing::Vmm(r) => r.unmap(&self.hip),
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, device = self.device, "freeing ROCm memory failed");
        }
    }
}

/// Pinned host memory mapped for the device (coherent, portable); freed on drop.
#[derive(Debug)]
pub struct RocmHostMemory {
    hip: Arc<Hip>,
    host: Raw<c_void>,
    device: DevicePtr,
    len: usize,
}

impl RocmHostMemory {
    pub(crate) fn alloc(hip: &Arc<Hip>, bytes: usize) -> Result<RocmHostMemory> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("cannot allocate zero bytes".into()));
        }
        // Mapped: the device gets an address for it. Portable: every device may use it.
        // Coherent: the proxy FIFO and host flags are polled by one side while the other
        // writes, so writes must be visible without a kernel boundary (the default
        // depends on HIP_HOST_COHERENT, so say it).
        let abi = hip.abi();
        let flags = abi.host_malloc_mapped | abi.host_malloc_portable | abi.host_malloc_coherent;
        let host = hip.host_malloc(bytes, flags)?;
        // SAFETY: `host` was just allocated mapped.
        let device = match unsafe { hip.host_device_pointer(host) } {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: ours, unused.
                let _ = unsafe { hip.host_free(host) };
                return Err(e);
            }
        };
        Ok(RocmHostMemory {
            hip: Arc::clone(hip),
            host: Raw(host),
            device: DevicePtr(device as u64),
            len: bytes,
        })
    }
}

impl Memory for RocmHostMemory {
    fn ptr(&self) -> DevicePtr {
        self.device
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl HostVisible for RocmHostMemory {
    fn host_ptr(&self) -> *mut u8 {
        self.host.0.cast()
    }
}

impl Drop for RocmHostMemory {
    fn drop(&mut self) {
        // SAFETY: we own the allocation and nothing uses it after drop.
        if let Err(e) = unsafe { self.hip.host_free(self.host.0) } {
            tracing::warn!(error = %e, "freeing pinned host memory failed");
        }
    }
}

/// A peer allocation mapped into this process: what [`RocmIpcOpener`] yields.
#[derive(Debug)]
pub struct RocmMapping {
    ptr: DevicePtr,
    device: c_int,
    vmm: Option<VmmRange>,
}

impl RocmMapping {
    /// The mapped address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
}

/// Opens and closes HIP IPC handles for the [`oxccl_hal::IpcCache`].
///
/// Holds the runtime weakly: the cache lives inside the runtime, and every import also
/// holds the runtime strongly, so the runtime outlives all open mappings.
#[derive(Debug)]
pub struct RocmIpcOpener {
    pub(crate) hip: std::sync::Weak<Hip>,
}

impl RocmIpcOpener {
    fn hip(&self) -> Result<Arc<Hip>> {
        self.hip
            .upgrade()
            .ok_or_else(|| Error::Ipc("the HIP runtime was unloaded".into()))
    }
}

impl IpcOpener for RocmIpcOpener {
    type Mapping = RocmMapping;

    fn open(&self, handle: &IpcHandle) -> Result<RocmMapping> {
        let hip = self.hip()?;
        // The device made current by the importing `RocmDevice`.
        let device = hip.current_device()?;
        match handle.kind {
            IpcHandleKind::RocmLegacy => {
                let p = hip.ipc_open_mem_handle(&handle.payload)?;
                Ok(RocmMapping {
                    ptr: DevicePtr(p as u64),
                    device,
                    vmm: None,
                })
            }
            IpcHandleKind::RocmPosixFd => {
                let size = <[u8; 8]>::try_from(handle.payload.as_slice())
                    .map(u64::from_le_bytes)
                    .ok()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| {
                        Error::Ipc("ROCm POSIX-FD handle without its mapped size".into())
                    })?;
                let fd = fd_share::fetch(
                    handle.owner_pid,
                    handle.owner_nonce,
                    handle.id,
                    FD_FETCH_TIMEOUT,
                )?;
                let h = hip.import_posix_fd(fd.as_raw_fd())?;
                // The imported handle holds the allocation; the descriptor can go.
                drop(fd);
                let g = hip.allocation_granularity(&vmm_prop(&hip, device))?;
                let range = VmmRange::map(&hip, h, size, device, g)?;
                Ok(RocmMapping {
                    ptr: DevicePtr(range.base.0 as u64),
                    device,
                    vmm: Some(range),
                })
            }
            other => Err(Error::Ipc(format!(
                "{other:?} handles cannot be imported by the ROCm backend"
            ))),
        }
    }

    fn close(&self, mapping: &RocmMapping) -> Result<()> {
        let hip = self.hip()?;
        hip.set_device(mapping.device)?;
        match &mapping.vmm {
            // SAFETY: the cache calls close exactly once, after the last user dropped.
            None => unsafe { hip.ipc_close_mem_handle(mapping.ptr.0 as *mut c_void) },
            Some(range) => range.unmap(&hip),
        }
    }
}

/// A peer's memory imported through the IPC handle cache. Clones share the mapping, which
/// is closed when the last clone drops.
#[derive(Debug, Clone)]
pub struct RocmImported {
    pub(crate) import: CachedImport<RocmIpcOpener>,
    pub(crate) len: usize,
    // Keeps the runtime (and the cache inside it) alive while the mapping is open.
    pub(crate) _hip: Arc<Hip>,
}

impl Memory for RocmImported {
    fn ptr(&self) -> DevicePtr {
        self.import.mapping().ptr
    }

    fn len(&self) -> usize {
        self.len
    }
}
