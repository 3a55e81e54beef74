//! One-shot LL16 reduce: the latency path, no barrier, and no sender waits for the root.
//! Every other rank writes its input as LL16 packets into its slot of the root's mailbox
//! (a packet region of its own, `FlagRegion::Mailbox`) and is done; the root reduces its
//! input and every peer's packets in rank order. A sender of mailbox call s waits only
//! until the root has started call s - 1 (MAILBOX_SEEN in abi_allreduce.h), so
//! back-to-back reduces pipeline: the packets are there when the root starts.

use oxccl_hal::{HostKernelTable, LaunchConfig, Result};

use crate::algorithms::all_reduce::one_shot::ll16_plan_one_block;
use crate::algorithms::scratch_kernel::ScratchKernel;
use crate::algorithms::{Algorithm, Buffers, CallShape, Collective, Descriptor, Plan};
use crate::host_kernels::{ll16_read_unit, ll16_write_unit, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "reduce_oneshot_ll";

/// The one-shot LL16 reduce.
pub const REDUCE_ONESHOT_LL: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::Reduce,
    name: "reduce_oneshot_ll",
    aliases: &["reduce_oneshot"],
    code: 503,
    serves: "small reduces, any world size 1..=8; needs world_size * 2 * bytes of mailbox \
             scratch",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "reduce_oneshot_ll (host)",
        kernels: &[(KERNEL, host_kernel)],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: None,
    setup: |ctx, me| ScratchKernel::setup(ctx, me, FlagRegion::Mailbox),
});

/// Units (16 bytes each) that one block takes whole, one per thread: a single block ends
/// the call without the count across blocks that a grid of several pays (2 H200s: 1 KB in
/// 1 x 64 took 3.04 us, 2 KB in 2 x 64 3.29 us).
const ONE_BLOCK_UNITS: usize = 256;

/// The launch for a call, or why one-shot cannot serve it (packet capacity).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    ll16_plan_one_block("reduce_oneshot_ll", KERNEL, s, ONE_BLOCK_UNITS)
}

/// The kernel on the host backend: the device kernel's steps on one thread.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let c = Call::new(bytes, KERNEL)?;
    let root = c.root()?;
    let units = c.total.div_ceil(16).max(1);
    let slot = units * 32;
    let (seq, flag, half) = c.mailbox_half(slot)?;
    c.publish_mailbox_start(seq);
    if c.me != root {
        c.wait_mailbox_free(root, seq)?;
        for u in 0..units {
            let v = c.load_input(u * 16);
            // SAFETY: packets 2u, 2u+1 of slot `me` of the root's current mailbox half,
            // which fits (checked above).
            unsafe { ll16_write_unit(&c, root, half + c.me * slot + u * 32, &v, flag) };
        }
    } else {
        let mut inputs = vec![[0u8; 16]; c.world];
        for u in 0..units {
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = if r == c.me {
                    c.load_input(u * 16)
                } else {
                    // SAFETY: slot r of this rank's own current mailbox half.
                    unsafe { ll16_read_unit(&c, half + r * slot + u * 32, r, flag)? }
                };
            }
            let valid = c.total.saturating_sub(u * 16).min(16);
            c.store_output(u * 16, &c.reduce_unit(&inputs, valid)?);
        }
    }
    c.finish_mailbox();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_hal::{BackendKind, Capabilities, DataType};

    #[test]
    fn one_block_while_it_takes_every_unit() {
        let caps = Capabilities {
            backend: Some(BackendKind::Cuda),
            multiprocessors: 132,
            ..Capabilities::default()
        };
        let shape = |bytes: usize| CallShape {
            collective: Collective::Reduce,
            count: bytes / 2,
            dtype: DataType::Bf16,
            bytes,
            world_size: 2,
            caps: &caps,
            packet_half_bytes: 8 << 20,
            ll128_half_bytes: 0,
            nvlink: true,
            multi_node: false,
            host: false,
            zero_copy: false,
        };
        let grid = |bytes| {
            let p = plan(&shape(bytes)).unwrap();
            (p.config.grid[0], p.config.block[0])
        };
        assert_eq!(grid(2), (1, 64));
        assert_eq!(grid(2 << 10), (1, 128));
        assert_eq!(grid(4 << 10), (1, 256));
        // Past one block's share: the LL16 one-shots' grid of 64-thread blocks.
        assert_eq!(grid((4 << 10) + 16), (5, 64));
        // Packets beyond the half: refused, whatever the grid.
        assert!(plan(&CallShape {
            packet_half_bytes: 1 << 10,
            ..shape(2 << 10)
        })
        .is_err());
    }
}
