//! Reduction operators made by `ncclRedOpCreatePreMulSum`: each rank multiplies its own
//! input by its own scalar, then the products are summed (NCCL's semantics).
//!
//! An operator belongs to one communicator and one data type (a call with another type, or
//! on another communicator, is `ncclInvalidArgument`); its id is past the built-in ones
//! (from `ncclNumOps` up), handed out once per process, so an id is never reused: a
//! destroyed operator, or one another communicator made, is recognised as such. The
//! scalar is read at creation (`ncclScalarHostImmediate`) or kept as a device pointer
//! that the scale kernel reads when it runs (`ncclScalarDevice`). When the communicator
//! has a real NCCL side, the real library makes its own operator too, whose id the calls
//! forwarded there carry.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use oxccl_collectives::hal::{DevicePtr, ReduceOp};
use oxccl_collectives::kernels::formats;
use oxccl_collectives::PreMul;

use crate::comm::served_dtype;
use crate::error::{ApiError, ApiResult};
use crate::types::*;

/// `ncclScalarDevice`.
pub const NCCL_SCALAR_DEVICE: NcclScalarResidence = 0;
/// `ncclScalarHostImmediate`.
pub const NCCL_SCALAR_HOST_IMMEDIATE: NcclScalarResidence = 1;

/// The next operator id of this process.
static NEXT_ID: AtomicI32 = AtomicI32::new(NCCL_NUM_OPS);

/// One PreMulSum operator of a communicator.
#[derive(Debug, Clone, Copy)]
pub struct UserOp {
    /// The data type it was made for.
    pub datatype: NcclDataType,
    /// This rank's scalar.
    pub scalar: PreMul,
    /// The real NCCL's operator made beside it, when the communicator has a real side.
    pub real: Option<NcclRedOp>,
}

impl UserOp {
    /// Checks `ncclRedOpCreatePreMulSum`'s arguments and takes the scalar: its value now
    /// for `ncclScalarHostImmediate`, its address for `ncclScalarDevice`.
    ///
    /// # Safety
    /// NCCL's contract: for `ncclScalarHostImmediate`, a non-null `scalar` points at one
    /// readable element of `datatype` in host memory.
    pub unsafe fn new(
        scalar: *mut c_void,
        datatype: NcclDataType,
        residence: NcclScalarResidence,
    ) -> ApiResult<UserOp> {
        let dtype = served_dtype(datatype).ok_or_else(|| {
            ApiError::invalid_argument(format!(
                "datatype {datatype} is not an ncclDataType_t (0..{NCCL_NUM_TYPES})"
            ))
        })?;
        if scalar.is_null() {
            return Err(ApiError::invalid_argument("scalar is NULL"));
        }
        let scalar = match residence {
            NCCL_SCALAR_HOST_IMMEDIATE => {
                // SAFETY: this function's contract: one element of `datatype` at `scalar`.
                let bytes =
                    unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), dtype.size()) };
                PreMul::Host(formats::read_element(dtype, bytes, 0).unwrap_or_default())
            }
            NCCL_SCALAR_DEVICE => PreMul::Device(DevicePtr(scalar as usize as u64)),
            other => {
                return Err(ApiError::invalid_argument(format!(
                    "residence {other} is not an ncclScalarResidence_t (ncclScalarDevice = 0, \
                     ncclScalarHostImmediate = 1)"
                )))
            }
        };
        Ok(UserOp {
            datatype,
            scalar,
            real: None,
        })
    }
}

/// The PreMulSum operators of one communicator, by id.
#[derive(Debug, Default)]
pub struct UserOps {
    ops: Mutex<HashMap<NcclRedOp, UserOp>>,
}

impl UserOps {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NcclRedOp, UserOp>> {
        self.ops.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an operator under a fresh id.
    pub fn insert(&self, op: UserOp) -> ApiResult<NcclRedOp> {
        let id = NEXT_ID
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1))
            .map_err(|_| ApiError::internal("every ncclRedOp_t id of this process was used"))?;
        self.lock().insert(id, op);
        Ok(id)
    }

    /// Removes an operator (`ncclRedOpDestroy`).
    pub fn remove(&self, op: NcclRedOp) -> ApiResult<UserOp> {
        let mut ops = self.lock();
        ops.remove(&op).ok_or_else(|| unknown(op))
    }

    /// The operator `op`, for a call with `datatype`.
    pub fn get(&self, op: NcclRedOp, datatype: NcclDataType) -> ApiResult<UserOp> {
        let found = self.lock().get(&op).copied().ok_or_else(|| unknown(op))?;
        if found.datatype != datatype {
            return Err(ApiError::invalid_argument(format!(
                "op {op} is a PreMulSum operator made for {}, and the call's datatype is {}",
                type_name(found.datatype),
                type_name(datatype)
            )));
        }
        Ok(found)
    }
}

fn unknown(op: NcclRedOp) -> ApiError {
    ApiError::invalid_argument(format!(
        "op {op} is not an operator of this communicator: destroyed already, made by \
         ncclRedOpCreatePreMulSum on another communicator, or never made"
    ))
}

/// What a reducing call reduces with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// A built-in operator.
    BuiltIn(ReduceOp),
    /// PreMulSum with this rank's scalar.
    PreMul(PreMul),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fresh_and_checked_per_type() {
        let ops = UserOps::default();
        let mut x = 2.5f32;
        // SAFETY: one f32 on the host.
        let op = unsafe {
            UserOp::new(
                (&mut x as *mut f32).cast(),
                NCCL_FLOAT32,
                NCCL_SCALAR_HOST_IMMEDIATE,
            )
        }
        .unwrap();
        assert_eq!(op.scalar, PreMul::Host(u64::from(2.5f32.to_bits())));
        let a = ops.insert(op).unwrap();
        let b = ops.insert(op).unwrap();
        assert!(a >= NCCL_NUM_OPS && b > a);
        assert!(ops.get(a, NCCL_FLOAT32).is_ok());
        let e = ops.get(a, NCCL_BFLOAT16).unwrap_err();
        assert!(e.message.contains("made for fp32"), "{}", e.message);
        ops.remove(a).unwrap();
        let e = ops.get(a, NCCL_FLOAT32).unwrap_err();
        assert!(e.message.contains("destroyed"), "{}", e.message);
        assert!(ops.remove(a).is_err());
        // SAFETY: refused before reading anything.
        let bad = unsafe { UserOp::new(std::ptr::null_mut(), NCCL_FLOAT32, 1) };
        assert!(bad.is_err());
        // SAFETY: as above.
        let bad = unsafe { UserOp::new((&mut x as *mut f32).cast(), NCCL_FLOAT32, 7) };
        assert!(bad.is_err());
    }
}
