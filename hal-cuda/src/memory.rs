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
    pub(crate) published: Vec<(u64, OwnedFd)>,
}

impl Export {
    /// Withdraws the descriptor from the server (new importers are refused from now on).
    pub(crate) fn withdraw(&mut self) {
        for (id, fd) in self.published.drain(..) {
            fd_share::withdraw(id);
            drop(fd);
        }
    }
}

/// Physical (VMM) payload layout: rounded size (u64 LE), owner's device ordinal (u32 LE),
/// then, for memory mapped as several allocations side by side (a caller's buffer across
/// chunks: PyTorch's expandable segments), each piece's length and the export number its
/// descriptor is served under (u64 LE each), in address order.
pub(crate) const VMM_PAYLOAD_LEN: usize = 12;

/// Most pieces one exported range may have (a 1 GiB tensor in PyTorch's 20 MiB chunks has
/// 52; the bound keeps a malformed payload from asking for a huge number of descriptors).
pub(crate) const MAX_VMM_PIECES: usize = 1024;

/// What a VMM handle's payload says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmmPayload {
    /// Bytes mapped in all (rounded to the granularity).
    pub(crate) size: usize,
    /// The owner's device ordinal.
    pub(crate) owner: u32,
    /// `(length, export number)` of each piece, in address order; empty when the handle's
    /// own export number serves the whole range as one allocation.
    pub(crate) pieces: Vec<(usize, u64)>,
}

impl VmmPayload {
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(VMM_PAYLOAD_LEN + 16 * self.pieces.len());
        out.extend_from_slice(&(self.size as u64).to_le_bytes());
        out.extend_from_slice(&self.owner.to_le_bytes());
        for &(len, id) in &self.pieces {
            out.extend_from_slice(&(len as u64).to_le_bytes());
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }
}

/// Parses a VMM payload; its pieces, when it has any, must add up to its size.
pub(crate) fn parse_vmm_payload(payload: &[u8]) -> Result<VmmPayload> {
    // Only called at offsets the length check below admits.
    let word = |at: usize| -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&payload[at..at + 8]);
        u64::from_le_bytes(w)
    };
    let usize_of = |v: u64| {
        usize::try_from(v)
            .map_err(|_| Error::Ipc("CUDA VMM handle size does not fit this process".into()))
    };
    let tail = payload.len().checked_sub(VMM_PAYLOAD_LEN);
    let count = match tail {
        Some(t) if t % 16 == 0 && t / 16 <= MAX_VMM_PIECES && t / 16 != 1 => t / 16,
        _ => {
            return Err(Error::Ipc(format!(
                "CUDA VMM handle payload is {} bytes, expected {VMM_PAYLOAD_LEN}, or that and \
                 16 per piece for 2 to {MAX_VMM_PIECES} pieces",
                payload.len()
            )))
        }
    };
    let size = usize_of(word(0))?;
    let owner = u32::from_le_bytes([payload[8], payload[9], payload[10], payload[11]]);
    if size == 0 {
        return Err(Error::Ipc("CUDA VMM handle has zero size".into()));
    }
    let mut pieces = Vec::with_capacity(count);
    let mut total = 0usize;
    for i in 0..count {
        let at = VMM_PAYLOAD_LEN + 16 * i;
        let len = usize_of(word(at))?;
        if len == 0 {
            return Err(Error::Ipc(format!(
                "CUDA VMM handle piece {i} has zero size"
            )));
        }
        total = total.saturating_add(len);
        pieces.push((len, word(at + 8)));
    }
    if count > 0 && total != size {
        return Err(Error::Ipc(format!(
            "CUDA VMM handle pieces add up to {total} bytes, not its {size}"
        )));
    }
    Ok(VmmPayload {
        size,
        owner,
        pieces,
    })
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
                (IpcHandleKind::CudaLegacy, h.to_vec(), Vec::new())
            }
            Backing::Physical { handle, size } => {
                // SAFETY: `handle` is live and was created with the POSIX-FD handle type.
                let fd = unsafe { result::export_fd(handle) }?;
                let id = fd_share::next_export_id();
                fd_share::publish(id, fd.as_fd())?;
                let payload = VmmPayload {
                    size,
                    owner: self.ctx.ordinal(),
                    pieces: Vec::new(),
                };
                (
                    IpcHandleKind::CudaPosixFd,
                    payload.to_bytes(),
                    vec![(id, fd)],
                )
            }
        };
        let id = match published.first() {
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
        let whole = parse_vmm_payload(&p).unwrap();
        assert_eq!((whole.size, whole.owner), (4 << 20, 3));
        assert!(whole.pieces.is_empty());
        assert!(matches!(parse_vmm_payload(&p[..11]), Err(Error::Ipc(_))));
        assert!(matches!(parse_vmm_payload(&[0u8; 64]), Err(Error::Ipc(_))));
        assert!(matches!(parse_vmm_payload(&[0u8; 12]), Err(Error::Ipc(_))));

        // Pieces side by side: they round-trip, and must add up to the size.
        let span = VmmPayload {
            size: 6 << 20,
            owner: 1,
            pieces: vec![(2 << 20, 17), (4 << 20, 18)],
        };
        assert_eq!(parse_vmm_payload(&span.to_bytes()).unwrap(), span);
        let short = VmmPayload {
            size: 8 << 20,
            ..span.clone()
        };
        let r = parse_vmm_payload(&short.to_bytes());
        assert!(
            matches!(r, Err(Error::Ipc(ref m)) if m.contains("add up")),
            "{r:?}"
        );
        let empty_piece = VmmPayload {
            size: 2 << 20,
            pieces: vec![(2 << 20, 17), (0, 18)],
            ..span.clone()
        };
        assert!(parse_vmm_payload(&empty_piece.to_bytes()).is_err());
        // One piece is the plain form's job; a cut piece is malformed.
        let mut one = p.clone();
        one.extend_from_slice(&[0u8; 16]);
        assert!(parse_vmm_payload(&one).is_err());
        let bytes = span.to_bytes();
        assert!(parse_vmm_payload(&bytes[..bytes.len() - 8]).is_err());
    }
}
