//! For callers that hand raw device pointers across a C API (the NCCL API's `ncclMemAlloc`
//! / `ncclMemFree`, the "current device" of a new communicator): plain functions over the
//! result layer, acting on whatever context the calling thread has current, as the CUDA
//! runtime does. Everything else goes through [`crate::CudaDevice`].

use oxccl_hal::{DevicePtr, Result};

use crate::{loader, result};

/// The ordinal of the device whose context is current on this thread; `None` when no
/// context is current or the driver reports no device.
pub fn current_device() -> Result<Option<u32>> {
    if !loader::init()? {
        return Ok(None);
    }
    Ok(result::ctx_get_device()?.and_then(|d| u32::try_from(d).ok()))
}

/// `bytes` (at least 1) of device memory in the current context, which the caller owns
/// until [`free_unowned`].
pub fn alloc_unowned(bytes: usize) -> Result<DevicePtr> {
    loader::init()?;
    Ok(DevicePtr(result::mem_alloc(bytes.max(1))?))
}

/// Frees memory from [`alloc_unowned`].
///
/// # Safety
/// `ptr` must come from [`alloc_unowned`], not be freed yet, and no queued work may still
/// use it.
pub unsafe fn free_unowned(ptr: DevicePtr) -> Result<()> {
    loader::init()?;
    // SAFETY: the caller's obligations are `mem_free`'s.
    unsafe { result::mem_free(ptr.0) }
}
