//! Callers' buffers: finding the allocation that holds one (`cuMemGetAddressRange`, the
//! pointer attributes) and exporting it, for zero-copy on memory oxccl did not allocate
//! (PyTorch's caching allocator: `cudaMalloc` blocks, or VMM chunks with expandable
//! segments).
//!
//! A `cudaMalloc` block is exported with a legacy IPC handle. A VMM chunk is exported as a
//! POSIX file descriptor when it was created shareable that way; others are refused with a
//! clear error (the caller then copies through its own memory instead).

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Mutex;

use cudarc::driver::sys;
use oxccl_hal::{
    fd_share, BackendKind, DevicePtr, Error, ForeignAllocation, IpcHandle, IpcHandleKind, Result,
};

use crate::device::{lock_mutex, Context};
use crate::memory::{Export, VMM_PAYLOAD_LEN};
use crate::result;

use sys::CUpointer_attribute as Attr;

/// Exports of callers' allocations made through one device, by allocation identity.
#[derive(Debug, Default)]
pub(crate) struct ForeignExports {
    exports: Mutex<HashMap<u64, Export>>,
}

/// The allocation on `ctx`'s device that holds `[ptr, ptr + bytes)`.
pub(crate) fn find(ctx: &Context, ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation> {
    ctx.bind()?;
    let not_device = |why: String| Error::InvalidArgument(format!("{ptr}: {why}"));
    let memory_type: u32 = result::pointer_attribute(Attr::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr.0)
        .map_err(|e| not_device(format!("not memory the CUDA driver knows ({e})")))?;
    if memory_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Err(not_device(format!(
            "not device memory (CUDA memory type {memory_type})"
        )));
    }
    let managed: i32 = result::pointer_attribute(Attr::CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr.0)?;
    if managed != 0 {
        return Err(not_device(
            "managed memory cannot be shared between processes".into(),
        ));
    }
    let ordinal: i32 = result::pointer_attribute(Attr::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr.0)?;
    if u32::try_from(ordinal).ok() != Some(ctx.ordinal()) {
        return Err(not_device(format!(
            "memory of CUDA device {ordinal}, used through device {}",
            ctx.ordinal()
        )));
    }
    let (base, len) = result::mem_get_address_range(ptr.0)?;
    let end = ptr.0.checked_add(bytes as u64);
    if end.is_none_or(|end| end > base + len as u64) {
        return Err(not_device(format!(
            "{bytes} bytes run past the end of their allocation ({len} bytes at {base:#x})"
        )));
    }
    let id: u64 = result::pointer_attribute(Attr::CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr.0)?;
    Ok(ForeignAllocation {
        base: DevicePtr(base),
        len,
        id,
    })
}

impl ForeignExports {
    /// Exports `allocation` (once; later calls return the same handle until released).
    pub(crate) fn export(
        &self,
        ctx: &Context,
        allocation: &ForeignAllocation,
    ) -> Result<IpcHandle> {
        let mut exports = lock_mutex(&self.exports);
        if let Some(e) = exports.get(&allocation.id) {
            return Ok(e.handle.clone());
        }
        // The allocation may have been freed (and its address reused) since it was found.
        let now = find(ctx, allocation.base, allocation.len)?;
        if now != *allocation {
            return Err(Error::InvalidArgument(format!(
                "allocation {} at {} was freed",
                allocation.id, allocation.base
            )));
        }
        let base = allocation.base.0;
        let legacy: i32 =
            result::pointer_attribute(Attr::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, base)?;
        let (kind, payload, published) = if legacy != 0 {
            // SAFETY: `base` is the start of a live cuMemAlloc allocation (checked above).
            let h = unsafe { result::ipc_get_mem_handle(base) }?;
            (IpcHandleKind::CudaLegacy, h.to_vec(), None)
        } else {
            // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR's bit in the allowed-types mask.
            let posix_fd = 0x1_u64;
            let allowed: u64 =
                result::pointer_attribute(Attr::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, base)?;
            if allowed & posix_fd == 0 {
                return Err(Error::Unsupported(format!(
                    "the VMM allocation at {} was not created shareable as a POSIX file \
                     descriptor (allowed handle types {allowed:#x}), so no other process can \
                     map it",
                    allocation.base
                )));
            }
            let handle = result::mem_retain_allocation_handle(base)?;
            // SAFETY: `handle` is live (retained above) and allows the POSIX-FD type.
            let fd = unsafe { result::export_fd(handle) };
            // SAFETY: the retain above is ours; the mapping keeps the allocation alive.
            let released = unsafe { result::mem_release(handle) };
            let fd = fd?;
            released?;
            let id = fd_share::next_export_id();
            fd_share::publish(id, fd.as_fd())?;
            let mut payload = Vec::with_capacity(VMM_PAYLOAD_LEN);
            payload.extend_from_slice(&(allocation.len as u64).to_le_bytes());
            payload.extend_from_slice(&ctx.ordinal().to_le_bytes());
            (IpcHandleKind::CudaPosixFd, payload, Some((id, fd)))
        };
        let id = match &published {
            Some((id, _)) => *id,
            None => fd_share::next_export_id(),
        };
        let handle = IpcHandle {
            backend: BackendKind::Cuda,
            kind,
            owner_pid: std::process::id(),
            owner_nonce: fd_share::process_nonce(),
            id,
            len: allocation.len as u64,
            payload,
        };
        exports.insert(
            allocation.id,
            Export {
                handle: handle.clone(),
                published,
            },
        );
        Ok(handle)
    }

    /// Forgets the export of `allocation`, withdrawing its descriptor (VMM).
    pub(crate) fn release(&self, allocation: &ForeignAllocation) {
        if let Some(mut e) = lock_mutex(&self.exports).remove(&allocation.id) {
            e.withdraw();
        }
    }
}

impl Drop for ForeignExports {
    fn drop(&mut self) {
        for (_, mut e) in lock_mutex(&self.exports).drain() {
            e.withdraw();
        }
    }
}
