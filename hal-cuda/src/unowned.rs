//! For callers that hand raw device pointers across a C API (the NCCL API's `ncclMemAlloc`
//! / `ncclMemFree`, the "current device" of a new communicator, making a device current
//! before calling a library on the CUDA runtime): plain functions over the result layer,
//! acting on whatever context the calling thread has current, as the CUDA runtime does.
//! Everything else goes through [`crate::CudaDevice`].

use cudarc::driver::sys;
use oxccl_hal::{DevicePtr, Error, Result};

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

/// `count` VMM allocations of `chunk_bytes` each (rounded up to the granularity), mapped
/// side by side in one reserved range of the current context's device, shareable as POSIX
/// file descriptors: memory as PyTorch's expandable segments lay it out (a segment mapped
/// chunk by chunk). Returns the range's start and the rounded chunk size; the caller owns
/// it until [`free_unowned_chunks`].
pub fn alloc_unowned_chunks(chunk_bytes: usize, count: usize) -> Result<(DevicePtr, usize)> {
    loader::init()?;
    let Some(device) = result::ctx_get_device()? else {
        return Err(Error::InvalidArgument(
            "no CUDA context is current on this thread".into(),
        ));
    };
    let prop = result::device_alloc_prop(device, false);
    let granularity = result::mem_granularity(&prop)?;
    let chunk = chunk_bytes.max(1).div_ceil(granularity) * granularity;
    let total = chunk
        .checked_mul(count.max(1))
        .ok_or_else(|| Error::InvalidArgument(format!("{count} chunks of {chunk} bytes")))?;
    let base = result::mem_address_reserve(total, granularity)?;
    let mut mapped = 0;
    let outcome = (|| {
        for i in 0..count.max(1) {
            let handle = result::mem_create(chunk, &prop)?;
            let at = base + (i * chunk) as u64;
            // SAFETY: `[at, at + chunk)` is reserved above and nothing is mapped there yet.
            let map = unsafe { result::mem_map(at, chunk, handle) };
            // SAFETY: the mapping (when made) keeps the memory; this handle is not used again.
            let released = unsafe { result::mem_release(handle) };
            map?;
            mapped += 1;
            released?;
            // SAFETY: the chunk is mapped just above.
            unsafe { result::mem_set_access(at, chunk, &[device]) }?;
        }
        Ok(())
    })();
    if let Err(e) = outcome {
        // SAFETY: the first `mapped` chunks were mapped above and nothing used them.
        let _ = unsafe { unmap_chunks(DevicePtr(base), chunk, mapped, total) };
        return Err(e);
    }
    Ok((DevicePtr(base), chunk))
}

/// Frees memory from [`alloc_unowned_chunks`].
///
/// # Safety
/// `ptr`, `chunk` and `count` must be what [`alloc_unowned_chunks`] was given and returned,
/// not freed yet, and no queued work may still use the range.
pub unsafe fn free_unowned_chunks(ptr: DevicePtr, chunk: usize, count: usize) -> Result<()> {
    loader::init()?;
    let count = count.max(1);
    // SAFETY: the caller's obligations: every chunk is mapped and idle.
    unsafe { unmap_chunks(ptr, chunk, count, chunk * count) }
}

/// Unmaps the first `mapped` chunks of a reservation of `total` bytes and frees it.
///
/// # Safety
/// Those chunks must be mapped and idle, and the rest of the reservation unmapped.
unsafe fn unmap_chunks(ptr: DevicePtr, chunk: usize, mapped: usize, total: usize) -> Result<()> {
    let mut outcome = Ok(());
    for i in 0..mapped {
        // SAFETY: the caller guarantees chunk `i` is mapped and idle.
        outcome = outcome.and(unsafe { result::mem_unmap(ptr.0 + (i * chunk) as u64, chunk) });
    }
    // SAFETY: nothing in the reservation is mapped any more.
    outcome.and(unsafe { result::mem_address_free(ptr.0, total) })
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
