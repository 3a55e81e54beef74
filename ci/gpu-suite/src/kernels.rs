//! The suite's view of the kernels crate: the code image, the test kernels' argument
//! blocks, and the host pattern.
//!
//! The argument blocks follow `kernels/include/oxccl/abi.h` (every field 8 bytes or
//! explicitly padded, so the byte image is fully defined); their sizes are the header's
//! static assertions.

use oxccl_hal::DevicePtr;

/// Kernel names in the CUDA image.
pub const SIGNAL: &str = "oxccl_test_signal";
/// See [`SIGNAL`].
pub const WAIT: &str = "oxccl_test_wait";
/// See [`SIGNAL`].
pub const STORE16: &str = "oxccl_test_store16";
/// See [`SIGNAL`].
pub const FILL_PATTERN: &str = "oxccl_test_fill_pattern";
/// See [`SIGNAL`].
pub const CHECK_PATTERN: &str = "oxccl_test_check_pattern";

/// `OXCCL_WAIT_OK` / `OXCCL_WAIT_TIMEOUT` from abi.h.
pub const WAIT_OK: u32 = 1;
/// See [`WAIT_OK`].
pub const WAIT_TIMEOUT: u32 = 2;

/// The host value of the test pattern.
pub fn pattern(seed: u32, index: u64) -> u32 {
    oxccl_kernels::pattern::value(seed, index)
}

fn words(ws: &[u64]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `OxcclSignalArgs { flag, value }` (16 bytes).
pub fn signal_args(flag: DevicePtr, value: u64) -> Vec<u8> {
    words(&[flag.0, value])
}

/// `OxcclWaitArgs { flag, expected, max_spins, result }` (32 bytes).
pub fn wait_args(flag: DevicePtr, expected: u64, max_spins: u64, result: DevicePtr) -> Vec<u8> {
    words(&[flag.0, expected, max_spins, result.0])
}

/// `OxcclCopyArgs { dst, src, bytes }` (24 bytes).
pub fn copy_args(dst: DevicePtr, src: DevicePtr, bytes: u64) -> Vec<u8> {
    words(&[dst.0, src.0, bytes])
}

/// `OxcclPatternArgs { data, count, seed, _pad0, mismatches }` (32 bytes).
pub fn pattern_args(data: DevicePtr, count: u64, seed: u32, mismatches: DevicePtr) -> Vec<u8> {
    words(&[data.0, count, u64::from(seed), mismatches.0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_blocks_have_the_header_sizes() {
        let p = DevicePtr(0x1000);
        assert_eq!(signal_args(p, 1).len(), 16);
        assert_eq!(wait_args(p, 1, 2, p).len(), 32);
        assert_eq!(copy_args(p, p, 3).len(), 24);
        let b = pattern_args(p, 5, 0xdead_beef, DevicePtr(0x2000));
        assert_eq!(b.len(), 32);
        assert_eq!(&b[16..20], &0xdead_beefu32.to_le_bytes());
        assert_eq!(&b[20..24], &[0; 4], "explicit padding is zero");
    }
}
