//! The channel kernels as host functions (host backend).
//!
//! Same names and argument blocks as `kernels/src/device/channel_kernels.cu`; each does
//! the whole grid's work on the stream's worker thread, through the `host_*` operations
//! that mirror the device headers. [`module_image`] picks this table on the host backend
//! and the kernels crate's image (which contains the device versions) elsewhere.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use oxccl_hal::{BackendKind, Error, HostKernelTable, LaunchConfig, ModuleImage, Result};
use oxccl_kernels::abi::{
    self, OxcclMemoryChannelArgs, OxcclPortChannelArgs, OxcclSwitchChannelArgs,
};

use crate::memory_channel::host_ops;
use crate::port_channel as port;

/// Kernel names (device image and host table alike).
pub const MEMORY_OP: &str = "channel_memory_op";
/// See [`MEMORY_OP`].
pub const PORT_OP: &str = "channel_port_op";
/// See [`MEMORY_OP`].
pub const SWITCH_OP: &str = "channel_switch_op";

/// The channel kernels of the host backend.
pub static TABLE: HostKernelTable = HostKernelTable {
    name: "oxccl-channels (host)",
    kernels: &[
        (MEMORY_OP, memory_op),
        (PORT_OP, port_op),
        (SWITCH_OP, switch_op),
    ],
};

/// The image holding the channel kernels for a backend.
pub fn module_image(kind: BackendKind) -> Result<ModuleImage<'static>> {
    match kind {
        BackendKind::Host => Ok(ModuleImage::Host(&TABLE)),
        other => oxccl_kernels::module_image(other),
    }
}

/// Writes a wait outcome where the block asks for it.
///
/// # Safety
/// `status`, when non-null, must be a live aligned u32.
unsafe fn report(status: *mut u32, r: &Result<()>) {
    if status.is_null() {
        return;
    }
    let code = if r.is_ok() {
        abi::OXCCL_WAIT_OK
    } else {
        abi::OXCCL_WAIT_TIMEOUT
    };
    // SAFETY: the caller's obligation.
    unsafe { AtomicU32::from_ptr(status) }.store(code, Ordering::Release);
}

/// # Safety
/// `p`, when non-null, must be a live aligned u64.
unsafe fn store_elapsed(p: *mut u64, ns: u64) {
    if !p.is_null() {
        // SAFETY: the caller's obligation.
        unsafe { AtomicU64::from_ptr(p) }.store(ns, Ordering::Release);
    }
}

/// Runs `round` `iterations` times and returns the time of all but the first, like the
/// device's ping-pong (the first round absorbs the two sides' start skew).
fn timed_rounds(iterations: u32, mut round: impl FnMut() -> Result<()>) -> Result<u64> {
    let mut start = Instant::now();
    for i in 0..iterations {
        if i == 1 {
            start = Instant::now();
        }
        round()?;
    }
    Ok(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

fn memory_op(cfg: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: OxcclMemoryChannelArgs = abi::parse_args(bytes, MEMORY_OP)?;
    let h = &a.channel;
    // The launch contract makes the handle's pointers live host-backend memory and the
    // ranges valid for the operation; the protocol keeps the sides apart. Each block below
    // relies on it.
    let outcome: Result<()> = match a.op {
        abi::OXCCL_MEMORY_OP_PUT => {
            // SAFETY: launch contract (see above).
            unsafe { host_ops::put(h, a.dst_offset, a.src_offset, a.bytes, 0, 1) };
            if a.signal_after != 0 {
                for _ in 0..cfg.grid[0] {
                    // SAFETY: launch contract.
                    unsafe { host_ops::signal(h) };
                }
            }
            return Ok(());
        }
        abi::OXCCL_MEMORY_OP_GET => {
            // SAFETY: launch contract.
            unsafe { host_ops::get(h, a.dst_offset, a.src_offset, a.bytes, 0, 1) };
            return Ok(());
        }
        abi::OXCCL_MEMORY_OP_PUT_PACKETS_LL16 => {
            // SAFETY: launch contract.
            unsafe {
                host_ops::put_packets_ll16(h, a.packet_offset, a.src_offset, a.bytes, a.flag, 0, 1)
            };
            return Ok(());
        }
        abi::OXCCL_MEMORY_OP_PUT_PACKETS_LL8 => {
            // SAFETY: launch contract.
            unsafe {
                host_ops::put_packets_ll8(h, a.packet_offset, a.src_offset, a.bytes, a.flag, 0, 1)
            };
            return Ok(());
        }
        abi::OXCCL_MEMORY_OP_GET_PACKETS_LL16 => {
            // SAFETY: launch contract.
            unsafe {
                host_ops::get_packets_ll16(h, a.packet_offset, a.dst_offset, a.bytes, a.flag, 0, 1)
            }
        }
        abi::OXCCL_MEMORY_OP_GET_PACKETS_LL8 => {
            // SAFETY: launch contract.
            unsafe {
                host_ops::get_packets_ll8(h, a.packet_offset, a.dst_offset, a.bytes, a.flag, 0, 1)
            }
        }
        abi::OXCCL_MEMORY_OP_SIGNAL => {
            for _ in 0..a.iterations {
                // SAFETY: launch contract.
                unsafe { host_ops::signal(h) };
            }
            Ok(())
        }
        abi::OXCCL_MEMORY_OP_RELAXED_SIGNAL => {
            for _ in 0..a.iterations {
                // SAFETY: launch contract.
                unsafe { host_ops::relaxed_signal(h) };
            }
            host_ops::flush();
            Ok(())
        }
        // SAFETY: launch contract.
        abi::OXCCL_MEMORY_OP_WAIT => {
            (0..a.iterations).try_for_each(|_| {
                // SAFETY: launch contract.
                unsafe { host_ops::wait(h) }
            })
        }
        abi::OXCCL_MEMORY_OP_PINGPONG => timed_rounds(a.iterations, || {
            // SAFETY: launch contract.
            unsafe {
                if a.initiator != 0 {
                    host_ops::signal(h);
                    host_ops::wait(h)
                } else {
                    host_ops::wait(h)?;
                    host_ops::signal(h);
                    Ok(())
                }
            }
        })
        .map(|ns| {
            // SAFETY: launch contract.
            unsafe { store_elapsed(a.elapsed_ns, ns) }
        }),
        other => Err(Error::InvalidArgument(format!(
            "{MEMORY_OP}: unknown op {other}"
        ))),
    };
    // SAFETY: launch contract.
    unsafe { report(a.status, &outcome) };
    outcome
}

fn port_op(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: OxcclPortChannelArgs = abi::parse_args(bytes, PORT_OP)?;
    let h = &a.channel;
    // Launch contract as for memory_op: the handle is a live host-backend channel.
    let outcome: Result<()> = match a.op {
        // SAFETY: launch contract.
        abi::OXCCL_PORT_OP_PUT => unsafe {
            port::host_put(h, a.dst_offset, a.src_offset, a.bytes, a.chunk)
        },
        // SAFETY: launch contract.
        abi::OXCCL_PORT_OP_SIGNAL => {
            (0..a.iterations).try_for_each(|_| {
                // SAFETY: launch contract.
                unsafe { port::host_signal(h) }
            })
        }
        abi::OXCCL_PORT_OP_PUT_WITH_SIGNAL => {
            // SAFETY: launch contract.
            unsafe { port::host_put_with_signal(h, a.dst_offset, a.src_offset, a.bytes, a.chunk) }
        }
        abi::OXCCL_PORT_OP_PUT_WITH_SIGNAL_AND_FLUSH => {
            // SAFETY: launch contract.
            unsafe {
                port::host_put_with_signal_and_flush(
                    h,
                    a.dst_offset,
                    a.src_offset,
                    a.bytes,
                    a.chunk,
                )
            }
        }
        // SAFETY: launch contract.
        abi::OXCCL_PORT_OP_FLUSH => unsafe { port::host_flush(h) },
        // SAFETY: launch contract.
        abi::OXCCL_PORT_OP_WAIT => {
            (0..a.iterations).try_for_each(|_| {
                // SAFETY: launch contract.
                unsafe { port::host_wait_signal(h) }
            })
        }
        abi::OXCCL_PORT_OP_PINGPONG => timed_rounds(a.iterations, || {
            // SAFETY: launch contract.
            unsafe {
                if a.initiator != 0 {
                    port::host_signal(h)?;
                    port::host_wait_signal(h)
                } else {
                    port::host_wait_signal(h)?;
                    port::host_signal(h)
                }
            }
        })
        .map(|ns| {
            // SAFETY: launch contract.
            unsafe { store_elapsed(a.elapsed_ns, ns) }
        }),
        other => Err(Error::InvalidArgument(format!(
            "{PORT_OP}: unknown op {other}"
        ))),
    };
    // SAFETY: launch contract.
    unsafe { report(a.status, &outcome) };
    outcome
}

fn switch_op(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let _: OxcclSwitchChannelArgs = abi::parse_args(bytes, SWITCH_OP)?;
    Err(Error::Unsupported(format!(
        "{SWITCH_OP}: the host backend has no multicast address; use SwitchChannel::reduce / \
         broadcast (the emulation)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_blocks_round_trip_through_launch_bytes() {
        // Their layouts against the C compiler: the kernels crate's ABI test.
        use oxccl_kernels::abi::KernelArgs;
        let a = OxcclPortChannelArgs {
            bytes: 77,
            ..Default::default()
        };
        assert_eq!(OxcclPortChannelArgs::from_bytes(a.as_bytes()), Some(a));
        assert!(OxcclPortChannelArgs::from_bytes(&[0; 8]).is_none());
    }

    #[test]
    fn the_device_source_declares_every_host_kernel() {
        let cu = include_str!("../../kernels/src/device/channel_kernels.cu");
        for n in [MEMORY_OP, PORT_OP, SWITCH_OP] {
            assert!(
                cu.contains(&format!(" void {n}(")),
                "{n} missing in channel_kernels.cu"
            );
            assert!(TABLE.kernels.iter().any(|(k, _)| *k == n), "{n}");
        }
    }
}
