//! The broadcast algorithms: every rank's output (`count` elements) gets the root's input.
//! In place when input and output are one buffer (NCCL's `ncclBcast`); the input of the
//! other ranks is not used. The kernels (`kernels/src/device/broadcast.cu`) take the
//! allreduce argument block (its `root`) and the shared scratch; data only moves. The
//! one-shot's alternating packet halves need every rank to receive from every peer; the
//! ranks that get no data get an acknowledgement instead (see the kernel file).
//!
//! | name | kernel | serves |
//! |---|---|---|
//! | `broadcast_oneshot_ll` | `broadcast_oneshot_ll` | small messages: the root writes LL16 packets into every peer's packet half, the others acknowledge; no barrier |
//! | `broadcast_staged` | `broadcast_staged` | any size, buffers nobody registered: the root pushes into every peer's staging, the peers copy out, two barriers per round |
//! | `broadcast_direct` | `broadcast_direct` | registered outputs: the root stores into every rank's output between two barriers |
//! | `broadcast_relay` | `broadcast_relay` | registered outputs, 3 or more ranks: the root stores chunk k into the k-th next rank's output, which stores it on into the others', in pipelined rounds |
//! | `broadcast_copy` | `broadcast_barrier` | registered outputs, large messages: the root's copy engine copies into every rank's output between two barrier kernels |

pub mod copy_engine;
pub mod direct;
pub mod one_shot;
pub mod relay;
pub mod staged;
