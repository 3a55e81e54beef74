//! Callers' buffers: finding the allocation that holds one (`cuMemGetAddressRange`, the
//! pointer attributes) and exporting it, for zero-copy on memory oxccl did not allocate
//! (PyTorch's caching allocator: `cudaMalloc` blocks, or VMM chunks with expandable
//! segments).
//!
//! A `cudaMalloc` block is exported with a legacy IPC handle. A VMM chunk is exported as a
//! POSIX file descriptor when it was created shareable that way; others are refused with a
//! clear error (the caller then copies through its own memory instead).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

use cudarc::driver::sys;
use oxccl_hal::{
    fd_share, BackendKind, DevicePtr, Error, ForeignAllocation, IpcHandle, IpcHandleKind, Result,
    SpanIds,
};

use crate::device::{lock_mutex, Context};
use crate::memory::{Export, VmmPayload, MAX_VMM_PIECES};
use crate::result;

use sys::CUpointer_attribute as Attr;

/// Exports of callers' allocations made through one device, by allocation identity, and
/// the identities given to ranges across several VMM allocations.
#[derive(Debug, Default)]
pub(crate) struct ForeignExports {
    exports: Mutex<HashMap<u64, Export>>,
    spans: SpanIds,
}

/// One allocation of the driver (a `cuMemAlloc` block or one VMM mapping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    base: u64,
    len: usize,
    id: u64,
    /// VMM memory (mapped by the caller with `cuMemMap`), which may lie beside other VMM
    /// mappings as one range; a `cuMemAlloc` block (legacy IPC) may not.
    vmm: bool,
}

impl Piece {
    fn end(&self) -> u64 {
        self.base + self.len as u64
    }
}

/// The allocation on `ctx`'s device that holds `ptr` (two driver queries).
fn piece_at(ctx: &Context, ptr: DevicePtr) -> Result<Piece> {
    let not_device = |why: String| Error::InvalidArgument(format!("{ptr}: {why}"));
    let facts = result::pointer_facts(ptr.0)?;
    if facts.memory_type == 0 {
        return Err(not_device("not memory the CUDA driver knows".into()));
    }
    if facts.memory_type != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Err(not_device(format!(
            "not device memory (CUDA memory type {})",
            facts.memory_type
        )));
    }
    if facts.managed {
        return Err(not_device(
            "managed memory cannot be shared between processes".into(),
        ));
    }
    if u32::try_from(facts.device_ordinal).ok() != Some(ctx.ordinal()) {
        return Err(not_device(format!(
            "memory of CUDA device {}, used through device {}",
            facts.device_ordinal,
            ctx.ordinal()
        )));
    }
    let (base, len) = result::mem_get_address_range(ptr.0)?;
    Ok(Piece {
        base,
        len,
        id: facts.buffer_id,
        vmm: !facts.legacy_ipc,
    })
}

impl ForeignExports {
    /// The allocation on `ctx`'s device that holds `[ptr, ptr + bytes)`: one driver
    /// allocation, or VMM allocations mapped side by side (PyTorch's expandable segments
    /// map a segment chunk by chunk, and a tensor may cross chunks), given one identity
    /// per sequence of driver allocations.
    pub(crate) fn find(
        &self,
        ctx: &Context,
        ptr: DevicePtr,
        bytes: usize,
    ) -> Result<ForeignAllocation> {
        Ok(self.find_pieces(ctx, ptr, bytes)?.0)
    }

    /// [`ForeignExports::find`], with the driver allocations it covers.
    fn find_pieces(
        &self,
        ctx: &Context,
        ptr: DevicePtr,
        bytes: usize,
    ) -> Result<(ForeignAllocation, Vec<Piece>)> {
        ctx.bind()?;
        let first = piece_at(ctx, ptr)?;
        let end = ptr.0.checked_add(bytes as u64).ok_or_else(|| {
            Error::InvalidArgument(format!("{bytes} bytes at {ptr} overflow the address space"))
        })?;
        let past_the_end = |why: &str| {
            Error::InvalidArgument(format!(
                "{ptr}: {bytes} bytes run past the end of their allocation ({} bytes at \
                 {:#x}){why}",
                first.len, first.base
            ))
        };
        if end <= first.end() {
            let whole = ForeignAllocation {
                base: DevicePtr(first.base),
                len: first.len,
                id: first.id,
            };
            return Ok((whole, vec![first]));
        }
        if !first.vmm {
            return Err(past_the_end(""));
        }
        let mut pieces = vec![first];
        let mut at = first.end();
        while at < end {
            if pieces.len() == MAX_VMM_PIECES {
                return Err(past_the_end(&format!(
                    " and over more than {MAX_VMM_PIECES} VMM mappings"
                )));
            }
            let next = piece_at(ctx, DevicePtr(at)).map_err(|e| {
                past_the_end(&format!(", and what follows it is not shareable: {e}"))
            })?;
            if next.base != at || !next.vmm {
                return Err(past_the_end(&format!(
                    ", and what follows it at {at:#x} is not a VMM mapping of its own"
                )));
            }
            at = next.end();
            pieces.push(next);
        }
        let len = (at - first.base) as usize;
        let id = self
            .spans
            .id_of(&pieces.iter().map(|p| p.id).collect::<Vec<_>>());
        let span = ForeignAllocation {
            base: DevicePtr(first.base),
            len,
            id,
        };
        Ok((span, pieces))
    }

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
        let (now, pieces) = self.find_pieces(ctx, allocation.base, allocation.len)?;
        if now != *allocation {
            return Err(Error::InvalidArgument(format!(
                "allocation {} at {} was freed",
                allocation.id, allocation.base
            )));
        }
        let (kind, payload, published) = if let [Piece {
            vmm: false, base, ..
        }] = pieces[..]
        {
            // SAFETY: `base` is the start of a live cuMemAlloc allocation (checked above).
            let h = unsafe { result::ipc_get_mem_handle(base) }?;
            (IpcHandleKind::CudaLegacy, h.to_vec(), Vec::new())
        } else {
            let published = publish_vmm_pieces(&pieces)?;
            let payload = VmmPayload {
                size: allocation.len,
                owner: ctx.ordinal(),
                // One allocation travels in the plain form, under its one export number.
                pieces: if pieces.len() > 1 {
                    pieces
                        .iter()
                        .zip(&published)
                        .map(|(p, (id, _))| (p.len, *id))
                        .collect()
                } else {
                    Vec::new()
                },
            };
            (IpcHandleKind::CudaPosixFd, payload.to_bytes(), published)
        };
        // Several pieces: the handle's own number names the whole range (in the importers'
        // caches) and serves no descriptor.
        let id = match published.as_slice() {
            [(id, _)] => *id,
            _ => fd_share::next_export_id(),
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

/// Descriptors for the VMM `pieces` of a caller's range, each served under its own export
/// number; on failure none stays served.
fn publish_vmm_pieces(pieces: &[Piece]) -> Result<Vec<(u64, OwnedFd)>> {
    let mut published = Vec::with_capacity(pieces.len());
    for piece in pieces {
        let served = export_vmm_piece(piece).and_then(|fd| {
            let id = fd_share::next_export_id();
            fd_share::publish(id, fd.as_fd())?;
            Ok((id, fd))
        });
        match served {
            Ok(p) => published.push(p),
            Err(e) => {
                for (id, _) in published {
                    fd_share::withdraw(id);
                }
                return Err(e);
            }
        }
    }
    Ok(published)
}

/// A descriptor for one VMM piece of a caller's range, or why it cannot be shared.
fn export_vmm_piece(piece: &Piece) -> Result<OwnedFd> {
    // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR's bit in the allowed-types mask.
    let posix_fd = 0x1_u64;
    let allowed: u64 =
        result::pointer_attribute(Attr::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, piece.base)?;
    if allowed & posix_fd == 0 {
        return Err(Error::Unsupported(format!(
            "the VMM allocation at {:#x} was not created shareable as a POSIX file \
             descriptor (allowed handle types {allowed:#x}), so no other process can map it",
            piece.base
        )));
    }
    let handle = result::mem_retain_allocation_handle(piece.base)?;
    // SAFETY: `handle` is live (retained above) and allows the POSIX-FD type.
    let fd = unsafe { result::export_fd(handle) };
    // SAFETY: the retain above is ours; the importers' mappings keep the allocation alive.
    let released = unsafe { result::mem_release(handle) };
    let fd = fd?;
    released?;
    Ok(fd)
}
