//! # oxccl-collectives: the crate users depend on
//!
//! A [`Communicator`] per rank (one GPU per process), built from the bootstrap (a
//! [`channels::bootstrap::UniqueId`] or the launcher environment), and
//! [`Communicator::all_reduce`]: in and out of place, sum/prod/min/max/avg, every data type
//! of the HAL with the mixed-precision accumulation of the kernels crate, any count, 1..=8
//! ranks.
//!
//! Layers, each knowing only the ones below it:
//! - [`algorithms`]: one descriptor per algorithm in its own file (name, code, kernel,
//!   plan, buffers, tuning, host stand-in, setup) and the one list of them,
//!   [`algorithms::ALGORITHMS`];
//! - [`tuner`] (measurement and cached tables) and [`selector`] (policy: which algorithm
//!   and launch for a call; `OXCCL_ALGO` forces one);
//! - [`communicator`]: setup, registered buffers, the entry checks and the steady-state
//!   call, iterating descriptors without knowing any algorithm.
//!
//! On the host backend the same protocols run as host stand-ins across processes
//! ([`host_kernels`] holds what they share), which is what CI tests.
//!
//! Features: `cuda` and `rocm` build those backends in, `ib` the InfiniBand transport. The
//! lower layers are re-exported so one dependency is enough.

pub mod algorithms;
pub mod communicator;
pub mod device_error;
pub mod host_kernels;
pub mod scratch;
pub mod selector;
pub mod timing;
pub mod tuner;

pub use algorithms::{Algorithm, Collective, ALGORITHMS};
pub use communicator::call_record::{BufferPath, CallRecord, Staged};
pub use communicator::{premul::PreMul, CommConfig, Communicator};
pub use oxccl_backend as backend;
pub use oxccl_channels as channels;
pub use oxccl_hal as hal;
pub use oxccl_kernels as kernels;

/// The README's Rust example, compiled (not run: it needs a launcher) as a doc test.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
