//! # oxccl-hal: the hardware abstraction layer
//!
//! The contract, before any type:
//! - **Traits, tied by one `Backend`.** [`Backend`] names a backend's device, memory, stream,
//!   event, module, kernel and multicast types; each concern is its own trait taking
//!   `B: Backend` ([`Device`], [`Stream`], [`Event`], [`Module`], [`Multicast`]). Code
//!   generic over `B` compiles to direct calls.
//! - **Backends are crates chosen by cargo features.** `host` is here and always built (the
//!   default; host memory shared between processes stands in for device memory). CUDA and
//!   ROCm live in `oxccl-hal-cuda` and `oxccl-hal-rocm`; the `oxccl-backend` crate holds the
//!   run-time dispatch enum over whichever were built.
//! - **Objects are returned by value and free themselves on drop.** Allocations, streams,
//!   modules and imports own their resource; plain numbers ([`DevicePtr`], [`DeviceId`]) do not.
//! - **`unsafe fn` where the caller carries obligations** (device pointers in copies and
//!   kernel arguments), with the obligations written above the function.
//! - **Every import goes through the [`ipc_cache`].** It is what keeps ROCm correct and is a
//!   pass-through on CUDA.
//! - **Multicast is gated** by [`multicast_gate`]: nothing creates a multicast object unless
//!   `OXCCL_NVLS=1` is set and `NCCL_NVLS_ENABLE` is not `0`.
//! - **One error type**, [`Error`], carrying the failing call, the backend's code and name,
//!   and (once a layer above knows it) the rank. No driver result is unwrapped.

pub mod api;
pub mod atomics;
pub mod error;
pub mod fd_share;
pub mod host;
pub mod ipc;
pub mod ipc_cache;
pub mod launch;
pub mod multicast_gate;
pub mod span_ids;
pub mod types;

pub use api::{Backend, Device, Event, HostVisible, Memory, Module, Multicast, Stream};
pub use error::{Error, Result};
pub use ipc::{IpcHandle, IpcHandleKind, IpcKey};
pub use ipc_cache::{CachePolicy, CachedImport, IpcCache, IpcOpener};
pub use launch::{HostKernelFn, HostKernelTable, LaunchConfig, ModuleImage};
pub use span_ids::SpanIds;
pub use types::{
    AccumType, BackendKind, Capabilities, DataType, DeviceId, DevicePtr, ForeignAllocation,
    MemoryKind, MulticastSupport, ReduceOp,
};
