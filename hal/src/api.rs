//! The backend trait family.
//!
//! [`Backend`] ties one backend's types together through associated types; each concern is
//! its own trait taking `B: Backend`. Callers that want run-time choice between built
//! backends use the dispatch enum of the `oxccl-backend` crate, which implements this same
//! family by matching, so no hot path goes through `dyn`.

use std::fmt::Debug;

use crate::error::Result;
use crate::ipc::IpcHandle;
use crate::launch::{LaunchConfig, ModuleImage};
use crate::types::{BackendKind, Capabilities, DeviceId, DevicePtr, ForeignAllocation, MemoryKind};

/// One backend: its device, memory, stream, event, module, kernel and multicast types.
pub trait Backend: Sized + Send + Sync + 'static {
    /// Which backend this is.
    const KIND: BackendKind;
    /// An opened device.
    type Device: Device<Self>;
    /// An owned device allocation; freed on drop.
    type Memory: Memory;
    /// Owned host memory that the device can read and write (pinned and mapped).
    type HostMemory: Memory + HostVisible;
    /// A peer's memory mapped into this process through IPC. Clones share one mapping;
    /// the mapping is closed when the last clone drops (through the IPC handle cache).
    type Imported: Memory + Clone;
    /// An in-order queue of device work.
    type Stream: Stream<Self>;
    /// A marker recorded in a stream.
    type Event: Event<Self>;
    /// A loaded code image.
    type Module: Module<Self>;
    /// A kernel entry point of a loaded module.
    type Kernel: Debug + Clone + Send + Sync;
    /// A multicast object: one address that reduces over or broadcasts to its members.
    type Multicast: Multicast<Self>;

    /// Number of devices this backend can open on this machine.
    ///
    /// Fails with [`crate::Error::RuntimeMissing`] when the backend's runtime is not
    /// installed.
    fn device_count() -> Result<u32>;

    /// Opens device `id` and makes it usable from the calling thread.
    fn open_device(id: DeviceId) -> Result<Self::Device>;
}

/// Anything that names a range of device-addressable memory.
pub trait Memory: Debug + Send + Sync {
    /// First byte, as the device sees it.
    fn ptr(&self) -> DevicePtr;
    /// Length in bytes (as requested, not rounded).
    fn len(&self) -> usize;
    /// Whether the range is empty (never true for a live allocation).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Memory the host can address directly.
pub trait HostVisible {
    /// The host address of the first byte. Valid while `self` lives.
    fn host_ptr(&self) -> *mut u8;
}

/// An opened device.
pub trait Device<B: Backend>: Debug + Send + Sync {
    /// The device ordinal.
    fn id(&self) -> DeviceId;

    /// The backend serving this device. Generic code picks code images by this, not by
    /// `B::KIND`, so that the run-time dispatch backend answers per device.
    fn backend(&self) -> BackendKind {
        B::KIND
    }

    /// What the device can do.
    fn capabilities(&self) -> &Capabilities;

    /// Allocates `bytes` of device memory of the given kind. Zero bytes is an error.
    fn alloc(&self, bytes: usize, kind: MemoryKind) -> Result<B::Memory>;

    /// Allocates `bytes` of pinned host memory mapped for the device.
    fn alloc_host(&self, bytes: usize) -> Result<B::HostMemory>;

    /// Creates a stream.
    fn create_stream(&self) -> Result<B::Stream>;

    /// Creates an event that can be timed.
    fn create_event(&self) -> Result<B::Event>;

    /// Creates an event used only to order work (record, wait, synchronize), never timed:
    /// the backends that have one make it without a timestamp (CUDA: no timing data).
    /// Timing it is an error where the backend keeps no timestamp.
    fn create_sync_event(&self) -> Result<B::Event> {
        self.create_event()
    }

    /// Loads a code image built for this backend.
    fn load_module(&self, image: &ModuleImage<'_>) -> Result<B::Module>;

    /// Exports an allocation so that other processes can map it.
    fn export_memory(&self, memory: &B::Memory) -> Result<IpcHandle>;

    /// Maps a peer's exported allocation, through the device's IPC handle cache: a handle
    /// already mapped returns the same mapping.
    fn import_memory(&self, handle: &IpcHandle) -> Result<B::Imported>;

    /// The allocation of this device that holds `[ptr, ptr + bytes)`, memory the caller
    /// allocated (not through oxccl): its base, length and identity, from the driver's
    /// range query. Where the backend maps memory in pieces (CUDA VMM), a range across
    /// pieces mapped side by side is one allocation, with one identity per sequence of
    /// pieces, exported and mapped side by side as a whole. A pointer that is not device
    /// memory of this device, or a range that runs past the end of its allocation, is
    /// [`crate::Error::InvalidArgument`].
    fn find_allocation(&self, ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation>;

    /// Exports an allocation found by [`Device::find_allocation`] so that other processes
    /// can map it (with [`Device::import_memory`]). Exporting the same allocation again
    /// returns the same handle until [`Device::release_export`].
    fn export_allocation(&self, allocation: &ForeignAllocation) -> Result<IpcHandle>;

    /// Stops serving an export made by [`Device::export_allocation`] to new importers and
    /// releases what it holds here (importers that mapped it keep their mapping).
    fn release_export(&self, allocation: &ForeignAllocation);

    /// Lets this device access `peer`'s memory directly (idempotent).
    fn enable_peer_access(&self, peer: DeviceId) -> Result<()>;

    /// Blocks until all work on the device has finished.
    fn synchronize(&self) -> Result<()>;

    /// Creates a multicast object for `members` devices of `bytes` each.
    ///
    /// Refused unless the multicast safety gate is open ([`crate::multicast_gate`]).
    fn create_multicast(&self, bytes: usize, members: u32) -> Result<B::Multicast>;

    /// Exports a multicast object so that the other member processes can join it.
    fn export_multicast(&self, multicast: &B::Multicast) -> Result<IpcHandle>;

    /// Joins a multicast object exported by another process.
    fn import_multicast(&self, handle: &IpcHandle) -> Result<B::Multicast>;
}

/// An in-order queue of device work.
///
/// Copies and launches are asynchronous: they are ordered after earlier work on the same
/// stream and complete before [`Stream::synchronize`] returns.
pub trait Stream<B: Backend>: Debug + Send + Sync {
    /// Blocks until all work queued so far has finished.
    fn synchronize(&self) -> Result<()>;

    /// Records `event` after the work queued so far.
    fn record(&self, event: &B::Event) -> Result<()>;

    /// Makes later work on this stream wait for `event`.
    fn wait_event(&self, event: &B::Event) -> Result<()>;

    /// Copies host bytes into device memory and waits for the copy.
    fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()>;

    /// Copies device memory into host bytes and waits for the copy.
    fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;

    /// Queues a device-to-device copy (also between peers).
    ///
    /// # Safety
    /// Both ranges must be live device memory of at least `bytes` for as long as the copy
    /// runs, and must not overlap.
    unsafe fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;

    /// Queues a byte fill.
    ///
    /// # Safety
    /// `dst` must be live device memory of at least `bytes` for as long as the fill runs.
    unsafe fn fill(&self, dst: DevicePtr, value: u8, bytes: usize) -> Result<()>;

    /// Queues a kernel launch. `args` is the kernel's argument block: every oxccl kernel
    /// takes exactly one parameter, a struct from the kernels crate's C header, by value.
    ///
    /// # Safety
    /// `args` must be the argument block `kernel` expects, and every pointer in it must be
    /// valid for what the kernel does with it until the kernel finishes.
    unsafe fn launch(&self, kernel: &B::Kernel, config: &LaunchConfig, args: &[u8]) -> Result<()>;

    /// Whether work queued now would be captured into a graph instead of running.
    fn is_capturing(&self) -> Result<bool>;
}

/// A marker in a stream.
pub trait Event<B: Backend>: Debug + Send + Sync {
    /// Blocks until the event has completed.
    fn synchronize(&self) -> Result<()>;
    /// Milliseconds between `start` (recorded earlier) and this event.
    fn elapsed_ms_since(&self, start: &Self) -> Result<f32>;
}

/// A loaded code image.
pub trait Module<B: Backend>: Debug + Send + Sync {
    /// Finds a kernel by name. An unknown name is an error that lists the known ones.
    fn kernel(&self, name: &str) -> Result<B::Kernel>;
}

/// A multicast object as seen by one member.
pub trait Multicast<B: Backend>: Debug + Send + Sync {
    /// Size in bytes (after granularity rounding).
    fn len(&self) -> usize;
    /// Whether the object has zero size (never for a live object).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Adds a device of this process to the object (before any member binds memory).
    fn add_device(&self, device: DeviceId) -> Result<()>;
    /// Binds `memory` as this member's backing store at `offset` in the object.
    fn bind(&self, memory: &B::Memory, offset: usize) -> Result<()>;
    /// Maps the object and returns the address through which reduce/broadcast work.
    fn map(&self) -> Result<DevicePtr>;
}
