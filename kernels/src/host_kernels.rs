//! The kernels as host functions, for the host backend: the same names and argument
//! blocks as the device code, doing the whole grid's work on the calling thread.
//!
//! Device pointers in the argument blocks are host addresses on the host backend.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use oxccl_hal::{AccumType, DataType, Error, HostKernelTable, LaunchConfig, ReduceOp, Result};

use crate::abi;
use crate::{formats, pattern, reduce};

/// Every kernel of the device images, as host functions.
pub static TABLE: HostKernelTable = HostKernelTable {
    name: "oxccl-kernels (host)",
    kernels: &[
        ("oxccl_copy", copy),
        ("oxccl_scale", scale),
        ("oxccl_selftest_decode", selftest_decode),
        ("oxccl_selftest_encode", selftest_encode),
        ("oxccl_selftest_reduce_own_type", selftest_reduce_own_type),
        ("oxccl_selftest_reduce_f32", selftest_reduce_f32),
        ("oxccl_selftest_reduce_f16", selftest_reduce_f16),
        ("oxccl_selftest_reduce_bf16", selftest_reduce_bf16),
        ("oxccl_selftest_reduce_fp8_e4m3", selftest_reduce_fp8_e4m3),
        ("oxccl_selftest_reduce_fp8_e5m2", selftest_reduce_fp8_e5m2),
        (
            "oxccl_selftest_reduce_fp8_e4m3_fnuz",
            selftest_reduce_fp8_e4m3_fnuz,
        ),
        (
            "oxccl_selftest_reduce_fp8_e5m2_fnuz",
            selftest_reduce_fp8_e5m2_fnuz,
        ),
        (
            "oxccl_selftest_reduce_fp8_e4m3b15",
            selftest_reduce_fp8_e4m3b15,
        ),
        ("oxccl_test_check_pattern", test_check_pattern),
        ("oxccl_test_fill_pattern", test_fill_pattern),
        ("oxccl_test_signal", test_signal),
        ("oxccl_test_store16", test_store16),
        ("oxccl_test_wait", test_wait),
    ],
};

fn non_null<T>(p: *const T, kernel: &str, field: &str) -> Result<()> {
    if p.is_null() {
        Err(Error::InvalidArgument(format!("{kernel}: {field} is null")))
    } else {
        Ok(())
    }
}

fn to_usize(n: u64, kernel: &str) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::InvalidArgument(format!("{kernel}: count {n} too large")))
}

fn test_signal(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: abi::OxcclSignalArgs = abi::parse_args(bytes, "oxccl_test_signal")?;
    non_null(a.flag, "oxccl_test_signal", "flag")?;
    // SAFETY: the launch contract (Stream::launch) makes `flag` a live, 8-byte aligned u64
    // for the kernel's duration; it may be shared with other threads, hence atomic access.
    let flag = unsafe { AtomicU64::from_ptr(a.flag) };
    flag.fetch_add(a.value, Ordering::Release);
    Ok(())
}

fn test_wait(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: abi::OxcclWaitArgs = abi::parse_args(bytes, "oxccl_test_wait")?;
    non_null(a.flag, "oxccl_test_wait", "flag")?;
    non_null(a.result, "oxccl_test_wait", "result")?;
    // SAFETY: launch contract: `flag` is a live aligned u64 for the kernel's duration.
    let flag = unsafe { AtomicU64::from_ptr(a.flag) };
    let mut spins = 0u64;
    let code = loop {
        if flag.load(Ordering::Acquire) >= a.expected {
            break abi::OXCCL_WAIT_OK;
        }
        spins += 1;
        if a.max_spins != 0 && spins >= a.max_spins {
            break abi::OXCCL_WAIT_TIMEOUT;
        }
        std::hint::spin_loop();
    };
    // SAFETY: launch contract: `result` is a live aligned u32.
    let result = unsafe { AtomicU32::from_ptr(a.result) };
    result.store(code as u32, Ordering::Release);
    Ok(())
}

fn test_store16(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    copy_bytes(bytes, "oxccl_test_store16")
}

fn copy(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    copy_bytes(bytes, "oxccl_copy")
}

/// The host form of the copy kernels (`oxccl_copy`, `oxccl_test_store16`): `bytes` bytes
/// from src to dst.
fn copy_bytes(bytes: &[u8], kernel: &str) -> Result<()> {
    let a: abi::OxcclCopyArgs = abi::parse_args(bytes, kernel)?;
    let n = to_usize(a.bytes, kernel)?;
    if n == 0 {
        return Ok(());
    }
    non_null(a.dst, kernel, "dst")?;
    non_null(a.src, kernel, "src")?;
    // SAFETY: launch contract: src and dst are live for `bytes` bytes; the device kernels
    // have a no-overlap requirement (copy semantics, not move), which `ptr::copy` does not
    // even need.
    unsafe { std::ptr::copy(a.src.cast::<u8>(), a.dst.cast::<u8>(), n) };
    Ok(())
}

fn pattern_slice<'a>(a: &abi::OxcclPatternArgs, kernel: &str) -> Result<&'a mut [u32]> {
    let n = to_usize(a.count, kernel)?;
    if n == 0 {
        return Ok(&mut []);
    }
    non_null(a.data, kernel, "data")?;
    // SAFETY: launch contract: `data` points to `count` live, aligned u32 that nothing else
    // accesses while the kernel runs.
    Ok(unsafe { std::slice::from_raw_parts_mut(a.data, n) })
}

fn test_fill_pattern(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: abi::OxcclPatternArgs = abi::parse_args(bytes, "oxccl_test_fill_pattern")?;
    pattern::fill(pattern_slice(&a, "oxccl_test_fill_pattern")?, a.seed);
    Ok(())
}

fn test_check_pattern(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: abi::OxcclPatternArgs = abi::parse_args(bytes, "oxccl_test_check_pattern")?;
    non_null(a.mismatches, "oxccl_test_check_pattern", "mismatches")?;
    let bad = pattern::mismatches(pattern_slice(&a, "oxccl_test_check_pattern")?, a.seed);
    // SAFETY: launch contract: `mismatches` is a live aligned u64.
    let counter = unsafe { AtomicU64::from_ptr(a.mismatches) };
    counter.fetch_add(bad, Ordering::Relaxed);
    Ok(())
}

/// Bytes at a device (here: host) address.
///
/// # Safety
/// `p` must be valid for reads of `len` bytes for `'a` (the kernel's duration).
unsafe fn bytes_at<'a>(p: *const std::ffi::c_void, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller's obligation.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

/// Mutable bytes at a device (here: host) address.
///
/// # Safety
/// `p` must be valid for writes of `len` bytes for `'a`, accessed by nothing else.
unsafe fn bytes_at_mut<'a>(p: *mut std::ffi::c_void, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: the caller's obligation.
    unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) }
}

fn scale(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: abi::OxcclScaleArgs = abi::parse_args(bytes, "oxccl_scale")?;
    let dtype = DataType::from_code(a.dtype)?;
    let n = to_usize(a.count, "oxccl_scale")?;
    if n == 0 {
        return Ok(());
    }
    non_null(a.input, "oxccl_scale", "input")?;
    non_null(a.output, "oxccl_scale", "output")?;
    let len = dtype.bytes(n)?;
    let scalar = if a.scalar.is_null() {
        a.scalar_bits
    } else {
        // SAFETY: launch contract: a non-null `scalar` points at one element of dtype,
        // read when the kernel runs.
        let bits = unsafe { bytes_at(a.scalar, dtype.size()) };
        formats::read_element(dtype, bits, 0).unwrap_or_default()
    };
    // In place is allowed (every element is read before it is written), so the input is
    // copied rather than borrowed beside the output.
    // SAFETY: launch contract: input holds `count` elements of dtype.
    let input = unsafe { bytes_at(a.input, len) }.to_vec();
    // SAFETY: launch contract: output holds `count` elements, accessed by nothing else
    // while the kernel runs.
    let output = unsafe { bytes_at_mut(a.output, len) };
    reduce::pre_multiply(dtype, scalar, &input, output, n)
}

fn selftest_decode(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: abi::OxcclSelftestDecodeArgs = abi::parse_args(bytes, "oxccl_selftest_decode")?;
    let dtype = DataType::from_code(a.dtype)?;
    let n = to_usize(a.count, "oxccl_selftest_decode")?;
    non_null(a.input, "oxccl_selftest_decode", "input")?;
    non_null(a.output, "oxccl_selftest_decode", "output")?;
    // SAFETY: launch contract: input holds `count` elements of dtype, output `count` f32.
    let (input, output) = unsafe {
        (
            bytes_at(a.input, dtype.bytes(n)?),
            bytes_at_mut(a.output.cast(), n * 4),
        )
    };
    for i in 0..n {
        let bits = formats::read_element(dtype, input, i).unwrap_or_default();
        let v = formats::decode(dtype, bits);
        formats::write_element(DataType::F32, output, i, u64::from(v.to_bits()));
    }
    Ok(())
}

fn selftest_encode(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a: abi::OxcclSelftestEncodeArgs = abi::parse_args(bytes, "oxccl_selftest_encode")?;
    let dtype = DataType::from_code(a.dtype)?;
    let n = to_usize(a.count, "oxccl_selftest_encode")?;
    non_null(a.input, "oxccl_selftest_encode", "input")?;
    non_null(a.output, "oxccl_selftest_encode", "output")?;
    // SAFETY: launch contract: input holds `count` f32, output `count` elements of dtype.
    let (input, output) = unsafe {
        (
            bytes_at(a.input.cast(), n * 4),
            bytes_at_mut(a.output, dtype.bytes(n)?),
        )
    };
    for i in 0..n {
        let x = f32::from_bits(
            formats::read_element(DataType::F32, input, i).unwrap_or_default() as u32,
        );
        formats::write_element(dtype, output, i, formats::encode(dtype, x));
    }
    Ok(())
}

/// The reduce self-test kernels (one per element format, one for the types reduced in their
/// own type; `selftest::reduce_kernel`), each refusing a block of another type.
macro_rules! selftest_reduce_kernels {
    ($($f:ident: $name:literal),* $(,)?) => {$(
        fn $f(_: &LaunchConfig, bytes: &[u8]) -> Result<()> {
            selftest_reduce($name, bytes)
        }
    )*};
}

selftest_reduce_kernels! {
    selftest_reduce_own_type: "oxccl_selftest_reduce_own_type",
    selftest_reduce_f32: "oxccl_selftest_reduce_f32",
    selftest_reduce_f16: "oxccl_selftest_reduce_f16",
    selftest_reduce_bf16: "oxccl_selftest_reduce_bf16",
    selftest_reduce_fp8_e4m3: "oxccl_selftest_reduce_fp8_e4m3",
    selftest_reduce_fp8_e5m2: "oxccl_selftest_reduce_fp8_e5m2",
    selftest_reduce_fp8_e4m3_fnuz: "oxccl_selftest_reduce_fp8_e4m3_fnuz",
    selftest_reduce_fp8_e5m2_fnuz: "oxccl_selftest_reduce_fp8_e5m2_fnuz",
    selftest_reduce_fp8_e4m3b15: "oxccl_selftest_reduce_fp8_e4m3b15",
}

fn selftest_reduce(kernel: &'static str, bytes: &[u8]) -> Result<()> {
    let a: abi::OxcclSelftestReduceArgs = abi::parse_args(bytes, kernel)?;
    let dtype = DataType::from_code(a.dtype)?;
    if crate::selftest::reduce_kernel(dtype) != kernel {
        return Err(Error::InvalidArgument(format!(
            "{kernel}: not the reduce kernel of {dtype}"
        )));
    }
    let op = ReduceOp::from_code(a.op)?;
    let accum = AccumType::from_code(a.accum)?;
    let k = a.num_inputs as usize;
    if k == 0 || k > a.inputs.len() {
        return Err(Error::InvalidArgument(format!("{kernel}: {k} inputs")));
    }
    let n = to_usize(a.count, kernel)?;
    let len = dtype.bytes(n)?;
    non_null(a.output, kernel, "output")?;
    let mut inputs = Vec::with_capacity(k);
    for (i, &p) in a.inputs.iter().take(k).enumerate() {
        non_null(p, kernel, &format!("inputs[{i}]"))?;
        // SAFETY: launch contract: each input holds `count` elements of dtype.
        inputs.push(unsafe { bytes_at(p, len) });
    }
    // SAFETY: launch contract: output holds `count` elements and overlaps no input.
    let output = unsafe { bytes_at_mut(a.output, len) };
    reduce::reduce(dtype, op, accum, &inputs, output, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::KernelArgs;
    use crate::images::KERNEL_NAMES;

    #[test]
    fn host_table_has_every_test_kernel_of_the_images() {
        // The images also hold kernels whose host versions live in other crates (channels,
        // collectives); the test, self-test, scale and copy kernels are this table's.
        let host: Vec<&str> = TABLE.kernels.iter().map(|(n, _)| *n).collect();
        for name in &host {
            assert!(KERNEL_NAMES.contains(name), "{name} is not a device kernel");
        }
        for name in KERNEL_NAMES {
            if name.starts_with("oxccl_test_")
                || name.starts_with("oxccl_selftest_")
                || *name == "oxccl_scale"
                || *name == "oxccl_copy"
            {
                assert!(host.contains(name), "{name} has no host version");
            }
        }
        assert_eq!(host.len(), 18);
    }

    #[test]
    fn every_type_has_a_reduce_kernel_that_refuses_other_types() {
        let cfg = LaunchConfig::linear(1, 1);
        let mut out = [0u8; 8];
        let input = [0u8; 8];
        for dtype in DataType::ALL {
            let kernel = crate::selftest::reduce_kernel(dtype);
            let (_, f) = TABLE
                .kernels
                .iter()
                .find(|(n, _)| *n == kernel)
                .unwrap_or_else(|| panic!("{kernel} ({dtype}) is not in the host table"));
            let mut inputs =
                [std::ptr::null::<std::ffi::c_void>(); abi::OXCCL_SELFTEST_MAX_INPUTS as usize];
            inputs[0] = input.as_ptr().cast();
            let args = abi::OxcclSelftestReduceArgs {
                inputs,
                output: out.as_mut_ptr().cast(),
                count: 1,
                num_inputs: 1,
                dtype: dtype.code(),
                op: ReduceOp::Sum.code(),
                accum: AccumType::Auto.code(),
            };
            f(&cfg, args.as_bytes()).unwrap();
            for other in DataType::ALL {
                if crate::selftest::reduce_kernel(other) != kernel {
                    let args = abi::OxcclSelftestReduceArgs {
                        dtype: other.code(),
                        ..args
                    };
                    assert!(f(&cfg, args.as_bytes()).is_err(), "{kernel} took {other}");
                }
            }
        }
    }

    #[test]
    fn signal_then_wait() {
        let mut flag = 0u64;
        let mut result = 0u32;
        let cfg = LaunchConfig::linear(1, 1);
        let s = abi::OxcclSignalArgs {
            flag: &mut flag,
            value: 3,
        };
        test_signal(&cfg, s.as_bytes()).unwrap();
        let w = abi::OxcclWaitArgs {
            flag: &mut flag,
            expected: 3,
            max_spins: 10,
            result: &mut result,
        };
        test_wait(&cfg, w.as_bytes()).unwrap();
        assert_eq!(result, abi::OXCCL_WAIT_OK);
        let w = abi::OxcclWaitArgs {
            flag: &mut flag,
            expected: 4,
            max_spins: 10,
            result: &mut result,
        };
        test_wait(&cfg, w.as_bytes()).unwrap();
        assert_eq!(result, abi::OXCCL_WAIT_TIMEOUT);
        assert!(test_wait(&cfg, &[0u8; 3]).is_err());
    }

    #[test]
    fn pattern_and_copy() {
        let cfg = LaunchConfig::linear(1, 1);
        let mut a = vec![0u32; 1001];
        let mut b = vec![0u32; 1001];
        let mut bad = 0u64;
        let p = abi::OxcclPatternArgs {
            data: a.as_mut_ptr(),
            count: 1001,
            seed: 5,
            _pad0: 0,
            mismatches: &mut bad,
        };
        test_fill_pattern(&cfg, p.as_bytes()).unwrap();
        let c = abi::OxcclCopyArgs {
            dst: b.as_mut_ptr().cast(),
            src: a.as_ptr().cast(),
            bytes: 4004,
        };
        test_store16(&cfg, c.as_bytes()).unwrap();
        let p = abi::OxcclPatternArgs {
            data: b.as_mut_ptr(),
            ..p
        };
        test_check_pattern(&cfg, p.as_bytes()).unwrap();
        assert_eq!(bad, 0);
        b[1000] ^= 1;
        test_check_pattern(&cfg, p.as_bytes()).unwrap();
        assert_eq!(bad, 1);
    }

    #[test]
    fn scale_in_place_and_from_a_scalar_in_memory() {
        let cfg = LaunchConfig::linear(1, 1);
        let mut x = [1.5f32, -2.0, 3.0];
        let mut s = 4.0f32;
        let a = abi::OxcclScaleArgs {
            input: x.as_ptr().cast(),
            output: x.as_mut_ptr().cast(),
            scalar: std::ptr::null(),
            scalar_bits: u64::from(0.5f32.to_bits()),
            count: 3,
            dtype: DataType::F32.code(),
            _pad0: 0,
        };
        scale(&cfg, a.as_bytes()).unwrap();
        assert_eq!(x, [0.75, -1.0, 1.5]);
        let a = abi::OxcclScaleArgs {
            scalar: (&mut s as *mut f32).cast_const().cast(),
            ..a
        };
        scale(&cfg, a.as_bytes()).unwrap();
        assert_eq!(x, [3.0, -4.0, 6.0]);
        let a = abi::OxcclScaleArgs {
            input: std::ptr::null(),
            ..a
        };
        assert!(scale(&cfg, a.as_bytes()).is_err());
    }
}
