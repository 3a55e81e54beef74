//! Registration of callers' buffers: [`Communicator::register`] (an oxccl allocation, by
//! every rank), windows ([`Communicator::register_window`]: any range of a caller's
//! allocation, NCCL's `ncclCommWindowRegister`), both into the registry whose views need
//! no exchange per call; and pins ([`Communicator::pin_allocation`], NCCL's
//! `ncclCommRegister`), which keep a caller's allocation in the zero-copy cache of
//! [`super::auto_register`].

use oxccl_backend::AnyMemory;
use oxccl_hal::{Device, DevicePtr, Error, ForeignAllocation, IpcHandle, Memory, Result};
use oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS;

use super::registry::Registered;
use super::Communicator;
use crate::algorithms::{Collective, PeerBuffers};

/// A window's record in the all-gather: its length, its offset in the exported
/// allocation, and the export (empty when this rank's window cannot be shared).
fn window_record(bytes: usize, offset: u64, handle: Option<&IpcHandle>) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    v.extend_from_slice(&(bytes as u64).to_le_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    if let Some(h) = handle {
        v.extend_from_slice(&h.to_bytes());
    }
    v
}

fn parse_window_record(b: &[u8]) -> Result<(u64, u64, Option<IpcHandle>)> {
    let word = |i: usize| -> Result<u64> {
        let s = b
            .get(8 * i..8 * i + 8)
            .ok_or_else(|| Error::Ipc("a peer's window record is malformed".into()))?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    };
    let (len, offset) = (word(0)?, word(1)?);
    let handle = match &b[16..] {
        [] => None,
        rest => Some(IpcHandle::from_bytes(rest)?),
    };
    Ok((len, offset, handle))
}

impl Communicator {
    /// Registers a user buffer for zero-copy allreduce (collective: every rank calls it,
    /// in the same order, with its own buffer of the same role). Exports the allocation,
    /// exchanges the handles and maps every peer's (IPC handle cache). Calls whose input
    /// and output lie 16-byte aligned inside registered buffers, at the same offsets on
    /// every rank, then use the zero-copy two-shot above the zero-copy threshold. Cached
    /// by (pointer, length): registering the same buffer again does nothing.
    ///
    /// The buffer must stay allocated until [`Communicator::deregister`] or the
    /// communicator is dropped (peers map it).
    ///
    /// Ranks on several nodes ([`Communicator::multi_node`]) map nothing: the PortChannel
    /// algorithms copy through their own registered scratch, so registering is a no-op.
    pub fn register(&self, memory: &AnyMemory) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        // Collective: the peers of an aborted communicator may be gone.
        self.check_not_aborted()?;
        let (base, len) = (memory.ptr(), memory.len());
        if self.multi_node {
            tracing::debug!(rank = self.rank, base = %base, len, "ranks on several nodes: nothing to register");
            return Ok(());
        }
        if self.registry.contains(base, len) {
            return Ok(());
        }
        let handle = self.device.export_memory(memory).map_err(at)?;
        let all = self.bootstrap.all_gather(&handle.to_bytes()).map_err(at)?;
        let mut bases = [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut lens = [0u64; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut imports = Vec::with_capacity(all.len().saturating_sub(1));
        for (r, bytes) in all.iter().enumerate() {
            if r == self.rank as usize {
                bases[r] = base;
                lens[r] = len as u64;
                continue;
            }
            let h = IpcHandle::from_bytes(bytes).map_err(at)?;
            let imported = self.device.import_memory(&h).map_err(at)?;
            bases[r] = imported.ptr();
            lens[r] = h.len;
            imports.push(imported);
        }
        tracing::debug!(rank = self.rank, base = %base, len, "registered buffer");
        self.registry.insert(
            base,
            Registered {
                len,
                bases,
                lens,
                _imports: imports,
            },
        );
        Ok(())
    }

    /// Releases a registration (collective). Every stream that used the buffer in an
    /// allreduce must be synchronized first; after it returns, every rank may free its
    /// buffer.
    pub fn deregister(&self, memory: &AnyMemory) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        self.bootstrap.barrier().map_err(at)?;
        drop(self.registry.remove(memory.ptr()));
        // No rank frees its buffer before every peer dropped its mapping.
        self.bootstrap.barrier().map_err(at)
    }

    /// Number of registered buffers.
    pub fn registered_buffers(&self) -> usize {
        self.registry.len()
    }

    /// Registers `[ptr, ptr + bytes)` of a caller's allocation as a window (collective:
    /// every rank calls it, in the same order, with a window of the same length; NCCL's
    /// `ncclCommWindowRegister`). The allocation holding it is exported and mapped by
    /// every peer once; calls whose buffers lie inside windows at the same offset on every
    /// rank then take the zero-copy algorithms with no exchange per call. A window that
    /// cannot be shared on some rank (host memory, a range across two allocations), or
    /// lengths that differ between ranks, are an error on every rank. Ranks on several
    /// nodes map nothing (as [`Communicator::register`]).
    pub fn register_window(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        self.check_not_aborted()?;
        if bytes == 0 {
            return Err(at(Error::InvalidArgument("a window of zero bytes".into())));
        }
        if self.multi_node {
            tracing::debug!(rank = self.rank, %ptr, bytes, "ranks on several nodes: nothing to register");
            return Ok(());
        }
        let mine = self
            .device
            .find_allocation(ptr, bytes)
            .and_then(|a| Ok((a, self.device.export_allocation(&a)?)));
        let record = match &mine {
            Ok((a, h)) => window_record(bytes, a.offset_of(ptr), Some(h)),
            Err(_) => window_record(bytes, 0, None),
        };
        let all = self.bootstrap.all_gather(&record).map_err(at)?;
        let mut peers = Vec::with_capacity(all.len());
        for b in &all {
            peers.push(parse_window_record(b).map_err(at)?);
        }
        if let Err(e) = &mine {
            return Err(at(Error::InvalidArgument(format!(
                "window of {bytes} bytes at {ptr} cannot be shared: {e}"
            ))));
        }
        let unshareable: Vec<usize> = (0..peers.len()).filter(|&r| peers[r].2.is_none()).collect();
        if !unshareable.is_empty() {
            return Err(at(Error::InvalidArgument(format!(
                "window registration: ranks {unshareable:?} passed a window that cannot be shared"
            ))));
        }
        let lens: Vec<u64> = peers.iter().map(|p| p.0).collect();
        if lens.iter().any(|l| *l != bytes as u64) {
            return Err(at(Error::InvalidArgument(format!(
                "window registration with different lengths across ranks: {lens:?} bytes"
            ))));
        }
        let mut bases = [DevicePtr::NULL; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut lens = [0u64; OXCCL_ALLREDUCE_MAX_RANKS as usize];
        let mut imports = Vec::with_capacity(peers.len().saturating_sub(1));
        for (r, (len, offset, handle)) in peers.iter().enumerate() {
            lens[r] = *len;
            if r == self.rank as usize {
                bases[r] = ptr;
                continue;
            }
            let Some(h) = handle else { continue };
            let imported = self.device.import_memory(h).map_err(at)?;
            bases[r] = imported.ptr().offset(*offset as usize).map_err(at)?;
            imports.push(imported);
        }
        tracing::debug!(rank = self.rank, %ptr, bytes, "registered window");
        self.registry.insert(
            ptr,
            Registered {
                len: bytes,
                bases,
                lens,
                _imports: imports,
            },
        );
        Ok(())
    }

    /// Releases a window (collective, as [`Communicator::deregister`]); unknown windows
    /// are an error.
    pub fn deregister_window(&self, ptr: DevicePtr) -> Result<()> {
        let at = |e: Error| e.at_rank(self.rank);
        self.bootstrap.barrier().map_err(at)?;
        let known = self.registry.remove(ptr);
        self.bootstrap.barrier().map_err(at)?;
        match known {
            Some(_) => Ok(()),
            // Ranks on several nodes registered nothing (register_window).
            None if self.multi_node => Ok(()),
            None => Err(at(Error::InvalidArgument(format!(
                "{ptr} is not a registered window"
            )))),
        }
    }

    /// Pins the allocation that holds `[ptr, ptr + bytes)` for zero-copy (NCCL's
    /// `ncclCommRegister`; local, not collective): the peers map it at the first call
    /// that uses it, as for any caller's buffer, and keep it mapped until
    /// [`Communicator::unpin_allocation`]. Host pointers, memory of another device and a
    /// range across two allocations are refused.
    pub fn pin_allocation(&self, ptr: DevicePtr, bytes: usize) -> Result<ForeignAllocation> {
        self.auto
            .pin(&self.device, ptr, bytes)
            .map_err(|e| e.at_rank(self.rank))
    }

    /// Undoes [`Communicator::pin_allocation`]; `false` when it was not pinned.
    pub fn unpin_allocation(&self, allocation: &ForeignAllocation) -> bool {
        self.auto.unpin(allocation)
    }

    /// Allocations mapped or known for zero-copy on unregistered buffers (all ranks').
    pub fn auto_registered(&self) -> usize {
        self.auto.len()
    }
}

impl Communicator {
    /// Every rank's view of this call's registered buffers, those the collective's
    /// zero-copy algorithms reach on the peers ([`Collective::peer_views`]); `None` unless
    /// all of them are registered.
    pub(crate) fn registered_view(
        &self,
        collective: Collective,
        input: DevicePtr,
        output: DevicePtr,
        bytes: usize,
    ) -> Option<PeerBuffers> {
        let (in_bytes, out_bytes) = collective.buffer_bytes(bytes, self.world).ok()?;
        let (inputs, outputs) = collective.peer_views();
        self.registry.peer_buffers(
            inputs.then_some((input, in_bytes)),
            outputs.then_some((output, out_bytes)),
            self.world,
        )
    }
}
