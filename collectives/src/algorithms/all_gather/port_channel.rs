//! PortChannel all-gather: the multi-node all-gather. Every rank's input goes to every
//! peer through the proxy (IPC copies, TCP or InfiniBand) into its slot of the peer's
//! receive area, then every rank copies all slots into its output. Set up where the ranks
//! are not all on one node (several nodes, or `OXCCL_SEPARATE_HOSTS=1`) or when forced
//! (`OXCCL_ALGO=allgather_port`); the machinery, protocol and host stand-in are shared with
//! the other PortChannel algorithms ([`crate::algorithms::port_channel`]).

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::port_channel::{self as port, host};
use crate::algorithms::{Algorithm, CallShape, Collective, Descriptor, Plan};

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "allgather_port";

/// The PortChannel all-gather.
pub const ALLGATHER_PORT: Algorithm = Algorithm::new(&DESCRIPTOR);

const DESCRIPTOR: Descriptor = port::descriptor(
    Collective::AllGather,
    ("allgather_port", &["allgather_port_channel"], 104),
    "multi-node all-gathers (proxy: IPC copies, TCP or InfiniBand), any size, world size \
     1..=8; chosen when the ranks are on several nodes (or OXCCL_SEPARATE_HOSTS=1), else \
     only when forced",
    KERNEL,
    HostKernelTable {
        name: "allgather_port (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
);

/// The launch for a call: see [`port::plan`].
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    port::plan(KERNEL, s)
}

/// `allgather_port` on the host backend.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    host::run(bytes, KERNEL, host::Kind::AllGather)
}
