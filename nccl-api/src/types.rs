//! The C types of NCCL 2.28's `nccl.h`, as Rust sees them. `include/nccl.h` is the C side of
//! the same ABI; every value here matches NCCL's.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `ncclResult_t` (a C enum: an `int` on every ABI NCCL supports).
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`.
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const NCCL_INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`.
pub const NCCL_IN_PROGRESS: NcclResult = 7;
/// `ncclNumResults`.
pub const NCCL_NUM_RESULTS: NcclResult = 8;

/// `ncclDataType_t`.
pub type NcclDataType = c_int;
/// `ncclInt8` / `ncclChar`.
pub const NCCL_INT8: NcclDataType = 0;
/// `ncclUint8`.
pub const NCCL_UINT8: NcclDataType = 1;
/// `ncclInt32` / `ncclInt`.
pub const NCCL_INT32: NcclDataType = 2;
/// `ncclUint32`.
pub const NCCL_UINT32: NcclDataType = 3;
/// `ncclInt64`.
pub const NCCL_INT64: NcclDataType = 4;
/// `ncclUint64`.
pub const NCCL_UINT64: NcclDataType = 5;
/// `ncclFloat16` / `ncclHalf`.
pub const NCCL_FLOAT16: NcclDataType = 6;
/// `ncclFloat32` / `ncclFloat`.
pub const NCCL_FLOAT32: NcclDataType = 7;
/// `ncclFloat64` / `ncclDouble`.
pub const NCCL_FLOAT64: NcclDataType = 8;
/// `ncclBfloat16`.
pub const NCCL_BFLOAT16: NcclDataType = 9;
/// `ncclFloat8e4m3`.
pub const NCCL_FLOAT8_E4M3: NcclDataType = 10;
/// `ncclFloat8e5m2`.
pub const NCCL_FLOAT8_E5M2: NcclDataType = 11;
/// `ncclNumTypes`.
pub const NCCL_NUM_TYPES: NcclDataType = 12;

/// `ncclRedOp_t`: 0..=4 are the built-in operators; larger values up to `ncclMaxRedOp`
/// are operators made by `ncclRedOpCreatePreMulSum`.
pub type NcclRedOp = c_int;
/// `ncclSum`.
pub const NCCL_SUM: NcclRedOp = 0;
/// `ncclProd`.
pub const NCCL_PROD: NcclRedOp = 1;
/// `ncclMax`.
pub const NCCL_MAX: NcclRedOp = 2;
/// `ncclMin`.
pub const NCCL_MIN: NcclRedOp = 3;
/// `ncclAvg`.
pub const NCCL_AVG: NcclRedOp = 4;
/// `ncclNumOps`.
pub const NCCL_NUM_OPS: NcclRedOp = 5;

/// `ncclScalarResidence_t`.
pub type NcclScalarResidence = c_int;

/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId` (passed by value to the init calls).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclUniqueId {
    /// The id's bytes.
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl NcclUniqueId {
    /// The id as bytes.
    pub fn bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }

    /// An id holding `bytes`.
    pub fn from_bytes(bytes: &[u8; NCCL_UNIQUE_ID_BYTES]) -> NcclUniqueId {
        NcclUniqueId {
            internal: bytes.map(|b| b as c_char),
        }
    }
}

/// `ncclConfig_t` of NCCL 2.28 (`ncclConfig_v22800`). Read only through its `size` field:
/// a program built against an older header passes a shorter struct.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` of the caller's header.
    pub size: usize,
    /// `0xcafebeef`.
    pub magic: c_uint,
    /// The caller's NCCL version code.
    pub version: c_uint,
    /// Blocking (1) or non-blocking (0) communicator.
    pub blocking: c_int,
    /// CGA cluster size.
    pub cga_cluster_size: c_int,
    /// Minimum CTAs.
    pub min_ctas: c_int,
    /// Maximum CTAs.
    pub max_ctas: c_int,
    /// Network name.
    pub net_name: *const c_char,
    /// Split shares resources.
    pub split_share: c_int,
    /// Traffic class.
    pub traffic_class: c_int,
    /// Communicator name.
    pub comm_name: *const c_char,
    /// CollNet.
    pub collnet_enable: c_int,
    /// CTA policy.
    pub cta_policy: c_int,
    /// Shrink shares resources.
    pub shrink_share: c_int,
    /// NVLS CTAs.
    pub nvls_ctas: c_int,
    /// Channels per network peer.
    pub n_channels_per_net_peer: c_int,
    /// NVLink-centric scheduling.
    pub nvlink_centric_sched: c_int,
}

/// Byte offset of `blocking` in every `ncclConfig_t` version that has it.
pub const CONFIG_BLOCKING_OFFSET: usize = 16;

/// `ncclTeam_t` of the device API (`nccl_device/core.h`), returned by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NcclTeam {
    /// Ranks in the team.
    pub n_ranks: c_int,
    /// This rank in the team.
    pub rank: c_int,
    /// Stride of the team in world ranks.
    pub stride: c_int,
}

/// A CUDA stream handle (`cudaStream_t` = `CUstream`).
pub type CudaStreamT = *mut c_void;
/// An opaque pointer NCCL hands out and takes back (windows, device communicators, ...).
pub type Opaque = *mut c_void;

/// Bytes of one element of a data type; `None` for an unknown type.
pub fn type_size(dtype: NcclDataType) -> Option<usize> {
    match dtype {
        NCCL_INT8 | NCCL_UINT8 | NCCL_FLOAT8_E4M3 | NCCL_FLOAT8_E5M2 => Some(1),
        NCCL_FLOAT16 | NCCL_BFLOAT16 => Some(2),
        NCCL_INT32 | NCCL_UINT32 | NCCL_FLOAT32 => Some(4),
        NCCL_INT64 | NCCL_UINT64 | NCCL_FLOAT64 => Some(8),
        _ => None,
    }
}

/// NCCL's name of a data type (for messages and the log).
pub fn type_name(dtype: NcclDataType) -> &'static str {
    match dtype {
        NCCL_INT8 => "int8",
        NCCL_UINT8 => "uint8",
        NCCL_INT32 => "int32",
        NCCL_UINT32 => "uint32",
        NCCL_INT64 => "int64",
        NCCL_UINT64 => "uint64",
        NCCL_FLOAT16 => "fp16",
        NCCL_FLOAT32 => "fp32",
        NCCL_FLOAT64 => "fp64",
        NCCL_BFLOAT16 => "bf16",
        NCCL_FLOAT8_E4M3 => "fp8e4m3",
        NCCL_FLOAT8_E5M2 => "fp8e5m2",
        _ => "unknown",
    }
}

/// NCCL's name of a reduction operator (for messages and the log).
pub fn op_name(op: NcclRedOp) -> String {
    match op {
        NCCL_SUM => "sum".into(),
        NCCL_PROD => "prod".into(),
        NCCL_MAX => "max".into(),
        NCCL_MIN => "min".into(),
        NCCL_AVG => "avg".into(),
        other => format!("op{other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nccl_2_28() {
        assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
        assert_eq!(std::mem::size_of::<NcclConfig>(), 80);
        assert_eq!(
            std::mem::offset_of!(NcclConfig, blocking),
            CONFIG_BLOCKING_OFFSET
        );
        assert_eq!(std::mem::size_of::<NcclTeam>(), 12);
    }
}
