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

pub mod direct;
pub mod one_shot;
pub mod staged;

use crate::host_kernels::{read_unit, Call};

/// Bytes `[off, off + 16)` of chunk `r` of the host stand-in's input (zeros past its end).
fn load_chunk(c: &Call, r: usize, off: usize) -> [u8; 16] {
    let base = c.a.input.cast::<u8>().wrapping_add(r * c.total);
    // SAFETY: launch contract of the reduce-scatter kernels: the input holds `world * total`
    // bytes, chunk r < world is [r * total, (r + 1) * total) of it.
    unsafe { read_unit(base.cast(), c.total, off) }
}
