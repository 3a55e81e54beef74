//! PortChannel allreduce: the multi-node algorithm. Every byte that leaves a rank is moved
//! by its proxy thread (IPC copies within a node, TCP or InfiniBand across nodes), so it
//! needs no load/store path between GPUs. Its state ([`PortAllreduce`]: its own scratch,
//! channels and proxy) is made at communicator setup, only when it is forced
//! (`OXCCL_ALGO=port_channel`): the proxy thread and the connections cost, and within a
//! node the NVLink algorithms are faster. The protocol is in [`allreduce`]'s docs.
//!
//! Serves any count and world sizes 1..=8 (one GPU per rank, any number of nodes among
//! them).

pub mod allreduce;

use oxccl_hal::{Error, HostKernelTable, LaunchConfig, Result};

use crate::algorithms::{Algorithm, Buffers, CallShape, Collective, Descriptor, Plan, THREADS};
pub use allreduce::{
    parse_transport, PortAllreduce, PortAllreduceConfig, CHUNK_VAR, DEFAULT_CHUNK, TRANSPORT_VAR,
};

/// Kernel symbol (device image and host stand-in).
pub(crate) const KERNEL: &str = "allreduce_port";

/// The PortChannel allreduce.
pub const PORT_CHANNEL: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllReduce,
    name: "port_channel",
    aliases: &["port", "portchannel"],
    code: 4,
    serves: "multi-node (proxy: IPC copies, TCP or InfiniBand), any world size 1..=8; \
             slower than the NVLink algorithms within a node, so only when forced \
             (OXCCL_ALGO=port_channel)",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "port_channel (host)",
        kernels: &[(KERNEL, allreduce::host_kernel)],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: false,
    tuning: None,
    setup: |ctx, me| {
        if !ctx.forced.is(me) {
            return Ok(None);
        }
        Ok(Some(Box::new(PortAllreduce::new(ctx, me)?)))
    },
});

/// The launch for a call: one block (thread p drives the channel to peer p; every thread
/// copies and reduces), one thread on the host backend.
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    if s.world_size == 0 || s.world_size > oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS {
        return Err(Error::Unsupported(format!(
            "port_channel: world size {}, it serves 1..=8",
            s.world_size
        )));
    }
    let config = if s.host {
        LaunchConfig::linear(1, 32)
    } else {
        LaunchConfig::linear(1, THREADS)
    };
    Ok(Plan {
        kernel: KERNEL,
        config,
    })
}
