//! # oxccl-hal-cuda: the CUDA backend
//!
//! The [`oxccl_hal`] trait family for NVIDIA GPUs, on the CUDA driver API through cudarc.
//!
//! - **Layered like cudarc.** `cudarc::driver::sys` holds the raw bindings (resolved from
//!   `libcuda` at run time); [`result`](crate::result) wraps each call this crate makes into a
//!   `Result` whose error names the call, the driver's code, its name and its description;
//!   the safe types ([`CudaDevice`], [`CudaMemory`], [`CudaStream`], ...) sit on top and free
//!   their resources on drop.
//! - **No link-time dependency on the driver.** The loader probes for `libcuda.so.1` before
//!   the first driver call: a machine without a driver gets [`oxccl_hal::Error::RuntimeMissing`]
//!   ("no CUDA driver found ..."), not a panic.
//! - **Primary contexts, bound on every thread.** A device retains its primary context once;
//!   every public operation makes it current on the calling thread first
//!   ([`CudaDevice::bind_to_thread`]).
//! - **Memory.** `Plain` is `cuMemAlloc` (legacy IPC export); `Physical` and `Coherent` are
//!   VMM allocations (`cuMemCreate`, POSIX-FD shareable, rounded to the granularity, mapped
//!   with read/write access for this device and every peer that can reach it), exported by
//!   handing the descriptor to [`oxccl_hal::fd_share`]. Host memory is pinned and mapped.
//! - **Imports go through the IPC cache.** Legacy handles: pass-through (the driver counts
//!   references and returns one address per handle). VMM handles: shared per handle, since
//!   each driver-level import would reserve and map a new range.
//! - **Multicast is gated.** Creating or importing a multicast object checks
//!   [`oxccl_hal::multicast_gate`] before any driver call.

mod device;
mod foreign;
mod graph;
mod ipc;
mod loader;
mod memory;
mod module;
mod multicast;
mod result;
mod stream;
mod unowned;

pub use device::{CudaBackend, CudaDevice};
pub use graph::{CudaGraph, CudaGraphExec};
pub use ipc::{CudaImported, CudaMapping, CudaOpener};
pub use memory::{CudaHostMemory, CudaMemory};
pub use module::{CudaKernel, CudaModule};
pub use multicast::CudaMulticast;
pub use stream::{validate_launch, CudaEvent, CudaStream, MAX_THREADS_PER_BLOCK};
pub use unowned::{
    alloc_unowned, alloc_unowned_chunks, current_device, free_unowned, free_unowned_chunks,
    make_device_current, restore_current, PreviousContext,
};
