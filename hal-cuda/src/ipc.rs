//! Importing peers' memory: the [`IpcOpener`] behind the device's IPC caches, and the
//! imported-memory type.

use std::sync::Arc;

use cudarc::driver::sys;
use oxccl_hal::{
    fd_share, BackendKind, CachedImport, DevicePtr, Error, IpcHandle, IpcHandleKind, IpcOpener,
    Memory, Result,
};

use crate::device::{Context, FD_FETCH_TIMEOUT};
use crate::memory::{map_physical, parse_vmm_payload, unmap_physical, VmmPayload};
use crate::result;

/// Checks what can be checked without the driver: backend, kind and payload shape.
pub(crate) fn validate_memory_handle(handle: &IpcHandle) -> Result<()> {
    handle.expect_backend(BackendKind::Cuda)?;
    match handle.kind {
        IpcHandleKind::CudaLegacy => {
            if handle.payload.len() != 64 {
                return Err(Error::Ipc(format!(
                    "CUDA legacy IPC handle payload is {} bytes, expected 64",
                    handle.payload.len()
                )));
            }
        }
        IpcHandleKind::CudaPosixFd => {
            let size = parse_vmm_payload(&handle.payload)?.size;
            if (size as u64) < handle.len {
                return Err(Error::Ipc(format!(
                    "CUDA VMM handle maps {size} bytes but claims {} bytes of memory",
                    handle.len
                )));
            }
        }
        other => {
            return Err(Error::Ipc(format!(
                "a {other:?} handle is not CUDA device memory (expected CudaLegacy or CudaPosixFd)"
            )))
        }
    }
    if handle.len == 0 {
        return Err(Error::Ipc("IPC handle of zero bytes".into()));
    }
    Ok(())
}

/// What one import maps.
#[derive(Debug)]
pub struct CudaMapping {
    ptr: sys::CUdeviceptr,
    kind: MappingKind,
}

#[derive(Debug)]
enum MappingKind {
    Legacy,
    Vmm {
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
    },
    /// Several allocations mapped side by side in one reserved range of `size` bytes:
    /// each piece's handle and length, in address order.
    VmmPieces {
        pieces: Vec<(sys::CUmemGenericAllocationHandle, usize)>,
        size: usize,
    },
}

/// Opens and closes imports for one device.
#[derive(Debug, Clone)]
pub struct CudaOpener {
    ctx: Arc<Context>,
    granularity: usize,
}

impl CudaOpener {
    pub(crate) fn new(ctx: Arc<Context>, granularity: usize) -> CudaOpener {
        CudaOpener { ctx, granularity }
    }

    fn open_vmm(&self, handle: &IpcHandle) -> Result<CudaMapping> {
        let payload = parse_vmm_payload(&handle.payload)?;
        if !payload.pieces.is_empty() {
            return self.open_vmm_pieces(handle, &payload);
        }
        let size = payload.size;
        let fd = fd_share::fetch(
            handle.owner_pid,
            handle.owner_nonce,
            handle.id,
            FD_FETCH_TIMEOUT,
        )?;
        let alloc = result::import_fd(&fd)?;
        drop(fd);
        // Access is granted to the importing device: other devices of this process import
        // through their own device objects.
        let ptr = match map_physical(alloc, size, self.granularity, &[self.ctx.device()]) {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the imported handle is ours and mapped nowhere.
                let _ = unsafe { result::mem_release(alloc) };
                return Err(e);
            }
        };
        Ok(CudaMapping {
            ptr,
            kind: MappingKind::Vmm {
                handle: alloc,
                size,
            },
        })
    }

    /// Maps the pieces of a range the owner mapped as several allocations side by side,
    /// side by side here too, so the range reads as one buffer at the same offsets.
    fn open_vmm_pieces(&self, handle: &IpcHandle, payload: &VmmPayload) -> Result<CudaMapping> {
        if let Some((len, _)) = payload
            .pieces
            .iter()
            .find(|(len, _)| len % self.granularity != 0)
        {
            return Err(Error::Ipc(format!(
                "a piece of {len} bytes of a CUDA VMM range is not a multiple of this \
                 device's granularity ({} bytes)",
                self.granularity
            )));
        }
        let ptr = result::mem_address_reserve(payload.size, self.granularity)?;
        let mut pieces = Vec::with_capacity(payload.pieces.len());
        let mapped = (|| {
            let mut at = ptr;
            for &(len, id) in &payload.pieces {
                let fd =
                    fd_share::fetch(handle.owner_pid, handle.owner_nonce, id, FD_FETCH_TIMEOUT)?;
                let alloc = result::import_fd(&fd)?;
                drop(fd);
                // SAFETY: `[at, at + len)` lies in the reservation above, past every piece
                // mapped so far; `alloc` is a live handle of the owner's `len`-byte piece.
                if let Err(e) = unsafe { result::mem_map(at, len, alloc) } {
                    // SAFETY: the imported handle is ours and mapped nowhere.
                    let _ = unsafe { result::mem_release(alloc) };
                    return Err(e);
                }
                pieces.push((alloc, len));
                at += len as u64;
            }
            // SAFETY: the whole reservation is mapped, piece by piece, just above.
            unsafe { result::mem_set_access(ptr, payload.size, &[self.ctx.device()]) }
        })();
        if let Err(e) = mapped {
            // SAFETY: the pieces mapped above are idle (nothing has seen the range yet).
            let _ = unsafe { unmap_pieces(ptr, payload.size, &pieces) };
            return Err(e);
        }
        Ok(CudaMapping {
            ptr,
            kind: MappingKind::VmmPieces {
                pieces,
                size: payload.size,
            },
        })
    }
}

/// Unmaps and releases `pieces`, mapped side by side from `ptr` in a reservation of `size`
/// bytes, and frees the reservation; reports the first failure after trying every step.
///
/// # Safety
/// `pieces` must be what `open_vmm_pieces` mapped from `ptr`, with no work in flight on
/// them; none may be used afterwards.
unsafe fn unmap_pieces(
    ptr: sys::CUdeviceptr,
    size: usize,
    pieces: &[(sys::CUmemGenericAllocationHandle, usize)],
) -> Result<()> {
    let mut outcome = Ok(());
    let mut at = ptr;
    for &(handle, len) in pieces {
        // SAFETY: the caller guarantees this piece is mapped at `at` and idle.
        let unmapped = unsafe { result::mem_unmap(at, len) };
        // SAFETY: the handle is ours and is given up here.
        let released = unsafe { result::mem_release(handle) };
        outcome = outcome.and(unmapped).and(released);
        at += len as u64;
    }
    // SAFETY: every piece of the reservation is unmapped (a failure is reported by this too).
    let freed = unsafe { result::mem_address_free(ptr, size) };
    outcome.and(freed)
}

impl IpcOpener for CudaOpener {
    type Mapping = CudaMapping;

    fn open(&self, handle: &IpcHandle) -> Result<CudaMapping> {
        validate_memory_handle(handle)?;
        self.ctx.bind()?;
        match handle.kind {
            IpcHandleKind::CudaLegacy => {
                let mut bytes = [0u8; 64];
                bytes.copy_from_slice(&handle.payload);
                let ptr = result::ipc_open_mem_handle(&bytes)?;
                Ok(CudaMapping {
                    ptr,
                    kind: MappingKind::Legacy,
                })
            }
            _ => self.open_vmm(handle),
        }
    }

    fn close(&self, mapping: &CudaMapping) -> Result<()> {
        self.ctx.bind()?;
        match mapping.kind {
            // SAFETY: the cache closes each mapping exactly once, after its last user.
            MappingKind::Legacy => unsafe { result::ipc_close_mem_handle(mapping.ptr) },
            // SAFETY: as above; the mapping was made by `map_physical` for `handle`.
            MappingKind::Vmm { handle, size } => unsafe {
                unmap_physical(mapping.ptr, size, handle)
            },
            // SAFETY: as above; the pieces were mapped by `open_vmm_pieces` from `ptr`.
            MappingKind::VmmPieces { ref pieces, size } => unsafe {
                unmap_pieces(mapping.ptr, size, pieces)
            },
        }
    }
}

/// A peer's memory mapped into this process. Clones share the mapping; it is closed when
/// the last clone drops.
#[derive(Debug, Clone)]
pub struct CudaImported {
    import: CachedImport<CudaOpener>,
    len: usize,
}

impl CudaImported {
    pub(crate) fn new(import: CachedImport<CudaOpener>, len: u64) -> Result<CudaImported> {
        let len = usize::try_from(len)
            .map_err(|_| Error::Ipc(format!("imported length {len} does not fit usize")))?;
        Ok(CudaImported { import, len })
    }
}

impl Memory for CudaImported {
    fn ptr(&self) -> DevicePtr {
        DevicePtr(self.import.mapping().ptr)
    }

    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(kind: IpcHandleKind, payload: Vec<u8>) -> IpcHandle {
        IpcHandle {
            backend: BackendKind::Cuda,
            kind,
            owner_pid: 1,
            owner_nonce: 2,
            id: 3,
            len: 4096,
            payload,
        }
    }

    fn vmm_payload(size: u64) -> Vec<u8> {
        let mut p = size.to_le_bytes().to_vec();
        p.extend_from_slice(&0u32.to_le_bytes());
        p
    }

    #[test]
    fn handle_kinds_and_payloads_are_validated_before_the_driver() {
        assert!(validate_memory_handle(&handle(IpcHandleKind::CudaLegacy, vec![0; 64])).is_ok());
        assert!(
            validate_memory_handle(&handle(IpcHandleKind::CudaPosixFd, vmm_payload(2 << 20)))
                .is_ok()
        );

        for (kind, payload) in [
            (IpcHandleKind::CudaLegacy, vec![0; 63]),
            (IpcHandleKind::CudaPosixFd, vec![0; 64]),
            (IpcHandleKind::CudaPosixFd, vmm_payload(1024)),
            (IpcHandleKind::CudaMulticastFd, vmm_payload(2 << 20)),
            (IpcHandleKind::HostMemfd, vec![]),
            (IpcHandleKind::RocmLegacy, vec![0; 64]),
        ] {
            let r = validate_memory_handle(&handle(kind, payload));
            assert!(matches!(r, Err(Error::Ipc(_))), "{kind:?}: {r:?}");
        }

        let mut foreign = handle(IpcHandleKind::CudaLegacy, vec![0; 64]);
        foreign.backend = BackendKind::Rocm;
        let r = validate_memory_handle(&foreign);
        assert!(
            matches!(r, Err(Error::Ipc(ref m)) if m.contains("ROCm")),
            "{r:?}"
        );

        let mut empty = handle(IpcHandleKind::CudaLegacy, vec![0; 64]);
        empty.len = 0;
        assert!(matches!(validate_memory_handle(&empty), Err(Error::Ipc(_))));
    }
}
