//! PortChannel reduce-scatter: the multi-node reduce-scatter, the first half of the
//! PortChannel allreduce. Chunk p of every rank's input goes to rank p through the proxy
//! (IPC copies, TCP or InfiniBand), then every rank reduces its chunk of every rank in rank
//! order. Set up where the ranks are not all on one node (several nodes, or
//! `OXCCL_SEPARATE_HOSTS=1`) or when forced (`OXCCL_ALGO=reducescatter_port`); the
//! machinery, protocol and host stand-in are shared with the other PortChannel algorithms
//! ([`crate::algorithms::port_channel`]), the device kernel with the allreduce's.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::port_channel::{self as port, host};
use crate::algorithms::{Algorithm, CallShape, Collective, Descriptor, Plan};

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "reducescatter_port";

/// The PortChannel reduce-scatter.
pub const REDUCESCATTER_PORT: Algorithm = Algorithm::new(&DESCRIPTOR);

const DESCRIPTOR: Descriptor = port::descriptor(
    Collective::ReduceScatter,
    ("reducescatter_port", &["reducescatter_port_channel"], 204),
    "multi-node reduce-scatters (proxy: IPC copies, TCP or InfiniBand), any size, world \
     size 1..=8; chosen when the ranks are on several nodes (or OXCCL_SEPARATE_HOSTS=1), \
     else only when forced",
    KERNEL,
    HostKernelTable {
        name: "reducescatter_port (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
);

/// The launch for a call: see [`port::plan`].
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    port::plan(KERNEL, s)
}

/// `reducescatter_port` on the host backend.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    host::run(bytes, KERNEL, host::Kind::ReduceScatter)
}
