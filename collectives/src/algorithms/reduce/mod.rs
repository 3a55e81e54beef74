//! The reduce algorithms: the root's output (`count` elements) is the reduction, in rank
//! order, of every rank's input (`count` elements each), with the allreduce reducers, so it
//! holds the bits of the host reference. In place when input and output are one buffer on
//! the root; the other ranks' output is not used (NCCL: `recvbuff` matters at the root only;
//! the communicator passes their input as output, and the kernels never write it). The
//! kernels (`kernels/src/device/reduce.cu`) take the allreduce argument block (its `root`)
//! and the shared scratch. The one-shot's alternating packet halves need every rank to
//! receive from every peer; the ranks that get no data get an acknowledgement instead (see
//! the kernel file).
//!
//! | name | kernel | serves |
//! |---|---|---|
//! | `reduce_oneshot_ll` | `reduce_oneshot_ll` | small messages: the other ranks write LL16 packets into the root's mailbox and leave (up to one call ahead of the root); no barrier |
//! | `reduce_staged` | `reduce_staged` | any size, buffers nobody registered: the other ranks push into their slots of the root's staging, the root reduces locally, two barriers per round |
//! | `reduce_direct` | `reduce_direct` | registered inputs: the root reduces straight from every rank's input between two barriers |
//! | `reduce_relay` | `reduce_relay` | registered inputs, 3 or more ranks: the rank owning chunk k (one per rank but the root) reduces it from every rank's input into the root's staging, the root copies it out a round later |
//! | `reduce_copy` | `broadcast_barrier`, `reduce_local` | registered inputs, 1-2 ranks: the root's copy engine pulls the peer's input in chunks on a second stream, a local kernel reduces each chunk as it lands |

pub mod copy;
pub mod direct;
pub mod one_shot;
pub mod relay;
pub mod staged;
