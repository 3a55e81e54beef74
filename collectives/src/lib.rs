//! # oxccl-collectives: the crate users depend on
//!
//! A [`Communicator`] per rank (one GPU per process), built from the bootstrap (a
//! [`channels::bootstrap::UniqueId`] or the launcher environment), and
//! [`Communicator::all_reduce`]: in and out of place, sum/prod/min/max/avg, every data type
//! of the HAL with the mixed-precision accumulation of the kernels crate, any count, 1..=8
//! ranks. The [`algorithms`] collection (one-shot LL packets, two-shot, gated NVLS and
//! PortChannel entries) and the [`selector`] choose per call; `OXCCL_ALGO` forces one.
//!
//! On the host backend the same protocol runs as host kernels ([`host_kernels`]) across
//! processes, which is what CI tests.
//!
//! Features: `cuda` and `rocm` build those backends in, `ib` the InfiniBand transport. The
//! lower layers are re-exported so one dependency is enough.

pub mod algorithms;
pub mod communicator;
pub mod host_kernels;
pub mod selector;
pub mod timing;
pub mod tuner;

pub use algorithms::{Algorithm, ALGORITHMS};
pub use communicator::{CommConfig, Communicator};
pub use oxccl_backend as backend;
pub use oxccl_channels as channels;
pub use oxccl_hal as hal;
pub use oxccl_kernels as kernels;
