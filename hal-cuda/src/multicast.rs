//! Multicast (NVLink SHARP) objects.
//!
//! Nothing here runs unless the caller passed the multicast gate
//! ([`oxccl_hal::multicast_gate`]): [`crate::CudaDevice`] checks it before it calls
//! [`CudaMulticast::create`] or [`CudaMulticast::import`].

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use oxccl_hal::{
    fd_share, BackendKind, DeviceId, DevicePtr, Error, IpcHandle, IpcHandleKind, Multicast, Result,
};

use crate::device::{lock_mutex, round_up, Context, CudaBackend, FD_FETCH_TIMEOUT};
use crate::memory::{Backing, CudaMemory, Export};
use crate::result;

/// Multicast payload layout: rounded size (u64 LE), granularity (u64 LE).
const MC_PAYLOAD_LEN: usize = 16;

fn parse_payload(payload: &[u8]) -> Result<(usize, usize)> {
    if payload.len() != MC_PAYLOAD_LEN {
        return Err(Error::Ipc(format!(
            "CUDA multicast handle payload is {} bytes, expected {MC_PAYLOAD_LEN}",
            payload.len()
        )));
    }
    let word = |at: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&payload[at..at + 8]);
        usize::try_from(u64::from_le_bytes(w))
            .map_err(|_| Error::Ipc("CUDA multicast handle field does not fit usize".into()))
    };
    let (size, gran) = (word(0)?, word(8)?);
    if size == 0 || gran == 0 || size % gran != 0 {
        return Err(Error::Ipc(format!(
            "CUDA multicast handle has size {size} and granularity {gran}"
        )));
    }
    Ok((size, gran))
}

/// One member's view of a multicast object; unmapped, unbound and released on drop.
///
/// Memory bound with [`Multicast::bind`] must outlive this object.
#[derive(Debug)]
pub struct CudaMulticast {
    ctx: Arc<Context>,
    handle: sys::CUmemGenericAllocationHandle,
    size: usize,
    granularity: usize,
    mapping: Mutex<Option<sys::CUdeviceptr>>,
    bindings: Mutex<Vec<(usize, usize)>>,
    export: Mutex<Option<Export>>,
}

impl CudaMulticast {
    /// Creates the object. Callers must have passed the multicast gate.
    pub(crate) fn create(ctx: Arc<Context>, bytes: usize, members: u32) -> Result<CudaMulticast> {
        if bytes == 0 || members == 0 {
            return Err(Error::InvalidArgument(format!(
                "multicast of {bytes} bytes for {members} members"
            )));
        }
        let mut prop = result::multicast_prop(members, bytes);
        let granularity = result::multicast_granularity(&prop)?;
        let size = round_up(bytes, granularity)?;
        prop.size = size;
        let handle = result::multicast_create(&prop)?;
        Ok(CudaMulticast {
            ctx,
            handle,
            size,
            granularity,
            mapping: Mutex::new(None),
            bindings: Mutex::new(Vec::new()),
            export: Mutex::new(None),
        })
    }

    /// Joins an object exported by another process. Callers must have passed the gate.
    pub(crate) fn import(ctx: Arc<Context>, handle: &IpcHandle) -> Result<CudaMulticast> {
        handle.expect_backend(BackendKind::Cuda)?;
        if handle.kind != IpcHandleKind::CudaMulticastFd {
            return Err(Error::Ipc(format!(
                "a {:?} handle is not a CUDA multicast object",
                handle.kind
            )));
        }
        let (size, granularity) = parse_payload(&handle.payload)?;
        let fd = fd_share::fetch(
            handle.owner_pid,
            handle.owner_nonce,
            handle.id,
            FD_FETCH_TIMEOUT,
        )?;
        let mc = result::import_fd(&fd)?;
        Ok(CudaMulticast {
            ctx,
            handle: mc,
            size,
            granularity,
            mapping: Mutex::new(None),
            bindings: Mutex::new(Vec::new()),
            export: Mutex::new(None),
        })
    }

    /// Exports the object (once; later calls return the same handle).
    pub(crate) fn export(&self) -> Result<IpcHandle> {
        let mut slot = lock_mutex(&self.export);
        if let Some(e) = slot.as_ref() {
            return Ok(e.handle.clone());
        }
        // SAFETY: the handle is live and was made (or imported) with the POSIX-FD type.
        let fd = unsafe { result::export_fd(self.handle) }?;
        let id = fd_share::next_export_id();
        fd_share::publish(id, fd.as_fd())?;
        let mut payload = Vec::with_capacity(MC_PAYLOAD_LEN);
        payload.extend_from_slice(&(self.size as u64).to_le_bytes());
        payload.extend_from_slice(&(self.granularity as u64).to_le_bytes());
        let handle = IpcHandle {
            backend: BackendKind::Cuda,
            kind: IpcHandleKind::CudaMulticastFd,
            owner_pid: std::process::id(),
            owner_nonce: fd_share::process_nonce(),
            id,
            len: self.size as u64,
            payload,
        };
        *slot = Some(Export {
            handle: handle.clone(),
            published: vec![(id, fd)],
        });
        Ok(handle)
    }
}

impl Multicast<CudaBackend> for CudaMulticast {
    fn len(&self) -> usize {
        self.size
    }

    fn add_device(&self, device: DeviceId) -> Result<()> {
        self.ctx.bind()?;
        let dev = result::device_get(device.0)?;
        // SAFETY: the multicast handle is live.
        unsafe { result::multicast_add_device(self.handle, dev) }
    }

    fn bind(&self, memory: &CudaMemory, offset: usize) -> Result<()> {
        let Backing::Physical { handle, size } = memory.backing() else {
            return Err(Error::InvalidArgument(
                "multicast binds physical (VMM) memory, not a plain allocation".into(),
            ));
        };
        if offset % self.granularity != 0
            || offset.checked_add(size).is_none_or(|end| end > self.size)
        {
            return Err(Error::InvalidArgument(format!(
                "binding {size} bytes at offset {offset} into a {}-byte multicast object \
                 (granularity {})",
                self.size, self.granularity
            )));
        }
        self.ctx.bind()?;
        // SAFETY: both handles are live; the range was checked above.
        unsafe { result::multicast_bind_mem(self.handle, offset, handle, size) }?;
        lock_mutex(&self.bindings).push((offset, size));
        Ok(())
    }

    fn map(&self) -> Result<DevicePtr> {
        let mut mapping = lock_mutex(&self.mapping);
        if let Some(p) = *mapping {
            return Ok(DevicePtr(p));
        }
        self.ctx.bind()?;
        let ptr = result::mem_address_reserve(self.size, self.granularity)?;
        // SAFETY: fresh reservation of `size` bytes; the object is `size` bytes.
        if let Err(e) = unsafe { result::mem_map(ptr, self.size, self.handle) } {
            // SAFETY: the reservation is unmapped.
            let _ = unsafe { result::mem_address_free(ptr, self.size) };
            return Err(e);
        }
        // SAFETY: the range is mapped.
        if let Err(e) = unsafe { result::mem_set_access(ptr, self.size, &[self.ctx.device()]) } {
            // SAFETY: mapped and unused.
            let _ = unsafe { result::mem_unmap(ptr, self.size) };
            // SAFETY: now unmapped.
            let _ = unsafe { result::mem_address_free(ptr, self.size) };
            return Err(e);
        }
        *mapping = Some(ptr);
        Ok(DevicePtr(ptr))
    }
}

impl Drop for CudaMulticast {
    fn drop(&mut self) {
        if let Some(mut e) = lock_mutex(&self.export).take() {
            e.withdraw();
        }
        if let Err(e) = self.ctx.bind() {
            tracing::warn!(error = %e, "binding the context to free a multicast object");
        }
        if let Some(ptr) = lock_mutex(&self.mapping).take() {
            // SAFETY: our mapping of the object; not used after this.
            let r = unsafe { result::mem_unmap(ptr, self.size) }
                // SAFETY: unmapped just above.
                .and_then(|()| unsafe { result::mem_address_free(ptr, self.size) });
            if let Err(e) = r {
                tracing::warn!(error = %e, "unmapping a multicast object failed");
            }
        }
        for (offset, size) in std::mem::take(&mut *lock_mutex(&self.bindings)) {
            let dev = self.ctx.device();
            // SAFETY: this binding was made by `bind` on this device.
            let unbound = unsafe { result::multicast_unbind(self.handle, dev, offset, size) };
            if let Err(e) = unbound {
                tracing::warn!(error = %e, "unbinding multicast memory failed");
            }
        }
        // SAFETY: the handle is ours and not used after this.
        if let Err(e) = unsafe { result::mem_release(self.handle) } {
            tracing::warn!(error = %e, "releasing a multicast object failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_payload_is_validated() {
        let mut p = (4u64 << 20).to_le_bytes().to_vec();
        p.extend_from_slice(&(2u64 << 20).to_le_bytes());
        assert_eq!(parse_payload(&p).ok(), Some((4 << 20, 2 << 20)));
        assert!(matches!(parse_payload(&p[..8]), Err(Error::Ipc(_))));
        let mut odd = (3u64 << 20).to_le_bytes().to_vec();
        odd.extend_from_slice(&(2u64 << 20).to_le_bytes());
        assert!(matches!(parse_payload(&odd), Err(Error::Ipc(_))));
        assert!(matches!(parse_payload(&[0u8; 16]), Err(Error::Ipc(_))));
    }
}
