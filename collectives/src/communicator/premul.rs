//! PreMulSum, NCCL's `ncclRedOpCreatePreMulSum` operator: every rank multiplies its own
//! input by its own scalar, then the products are summed
//! ([`super::Communicator::all_reduce_premul`], [`super::Communicator::reduce_scatter_premul`],
//! [`super::Communicator::reduce_premul`]).
//!
//! Two launches on the caller's stream: `oxccl_scale` (`kernels/src/device/scale.cu`)
//! writes the products into a buffer, then the ordinary sum of the collective runs on that
//! buffer (the one call path, [`super::Communicator`]'s `run`):
//! - allreduce: the products go into the output, which is then reduced in place (no memory
//!   of its own);
//! - reduce-scatter and reduce: into a buffer of the communicator's ([`PreMulState`]),
//!   because the output is too small (reduce-scatter's holds one chunk), absent (reduce's on
//!   the other ranks) and the caller's input must stay as it was. Reduce uses it on the root
//!   too, so every rank's call looks alike: with the root's output registered, the root
//!   would otherwise choose the zero-copy algorithm and the others the staged one.
//!
//! The scalar is one element of the call's data type, given on the host (read at the call)
//! or in device memory (read by the kernel when it runs, so a captured CUDA graph replays
//! with the value the memory holds then). The product's arithmetic is the host reference's
//! `oxccl_kernels::reduce::pre_multiply_element`.

use std::sync::Mutex;

use super::Communicator;
use crate::algorithms::Collective;
use oxccl_backend::{AnyDevice, AnyKernel, AnyMemory, AnyStream};
use oxccl_hal::{
    BackendKind, DataType, Device, DevicePtr, LaunchConfig, Memory, MemoryKind, Result, Stream,
};
use oxccl_hal::{Error, ReduceOp};
use oxccl_kernels::abi::{self, KernelArgs, OxcclScaleArgs};

/// The kernel's name in the device image and in the host kernel table.
pub(crate) const SCALE_KERNEL: &str = "oxccl_scale";

/// The code a PreMulSum call's signature carries as its operator (checked across ranks on
/// the first call: a rank that calls the plain sum instead is a mismatched call). Past
/// every [`oxccl_hal::ReduceOp`] code.
pub(crate) const PREMUL_SIGNATURE_OP: u32 = 0x100;

/// The scalar of a PreMulSum call: one element of the call's data type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreMul {
    /// The element's bit pattern in the low bits (NCCL's `ncclScalarHostImmediate`: the
    /// value is taken now), e.g. `u64::from(0.5f32.to_bits())` for f32.
    Host(u64),
    /// Device memory of the communicator's device holding the element (NCCL's
    /// `ncclScalarDevice`): read when the scale kernel runs, so it may change between
    /// replays of a captured graph. On the host backend: host-backend device memory (a
    /// host address).
    Device(DevicePtr),
}

/// The pre-multiply's kernel and the buffers reduce-scatter and reduce scale into.
#[derive(Debug)]
pub(crate) struct PreMulState {
    kernel: AnyKernel,
    buffers: Mutex<Buffers>,
}

/// The buffer in use and the ones it replaced.
#[derive(Debug, Default)]
struct Buffers {
    current: Option<AnyMemory>,
    /// Smaller buffers replaced by a larger one. Work queued on a stream, or a captured
    /// graph that is replayed later, may still use them: they live as long as the
    /// communicator (each was at most half of its successor, so all of them together take
    /// less than the current one).
    retired: Vec<AnyMemory>,
}

impl PreMulState {
    pub(crate) fn new(kernel: AnyKernel) -> PreMulState {
        PreMulState {
            kernel,
            buffers: Mutex::new(Buffers::default()),
        }
    }

    /// A buffer of at least `bytes` on `device`, live until the communicator is dropped
    /// (grown on demand, to at least twice the size of the one it replaces).
    pub(crate) fn buffer(&self, device: &AnyDevice, bytes: usize) -> Result<DevicePtr> {
        let mut b = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = b.current.as_ref().filter(|m| m.len() >= bytes) {
            return Ok(m.ptr());
        }
        let old = b.current.as_ref().map_or(0, |m| m.len());
        let size = bytes
            .max(old.saturating_mul(2))
            .max(4096)
            .next_multiple_of(4096);
        let memory = device.alloc(size, MemoryKind::Plain)?;
        let ptr = memory.ptr();
        tracing::debug!(bytes = size, "PreMulSum buffer");
        if let Some(previous) = b.current.replace(memory) {
            b.retired.push(previous);
        }
        Ok(ptr)
    }

    /// Queues `output[i] = scalar * input[i]` for `count` elements of `dtype` on `stream`.
    ///
    /// # Safety
    /// `input` and `output` are device memory of the stream's device holding `count`
    /// elements (the same, or not overlapping), `scalar` (when in device memory) one
    /// element, all live until the work queued on `stream` completes.
    pub(crate) unsafe fn launch(
        &self,
        device: &AnyDevice,
        (input, output): (DevicePtr, DevicePtr),
        count: usize,
        dtype: DataType,
        scalar: PreMul,
        stream: &AnyStream,
    ) -> Result<()> {
        let (scalar, scalar_bits) = match scalar {
            PreMul::Host(bits) => (std::ptr::null(), bits),
            PreMul::Device(p) => (abi::ptr::<std::ffi::c_void>(p).cast_const(), 0),
        };
        let args = OxcclScaleArgs {
            input: abi::ptr::<std::ffi::c_void>(input).cast_const(),
            output: abi::ptr(output),
            scalar,
            scalar_bits,
            count: count as u64,
            dtype: dtype.code(),
            _pad0: 0,
        };
        // An element per thread and pass, up to four blocks per multiprocessor (the
        // kernel's loop strides over the rest).
        let threads = 512u32;
        let blocks = if Device::backend(device) == BackendKind::Host {
            1
        } else {
            let sms = device.capabilities().multiprocessors.max(1) as usize;
            count.div_ceil(threads as usize).clamp(1, 4 * sms) as u32
        };
        let config = LaunchConfig::linear(blocks, threads);
        // SAFETY: the argument block is the one `oxccl_scale` takes; its pointers satisfy
        // this function's contract, which is the kernel's.
        unsafe { stream.launch(&self.kernel, &config, args.as_bytes()) }
    }
}

impl Communicator {
    /// Where a PreMulSum call of `collective` puts the products and runs its sum: the
    /// (input, output) the sum then takes in place of the caller's (see this module).
    pub(super) fn premul_buffers(
        &self,
        collective: Collective,
        op: ReduceOp,
        output: DevicePtr,
        bytes: usize,
        root: u32,
    ) -> Result<(DevicePtr, DevicePtr)> {
        if op != ReduceOp::Sum || !collective.reduces() {
            return Err(Error::InvalidArgument(format!(
                "{collective}: PreMulSum multiplies the inputs of a sum, not of a {op} or a \
                 collective that does not reduce"
            )));
        }
        match collective {
            Collective::AllReduce => Ok((output, output)),
            Collective::ReduceScatter => {
                let (in_bytes, _) = collective.buffer_bytes(bytes, self.world)?;
                Ok((self.premul.buffer(&self.device, in_bytes)?, output))
            }
            _ => {
                let buf = self.premul.buffer(&self.device, bytes)?;
                // The other ranks' output is their input (`used_buffers`): never written.
                Ok((buf, if self.rank == root { output } else { buf }))
            }
        }
    }
}
