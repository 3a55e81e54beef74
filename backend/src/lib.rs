//! # oxccl-backend: one concrete type per HAL concept, whichever backends were built
//!
//! The HAL's backends are separate crates (`oxccl-hal` holds the host backend,
//! `oxccl-hal-cuda` and `oxccl-hal-rocm` the GPU ones), so an `enum_dispatch` enum, which
//! needs the trait and the enum in one crate, cannot be used. This crate dispatches by hand:
//! each `Any*` enum has one variant per built backend and implements the same trait family
//! by `match`, so callers hold one concrete type and every call is a jump, never a `dyn`.
//!
//! [`AnyBackend::open_device`] picks the backend at run time ([`select`]); objects from two
//! backends cannot be mixed, and a mix is reported as an error, not a crash.

pub mod select;
pub mod vendor;

/// The CUDA backend crate, for callers that use what only it has (graph capture).
#[cfg(feature = "cuda")]
pub use oxccl_hal_cuda as hal_cuda;
/// The ROCm backend crate, for callers that use what only it has (wrapping a caller's
/// `hipStream_t`, the runtime's current device).
#[cfg(feature = "rocm")]
pub use oxccl_hal_rocm as hal_rocm;

use oxccl_hal::host::HostBackend;
use oxccl_hal::{
    Backend, BackendKind, Capabilities, Device, DeviceId, DevicePtr, Error, Event,
    ForeignAllocation, HostVisible, IpcHandle, LaunchConfig, Memory, MemoryKind, Module,
    ModuleImage, Multicast, Result, Stream,
};
#[cfg(feature = "cuda")]
use oxccl_hal_cuda::CudaBackend;
#[cfg(feature = "rocm")]
use oxccl_hal_rocm::RocmBackend;

/// Declares an enum with one variant per built backend, holding that backend's `$assoc`.
macro_rules! any_type {
    ($(#[$meta:meta])* $name:ident => $assoc:ident $(, $derive:ident)*) => {
        $(#[$meta])*
        #[derive(Debug $(, $derive)*)]
        // The variants differ in size (the host backend's objects are larger than a CUDA
        // handle), but these values live long and are used on every call: boxing would add
        // an indirection to the hot path to save bytes nobody is short of.
        #[allow(clippy::large_enum_variant)]
        pub enum $name {
            /// The host backend's value.
            Host(<HostBackend as Backend>::$assoc),
            /// The CUDA backend's value.
            #[cfg(feature = "cuda")]
            Cuda(<CudaBackend as Backend>::$assoc),
            /// The ROCm backend's value.
            #[cfg(feature = "rocm")]
            Rocm(<RocmBackend as Backend>::$assoc),
        }

        impl $name {
            /// The backend this value belongs to.
            pub fn backend(&self) -> BackendKind {
                match self {
                    $name::Host(_) => BackendKind::Host,
                    #[cfg(feature = "cuda")]
                    $name::Cuda(_) => BackendKind::Cuda,
                    #[cfg(feature = "rocm")]
                    $name::Rocm(_) => BackendKind::Rocm,
                }
            }
        }
    };
}

/// Runs `$body` with `$x` bound to the inner value, whatever the backend.
macro_rules! each {
    ($value:expr, $enum:ident, $x:ident => $body:expr) => {
        match $value {
            $enum::Host($x) => $body,
            #[cfg(feature = "cuda")]
            $enum::Cuda($x) => $body,
            #[cfg(feature = "rocm")]
            $enum::Rocm($x) => $body,
        }
    };
}

/// Like [`each`], wrapping the `Ok` value into the same backend's variant of `$out`.
macro_rules! each_into {
    ($value:expr, $enum:ident, $out:ident, $x:ident => $body:expr) => {
        match $value {
            $enum::Host($x) => ($body).map($out::Host),
            #[cfg(feature = "cuda")]
            $enum::Cuda($x) => ($body).map($out::Cuda),
            #[cfg(feature = "rocm")]
            $enum::Rocm($x) => ($body).map($out::Rocm),
        }
    };
}

/// Runs `$body` on two values that must come from the same backend.
macro_rules! each_pair {
    ($what:literal, ($a:expr, $ea:ident, $x:ident), ($b:expr, $eb:ident, $y:ident) => $body:expr) => {
        match ($a, $b) {
            ($ea::Host($x), $eb::Host($y)) => $body,
            #[cfg(feature = "cuda")]
            ($ea::Cuda($x), $eb::Cuda($y)) => $body,
            #[cfg(feature = "rocm")]
            ($ea::Rocm($x), $eb::Rocm($y)) => $body,
            #[allow(unreachable_patterns)]
            (a, b) => Err(mixed($what, a.backend(), b.backend())),
        }
    };
}

fn mixed(what: &str, a: BackendKind, b: BackendKind) -> Error {
    Error::InvalidArgument(format!(
        "{what}: a {b} object was passed to a {a} object; objects of two backends cannot mix"
    ))
}

/// The run-time dispatch backend.
#[derive(Debug, Clone, Copy)]
pub struct AnyBackend;

any_type!(
    /// An opened device of whichever backend was chosen.
    AnyDevice => Device
);
any_type!(
    /// Device memory.
    AnyMemory => Memory
);
any_type!(
    /// Host-pinned memory mapped for the device.
    AnyHostMemory => HostMemory
);
any_type!(
    /// Peer memory imported through the IPC handle cache.
    AnyImported => Imported, Clone
);
any_type!(
    /// A stream.
    AnyStream => Stream
);
any_type!(
    /// An event.
    AnyEvent => Event
);
any_type!(
    /// A loaded module.
    AnyModule => Module
);
any_type!(
    /// A kernel of a loaded module.
    AnyKernel => Kernel, Clone
);
any_type!(
    /// A multicast object (the host backend's is an emulation).
    AnyMulticast => Multicast
);

impl AnyDevice {
    /// Opens device `id` of a given backend (which must be built).
    pub fn open_with(kind: BackendKind, id: DeviceId) -> Result<AnyDevice> {
        let _span = tracing::info_span!("open_device", backend = %kind, device = id.0).entered();
        match kind {
            BackendKind::Host => HostBackend::open_device(id).map(AnyDevice::Host),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => CudaBackend::open_device(id).map(AnyDevice::Cuda),
            #[cfg(feature = "rocm")]
            BackendKind::Rocm => RocmBackend::open_device(id).map(AnyDevice::Rocm),
            #[allow(unreachable_patterns)]
            other => Err(Error::Unsupported(format!(
                "the {other} backend is not built into this binary; rebuild with `--features {}`",
                other.to_string().to_ascii_lowercase()
            ))),
        }
    }
}

/// Device count of one built backend.
pub fn device_count_of(kind: BackendKind) -> Result<u32> {
    match kind {
        BackendKind::Host => HostBackend::device_count(),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => CudaBackend::device_count(),
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => RocmBackend::device_count(),
        #[allow(unreachable_patterns)]
        other => Err(Error::Unsupported(format!(
            "the {other} backend is not built into this binary"
        ))),
    }
}

/// The backend this process uses: `OXCCL_BACKEND`, else the first built GPU backend with a
/// device, else (in a build without GPU backends) the host.
pub fn chosen() -> Result<BackendKind> {
    let requested = std::env::var(select::BACKEND_VAR).ok();
    let built = select::built();
    let probes: Vec<(BackendKind, Result<u32>)> = if requested.is_some() {
        Vec::new()
    } else {
        built
            .iter()
            .filter(|k| **k != BackendKind::Host)
            .map(|k| (*k, device_count_of(*k)))
            .collect()
    };
    select::decide(requested.as_deref(), built, &probes)
}

impl Backend for AnyBackend {
    /// Not meaningful for the dispatch backend: ask [`Device::backend`] of a device.
    const KIND: BackendKind = BackendKind::Host;
    type Device = AnyDevice;
    type Memory = AnyMemory;
    type HostMemory = AnyHostMemory;
    type Imported = AnyImported;
    type Stream = AnyStream;
    type Event = AnyEvent;
    type Module = AnyModule;
    type Kernel = AnyKernel;
    type Multicast = AnyMulticast;

    fn device_count() -> Result<u32> {
        device_count_of(chosen()?)
    }

    fn open_device(id: DeviceId) -> Result<AnyDevice> {
        AnyDevice::open_with(chosen()?, id)
    }
}

impl Memory for AnyMemory {
    fn ptr(&self) -> DevicePtr {
        each!(self, AnyMemory, m => m.ptr())
    }
    fn len(&self) -> usize {
        each!(self, AnyMemory, m => m.len())
    }
}

impl Memory for AnyHostMemory {
    fn ptr(&self) -> DevicePtr {
        each!(self, AnyHostMemory, m => m.ptr())
    }
    fn len(&self) -> usize {
        each!(self, AnyHostMemory, m => m.len())
    }
}

impl HostVisible for AnyHostMemory {
    fn host_ptr(&self) -> *mut u8 {
        each!(self, AnyHostMemory, m => m.host_ptr())
    }
}

impl Memory for AnyImported {
    fn ptr(&self) -> DevicePtr {
        each!(self, AnyImported, m => m.ptr())
    }
    fn len(&self) -> usize {
        each!(self, AnyImported, m => m.len())
    }
}

impl Device<AnyBackend> for AnyDevice {
    fn id(&self) -> DeviceId {
        each!(self, AnyDevice, d => d.id())
    }
    fn backend(&self) -> BackendKind {
        AnyDevice::backend(self)
    }
    fn capabilities(&self) -> &Capabilities {
        each!(self, AnyDevice, d => d.capabilities())
    }
    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<AnyMemory> {
        each_into!(self, AnyDevice, AnyMemory, d => d.alloc(bytes, kind))
    }
    fn alloc_host(&self, bytes: usize) -> Result<AnyHostMemory> {
        each_into!(self, AnyDevice, AnyHostMemory, d => d.alloc_host(bytes))
    }
    fn create_stream(&self) -> Result<AnyStream> {
        each_into!(self, AnyDevice, AnyStream, d => d.create_stream())
    }
    fn create_event(&self) -> Result<AnyEvent> {
        each_into!(self, AnyDevice, AnyEvent, d => d.create_event())
    }
    fn create_sync_event(&self) -> Result<AnyEvent> {
        each_into!(self, AnyDevice, AnyEvent, d => d.create_sync_event())
    }
    fn load_module(&self, image: &ModuleImage<'_>) -> Result<AnyModule> {
        each_into!(self, AnyDevice, AnyModule, d => d.load_module(image))
    }
    fn export_memory(&self, memory: &AnyMemory) -> Result<IpcHandle> {
        each_pair!("export_memory", (self, AnyDevice, d), (memory, AnyMemory, m) => d.export_memory(m))
    }
    fn import_memory(&self, handle: &IpcHandle) -> Result<AnyImported> {
        each_into!(self, AnyDevice, AnyImported, d => d.import_memory(handle))
    }
    fn find_allocation(&self, ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation> {
        each!(self, AnyDevice, d => d.find_allocation(ptr, bytes))
    }
    fn export_allocation(&self, allocation: &ForeignAllocation) -> Result<IpcHandle> {
        each!(self, AnyDevice, d => d.export_allocation(allocation))
    }
    fn release_export(&self, allocation: &ForeignAllocation) {
        each!(self, AnyDevice, d => d.release_export(allocation))
    }
    fn enable_peer_access(&self, peer: DeviceId) -> Result<()> {
        each!(self, AnyDevice, d => d.enable_peer_access(peer))
    }
    fn synchronize(&self) -> Result<()> {
        each!(self, AnyDevice, d => d.synchronize())
    }
    fn create_multicast(&self, bytes: usize, members: u32) -> Result<AnyMulticast> {
        each_into!(self, AnyDevice, AnyMulticast, d => d.create_multicast(bytes, members))
    }
    fn export_multicast(&self, multicast: &AnyMulticast) -> Result<IpcHandle> {
        each_pair!("export_multicast", (self, AnyDevice, d), (multicast, AnyMulticast, m) => d.export_multicast(m))
    }
    fn import_multicast(&self, handle: &IpcHandle) -> Result<AnyMulticast> {
        each_into!(self, AnyDevice, AnyMulticast, d => d.import_multicast(handle))
    }
}

impl Stream<AnyBackend> for AnyStream {
    fn synchronize(&self) -> Result<()> {
        each!(self, AnyStream, s => s.synchronize())
    }
    fn record(&self, event: &AnyEvent) -> Result<()> {
        each_pair!("record", (self, AnyStream, s), (event, AnyEvent, e) => s.record(e))
    }
    fn wait_event(&self, event: &AnyEvent) -> Result<()> {
        each_pair!("wait_event", (self, AnyStream, s), (event, AnyEvent, e) => s.wait_event(e))
    }
    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        each!(self, AnyStream, s => s.write(dst, src))
    }
    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        each!(self, AnyStream, s => s.read(src, dst))
    }
    unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the caller upholds `Stream::copy`'s contract, which is the same for every backend.
        each!(self, AnyStream, s => unsafe { s.copy(dst, src, bytes) })
    }
    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller upholds `Stream::fill`'s contract, which is the same for every backend.
        each!(self, AnyStream, s => unsafe { s.fill(dst, value, bytes) })
    }
    unsafe fn launch(&self, kernel: &AnyKernel, config: &LaunchConfig, args: &[u8]) -> Result<()> {
        // SAFETY: the caller upholds `Stream::launch`'s contract; the pair check keeps the
        // kernel on its own backend's stream.
        each_pair!("launch", (self, AnyStream, s), (kernel, AnyKernel, k) => unsafe { s.launch(k, config, args) })
    }
    fn is_capturing(&self) -> Result<bool> {
        each!(self, AnyStream, s => s.is_capturing())
    }
}

impl Event<AnyBackend> for AnyEvent {
    fn synchronize(&self) -> Result<()> {
        each!(self, AnyEvent, e => e.synchronize())
    }
    fn elapsed_ms_since(&self, start: &AnyEvent) -> Result<f32> {
        each_pair!("elapsed_ms_since", (self, AnyEvent, e), (start, AnyEvent, s) => e.elapsed_ms_since(s))
    }
}

impl Module<AnyBackend> for AnyModule {
    fn kernel(&self, name: &str) -> Result<AnyKernel> {
        each_into!(self, AnyModule, AnyKernel, m => m.kernel(name))
    }
}

impl Multicast<AnyBackend> for AnyMulticast {
    fn len(&self) -> usize {
        each!(self, AnyMulticast, m => m.len())
    }
    fn add_device(&self, device: DeviceId) -> Result<()> {
        each!(self, AnyMulticast, m => m.add_device(device))
    }
    fn bind(&self, memory: &AnyMemory, offset: usize) -> Result<()> {
        each_pair!("bind", (self, AnyMulticast, m), (memory, AnyMemory, mem) => m.bind(mem, offset))
    }
    fn map(&self) -> Result<DevicePtr> {
        each!(self, AnyMulticast, m => m.map())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> AnyDevice {
        AnyDevice::open_with(BackendKind::Host, DeviceId(0)).unwrap()
    }

    #[test]
    fn host_device_through_dispatch_moves_bytes() {
        let dev = host();
        assert_eq!(Device::backend(&dev), BackendKind::Host);
        assert_eq!(dev.capabilities().backend, Some(BackendKind::Host));
        let a = dev.alloc(1000, MemoryKind::Plain).unwrap();
        let b = dev.alloc(1000, MemoryKind::Physical).unwrap();
        let stream = dev.create_stream().unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        stream.write(a.ptr(), &data).unwrap();
        // SAFETY: both allocations are live, 1000 bytes long and distinct.
        unsafe { stream.copy(b.ptr(), a.ptr(), 1000) }.unwrap();
        let mut back = vec![0u8; 1000];
        stream.read(b.ptr(), &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn import_through_dispatch_shares_one_mapping() {
        let dev = host();
        let mem = dev.alloc(4096, MemoryKind::Physical).unwrap();
        let handle = dev.export_memory(&mem).unwrap();
        let bytes = handle.to_bytes();
        let one = dev
            .import_memory(&IpcHandle::from_bytes(&bytes).unwrap())
            .unwrap();
        let two = dev.import_memory(&handle).unwrap();
        assert_eq!(one.ptr(), two.ptr());
        assert_eq!(one.len(), 4096);
    }

    #[test]
    fn unbuilt_backend_is_a_clear_error() {
        if cfg!(feature = "rocm") {
            return;
        }
        let err = AnyDevice::open_with(BackendKind::Rocm, DeviceId(0)).unwrap_err();
        assert!(err.to_string().contains("--features rocm"), "{err}");
    }
}
