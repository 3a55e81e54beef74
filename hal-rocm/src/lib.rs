//! # oxccl-hal-rocm: the HAL on AMD GPUs (HIP runtime, loaded at run time)
//!
//! - **Feature `hip` holds the backend.** Without it this crate is empty, so that
//!   `cargo build --workspace` works on machines without HIP headers; `oxccl-backend`'s
//!   `rocm` feature enables it.
//! - **Bindings: checked in, one file per HIP ABI generation, not `hip-sys`.**
//!   `hip-sys`/`hip-runtime-sys` 0.1.2 ship bindings of one older ROCm release and *link*
//!   `libamdhip64` (`cargo:rustc-link-lib=dylib=amdhip64`), which breaks the rule that one
//!   binary runs on machines with or without ROCm. [`sys::v5`], [`sys::v6`] and [`sys::v7`]
//!   are bindgen's output for the HIP 5.7, 6.4 and 7.2 headers, restricted to the calls,
//!   types and flags oxccl uses, as a table of function pointers ([`sys::HipApi`]). They are
//!   in git (like cudarc's per-version bindings) so that a `--features rocm` build needs
//!   neither HIP headers nor libclang here, and one binary serves every generation;
//!   `build.rs` regenerates them only on request and `tests/bindings.rs` checks, where the
//!   headers are present (CI), that regenerating changes nothing.
//! - **The generation is chosen at run time.** [`Hip::load`] reads `hipRuntimeGetVersion`
//!   and takes that major's [`sys::Abi`]: the enum values and flags of that generation
//!   (e.g. `hipIpcMemLazyEnablePeerAccess` is 0 in 5.x, 1 from 6.0). A runtime of any other
//!   major (4.x, 8.x) is [`oxccl_hal::Error::Unsupported`], naming the version found and
//!   the generations supported. What differs between generations, and what oxccl avoids
//!   because it differs (`hipDeviceProp_t`, `hipPointerAttribute_t`): [`sys`].
//! - **Layers as in cudarc.** [`sys`]: raw bindings; [`result`]: one method per HIP call on
//!   [`Hip`] returning `Result`, errors mapped to [`oxccl_hal::Error::Backend`] with the
//!   call, the code, `hipGetErrorName` and `hipGetErrorString`; safe owners on top
//!   ([`RocmDevice`], [`RocmMemory`], [`RocmStream`], ...), which free on drop.
//! - **Capabilities only through `hipDeviceGetAttribute`**, never `hipDeviceProp_t`
//!   (see [`RocmDevice`]). Multicast is [`oxccl_hal::MulticastSupport::None`].
//! - **Memory.** `Plain`: `hipMalloc`, exported as a legacy IPC handle. `Coherent`:
//!   `hipExtMallocWithFlags(hipDeviceMallocUncached)` for flags and semaphores that peers
//!   write (why: [`RocmMemory`]); also legacy IPC. `Physical`: `hipMemCreate` + reserve +
//!   map + set access, exported as a POSIX FD through [`oxccl_hal::fd_share`], where the
//!   runtime reports VMM support. Host memory: `hipHostMalloc(mapped | portable |
//!   coherent)`.
//! - **Callers' buffers** (zero-copy on memory oxccl did not allocate): `find_allocation`
//!   finds the `hipMalloc` block that holds a pointer (`hipMemGetAddressRange`, the
//!   pointer attributes, numbered per generation) and `export_allocation` exports its base
//!   as a legacy IPC handle, once per block. VMM memory (`hipMemCreate` + `hipMemMap`, as
//!   PyTorch's expandable segments map it) is not shared: the calls it needs exist in every
//!   generation's headers but do not behave alike in the runtimes (`foreign` says how).
//! - **Every import goes through one [`oxccl_hal::IpcCache`] per runtime**
//!   ([`Hip::ipc_cache`]) with `CachePolicy::Shared`: ROCm fails (or leaks) when a handle
//!   already open in the process is opened again, so a re-import returns the open mapping,
//!   `hipIpcCloseMemHandle` runs once after the last user drops, and at most
//!   `OXCCL_ROCM_MAX_IPC_IMPORTS` (default 1024) handles are open at once
//!   ([`oxccl_hal::Error::IpcCacheFull`] beyond).
//! - **Kernel launch passes the argument block through `extra`**
//!   (`HIP_LAUNCH_PARAM_BUFFER_POINTER/SIZE/END`), not `kernelParams`: every oxccl kernel
//!   takes one struct by value, and `extra` gives HIP the bytes *and their length*, so the
//!   runtime never reads past the caller's slice (with `kernelParams` it would read as many
//!   bytes as the kernel's metadata says from an unchecked pointer).
//!
//! No AMD GPU has been available to this project: the backend is tested against a fake
//! HIP runtime (`tests/fake_hip/`), built once per generation against that generation's
//! real headers, never against a real libamdhip64 of any version, and never on an MI300X.
//! `ci/gpu/run-rocm.sh` is the suite for someone who has one.

#[cfg(feature = "hip")]
mod device;
#[cfg(feature = "hip")]
mod foreign;
#[cfg(feature = "hip")]
mod memory;
#[cfg(feature = "hip")]
mod module;
#[cfg(feature = "hip")]
pub mod result;
#[cfg(feature = "hip")]
mod runtime;
#[cfg(feature = "hip")]
mod stream;
#[cfg(feature = "hip")]
pub mod sys;

#[cfg(feature = "hip")]
pub use device::{RocmBackend, RocmDevice};
#[cfg(feature = "hip")]
pub use memory::{RocmHostMemory, RocmImported, RocmIpcOpener, RocmMapping, RocmMemory};
#[cfg(feature = "hip")]
pub use module::{RocmKernel, RocmModule, RocmMulticast};
#[cfg(feature = "hip")]
pub use runtime::{Hip, DEFAULT_MAX_IPC_IMPORTS, LIBRARY_VAR, MAX_IPC_IMPORTS_VAR};
#[cfg(feature = "hip")]
pub use stream::{RocmEvent, RocmStream};

/// Whether this build contains the ROCm backend (feature `hip`).
pub const BUILT: bool = cfg!(feature = "hip");
