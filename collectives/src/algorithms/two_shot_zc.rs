//! Zero-copy two-shot allreduce on registered buffers ([`crate::Communicator::register`]).
//!
//! One pass, no staging: per-block barrier (every peer's call started, so its input is
//! ready and its output free); rank r reduces chunk r straight from every rank's input
//! (L2-only 16-byte peer loads, every rank's [`UNITS_PER_THREAD`] units in flight per
//! thread, reduced in rank order) and stores the result into every rank's output (peer stores over NVLink);
//! per-block barrier (every peer stored its chunk into this rank's output and no longer
//! reads its input). Each input byte is read once, each output byte written once.

use oxccl_hal::{Error, LaunchConfig, Result};

use super::{max_blocks, CallShape, Plan, THREADS};
use crate::host_kernels::TWOSHOT_ZC;

/// 16-byte units each device thread loads per rank and pass (`kZcUnits` in allreduce.cu).
pub const UNITS_PER_THREAD: usize = 2;
/// Fewest 16-byte units of the chunk per block before another block is added.
const UNITS_PER_BLOCK: usize = 256;

/// The launch for a call, or why zero-copy cannot serve it (buffers not registered).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    if !s.zero_copy {
        return Err(Error::Unsupported(
            "twoshot_zc: input and output must be 16-byte aligned inside buffers registered \
             on every rank (Communicator::register)"
                .into(),
        ));
    }
    if s.host {
        return Ok(Plan {
            kernel: TWOSHOT_ZC,
            config: LaunchConfig::linear(1, 32),
        });
    }
    let units = s.bytes.div_ceil(16).max(1);
    let chunk = units.div_ceil(s.world_size.max(1) as usize);
    // Spread the chunk over many SMs (each SM's NVLink throughput is limited): one block
    // per UNITS_PER_BLOCK units up to the whole chip; threads sized so that a block's
    // share is about one pass of UNITS_PER_THREAD units per thread.
    let blocks = chunk
        .div_ceil(UNITS_PER_BLOCK)
        .clamp(1, max_blocks(s.caps) as usize);
    let share = chunk.div_ceil(blocks);
    let threads = (share.div_ceil(UNITS_PER_THREAD).next_multiple_of(32) as u32)
        .clamp(64.max(s.world_size), THREADS);
    Ok(Plan {
        kernel: TWOSHOT_ZC,
        config: LaunchConfig::linear(blocks as u32, threads),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_registration_and_fills_the_chip() {
        let caps = oxccl_hal::Capabilities {
            multiprocessors: 132,
            ..oxccl_hal::Capabilities::default()
        };
        let mut s = CallShape {
            count: 1 << 29,
            dtype: oxccl_hal::DataType::Bf16,
            bytes: 1 << 30,
            world_size: 4,
            caps: &caps,
            packet_half_bytes: 0,
            ll128_half_bytes: 0,
            nvlink: false,
            host: false,
            zero_copy: false,
        };
        assert!(plan(&s).is_err());
        s.zero_copy = true;
        let p = plan(&s).unwrap().config;
        assert_eq!((p.grid[0], p.block[0]), (132, 512));
        s.bytes = 128 << 10;
        let p = plan(&s).unwrap().config;
        assert_eq!((p.grid[0], p.block[0]), (8, 128));
        s.bytes = 2;
        let p = plan(&s).unwrap().config;
        assert_eq!((p.grid[0], p.block[0]), (1, 64));
    }
}
