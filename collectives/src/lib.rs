//! # oxccl-collectives: the crate users depend on
//!
//! What comes here (issue "Allreduce: Communicator, algorithm collection, selector, tuner"):
//! the `Communicator`, `all_reduce` with its algorithm collection, selector and tuner.
//!
//! Features: `cuda` and `rocm` build those backends in, `ib` the InfiniBand transport. The
//! lower layers are re-exported so one dependency is enough.

pub use oxccl_backend as backend;
pub use oxccl_channels as channels;
pub use oxccl_hal as hal;
pub use oxccl_kernels as kernels;
