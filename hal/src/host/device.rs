//! The host device: allocation, streams, modules, IPC and multicast of the host backend.

use super::memory::{self, page_size, HostImport, HostMemory, HostOpener};
use super::module::HostModule;
use super::multicast::HostMulticast;
use super::stream::{HostEvent, HostStream};
use super::HostBackend;
use crate::api::Device;
use crate::error::Result;
use crate::ipc::IpcHandle;
use crate::ipc_cache::{CachePolicy, IpcCache};
use crate::launch::ModuleImage;
use crate::types::{
    BackendKind, Capabilities, DeviceId, DevicePtr, ForeignAllocation, MemoryKind, MulticastSupport,
};

/// An opened host device. Devices are independent: each has its own IPC cache, as each GPU
/// has its own context.
#[derive(Debug)]
pub struct HostDevice {
    id: DeviceId,
    caps: Capabilities,
    cache: IpcCache<HostOpener>,
}

fn total_memory() -> u64 {
    let pages = nix::unistd::sysconf(nix::unistd::SysconfVar::_PHYS_PAGES)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(0);
    pages.saturating_mul(page_size() as u64)
}

impl HostDevice {
    pub(crate) fn new(id: DeviceId) -> HostDevice {
        let caps = Capabilities {
            backend: Some(BackendKind::Host),
            name: "host".into(),
            arch: "host".into(),
            multiprocessors: std::thread::available_parallelism()
                .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
                .unwrap_or(1),
            total_memory: total_memory(),
            vmm: true,
            posix_fd_handles: true,
            fabric_handles: false,
            legacy_ipc: false,
            multicast: MulticastSupport::Emulated,
            gpu_direct_rdma: false,
            fine_grained_memory: true,
            allocation_granularity: page_size() as u64,
            peers_over_nvlink: false,
            // Host kernels run in stream order; there is no launch latency to hide.
            early_launch: false,
        };
        HostDevice {
            id,
            caps,
            // The host backend models ROCm's strict rule (one open per handle) so that the
            // layers above are tested against it.
            cache: IpcCache::new(HostOpener, CachePolicy::Shared { max_live: None }),
        }
    }

    /// Number of distinct imports this device has open now.
    pub fn ipc_cache_live(&self) -> usize {
        self.cache.live()
    }

    /// The device's IPC cache (shared by its multicast objects).
    pub fn ipc_cache(&self) -> &IpcCache<HostOpener> {
        &self.cache
    }
}

impl Device<HostBackend> for HostDevice {
    fn id(&self) -> DeviceId {
        self.id
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn alloc(&self, bytes: usize, _kind: MemoryKind) -> Result<HostMemory> {
        // All three kinds are the same host memory: coherent, shareable, physical.
        HostMemory::allocate(bytes)
    }

    fn alloc_host(&self, bytes: usize) -> Result<HostMemory> {
        HostMemory::allocate(bytes)
    }

    fn create_stream(&self) -> Result<HostStream> {
        HostStream::new()
    }

    fn create_event(&self) -> Result<HostEvent> {
        Ok(HostEvent::new())
    }

    fn load_module(&self, image: &ModuleImage<'_>) -> Result<HostModule> {
        HostModule::load(image)
    }

    fn export_memory(&self, memory: &HostMemory) -> Result<IpcHandle> {
        memory.export()
    }

    fn import_memory(&self, handle: &IpcHandle) -> Result<HostImport> {
        self.cache.import(handle).map(HostImport)
    }

    fn find_allocation(&self, ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation> {
        memory::find_allocation(ptr, bytes)
    }

    fn export_allocation(&self, allocation: &ForeignAllocation) -> Result<IpcHandle> {
        memory::export_allocation(allocation)
    }

    fn release_export(&self, _allocation: &ForeignAllocation) {
        // The export is the allocation's own: it is withdrawn when the allocation is freed.
    }

    fn enable_peer_access(&self, _peer: DeviceId) -> Result<()> {
        // Every host device addresses the same process memory.
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        // Work lives on streams, and each stream is synchronized through itself.
        Ok(())
    }

    fn create_multicast(&self, bytes: usize, members: u32) -> Result<HostMulticast> {
        // No call to the multicast gate: the gate protects NVSwitch hardware from being
        // wedged; this emulation only touches this machine's ordinary memory.
        HostMulticast::create(self.id, self.cache.clone(), bytes, members)
    }

    fn export_multicast(&self, multicast: &HostMulticast) -> Result<IpcHandle> {
        multicast.export()
    }

    fn import_multicast(&self, handle: &IpcHandle) -> Result<HostMulticast> {
        HostMulticast::import(self.id, self.cache.clone(), handle)
    }
}
