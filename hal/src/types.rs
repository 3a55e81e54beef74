//! Plain types shared by every backend and every layer above the HAL.

use std::fmt;

use crate::error::{Error, Result};

/// Which backend a handle, an error or a device belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Host memory standing in for device memory; always built.
    Host,
    /// NVIDIA GPUs through the CUDA driver API.
    Cuda,
    /// AMD GPUs through the HIP runtime.
    Rocm,
}

impl BackendKind {
    /// Stable numeric tag used in serialized handles.
    pub const fn tag(self) -> u8 {
        match self {
            BackendKind::Host => 1,
            BackendKind::Cuda => 2,
            BackendKind::Rocm => 3,
        }
    }

    /// Inverse of [`BackendKind::tag`].
    pub const fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            1 => Some(BackendKind::Host),
            2 => Some(BackendKind::Cuda),
            3 => Some(BackendKind::Rocm),
            _ => None,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "CUDA",
            BackendKind::Rocm => "ROCm",
        })
    }
}

/// Ordinal of a device within its backend (CUDA ordinal, HIP ordinal, host slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub u32);

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {}", self.0)
    }
}

/// An address in a device's (or, on the host backend, the process's) virtual address space.
///
/// It is a plain number: it carries no ownership and is what kernels receive in their
/// argument blocks. The allocation that owns it decides how long it stays valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null address.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// This address plus `bytes`, or an error when that overflows.
    pub fn offset(self, bytes: usize) -> Result<DevicePtr> {
        u64::try_from(bytes)
            .ok()
            .and_then(|b| self.0.checked_add(b))
            .map(DevicePtr)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("pointer {self} + {bytes} bytes overflows"))
            })
    }

    /// Whether the address is a multiple of `align` (a power of two).
    pub const fn is_aligned(self, align: u64) -> bool {
        align != 0 && self.0 % align == 0
    }

    /// Whether this is the null address.
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }
}

/// The allocation that holds a caller's buffer (memory oxccl did not allocate), as
/// [`crate::Device::find_allocation`] finds it: what a peer maps to reach the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ForeignAllocation {
    /// First byte of the allocation.
    pub base: DevicePtr,
    /// Its length in bytes.
    pub len: usize,
    /// Its identity: unique among the allocations this process has ever made on the
    /// backend, so memory freed and allocated again at the same address is told apart.
    pub id: u64,
}

impl ForeignAllocation {
    /// Byte offset of `ptr` in the allocation (the caller found it through `ptr`).
    pub fn offset_of(&self, ptr: DevicePtr) -> u64 {
        ptr.0.saturating_sub(self.base.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Element types of collective buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    Bf16,
    /// OCP fp8 E4M3 (bias 7, NaN = S.1111.111, no infinities); native on sm_90.
    Fp8E4m3,
    /// OCP fp8 E5M2 (bias 15, IEEE-like infinities and NaNs); native on sm_90.
    Fp8E5m2,
    /// fp8 E4M3 FNUZ (bias 8, single NaN 0x80, no negative zero); native on gfx942.
    Fp8E4m3Fnuz,
    /// fp8 E5M2 FNUZ (bias 16, single NaN 0x80, no negative zero); native on gfx942.
    Fp8E5m2Fnuz,
    /// fp8 E4M3 with exponent bias 15, defined in software; every code is finite.
    Fp8E4m3b15,
    /// Signed 8-bit integer (two's complement).
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE binary64.
    F64,
}

impl DataType {
    /// Every data type, in declaration order.
    pub const ALL: [DataType; 15] = [
        DataType::F32,
        DataType::F16,
        DataType::Bf16,
        DataType::Fp8E4m3,
        DataType::Fp8E5m2,
        DataType::Fp8E4m3Fnuz,
        DataType::Fp8E5m2Fnuz,
        DataType::Fp8E4m3b15,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F64,
    ];

    /// The types reduced through an f32 accumulator (f32 and narrower floats): the
    /// mixed-precision path, with a choice of [`AccumType`].
    pub const WIDENED: [DataType; 8] = [
        DataType::F32,
        DataType::F16,
        DataType::Bf16,
        DataType::Fp8E4m3,
        DataType::Fp8E5m2,
        DataType::Fp8E4m3Fnuz,
        DataType::Fp8E5m2Fnuz,
        DataType::Fp8E4m3b15,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::Fp8E4m3
            | DataType::Fp8E5m2
            | DataType::Fp8E4m3Fnuz
            | DataType::Fp8E5m2Fnuz
            | DataType::Fp8E4m3b15
            | DataType::I8
            | DataType::U8 => 1,
        }
    }

    /// Whether this is one of the 8-bit float formats.
    pub const fn is_fp8(self) -> bool {
        matches!(
            self,
            DataType::Fp8E4m3
                | DataType::Fp8E5m2
                | DataType::Fp8E4m3Fnuz
                | DataType::Fp8E5m2Fnuz
                | DataType::Fp8E4m3b15
        )
    }

    /// Whether this is an integer type.
    pub const fn is_integer(self) -> bool {
        matches!(
            self,
            DataType::I8
                | DataType::U8
                | DataType::I32
                | DataType::U32
                | DataType::I64
                | DataType::U64
        )
    }

    /// Whether this is a signed integer type.
    pub const fn is_signed_integer(self) -> bool {
        matches!(self, DataType::I8 | DataType::I32 | DataType::I64)
    }

    /// Whether elements are reduced in their own type, with no accumulation choice: the
    /// integers (wrapping, as NCCL) and f64 (wider than any accumulator). The other types
    /// widen to an accumulator ([`DataType::WIDENED`]).
    pub const fn reduces_in_own_type(self) -> bool {
        self.is_integer() || matches!(self, DataType::F64)
    }

    /// Bytes taken by `count` elements, or an error when that overflows.
    pub fn bytes(self, count: usize) -> Result<usize> {
        count.checked_mul(self.size()).ok_or_else(|| {
            Error::InvalidArgument(format!("{count} elements of {self} overflow usize"))
        })
    }

    /// The accumulation type used when the caller asks for [`AccumType::Auto`].
    ///
    /// Software fp8 e4m3b15 sums in f32 (its range is tiny, so partial sums leave it at
    /// once); hardware fp8 sums in f16, which every fp8 value widens to exactly.
    pub const fn default_accum(self) -> AccumType {
        match self {
            DataType::Fp8E4m3b15 => AccumType::F32,
            DataType::Fp8E4m3
            | DataType::Fp8E5m2
            | DataType::Fp8E4m3Fnuz
            | DataType::Fp8E5m2Fnuz => AccumType::F16,
            DataType::F32
            | DataType::F16
            | DataType::Bf16
            | DataType::I8
            | DataType::U8
            | DataType::I32
            | DataType::U32
            | DataType::I64
            | DataType::U64
            | DataType::F64 => AccumType::Native,
        }
    }

    /// Stable numeric code, shared with the device code's C header.
    pub const fn code(self) -> u32 {
        match self {
            DataType::F32 => 0,
            DataType::F16 => 1,
            DataType::Bf16 => 2,
            DataType::Fp8E4m3 => 3,
            DataType::Fp8E5m2 => 4,
            DataType::Fp8E4m3Fnuz => 5,
            DataType::Fp8E5m2Fnuz => 6,
            DataType::Fp8E4m3b15 => 7,
            DataType::I8 => 8,
            DataType::U8 => 9,
            DataType::I32 => 10,
            DataType::U32 => 11,
            DataType::I64 => 12,
            DataType::U64 => 13,
            DataType::F64 => 14,
        }
    }

    /// Inverse of [`DataType::code`].
    pub fn from_code(code: u32) -> Result<Self> {
        DataType::ALL
            .into_iter()
            .find(|d| d.code() == code)
            .ok_or_else(|| Error::Unsupported(format!("data type code {code}")))
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataType::F32 => "f32",
            DataType::F16 => "f16",
            DataType::Bf16 => "bf16",
            DataType::Fp8E4m3 => "fp8_e4m3",
            DataType::Fp8E5m2 => "fp8_e5m2",
            DataType::Fp8E4m3Fnuz => "fp8_e4m3fnuz",
            DataType::Fp8E5m2Fnuz => "fp8_e5m2fnuz",
            DataType::Fp8E4m3b15 => "fp8_e4m3b15",
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F64 => "f64",
        })
    }
}

impl std::str::FromStr for DataType {
    type Err = Error;

    /// The names [`fmt::Display`] prints, and nccl-tests' names (`int8`, `uint32`,
    /// `half`, `float`, `double`, `bfloat16`, ...).
    fn from_str(s: &str) -> Result<Self> {
        const NCCL_TESTS_NAMES: [(&str, DataType); 11] = [
            ("int8", DataType::I8),
            ("uint8", DataType::U8),
            ("int32", DataType::I32),
            ("uint32", DataType::U32),
            ("int64", DataType::I64),
            ("uint64", DataType::U64),
            ("half", DataType::F16),
            ("float", DataType::F32),
            ("double", DataType::F64),
            ("bfloat16", DataType::Bf16),
            ("float64", DataType::F64),
        ];
        DataType::ALL
            .into_iter()
            .find(|d| d.to_string().eq_ignore_ascii_case(s))
            .or_else(|| {
                NCCL_TESTS_NAMES
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case(s))
                    .map(|&(_, d)| d)
            })
            .ok_or_else(|| Error::Unsupported(format!("unknown data type '{s}'")))
    }
}

/// Reduction operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks.
    Avg,
}

impl ReduceOp {
    /// Every operator, in declaration order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// Stable numeric code, shared with the device code's C header.
    pub const fn code(self) -> u32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
        }
    }

    /// Inverse of [`ReduceOp::code`].
    pub fn from_code(code: u32) -> Result<Self> {
        ReduceOp::ALL
            .into_iter()
            .find(|o| o.code() == code)
            .ok_or_else(|| Error::Unsupported(format!("reduce op code {code}")))
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        })
    }
}

impl std::str::FromStr for ReduceOp {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        ReduceOp::ALL
            .into_iter()
            .find(|d| d.to_string().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::Unsupported(format!("unknown reduce op '{s}'")))
    }
}

/// The type partial results are held in while reducing.
///
/// Inputs are widened to it, combined in it, and rounded to the element type once at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccumType {
    /// The data type's default: [`DataType::default_accum`].
    Auto,
    /// Accumulate in the element type itself (no widening).
    Native,
    /// Accumulate in IEEE binary16.
    F16,
    /// Accumulate in IEEE binary32.
    F32,
}

impl AccumType {
    /// Every accumulation type, in declaration order.
    pub const ALL: [AccumType; 4] = [
        AccumType::Auto,
        AccumType::Native,
        AccumType::F16,
        AccumType::F32,
    ];

    /// The concrete accumulation type for `dtype`: never `Auto`.
    pub const fn resolve(self, dtype: DataType) -> AccumType {
        match self {
            AccumType::Auto => dtype.default_accum(),
            other => other,
        }
    }

    /// Why the kernels do not serve this accumulation type for `dtype`, or `None` when
    /// they do: every float type of f32 or narrower takes `Auto`, `Native` and `F32`, and
    /// `F16` when narrower than f32 (for f32 data it would silently truncate); integers and
    /// f64 take `Auto` and `Native` only (they reduce in their own type).
    pub fn refusal(self, dtype: DataType) -> Option<String> {
        let wider_accum = matches!(self, AccumType::F16 | AccumType::F32);
        if dtype.reduces_in_own_type() && wider_accum {
            return Some(format!(
                "{dtype} data with an {self} accumulator (integers and f64 reduce in their \
                 own type: use auto or native)"
            ));
        }
        if dtype == DataType::F32 && self == AccumType::F16 {
            return Some("f32 data with an f16 accumulator (narrower than the data)".into());
        }
        None
    }

    /// Stable numeric code, shared with the device code's C header.
    pub const fn code(self) -> u32 {
        match self {
            AccumType::Auto => 0,
            AccumType::Native => 1,
            AccumType::F16 => 2,
            AccumType::F32 => 3,
        }
    }

    /// Inverse of [`AccumType::code`].
    pub fn from_code(code: u32) -> Result<Self> {
        AccumType::ALL
            .into_iter()
            .find(|a| a.code() == code)
            .ok_or_else(|| Error::Unsupported(format!("accumulation code {code}")))
    }
}

impl fmt::Display for AccumType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccumType::Auto => "auto",
            AccumType::Native => "native",
            AccumType::F16 => "f16",
            AccumType::F32 => "f32",
        })
    }
}

/// How far a device supports multicast (NVLink SHARP) objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MulticastSupport {
    /// No multicast at all (ROCm, older NVIDIA parts).
    #[default]
    None,
    /// The host backend's emulation: reduce and broadcast over the members' memory.
    Emulated,
    /// Hardware multicast through the driver (NVLS).
    Hardware,
}

/// What a device can do, read once when it is opened.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// The backend that answered.
    pub backend: Option<BackendKind>,
    /// Marketing name of the device ("NVIDIA H200", "host").
    pub name: String,
    /// Architecture name the kernels were built for ("sm_90", "gfx942", "host").
    pub arch: String,
    /// Number of streaming multiprocessors / compute units.
    pub multiprocessors: u32,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Physical allocation with reserve/map (cuMemCreate / hipMemCreate).
    pub vmm: bool,
    /// VMM allocations can be exported as POSIX file descriptors.
    pub posix_fd_handles: bool,
    /// VMM allocations can be exported as fabric handles (multi-node NVLink).
    pub fabric_handles: bool,
    /// Legacy IPC handles (cuIpcGetMemHandle / hipIpcGetMemHandle).
    pub legacy_ipc: bool,
    /// Multicast objects.
    pub multicast: MulticastSupport,
    /// RDMA NICs can read and write this device's memory directly.
    pub gpu_direct_rdma: bool,
    /// Fine-grained (coherent across devices) memory can be allocated.
    pub fine_grained_memory: bool,
    /// Granularity, in bytes, that physical allocations are rounded to.
    pub allocation_granularity: u64,
    /// Every other visible device this one can reach as a peer supports native atomics
    /// with it (NVLink; PCIe peers do not), and there is at least one. Protocols that rely
    /// on NVLink's delivery of whole 128-byte lines (LL128) need it on every rank.
    pub peers_over_nvlink: bool,
    /// Kernels launched with [`crate::LaunchConfig::early_launch`] may start before the
    /// previous kernel on their stream has finished (CUDA: compute capability 9.0 or
    /// later with a driver that captures it into graphs, 12.3 on). Elsewhere the flag is
    /// accepted and ignored.
    pub early_launch: bool,
}

/// How a device allocation is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Plain allocation (cuMemAlloc / hipMalloc); exportable through legacy IPC where the
    /// backend has it.
    Plain,
    /// Physical allocation mapped into a reserved range, exportable as a shareable handle.
    Physical,
    /// Memory that stays coherent while other devices write it (flags, semaphores). On
    /// AMD this is fine-grained or uncached memory; elsewhere it is `Physical`.
    Coherent,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_refused() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_code(d.code()).unwrap(), d);
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_code(o.code()).unwrap(), o);
        }
        for a in AccumType::ALL {
            assert_eq!(AccumType::from_code(a.code()).unwrap(), a);
        }
        assert!(DataType::from_code(15).is_err());
        assert_eq!("int32".parse::<DataType>().unwrap(), DataType::I32);
        assert_eq!("double".parse::<DataType>().unwrap(), DataType::F64);
        assert_eq!("u64".parse::<DataType>().unwrap(), DataType::U64);
        assert!("int16".parse::<DataType>().is_err());
        for d in DataType::ALL {
            assert_eq!(
                d.reduces_in_own_type(),
                !DataType::WIDENED.contains(&d),
                "{d}"
            );
            assert_eq!(d.to_string().parse::<DataType>().unwrap(), d);
        }
        assert!(ReduceOp::from_code(5).is_err());
        let e = AccumType::from_code(4).unwrap_err().to_string();
        assert!(e.contains("accumulation code 4"), "{e}");
    }
}
