//! The all-gather algorithms: every rank's input (`count` elements) lands in slot r (at
//! byte `r * bytes`) of every rank's output, which holds `world_size * count` elements.
//! In place when the input is this rank's slot of the output (NCCL's rule). The kernels
//! (`kernels/src/device/allgather.cu`) take the allreduce argument block and the shared
//! scratch; data only moves, so they see bytes, never elements.
//!
//! | name | kernel | serves |
//! |---|---|---|
//! | `allgather_oneshot_ll` | `allgather_oneshot_ll` | small messages: LL16 packets into every peer's packet half, no barrier |
//! | `allgather_staged` | `allgather_staged` | any size, buffers nobody registered: pushed into the peers' staging, copied out locally, two barriers per round |
//! | `allgather_direct` | `allgather_direct` | registered outputs: stored straight into every peer's output between two barriers |
//! | `allgather_port` | `allgather_port` | multi-node (ranks on several nodes, or `OXCCL_SEPARATE_HOSTS=1`): every input to every peer through the PortChannel proxy (IPC, TCP, InfiniBand), copied out locally |

pub mod direct;
pub mod one_shot;
pub mod port_channel;
pub mod staged;

use crate::host_kernels::Call;

/// Copies this rank's input into its own slot of the output, unless in place (the input
/// is that slot).
fn copy_own_slot(c: &Call) {
    if c.a.input.cast::<u8>() == c.output_slot(c.me).cast::<u8>().cast_const() {
        return;
    }
    for u in 0..c.total.div_ceil(16) {
        c.store_output_slot(c.me, u * 16, &c.load_input(u * 16));
    }
}
