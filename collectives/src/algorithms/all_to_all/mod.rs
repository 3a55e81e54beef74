//! The all-to-all algorithms (equal counts): chunk p (elements `[p * count, (p + 1) *
//! count)`) of rank r's input lands in slot r of rank p's output; both hold
//! `world_size * count` elements and must not overlap (NCCL defines no in-place
//! all-to-all). The kernels (`kernels/src/device/alltoall.cu`) take the allreduce argument
//! block (`count` is one chunk's) and the shared scratch; data only moves.
//!
//! | name | kernel | serves |
//! |---|---|---|
//! | `alltoall_oneshot_ll` | `alltoall_oneshot_ll` | small messages: every chunk as LL16 packets into its owner's packet half, no barrier |
//! | `alltoall_staged` | `alltoall_staged` | any size, buffers nobody registered: chunks pushed into their owners' staging, copied out locally |
//! | `alltoall_direct` | `alltoall_direct` | registered outputs: every chunk stored straight into its owner's output between two barriers |
//! | `alltoall_copy` | `broadcast_barrier` | registered outputs, large messages: the copy engine copies every peer's chunk into its owner's output on a second stream, the own chunk on the caller's, between two barrier kernels |

pub mod copy_engine;
pub mod direct;
pub mod one_shot;
pub mod staged;
