//! Callers' buffers: finding the `hipMalloc` block that holds one (`hipMemGetAddressRange`,
//! the pointer attributes) and exporting it, for zero-copy on memory oxccl did not allocate
//! (PyTorch's caching allocator on ROCm without expandable segments hands out pieces of
//! `hipMalloc` blocks).
//!
//! A block is exported as a legacy IPC handle of its base (ROCm's handle records the offset
//! of the pointer it was made from, and an importer maps the block at that offset, so the
//! base is what peers must get), once per block identity; peers import it through the
//! runtime's IPC cache like any oxccl allocation ([`crate::Hip::ipc_cache`]).
//!
//! # VMM memory is not shared
//!
//! hal-cuda also shares VMM memory (`cuMemCreate` + `cuMemMap`, PyTorch's expandable
//! segments): it walks the chunks side by side, retains each one's allocation handle and
//! exports it as a POSIX file descriptor. Every HIP call that needs exists with the same
//! signature in the 5.7, 6.4 and 7.2 headers, but not with the same meaning in the runtimes
//! (AMD's CLR source, release by release):
//! - ROCm 5.7's `hipMemExportToShareableHandle` answers `hipErrorNotSupported` (VMM IPC on
//!   Linux came with ROCm 6.2);
//! - `hipMemRetainAllocationHandle` takes no reference in ROCm 5.7 to 6.2, while AMD's
//!   current source takes one: the `hipMemRelease` that must follow it on newer runtimes
//!   drops the caller's own reference on older ones;
//! - in ROCm 6.2 that call dereferences a null pointer for memory that is not VMM memory,
//!   so it cannot even be used to ask whether a pointer is VMM memory, and the pointer
//!   attributes that tell CUDA's VMM memory apart (`HIP_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES`,
//!   `..._IS_LEGACY_HIP_IPC_CAPABLE`) answer `hipErrorNotSupported`.
//!
//! So VMM memory is not told apart when it is found: a buffer across two mappings is
//! refused as running past its allocation, and one inside a single mapping is found as
//! whatever range `hipMemGetAddressRange` answers; its export is then a legacy IPC handle,
//! and when `hipIpcGetMemHandle` refuses it (`hipErrorInvalidValue`, ROCm's answer when it
//! cannot make the handle) the error is [`Error::Unsupported`], saying that only
//! `hipMalloc` memory is shared. What ROCm's `hipIpcGetMemHandle` does with a VMM address
//! was not checked on hardware: this module is compiled and tested against the fake HIP
//! runtime of `tests/fake_hip/` only.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use oxccl_hal::{
    fd_share, BackendKind, DevicePtr, Error, ForeignAllocation, IpcHandle, IpcHandleKind, Result,
};

use crate::runtime::Hip;
use crate::sys::PointerAttribute as Attr;

/// Exports of callers' blocks made through one device, by block identity (the runtime's
/// buffer id).
#[derive(Debug, Default)]
pub(crate) struct ForeignExports {
    exports: Mutex<HashMap<u64, IpcHandle>>,
}

/// The allocation of `hip` on `device` (current on this thread) that holds
/// `[ptr, ptr + bytes)`: the block's base and length from `hipMemGetAddressRange`, its
/// identity from `HIP_POINTER_ATTRIBUTE_BUFFER_ID`. Host memory, memory the runtime does not
/// know, managed memory, memory of another device and a range that runs past its block are
/// [`Error::InvalidArgument`].
pub(crate) fn find(
    hip: &Hip,
    device: c_int,
    ptr: DevicePtr,
    bytes: usize,
) -> Result<ForeignAllocation> {
    let refused = |why: String| Error::InvalidArgument(format!("{ptr}: {why}"));
    let unknown = || {
        refused(
            "not memory the HIP runtime knows (not from hipMalloc or another HIP \
             allocation: malloc'd, stack or freed memory?)"
                .into(),
        )
    };
    let attr = |a: Attr| hip.pointer_attribute(a, ptr.0)?.ok_or_else(unknown);
    let abi = hip.abi();
    let memory_type = attr(Attr::MemoryType)?;
    if memory_type == u64::from(abi.memory_type_host.0) {
        return Err(refused(
            "host memory (hipHostMalloc or registered), not device memory: legacy IPC cannot \
             share it"
                .into(),
        ));
    }
    if memory_type != u64::from(abi.memory_type_device.0) {
        return Err(refused(format!(
            "not device memory (HIP memory type {memory_type} in the numbering of HIP {}.x)",
            abi.major
        )));
    }
    if attr(Attr::IsManaged)? != 0 {
        return Err(refused(
            "managed memory cannot be shared between processes".into(),
        ));
    }
    // The runtime writes an `int`: the low 32 bits, as signed.
    let owner = attr(Attr::DeviceOrdinal)? as u32 as i32;
    if owner != device {
        return Err(refused(format!(
            "memory of HIP device {owner}, used through device {device}"
        )));
    }
    let id = attr(Attr::BufferId)?;
    let (base, len) = hip.mem_get_address_range(ptr.0)?.ok_or_else(unknown)?;
    let end = ptr.0.checked_add(bytes as u64).ok_or_else(|| {
        refused(format!(
            "{bytes} bytes from there overflow the address space"
        ))
    })?;
    let block_end = base.saturating_add(len as u64);
    if ptr.0 < base || end > block_end {
        return Err(refused(format!(
            "{bytes} bytes (to {end:#x}) run past their allocation ({len} bytes from {base:#x} \
             to {block_end:#x}); a range across two allocations, VMM mappings among them, \
             cannot be shared on ROCm"
        )));
    }
    Ok(ForeignAllocation {
        base: DevicePtr(base),
        len,
        id,
    })
}

impl ForeignExports {
    /// Exports `allocation` (once; later calls return the same handle until released).
    /// `device` must be current on this thread.
    pub(crate) fn export(
        &self,
        hip: &Hip,
        device: c_int,
        allocation: &ForeignAllocation,
    ) -> Result<IpcHandle> {
        // Held across the lookup and the export, so two threads export a block once.
        let mut exports = self.exports.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = exports.get(&allocation.id) {
            return Ok(h.clone());
        }
        // The block may have been freed (and its address reused) since it was found.
        let now = find(hip, device, allocation.base, allocation.len)?;
        if now != *allocation {
            return Err(Error::InvalidArgument(format!(
                "allocation {} at {} was freed",
                allocation.id, allocation.base
            )));
        }
        // SAFETY: `base` is the start of a live block of this runtime on `device` (checked
        // just above); ROCm only records the block in the handle.
        let payload = unsafe { hip.ipc_get_mem_handle(allocation.base.0 as *mut c_void) }.map_err(
            |e| match e {
                Error::Backend { code, .. }
                    if code == i64::from(hip.abi().error_invalid_value.0) =>
                {
                    Error::Unsupported(format!(
                        "allocation of {} bytes at {}: hipIpcGetMemHandle cannot share it \
                         ({e}); the ROCm backend shares hipMalloc blocks only, not VMM memory \
                         (hipMemCreate + hipMemMap, as PyTorch's expandable segments map it)",
                        allocation.len, allocation.base
                    ))
                }
                other => other,
            },
        )?;
        let handle = IpcHandle {
            backend: BackendKind::Rocm,
            kind: IpcHandleKind::RocmLegacy,
            owner_pid: std::process::id(),
            owner_nonce: fd_share::process_nonce(),
            // Serves no descriptor: it only keeps this export's key apart in the importers'
            // caches.
            id: fd_share::next_export_id(),
            len: allocation.len as u64,
            payload,
        };
        exports.insert(allocation.id, handle.clone());
        Ok(handle)
    }

    /// Forgets the export of `allocation`; the next export makes a new handle. Importers
    /// keep what they mapped (a legacy handle holds nothing open here).
    pub(crate) fn release(&self, allocation: &ForeignAllocation) {
        self.exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&allocation.id);
    }
}
