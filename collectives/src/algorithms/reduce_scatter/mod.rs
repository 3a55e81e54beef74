//! The reduce-scatter algorithms: rank r's output (`count` elements) is the reduction, in
//! rank order, of chunk r (elements `[r * count, (r + 1) * count)`) of every rank's input,
//! which holds `world_size * count` elements. In place when the output is this rank's chunk
//! of the input (NCCL's rule). The kernels (`kernels/src/device/reducescatter.cu`) take the
//! allreduce argument block (`count` is the output's), the shared scratch and the allreduce
//! reducers.
//!
//! | name | kernel | serves |
//! |---|---|---|
//! | `reducescatter_oneshot_ll` | `reducescatter_oneshot_ll` | small messages: every peer's chunk as LL16 packets into its owner's packet half, no barrier |
//! | `reducescatter_staged` | `reducescatter_staged` | any size, buffers nobody registered: chunks pushed into their owners' staging, reduced locally, two barriers per round |
//! | `reducescatter_direct` | `reducescatter_direct` | registered inputs: the chunk read from every peer's input between two barriers |
//! | `reducescatter_port` | `reducescatter_port` | multi-node (ranks on several nodes, or `OXCCL_SEPARATE_HOSTS=1`): chunk p to rank p through the PortChannel proxy (IPC, TCP, InfiniBand), reduced locally |

pub mod direct;
pub mod one_shot;
pub mod port_channel;
pub mod staged;
