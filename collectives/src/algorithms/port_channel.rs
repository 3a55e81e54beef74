//! PortChannel allreduce: the multi-node algorithm. Every byte that leaves a rank is moved
//! by its proxy thread (IPC copies within a node, TCP or InfiniBand across nodes), so it
//! needs no load/store path between GPUs. Built and launched by
//! [`PortAllreduce`] (its own scratch, channels and proxy); the
//! protocol is in that module's docs.
//!
//! Serves any count and world sizes 1..=8 (one GPU per rank, any number of nodes among
//! them). Within a node it is slower than the NVLink algorithms (one block, data through
//! the proxy): choose it only with `OXCCL_ALGO=port_channel` or when ranks span hosts.

pub mod allreduce;

use oxccl_hal::{Error, LaunchConfig, Result};

use super::{CallShape, Plan, THREADS};
pub use allreduce::{
    parse_transport, PortAllreduce, PortAllreduceConfig, CHUNK_VAR, DEFAULT_CHUNK, PORT_ALLREDUCE,
    TABLE, TRANSPORT_VAR,
};

/// The launch for a call.
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    plan_for(s.world_size, s.host)
}

/// The launch for `world_size` ranks: one block (thread p drives the channel to peer p;
/// every thread copies and reduces), one thread on the host backend.
pub fn plan_for(world_size: u32, host: bool) -> Result<Plan> {
    if world_size == 0 || world_size > oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS {
        return Err(Error::Unsupported(format!(
            "port_channel: world size {world_size}, it serves 1..=8"
        )));
    }
    let config = if host {
        LaunchConfig::linear(1, 32)
    } else {
        LaunchConfig::linear(1, THREADS)
    };
    Ok(Plan {
        kernel: PORT_ALLREDUCE,
        config,
    })
}
