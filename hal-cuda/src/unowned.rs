//! For callers that hand raw device pointers across a C API (the NCCL API's `ncclMemAlloc`
//! / `ncclMemFree`, the "current device" of a new communicator, making a device current
//! before calling a library on the CUDA runtime): plain functions over the result layer,
//! acting on whatever context the calling thread has current, as the CUDA runtime does.
//! Everything else goes through [`crate::CudaDevice`].

use cudarc::driver::sys;
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

/// What [`make_device_current`] changed on a thread, for [`restore_current`] to undo.
#[derive(Debug)]
pub struct PreviousContext {
    ctx: sys::CUcontext,
    retained: sys::CUdevice,
}

/// Makes device `ordinal`'s primary context current on the calling thread, as
/// `cudaSetDevice` does (a library on the CUDA runtime called next takes that device as the
/// current one), retaining it until [`restore_current`], which also puts back the context
/// that was current before.
pub fn make_device_current(ordinal: u32) -> Result<PreviousContext> {
    loader::init()?;
    let previous = result::ctx_get_current()?;
    let device = result::device_get(ordinal)?;
    let ctx = result::primary_ctx_retain(device)?;
    // SAFETY: `ctx` was retained just now and stays retained until `restore_current`.
    if let Err(e) = unsafe { result::ctx_set_current(ctx) } {
        let _ = result::primary_ctx_release(device);
        return Err(e);
    }
    Ok(PreviousContext {
        ctx: previous,
        retained: device,
    })
}

/// Undoes [`make_device_current`]: the context current before it is current again (none,
/// when none was), and its retain of the primary context is released.
///
/// # Safety
/// The context that was current before [`make_device_current`] must still be alive (the
/// caller's own, not destroyed meanwhile), and no other context may have been made current
/// on this thread in between that the caller still needs current.
pub unsafe fn restore_current(previous: PreviousContext) -> Result<()> {
    // SAFETY: the caller guarantees the previous context is alive; null unbinds.
    let set = unsafe { result::ctx_set_current(previous.ctx) };
    let released = result::primary_ctx_release(previous.retained);
    set.and(released)
}
