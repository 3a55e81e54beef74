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

pub mod direct;
pub mod one_shot;
pub mod staged;

use std::ffi::c_void;

use crate::host_kernels::{write_unit, Call};

/// Slot `r` of the host stand-in's output: where rank r's input goes.
fn slot(c: &Call, r: usize) -> *mut c_void {
    c.a.output.cast::<u8>().wrapping_add(r * c.total).cast()
}

/// Whether the call is in place (the input is this rank's slot of the output): the copy
/// of my own slot is skipped.
fn in_place(c: &Call) -> bool {
    c.a.input.cast::<u8>() == slot(c, c.me).cast::<u8>().cast_const()
}

/// Stores the part of `v` inside slot `r` at byte `off` of it.
fn store_slot(c: &Call, r: usize, off: usize, v: &[u8; 16]) {
    // SAFETY: launch contract of the all-gather kernels: the output holds `world * total`
    // bytes, slot r < world is [r * total, (r + 1) * total) of it, and only this call
    // writes it while it runs.
    unsafe { write_unit(slot(c, r), c.total, off, v) }
}

/// Copies this rank's input into its own slot, unless in place.
fn copy_own_slot(c: &Call) {
    if in_place(c) {
        return;
    }
    for u in 0..c.total.div_ceil(16) {
        store_slot(c, c.me, u * 16, &c.load_input(u * 16));
    }
}
