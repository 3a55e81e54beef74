//! Device allocations (plain and physical/VMM) and pinned, mapped host memory.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use oxccl_hal::{
    fd_share, BackendKind, DevicePtr, Error, HostVisible, IpcHandle, IpcHandleKind, Memory,
    MemoryKind, Result,
};

use crate::device::{lock_mutex, round_up, Context};
use crate::result;

/// How an allocation was made, and what freeing it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    /// `cuMemAlloc`; freed with `cuMemFree`.
    Plain,
    /// `cuMemCreate` mapped into a reserved range of `size` (rounded) bytes.
    Physical {
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
    },
}

/// A published export: the handle others receive and, for VMM memory, the descriptor the
/// descriptor server hands out until it is withdrawn.
#[derive(Debug)]
pub(crate) struct Export {
    pub(crate) handle: IpcHandle,
    pub(crate) published: Option<(u64, OwnedFd)>,
}

impl Export {
    /// Withdraws the descriptor from the server (new importers are refused from now on).
    pub(crate) fn withdraw(&mut self) {
        if let Some((id, fd)) = self.published.take() {
            fd_share::withdraw(id);
            drop(fd);
        }
    }
}

/// Physical (VMM) payload layout: rounded size (u64 LE), owner's device ordinal (u32 LE).
pub(crate) const VMM_PAYLOAD_LEN: usize = 12;

/// Parses a VMM payload into (rounded size, owner device).
pub(crate) fn parse_vmm_payload(payload: &[u8]) -> Result<(usize, u32)> {
    let bytes: &[u8; VMM_PAYLOAD_LEN] = payload.try_into().map_err(|_| {
        Error::Ipc(format!(
            "CUDA VMM handle payload is {} bytes, expected {VMM_PAYLOAD_LEN}",
            payload.len()
        ))
    })?;
    let mut size = [0u8; 8];
    size.copy_from_slice(&bytes[..8]);
    let size = usize::try_from(u64::from_le_bytes(size))
        .map_err(|_| Error::Ipc("CUDA VMM handle size does not fit this process".into()))?;
    let owner = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    if size == 0 {
        return Err(Error::Ipc("CUDA VMM handle has zero size".into()));
    }
    Ok((size, owner))
}

/// Reserves an address range, maps `handle` into it and grants access to `access`; undoes
/// what it did when a step fails. Returns the address.
pub(crate) fn map_physical(
    handle: sys::CUmemGenericAllocationHandle,
    size: usize,
    align: usize,
    access: &[sys::CUdevice],
) -> Result<sys::CUdeviceptr> {
    let ptr = result::mem_address_reserve(size, align)?;
    // SAFETY: `ptr`/`size` was just reserved and `handle` covers `size` bytes.
    if let Err(e) = unsafe { result::mem_map(ptr, size, handle) } {
        // SAFETY: the reservation is unmapped.
        let _ = unsafe { result::mem_address_free(ptr, size) };
        return Err(e);
    }
    // SAFETY: the range is mapped.
    if let Err(e) = unsafe { result::mem_set_access(ptr, size, access) } {
        // SAFETY: the range is mapped and nothing has used it yet.
        let _ = unsafe { result::mem_unmap(ptr, size) };
        // SAFETY: the reservation is now unmapped.
        let _ = unsafe { result::mem_address_free(ptr, size) };
        return Err(e);
    }
    Ok(ptr)
}

/// Undoes [`map_physical`] and releases this process's reference to `handle`.
///
/// # Safety
/// `ptr`/`size` must be a mapping made by [`map_physical`] for `handle`, with no work in
/// flight on it; neither may be used afterwards.
pub(crate) unsafe fn unmap_physical(
    ptr: sys::CUdeviceptr,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<()> {
    // SAFETY: the caller guarantees the mapping is idle and no longer used.
    let unmapped = unsafe { result::mem_unmap(ptr, size) };
    // SAFETY: the caller gives up the handle.
    let released = unsafe { result::mem_release(handle) };
    // SAFETY: the range is unmapped (if unmapping failed, freeing fails too and is reported).
    let freed = unsafe { result::mem_address_free(ptr, size) };
    unmapped.and(released).and(freed)
}

/// Device memory owned by this process; freed on drop.
#[derive(Debug)]
pub struct CudaMemory {
    ctx: Arc<Context>,
    ptr: sys::CUdeviceptr,
    len: usize,
    backing: Backing,
    export: Mutex<Option<Export>>,
}

impl CudaMemory {
    pub(crate) fn plain(ctx: Arc<Context>, bytes: usize) -> Result<CudaMemory> {
        let ptr = result::mem_alloc(bytes)?;
        Ok(CudaMemory {
            ctx,
            ptr,
            len: bytes,
            backing: Backing::Plain,
            export: Mutex::new(None),
        })
    }

    pub(crate) fn physical(
        ctx: Arc<Context>,
        bytes: usize,
        granularity: usize,
        access: &[sys::CUdevice],
        rdma: bool,
    ) -> Result<CudaMemory> {
        let size = round_up(bytes, granularity)?;
        let prop = result::device_alloc_prop(ctx.device(), rdma);
        let handle = result::mem_create(size, &prop)?;
        let ptr = match map_physical(handle, size, granularity, access) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the handle is ours and mapped nowhere.
                let _ = unsafe { result::mem_release(handle) };
                return Err(e);
            }
        };
        Ok(CudaMemory {
            ctx,
            ptr,
            len: bytes,
            backing: Backing::Physical { handle, size },
            export: Mutex::new(None),
        })
    }

    /// Which kind of allocation this is (`Physical` covers `Coherent`).
    pub fn kind(&self) -> MemoryKind {
        match self.backing {
            Backing::Plain => MemoryKind::Plain,
            Backing::Physical { .. } => MemoryKind::Physical,
        }
    }

    /// Bytes actually reserved (rounded to the granularity for physical allocations).
    pub fn allocated_len(&self) -> usize {
        match self.backing {
            Backing::Plain => self.len,
            Backing::Physical { size, .. } => size,
        }
    }

    pub(crate) fn requested_len(&self) -> usize {
        self.len
    }

    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn backing(&self) -> Backing {
        self.backing
    }

    /// Exports this allocation (once; later calls return the same handle).
    pub(crate) fn export(&self) -> Result<IpcHandle> {
        let mut slot = lock_mutex(&self.export);
        if let Some(e) = slot.as_ref() {
            return Ok(e.handle.clone());
        }
        let (kind, payload, published) = match self.backing {
            Backing::Plain => {
                // SAFETY: `self.ptr` is a live cuMemAlloc allocation.
                let h = unsafe { result::ipc_get_mem_handle(self.ptr) }?;
                (IpcHandleKind::CudaLegacy, h.to_vec(), None)
            }
            Backing::Physical { handle, size } => {
                // SAFETY: `handle` is live and was created with the POSIX-FD handle type.
                let fd = unsafe { result::export_fd(handle) }?;
                let id = fd_share::next_export_id();
                fd_share::publish(id, fd.as_fd())?;
                let mut payload = Vec::with_capacity(VMM_PAYLOAD_LEN);
                payload.extend_from_slice(&(size as u64).to_le_bytes());
                payload.extend_from_slice(&self.ctx.ordinal().to_le_bytes());
                (IpcHandleKind::CudaPosixFd, payload, Some((id, fd)))
            }
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
            len: self.len as u64,
            payload,
        };
        *slot = Some(Export {
            handle: handle.clone(),
            published,
        });
        Ok(handle)
    }
}

impl Memory for CudaMemory {
    fn ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr)
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if let Some(mut e) = lock_mutex(&self.export).take() {
            e.withdraw();
        }
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(error = %e, "binding the context to free device memory");
        }
        let freed = match self.backing {
            // SAFETY: `ptr` is our live allocation and is not used after this.
            Backing::Plain => unsafe { result::mem_free(self.ptr) },
            // SAFETY: as above, for the mapping and the handle made in `physical`.
            Backing::Physical { handle, size } => unsafe { unmap_physical(self.ptr, size, handle) },
        };
        if let Err(e) = freed {
            tracing::warn!(error = %e, ptr = self.ptr, "freeing device memory failed");
        }
    }
}

/// Pinned host memory mapped into the device's address space; freed on drop.
///
/// [`Memory::ptr`] is the address kernels use; [`HostVisible::host_ptr`] the host's. The
/// bytes start out zeroed.
#[derive(Debug)]
pub struct CudaHostMemory {
    ctx: Arc<Context>,
    host: *mut std::ffi::c_void,
    device: sys::CUdeviceptr,
    len: usize,
}

// SAFETY: the allocation is plain pinned memory owned by this value; the raw pointer is only
// an address, and concurrent access to the bytes is the users' business (as with any device
// memory).
unsafe impl Send for CudaHostMemory {}
// SAFETY: as above; `&self` methods only read the addresses.
unsafe impl Sync for CudaHostMemory {}

impl CudaHostMemory {
    pub(crate) fn new(ctx: Arc<Context>, bytes: usize) -> Result<CudaHostMemory> {
        let host = result::mem_host_alloc(bytes)?;
        // SAFETY: `host` is a fresh allocation of `bytes` bytes.
        unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
        // SAFETY: `host` is live, mapped (DEVICEMAP) pinned memory.
        let device = match unsafe { result::mem_host_device_pointer(host) } {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: `host` is ours and unused.
                let _ = unsafe { result::mem_free_host(host) };
                return Err(e);
            }
        };
        Ok(CudaHostMemory {
            ctx,
            host,
            device,
            len: bytes,
        })
    }
}

impl Memory for CudaHostMemory {
    fn ptr(&self) -> DevicePtr {
        DevicePtr(self.device)
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl HostVisible for CudaHostMemory {
    fn host_ptr(&self) -> *mut u8 {
        self.host.cast()
    }
}

impl Drop for CudaHostMemory {
    fn drop(&mut self) {
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(error = %e, "binding the context to free host memory");
        }
        // SAFETY: `host` is our live allocation and is not used after this.
        if let Err(e) = unsafe { result::mem_free_host(self.host) } {
            tracing::warn!(error = %e, "freeing pinned host memory failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmm_payload_is_validated() {
        let mut p = Vec::new();
        p.extend_from_slice(&(4u64 << 20).to_le_bytes());
        p.extend_from_slice(&3u32.to_le_bytes());
        assert_eq!(parse_vmm_payload(&p).ok(), Some((4 << 20, 3)));
        assert!(matches!(parse_vmm_payload(&p[..11]), Err(Error::Ipc(_))));
        assert!(matches!(parse_vmm_payload(&[0u8; 64]), Err(Error::Ipc(_))));
        assert!(matches!(parse_vmm_payload(&[0u8; 12]), Err(Error::Ipc(_))));
    }
}
