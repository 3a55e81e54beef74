//! # oxccl-kernels: device code, its images, and the host reference of every number format
//!
//! - **Single-source device code.** `include/oxccl/*.hpp` compile as CUDA (nvcc) and as HIP
//!   (clang `-x hip`); `platform.hpp` is the only place that tells them apart. Kernels live
//!   in `src/device/*.cu`, are `extern "C"` and take exactly one parameter: their argument
//!   block from `include/oxccl/abi.h`, by value.
//! - **One ABI header.** `abi.h` defines every struct crossing the Rust/device boundary;
//!   [`abi`] is its bindgen translation, with layouts asserted on both sides.
//! - **Embedded images.** Feature `cuda` embeds an sm_90 fatbin ([`images::CUDA_FATBIN`]),
//!   feature `rocm` a gfx942 code object ([`images::ROCM_CODE_OBJECT`]); [`module_image`]
//!   hands a backend the image it can load, or the host kernel table ([`host_kernels`]).
//! - **Host reference.** [`formats`] and [`reduce`] are the bit-exact reference of the
//!   device conversions and the mixed-precision reduction; [`selftest`] runs the device
//!   kernels against them. The rules are in `docs/number-formats.md`.

pub mod abi;
pub mod formats;
pub mod host_kernels;
pub mod images;
pub mod pattern;
pub mod reduce;
pub mod selftest;

use oxccl_hal::{BackendKind, ModuleImage, Result};

/// The code image of this crate's kernels for a backend.
///
/// Fails with [`oxccl_hal::Error::Unsupported`] when the crate was built without the backend's
/// feature (there is then no image to load).
pub fn module_image(kind: BackendKind) -> Result<ModuleImage<'static>> {
    match kind {
        BackendKind::Host => Ok(ModuleImage::Host(&host_kernels::TABLE)),
        BackendKind::Cuda => cuda_image(),
        BackendKind::Rocm => rocm_image(),
    }
}

#[cfg(feature = "cuda")]
fn cuda_image() -> Result<ModuleImage<'static>> {
    Ok(ModuleImage::Cuda(images::CUDA_FATBIN))
}

#[cfg(not(feature = "cuda"))]
fn cuda_image() -> Result<ModuleImage<'static>> {
    Err(oxccl_hal::Error::Unsupported(
        "oxccl-kernels was built without feature cuda: no CUDA kernel image (rebuild with \
         `--features cuda`)"
            .into(),
    ))
}

#[cfg(feature = "rocm")]
fn rocm_image() -> Result<ModuleImage<'static>> {
    Ok(ModuleImage::Rocm(images::ROCM_CODE_OBJECT))
}

#[cfg(not(feature = "rocm"))]
fn rocm_image() -> Result<ModuleImage<'static>> {
    Err(oxccl_hal::Error::Unsupported(
        "oxccl-kernels was built without feature rocm: no ROCm kernel image (rebuild with \
         `--features rocm`)"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_per_feature() {
        assert!(matches!(
            module_image(BackendKind::Host),
            Ok(ModuleImage::Host(_))
        ));
        let cuda = module_image(BackendKind::Cuda);
        if cfg!(feature = "cuda") {
            assert!(matches!(cuda, Ok(ModuleImage::Cuda(b)) if b.len() > 1000));
        } else {
            let msg = cuda.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(msg.contains("built without feature cuda"), "{msg}");
        }
        let rocm = module_image(BackendKind::Rocm);
        if cfg!(feature = "rocm") {
            assert!(matches!(rocm, Ok(ModuleImage::Rocm(b)) if b.len() > 1000));
        } else {
            let msg = rocm.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(msg.contains("built without feature rocm"), "{msg}");
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn fatbin_is_aligned_and_has_the_magic() {
        assert_eq!(images::CUDA_FATBIN.as_ptr() as usize % 64, 0);
        // Fatbin header magic 0xBA55ED50, little-endian.
        assert_eq!(&images::CUDA_FATBIN[..4], &[0x50, 0xed, 0x55, 0xba]);
    }

    #[cfg(feature = "rocm")]
    #[test]
    fn code_object_is_an_amdgpu_elf_or_bundle() {
        let img = images::ROCM_CODE_OBJECT;
        assert_eq!(img.as_ptr() as usize % 64, 0);
        assert!(img.starts_with(b"\x7fELF") || img.starts_with(b"__CLANG_OFFLOAD_BUNDLE__"));
    }
}
