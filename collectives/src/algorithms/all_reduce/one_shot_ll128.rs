//! One-shot LL128 allreduce: the one-shot with 128-byte lines instead of 16-byte packets.
//!
//! Each line carries seven 16-byte units of the message and, in its last 16 bytes, the
//! call's flag; 8 lanes of a warp store a line in one instruction and read it in one, so
//! a line whose flag matches holds that call's data (NVLink delivers a warp's stores to an
//! aligned 128-byte line as one write: the property NCCL's LL128 protocol relies on).
//! 112 of 128 bytes are data, against 64 of 128 for LL16, so it moves 1.75x less over
//! NVLink per call for the same latency structure (no barrier; flags derived from the
//! epoch, two halves alternating by epoch parity). Its lines live in their own scratch
//! region, so LL16 readers never meet user data where they expect flags.
//!
//! CUDA (and the host stand-in) only: on ROCm the line atomicity is not established, so
//! the plan refuses it there.

use std::sync::atomic::Ordering;

use oxccl_hal::{BackendKind, DataType, Error, HostKernelTable, LaunchConfig, ReduceOp, Result};
use oxccl_kernels::reduce::Accumulator;

use super::one_shot::{check_capacity, spread};
use crate::algorithms::scratch_kernel::{ScratchKernel, TypedKernel};
use crate::algorithms::{
    max_blocks, Algorithm, Buffers, CallShape, Collective, Descriptor, Plan, Tuning,
};
use crate::host_kernels::{backoff, packet, unwords, words, Call};
use crate::scratch::FlagRegion;

/// Kernel symbol (device image and host stand-in).
const KERNEL: &str = "allreduce_oneshot_ll128";

/// The sums PyTorch issues most, each with a kernel of its own: the generic kernel's
/// dispatch over 18 reducers cost 0.24-0.27 us per call at 1-64 KB on 2 H200s
/// (`ci/gpu/probe/latency_probe.cu`, "real" against "typed"). Each takes the call's default
/// accumulator (bf16 in bf16, f16 in f16, f32 in f32); the host stand-in serves every name.
const TYPED: [TypedKernel; 3] = [
    TypedKernel {
        kernel: "allreduce_oneshot_ll128_bf16_sum",
        dtype: DataType::Bf16,
        op: ReduceOp::Sum,
        accumulator: Accumulator::Element(DataType::Bf16),
    },
    TypedKernel {
        kernel: "allreduce_oneshot_ll128_f16_sum",
        dtype: DataType::F16,
        op: ReduceOp::Sum,
        accumulator: Accumulator::F16,
    },
    TypedKernel {
        kernel: "allreduce_oneshot_ll128_f32_sum",
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        accumulator: Accumulator::F32,
    },
];

/// The one-shot LL128 allreduce.
pub const ONESHOT_LL128: Algorithm = Algorithm::new(&Descriptor {
    collective: Collective::AllReduce,
    name: "oneshot_ll128",
    aliases: &["ll128", "one_shot_ll128"],
    code: 7,
    serves: "small and medium messages (up to the one-shot capacity), any world size \
             1..=8, CUDA only; needs world_size * 128/112 * bytes of line scratch",
    kernel: KERNEL,
    host: HostKernelTable {
        name: "oneshot_ll128 (host)",
        kernels: &[
            (KERNEL, host_kernel),
            (TYPED[0].kernel, typed_host_kernel::<0>),
            (TYPED[1].kernel, typed_host_kernel::<1>),
            (TYPED[2].kernel, typed_host_kernel::<2>),
        ],
    },
    plan,
    buffers: Buffers::Own,
    maps_peers: true,
    tuning: Some(Tuning {
        threads: &[64, 128, 256, 512],
        work: lanes,
        one_block: true,
        on_registered: true,
    }),
    setup: |ctx, me| ScratchKernel::setup_typed(ctx, me, FlagRegion::Lines, &TYPED),
});

/// Data units (16 bytes) per 128-byte line.
pub const UNITS_PER_LINE: usize = 7;

/// Line bytes one rank's input of `bytes` takes in each peer.
pub fn slot_bytes(bytes: usize) -> usize {
    bytes.div_ceil(16).div_ceil(UNITS_PER_LINE) * 128
}

/// Lanes a call's lines take: 8 per line of seven units (a line is one warp store of 8
/// lanes).
fn lanes(s: &CallShape<'_>) -> usize {
    s.bytes.div_ceil(16).div_ceil(UNITS_PER_LINE).max(1) * 8
}

/// The launch for a call, or why LL128 cannot serve it (backend, line capacity).
pub fn plan(s: &CallShape<'_>) -> Result<Plan> {
    if s.caps.backend == Some(BackendKind::Rocm) {
        return Err(Error::Unsupported(
            "oneshot_ll128: needs NVLink's 128-byte store atomicity; not used on ROCm".into(),
        ));
    }
    if !s.host && !s.nvlink {
        return Err(Error::Unsupported(
            "oneshot_ll128: needs NVLink between every pair of ranks (whole 128-byte lines); \
             some rank reaches a peer over PCIe or does not see its peers' devices"
                .into(),
        ));
    }
    check_capacity(
        "oneshot_ll128",
        "line",
        slot_bytes(s.bytes),
        s.ll128_half_bytes,
        s,
    )?;
    // One block while the lines fit 160 threads (no count across blocks at the end; 2
    // H200s, tuned: 1 KB 1 x 96 at 2.86 us, 2 KB 1 x 160 at 2.92 us against 2.96-2.98 for
    // 3 x 64; 4 KB 5 x 64 at 3.04 us). Then as the LL16 one-shot: 64-thread blocks (8
    // lines each) up to the chip, then wider, one line per 8 lanes while that needs at
    // most 320 threads per block; beyond, 256-thread blocks (about 2.25 lines per 8 lanes
    // at 1 MB: 132 x 256 at 7.7 us, tuned 128 x 512 at 7.9; 2 MB 132 x 256 at 12.9 us,
    // tuned 132 x 512 at 12.5).
    let lanes = lanes(s);
    let max = max_blocks(s.caps) as usize;
    let per_block = if lanes <= 160 {
        lanes
    } else {
        lanes.div_ceil(max)
    };
    let per_block = if per_block > 320 {
        (lanes * 4).div_ceil(max * 9).min(256)
    } else {
        per_block
    };
    Ok(spread(KERNEL, lanes, per_block, s))
}

/// Typed kernel `I` of [`TYPED`]: the generic stand-in for the calls that kernel takes; any
/// other call is refused, as the device kernel refuses it.
fn typed_host_kernel<const I: usize>(config: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let typed = &TYPED[I];
    let (dtype, op, accum) = Call::new(bytes, typed.kernel)?.types();
    if !typed.matches(dtype, op, accum) {
        return Err(Error::InvalidArgument(format!(
            "{}: launched for a {dtype} {op} call with the {accum} accumulation",
            typed.kernel
        )));
    }
    host_kernel(config, bytes)
}

/// One-shot LL128: lines of seven 16-byte units and a 16-byte flag. On the device a warp
/// stores and loads a line in one instruction; here the flag words are stored after the
/// data (release) and loaded before it (acquire), which gives the same guarantee.
fn host_kernel(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    const UNITS: usize = UNITS_PER_LINE;
    let c = Call::new(bytes, KERNEL)?;
    let units = c.total.div_ceil(16);
    let lines = units.div_ceil(UNITS);
    let slot = lines * 128;
    let (flag, half) = c.flagged_half(slot)?;
    for line in 0..lines {
        for k in 1..c.world {
            let p = (c.me + k) % c.world;
            let off = half + c.me * slot + line * 128;
            for t in 0..UNITS {
                let w = words(&c.load_input((line * UNITS + t) * 16));
                // SAFETY: `off + 16 t` addresses 16 bytes of line `line` in slot `me` of the
                // current half of peer p's line region, which fits (checked above).
                let d = unsafe { packet(c.scratch(p), off + t * 16) };
                for (word, x) in d.iter().zip(w) {
                    word.store(x, Ordering::Relaxed);
                }
            }
            // SAFETY: the line's flag words, as above.
            let f = unsafe { packet(c.scratch(p), off + UNITS * 16) };
            for word in f {
                word.store(flag, Ordering::Release);
            }
        }
    }
    let mut inputs = vec![[0u8; 16]; c.world];
    for line in 0..lines {
        let mut lanes = vec![[[0u8; 16]; UNITS]; c.world];
        for (r, lane) in lanes.iter_mut().enumerate().filter(|(r, _)| *r != c.me) {
            let off = half + r * slot + line * 128;
            // SAFETY: line `line` of slot r in this rank's own line region.
            let f = unsafe { packet(c.scratch(c.me), off + UNITS * 16) };
            let mut polls = 0u32;
            while !f.iter().all(|w| w.load(Ordering::Acquire) == flag) {
                if c.expired() {
                    return Err(c.fail(r, "one-shot LL128 lines"));
                }
                backoff(&mut polls);
            }
            for (t, unit) in lane.iter_mut().enumerate() {
                // SAFETY: as above; written before the flag this thread acquired.
                let d = unsafe { packet(c.scratch(c.me), off + t * 16) };
                *unit = unwords([0, 1, 2, 3].map(|i| d[i].load(Ordering::Relaxed)));
            }
        }
        for (t, u) in (line * UNITS..units.min((line + 1) * UNITS)).enumerate() {
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = if r == c.me {
                    c.load_input(u * 16)
                } else {
                    lanes[r][t]
                };
            }
            let valid = c.total.saturating_sub(u * 16).min(16);
            c.store_output(u * 16, &c.reduce_unit(&inputs, valid)?);
        }
    }
    c.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxccl_hal::{Capabilities, DataType};

    #[test]
    fn lines_and_capacity() {
        assert_eq!(slot_bytes(1), 128);
        assert_eq!(slot_bytes(112), 128);
        assert_eq!(slot_bytes(113), 256);
        let caps = Capabilities {
            backend: Some(BackendKind::Cuda),
            multiprocessors: 132,
            ..Capabilities::default()
        };
        let mut s = CallShape {
            collective: Collective::AllReduce,
            count: 1 << 19,
            dtype: DataType::Bf16,
            bytes: 1 << 20,
            world_size: 4,
            caps: &caps,
            packet_half_bytes: 8 << 20,
            ll128_half_bytes: 4 * slot_bytes(1 << 20),
            nvlink: true,
            multi_node: false,
            host: false,
            zero_copy: false,
        };
        let p = plan(&s).unwrap();
        assert_eq!((p.config.grid[0], p.config.block[0]), (132, 256));
        s.bytes = 512 << 10;
        let p = plan(&s).unwrap();
        assert_eq!((p.config.grid[0], p.config.block[0]), (131, 288));
        s.bytes = 2 << 20;
        s.ll128_half_bytes = 4 * slot_bytes(2 << 20);
        let p = plan(&s).unwrap();
        assert_eq!((p.config.grid[0], p.config.block[0]), (132, 256));
        s.bytes = 1 << 20;
        s.ll128_half_bytes = 4 * slot_bytes(1 << 20);
        s.bytes = 1024; // 64 units: 10 lines, 80 lanes: one block
        let small = plan(&s).unwrap();
        assert_eq!((small.config.grid[0], small.config.block[0]), (1, 96));
        s.bytes = 2048; // 19 lines, 152 lanes: one block
        let p = plan(&s).unwrap();
        assert_eq!((p.config.grid[0], p.config.block[0]), (1, 160));
        s.bytes = 4096; // 37 lines, 296 lanes: 64-thread blocks
        let p = plan(&s).unwrap();
        assert_eq!((p.config.grid[0], p.config.block[0]), (5, 64));
        s.bytes = 1 << 20;
        s.bytes += 16 * UNITS_PER_LINE;
        assert!(plan(&s).unwrap_err().to_string().contains("line scratch"));
        let rocm = Capabilities {
            backend: Some(BackendKind::Rocm),
            ..caps.clone()
        };
        s.caps = &rocm;
        s.bytes = 1024;
        assert!(plan(&s).unwrap_err().to_string().contains("ROCm"));
        s.caps = &caps;
        s.nvlink = false;
        assert!(plan(&s)
            .unwrap_err()
            .to_string()
            .contains("NVLink between every pair"));
    }

    /// Each typed kernel exists on the device and in the host table, and takes exactly the
    /// calls whose reducer it was built with: its type's sum with the default accumulator
    /// (the device kernel refuses the rest, so a wider match would fail calls).
    #[test]
    fn typed_kernels_take_their_default_sums_only() {
        use oxccl_hal::AccumType;
        let host: Vec<&str> = ONESHOT_LL128
            .descriptor()
            .host
            .kernels
            .iter()
            .map(|(name, _)| *name)
            .collect();
        for t in &TYPED {
            assert!(
                oxccl_kernels::images::KERNEL_NAMES.contains(&t.kernel),
                "{} is not a device kernel",
                t.kernel
            );
            assert!(
                host.contains(&t.kernel),
                "{} has no host stand-in",
                t.kernel
            );
            // The accumulation type that names the kernel's accumulator outright (bf16's
            // own type has no name but Native).
            let named = match t.dtype {
                DataType::F16 => AccumType::F16,
                DataType::F32 => AccumType::F32,
                _ => AccumType::Native,
            };
            for dtype in DataType::ALL {
                for op in ReduceOp::ALL {
                    for accum in AccumType::ALL {
                        let takes = t.matches(dtype, op, accum);
                        let default = dtype == t.dtype
                            && op == ReduceOp::Sum
                            && (matches!(accum, AccumType::Auto | AccumType::Native)
                                || accum == named);
                        assert_eq!(takes, default, "{} for {dtype} {op} {accum}", t.kernel);
                    }
                }
            }
        }
    }
}
