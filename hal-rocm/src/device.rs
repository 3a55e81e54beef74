//! [`RocmBackend`] and [`RocmDevice`]: opening devices and reading their capabilities.

use std::ffi::c_int;
use std::sync::Arc;

use oxccl_hal::{
    Backend, BackendKind, Capabilities, Device, DeviceId, DevicePtr, Error, ForeignAllocation,
    IpcHandle, IpcHandleKind, ModuleImage, MulticastSupport, Result,
};

use crate::foreign::{self, ForeignExports};
use crate::memory::{vmm_prop, RocmHostMemory, RocmImported, RocmMemory};
use crate::module::{RocmKernel, RocmModule, RocmMulticast};
use crate::runtime::Hip;
use crate::stream::{RocmEvent, RocmStream};
use crate::sys;

/// The ROCm backend: AMD GPUs through the HIP runtime, loaded at run time.
#[derive(Debug, Clone, Copy)]
pub struct RocmBackend;

impl Backend for RocmBackend {
    const KIND: BackendKind = BackendKind::Rocm;
    type Device = RocmDevice;
    type Memory = RocmMemory;
    type HostMemory = RocmHostMemory;
    type Imported = RocmImported;
    type Stream = RocmStream;
    type Event = RocmEvent;
    type Module = RocmModule;
    type Kernel = RocmKernel;
    type Multicast = RocmMulticast;

    fn device_count() -> Result<u32> {
        Hip::global()?.device_count()
    }

    fn open_device(id: DeviceId) -> Result<RocmDevice> {
        RocmDevice::open_on(&Hip::global()?, id)
    }
}

/// An opened AMD GPU.
///
/// HIP keeps the current device per thread, so every method that touches the device first
/// makes it current on the calling thread (`hipSetDevice`, which is cheap).
#[derive(Debug)]
pub struct RocmDevice {
    hip: Arc<Hip>,
    id: DeviceId,
    ordinal: c_int,
    caps: Capabilities,
    peers: Vec<DeviceId>,
    /// Exports of callers' allocations (`export_allocation`), by allocation identity.
    foreign: ForeignExports,
}

fn ordinal_of(id: DeviceId) -> Result<c_int> {
    c_int::try_from(id.0).map_err(|_| Error::InvalidArgument(format!("{id} is out of range")))
}

/// The architecture name kernels are built for, from the compute capability HIP reports
/// (gfx9.4 parts are MI300: gfx942; gfx940/941 were pre-production steppings that ROCm
/// has folded into gfx942).
fn arch_name(major: i32, minor: i32) -> String {
    match (major, minor) {
        (9, 4) => "gfx942".to_string(),
        _ => format!("gfx{major}{minor}x (compute capability {major}.{minor})"),
    }
}

impl RocmDevice {
    /// Opens device `id` of an explicitly loaded runtime (tests, tools); [`RocmBackend`]
    /// uses [`Hip::global`].
    pub fn open_on(hip: &Arc<Hip>, id: DeviceId) -> Result<RocmDevice> {
        let count = hip.device_count()?;
        if id.0 >= count {
            return Err(Error::InvalidArgument(format!(
                "{id} does not exist: the HIP runtime reports {count} device(s)"
            )));
        }
        let ordinal = ordinal_of(id)?;
        hip.set_device(ordinal)?;
        let caps = Self::query_capabilities(hip, ordinal)?;
        let mut peers = Vec::new();
        for p in 0..count {
            let po = ordinal_of(DeviceId(p))?;
            if po != ordinal && hip.can_access_peer(ordinal, po)? {
                peers.push(DeviceId(p));
            }
        }
        tracing::debug!(device = id.0, name = %caps.name, arch = %caps.arch, ?peers, "ROCm device opened");
        Ok(RocmDevice {
            hip: Arc::clone(hip),
            id,
            ordinal,
            caps,
            peers,
            foreign: ForeignExports::default(),
        })
    }

    /// Reads every capability through `hipDeviceGetAttribute` (plus name and memory size).
    ///
    /// Never through `hipDeviceProp_t`: its layout changed in ROCm 6 (the runtime exports
    /// `hipGetDevicePropertiesR0600` next to the old symbol and the headers pick one by
    /// macro), so a structure read with one generation's layout is garbage with another's
    /// runtime. Attributes are plain ints, numbered by the runtime's generation
    /// ([`sys::Abi`]).
    fn query_capabilities(hip: &Hip, dev: c_int) -> Result<Capabilities> {
        use sys::Attribute as A;
        let attr = |a: A| hip.attribute(a, dev);
        let vmm = attr(A::VirtualMemoryManagementSupported)? != 0;
        let allocation_granularity = if vmm {
            hip.allocation_granularity(&vmm_prop(hip, dev))? as u64
        } else {
            0
        };
        Ok(Capabilities {
            backend: Some(BackendKind::Rocm),
            name: hip.device_name(dev)?,
            arch: arch_name(
                attr(A::ComputeCapabilityMajor)?,
                attr(A::ComputeCapabilityMinor)?,
            ),
            multiprocessors: u32::try_from(attr(A::MultiprocessorCount)?).unwrap_or(0),
            total_memory: hip.total_mem(dev)?,
            vmm,
            // HIP's VMM on Linux exports POSIX file descriptors (its only shareable type
            // there); there is no separate attribute for it.
            posix_fd_handles: vmm,
            fabric_handles: false,
            legacy_ipc: true,
            // MI300X has no NVLink SHARP equivalent.
            multicast: MulticastSupport::None,
            // HIP has no attribute for it; RDMA to AMD GPU memory depends on the kernel's
            // peer-memory support, which the InfiniBand transport probes itself.
            gpu_direct_rdma: false,
            fine_grained_memory: attr(A::FineGrainSupport)? != 0,
            allocation_granularity,
            // xGMI is not NVLink; nothing here relies on NVLink's line delivery.
            peers_over_nvlink: false,
            // HIP has no programmatic dependent launch: `early_launch` is ignored.
            early_launch: false,
        })
    }

    /// The runtime this device was opened on.
    pub fn hip(&self) -> &Arc<Hip> {
        &self.hip
    }

    /// Devices whose memory this one can access directly (xGMI peers), as reported by
    /// `hipDeviceCanAccessPeer` when the device was opened.
    pub fn peers(&self) -> &[DeviceId] {
        &self.peers
    }

    /// Makes this device current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.hip.set_device(self.ordinal)
    }
}

impl Device<RocmBackend> for RocmDevice {
    fn id(&self) -> DeviceId {
        self.id
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn alloc(&self, bytes: usize, kind: oxccl_hal::MemoryKind) -> Result<RocmMemory> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("cannot allocate zero bytes".into()));
        }
        self.bind()?;
        RocmMemory::alloc(&self.hip, self.ordinal, bytes, kind, self.caps.vmm)
    }

    fn alloc_host(&self, bytes: usize) -> Result<RocmHostMemory> {
        self.bind()?;
        RocmHostMemory::alloc(&self.hip, bytes)
    }

    fn create_stream(&self) -> Result<RocmStream> {
        self.bind()?;
        RocmStream::new(&self.hip, self.ordinal)
    }

    fn create_event(&self) -> Result<RocmEvent> {
        self.bind()?;
        RocmEvent::new(&self.hip)
    }

    fn load_module(&self, image: &ModuleImage<'_>) -> Result<RocmModule> {
        match image {
            ModuleImage::Rocm(bytes) => {
                self.bind()?;
                RocmModule::load(&self.hip, bytes)
            }
            ModuleImage::Cuda(_) => Err(Error::InvalidArgument(
                "a CUDA fatbin cannot be loaded by the ROCm backend".into(),
            )),
            ModuleImage::Host(t) => Err(Error::InvalidArgument(format!(
                "host kernel table '{}' cannot be loaded by the ROCm backend",
                t.name
            ))),
        }
    }

    fn export_memory(&self, memory: &RocmMemory) -> Result<IpcHandle> {
        self.bind()?;
        memory.export()
    }

    fn import_memory(&self, handle: &IpcHandle) -> Result<RocmImported> {
        handle.expect_backend(BackendKind::Rocm)?;
        if !matches!(
            handle.kind,
            IpcHandleKind::RocmLegacy | IpcHandleKind::RocmPosixFd
        ) {
            return Err(Error::Ipc(format!(
                "{:?} handles cannot be imported by the ROCm backend",
                handle.kind
            )));
        }
        let len = usize::try_from(handle.len)
            .map_err(|_| Error::Ipc(format!("handle length {} does not fit", handle.len)))?;
        // The opener maps on the current device.
        self.bind()?;
        let import = self.hip.ipc_cache().import(handle)?;
        Ok(RocmImported {
            import,
            len,
            _hip: Arc::clone(&self.hip),
        })
    }

    /// `hipMalloc` memory only: VMM memory (`hipMemCreate` + `hipMemMap`) is not shared by
    /// this backend (why: the `foreign` module), and a range across two allocations is
    /// refused.
    fn find_allocation(&self, ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation> {
        self.bind()?;
        foreign::find(&self.hip, self.ordinal, ptr, bytes)
    }

    /// A legacy IPC handle of the allocation's base, which [`Device::import_memory`]
    /// accepts; VMM memory that `hipIpcGetMemHandle` refuses is [`Error::Unsupported`].
    fn export_allocation(&self, allocation: &ForeignAllocation) -> Result<IpcHandle> {
        self.bind()?;
        self.foreign.export(&self.hip, self.ordinal, allocation)
    }

    fn release_export(&self, allocation: &ForeignAllocation) {
        self.foreign.release(allocation);
    }

    fn enable_peer_access(&self, peer: DeviceId) -> Result<()> {
        if peer == self.id {
            return Ok(());
        }
        if !self.peers.contains(&peer) {
            return Err(Error::Unsupported(format!(
                "{} cannot access {peer} directly (hipDeviceCanAccessPeer = 0: no xGMI/PCIe peer path)",
                self.id
            )));
        }
        self.bind()?;
        self.hip.enable_peer_access(ordinal_of(peer)?)
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.hip.device_synchronize()
    }

    // Multicast: unsupported is decided before the multicast gate is consulted. The gate
    // protects machines that could create an object; here nothing is ever created, and a
    // user on MI300X should learn "no multicast" whatever OXCCL_NVLS says.
    fn create_multicast(&self, _bytes: usize, _members: u32) -> Result<RocmMulticast> {
        Err(RocmMulticast::unsupported())
    }

    fn export_multicast(&self, multicast: &RocmMulticast) -> Result<IpcHandle> {
        match *multicast {}
    }

    fn import_multicast(&self, _handle: &IpcHandle) -> Result<RocmMulticast> {
        Err(RocmMulticast::unsupported())
    }
}
