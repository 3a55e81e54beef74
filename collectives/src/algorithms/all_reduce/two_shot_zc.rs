//! Zero-copy two-shot allreduce on registered buffers ([`crate::Communicator::register`]).
//!
//! One pass, no staging: per-block barrier (every peer's call started, so its input is
//! ready and its output free); rank r reduces chunk r straight from every rank's input
//! (L2-only 16-byte peer loads, every rank's [`UNITS_PER_THREAD`] units in flight per
//! thread, reduced in rank order) and stores the result into every rank's output (peer stores over NVLink);
//! per-block barrier (every peer stored its chunk into this rank's output and no longer
//! reads its input). Each input byte is read once, each output byte written once.

use oxccl_hal::{Error, HostKernelTable, LaunchConfig, Result};

use super::two_shot::chunk_units;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{
    max_blocks, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan, Tuning, THREADS,
};
use crate::host_kernels::{barrier, barrier_blocks, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "allreduce_twoshot_zc";

/// The zero-copy two-shot allreduce.
pub const TWOSHOT_ZC: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllReduce,
    name: "twoshot_zc",
    aliases: &["zc", "zerocopy", "zero_copy", "twoshot_zero_copy"],
    code: 5,
    serves: "medium and large messages on registered buffers (Communicator::register), \
             world size 1..=8, any size; input and output 16-byte aligned at the same \
             offset of every rank's registered buffer",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "twoshot_zc (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Registered,
    maps_peers: true,
    tuning: Some(Tuning {
        threads: &[128, 256, 512],
        work: chunk_units,
        one_block: false,
        on_registered: true,
    }),
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Packets),
});

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
            kernel: KERNEL,
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
        kernel: KERNEL,
        config: LaunchConfig::linear(blocks as u32, threads),
    })
}

/// Zero-copy two-shot: barrier; reduce my chunk straight from every rank's registered
/// input and store it into every rank's registered output; barrier.
fn host_kernel(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let blocks = barrier_blocks(config);
    let (ins, outs) = (c.peer_inputs()?, c.peer_outputs()?);
    barrier(&c, blocks)?;
    let units = c.total.div_ceil(16);
    let chunk = units.div_ceil(c.world);
    let mut inputs = vec![[0u8; 16]; c.world];
    for u in (c.me * chunk).min(units)..((c.me + 1) * chunk).min(units) {
        let off = u * 16;
        let valid = c.total.saturating_sub(off).min(16);
        for (r, input) in inputs.iter_mut().enumerate() {
            *input = [0u8; 16];
            // SAFETY: launch contract: every rank's registered input holds `total` bytes,
            // mapped at `ins[r]`; [off, off + valid) is inside. The peers' inputs are not
            // written during the call (their kernels passed the first barrier).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    ins[r].cast::<u8>().add(off),
                    input.as_mut_ptr(),
                    valid,
                )
            };
        }
        let v = c.reduce_unit(&inputs, valid)?;
        for k in 1..=c.world {
            let q = (c.me + k) % c.world;
            // SAFETY: every rank's registered output holds `total` bytes at `outs[q]`; only
            // this rank writes chunk `me` of it during the call.
            unsafe {
                std::ptr::copy_nonoverlapping(v.as_ptr(), outs[q].cast::<u8>().add(off), valid)
            };
        }
    }
    barrier(&c, blocks)?;
    c.finish();
    Ok(())
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
            collective: Collective::AllReduce,
            count: 1 << 29,
            dtype: oxccl_hal::DataType::Bf16,
            bytes: 1 << 30,
            world_size: 4,
            caps: &caps,
            packet_half_bytes: 0,
            ll128_half_bytes: 0,
            nvlink: false,
            multi_node: false,
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
