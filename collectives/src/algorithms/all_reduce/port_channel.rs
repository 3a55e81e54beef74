//! PortChannel allreduce: the multi-node allreduce. Every rank's input goes to every peer
//! through the proxy (IPC copies, TCP or InfiniBand), then every rank reduces all chunks in
//! rank order. Set up where the ranks are not all on one node (several nodes, or
//! `OXCCL_SEPARATE_HOSTS=1`) or when forced (`OXCCL_ALGO=port_channel`); the machinery,
//! protocol and host stand-in are shared with the other PortChannel algorithms
//! ([`crate::algorithms::port_channel`]).

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::port_channel::{self as port, host};
pub use crate::algorithms::port_channel::{
    parse_transport, PortAlgorithm, PortAllreduce, PortAllreduceConfig, PortConfig, CHUNK_VAR,
    DEFAULT_CHUNK, TRANSPORT_VAR,
};
use crate::algorithms::{Algorithm, CallShape, Collective, Descriptor, Plan};

/// Kernel symbol (device image and host stand-in).
pub(crate) const KERNEL: &str = "allreduce_port";

/// The PortChannel allreduce.
pub const PORT_CHANNEL: Algorithm = Algorithm::new(&DESCRIPTOR);

const DESCRIPTOR: Descriptor = port::descriptor(
    Collective::AllReduce,
    (
        "port_channel",
        &["port", "portchannel", "allreduce_port"],
        4,
    ),
    "multi-node (proxy: IPC copies, TCP or InfiniBand), any world size 1..=8; chosen when \
     the ranks are on several nodes (or OXCCL_SEPARATE_HOSTS=1), else only when forced \
     (OXCCL_ALGO=port_channel): within a node the NVLink algorithms are faster",
    KERNEL,
    HostKernelTable {
        name: "port_channel (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
);

/// The launch for a call: see [`port::plan`].
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    port::plan(KERNEL, s)
}

/// `allreduce_port` on the host backend.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    host::run(bytes, KERNEL, host::Kind::AllReduce)
}
