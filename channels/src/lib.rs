//! # oxccl-channels
//!
//! What comes here (issue "Bootstrap, connections, semaphores and the three channels"):
//! a TCP bootstrap with unique ids and launcher-environment init; connections over same-node
//! IPC, InfiniBand (behind the `ib` feature; without it a stub that reports "InfiniBand
//! support not built") and TCP; device-to-device and host-to-device semaphores; and the
//! MemoryChannel, PortChannel (with its proxy thread) and SwitchChannel.
//!
//! Built so far: the [`bootstrap`]. Its features already forward to the backends.
pub mod bootstrap;
pub mod connection;
pub mod registered_memory;
pub mod fifo;
pub mod host_kernels;
pub mod memory_channel;
pub mod port_channel;
pub mod proxy;
pub mod semaphore;
pub mod switch_channel;
