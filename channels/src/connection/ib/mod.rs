//! InfiniBand transport: RC queue pairs on rdma-core's verbs, behind the `ib` feature.
//!
//! With `--features ib` this is the verbs implementation (`ibverbs-sys`: the bindings layer
//! of the `ibverbs` crate, whose safe layer cannot register foreign memory or post RDMA
//! writes). A process opens one device (the first, or `OXCCL_IB_HCA=name[:port]`), one
//! protection domain for all its registrations and queue pairs, and one completion queue
//! and RC queue pair per connection. `write` is an RDMA write; `update_and_sync` is an RDMA
//! write of the 8-byte value (inline) on the same queue pair, which RC delivers after the
//! earlier writes; `flush` polls the completion queue until every posted request is done.
//! On a host without a device every constructor answers [`NO_DEVICE`].
//!
//! Without the feature a stub with the same public API is built: its constructors answer
//! [`NOT_BUILT`] and its types cannot be instantiated.

#[cfg(feature = "ib")]
mod verbs;
#[cfg(feature = "ib")]
pub use verbs::{available, IbConnection, IbRegion};

#[cfg(not(feature = "ib"))]
mod stub;
#[cfg(not(feature = "ib"))]
pub use stub::{available, IbConnection, IbRegion};

/// What every InfiniBand call answers in a build without the `ib` feature.
pub const NOT_BUILT: &str = "InfiniBand support not built (rebuild with --features ib)";
/// What every InfiniBand constructor answers on a host without an RDMA device.
pub const NO_DEVICE: &str = "no InfiniBand device found";
/// Environment variable naming the RDMA device (and optionally the port: `mlx5_0:1`).
pub const HCA_VAR: &str = "OXCCL_IB_HCA";
/// Environment variable with the GID index to use on RoCE ports (default 0).
pub const GID_INDEX_VAR: &str = "OXCCL_IB_GID_INDEX";
