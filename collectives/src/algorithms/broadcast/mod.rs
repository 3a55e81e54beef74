//! The broadcast algorithms: every rank's output (`count` elements) gets the root's input.
//! In place when input and output are one buffer (NCCL's `ncclBcast`); the input of the
//! other ranks is not used. The kernels (`kernels/src/device/broadcast.cu`) take the
//! allreduce argument block (its `root`) and the shared scratch; data only moves. No LL
//! one-shot: its alternating packet halves need every rank to receive from every peer,
//! and a root receives nothing (see the kernel file).
//!
//! | name | kernel | serves |
//! |---|---|---|
//! | `broadcast_staged` | `broadcast_staged` | any size, buffers nobody registered: the root pushes into every peer's staging, the peers copy out, two barriers per round |
//! | `broadcast_direct` | `broadcast_direct` | registered outputs: the root stores into every rank's output between two barriers |

pub mod direct;
pub mod staged;
