//! The allocator behind `oxccl.torch.mem_pool()`: torch's `CUDAPluggableAllocator` calls
//! these two C functions (looked up by name in this extension module), so tensors made
//! inside the pool live in oxccl's own exportable allocations (`MemoryKind::Physical`):
//! registering them, or the zero-copy cache mapping them, needs no fallback.
//!
//! Allocations are kept by address until torch frees them; the devices are opened once per
//! ordinal. Failures return null (torch raises its out-of-memory error) and are logged.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, PoisonError};

use oxccl_collectives::backend::{AnyDevice, AnyMemory};
use oxccl_collectives::hal::{BackendKind, Device, DeviceId, Memory, MemoryKind, Result};

#[derive(Default)]
struct Pool {
    devices: HashMap<i32, AnyDevice>,
    live: HashMap<u64, AnyMemory>,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

fn alloc(bytes: usize, device: i32) -> Result<u64> {
    let mut guard = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let pool = guard.get_or_insert_with(Pool::default);
    let dev = match pool.devices.entry(device) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let ordinal = u32::try_from(device).map_err(|_| {
                oxccl_collectives::hal::Error::InvalidArgument(format!("device {device}"))
            })?;
            v.insert(AnyDevice::open_with(BackendKind::Cuda, DeviceId(ordinal))?)
        }
    };
    let mem = dev.alloc(bytes.max(1), MemoryKind::Physical)?;
    let ptr = mem.ptr().0;
    pool.live.insert(ptr, mem);
    Ok(ptr)
}

/// torch's pluggable-allocator `malloc`: `size` bytes on CUDA device `device` (the stream
/// is not needed: the memory is ready when this returns).
#[no_mangle]
pub extern "C" fn oxccl_torch_alloc(size: isize, device: i32, _stream: *mut c_void) -> *mut c_void {
    let Ok(bytes) = usize::try_from(size) else {
        return std::ptr::null_mut();
    };
    match alloc(bytes, device) {
        Ok(ptr) => ptr as usize as *mut c_void,
        Err(e) => {
            eprintln!("oxccl mem_pool: allocating {bytes} bytes on cuda:{device} failed: {e}");
            std::ptr::null_mut()
        }
    }
}

/// torch's pluggable-allocator `free`: releases an allocation made by
/// [`oxccl_torch_alloc`] (torch frees only blocks no stream still uses).
#[no_mangle]
pub extern "C" fn oxccl_torch_free(
    ptr: *mut c_void,
    _size: isize,
    _device: i32,
    _stream: *mut c_void,
) {
    let mut guard = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    let released = guard
        .as_mut()
        .and_then(|p| p.live.remove(&(ptr as usize as u64)));
    drop(guard);
    if released.is_none() && !ptr.is_null() {
        eprintln!("oxccl mem_pool: {ptr:?} was not allocated here");
    }
}
