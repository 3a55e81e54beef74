//! # oxccl-channels: how GPUs of a job find and talk to each other
//!
//! Setup is collective and goes through the [`bootstrap`] (TCP rendezvous, all-gather,
//! tagged send/recv, barrier; every wait bounded and naming the ranks it waited for); the
//! ranks of one node exchange small per-call records through shared host memory instead
//! ([`local_exchange`]).
//! Memory ([`backing`]: device memory, or pinned host memory the device maps) is made
//! reachable by peers through [`registered_memory`] and moved by a
//! [`connection`] (chosen per peer from [`hosts`], every rank's node): same-node IPC (the
//! copy engine on GPUs), TCP, or InfiniBand RC queue pairs behind the `ib` feature (without
//! it, a stub whose every call says "InfiniBand support not built"). On top of those:
//! - [`semaphore`]: device-to-device, host-to-device and host-to-host counters;
//! - [`memory_channel`]: GPU threads load and store peer memory directly (put/get, LL packets);
//! - [`port_channel`]: GPU threads push triggers into a [`fifo`] that a [`proxy`] thread turns
//!   into connection writes and signals;
//! - [`switch_channel`]: multicast reduce/broadcast, only behind the multicast gate (and on
//!   the host backend's emulation).
//!
//! Device handles are the plain structs of `kernels/include/oxccl/abi.h`; [`host_kernels`]
//! implements the same operations on the host backend so the protocols are tested in CI.

pub mod backing;
pub mod bootstrap;
pub mod connection;
pub mod fifo;
pub mod host_kernels;
pub mod hosts;
pub mod local_exchange;
pub mod memory_channel;
pub mod port_channel;
pub mod proxy;
pub mod registered_memory;
pub mod semaphore;
pub mod switch_channel;
pub mod timeline;
