//! The device code images embedded in this crate, and the names of their kernels.
//!
//! Which images exist depends on the cargo features the crate was built with; use
//! [`crate::module_image`] to get the one a backend needs with a clear error otherwise.

/// Forces the alignment of embedded images: drivers parse the image headers in place and
/// some expect 8-byte (or better) alignment, which `include_bytes!` alone does not give.
#[cfg(any(feature = "cuda", feature = "rocm"))]
#[repr(C, align(64))]
struct Aligned<T: ?Sized>(T);

#[cfg(feature = "cuda")]
static CUDA_FATBIN_ALIGNED: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/oxccl_kernels.fatbin"
)));

/// The CUDA fatbin: SASS for sm_90 and any `OXCCL_CUDA_ARCHS`, no PTX.
#[cfg(feature = "cuda")]
pub static CUDA_FATBIN: &[u8] = &CUDA_FATBIN_ALIGNED.0;

#[cfg(feature = "rocm")]
static ROCM_CODE_OBJECT_ALIGNED: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/oxccl_kernels.hsaco"
)));

/// The AMD code object for gfx942 (an offload bundle when `OXCCL_ROCM_ARCHS` adds more).
#[cfg(feature = "rocm")]
pub static ROCM_CODE_OBJECT: &[u8] = &ROCM_CODE_OBJECT_ALIGNED.0;

include!(concat!(env!("OUT_DIR"), "/kernel_names.rs"));
