//! The allocation behind a registration or a semaphore: device memory, or pinned host
//! memory that the device maps.
//!
//! A TCP peer moves host memory in place: the sender's socket reads it, the receiver's
//! socket writes it, and an update is one atomic store. Device memory of a GPU has to go
//! through bounce buffers and a stream instead (a copy out, a copy in, and a stream
//! synchronization before every signal). So the PortChannel machinery keeps what only TCP
//! peers touch in [`Backing::HostMapped`] memory, which kernels read and write through its
//! device mapping.

use std::sync::Arc;

use oxccl_backend::{AnyDevice, AnyHostMemory, AnyMemory};
use oxccl_hal::{BackendKind, Device, DevicePtr, HostVisible, Memory, MemoryKind, Result, Stream};

/// Where an allocation lives (see the module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub enum Backing {
    /// Device memory (on the host backend, host memory that stands in for it).
    Device(Arc<AnyMemory>),
    /// Pinned host memory mapped for the device.
    HostMapped(Arc<AnyHostMemory>),
}

impl Backing {
    /// Allocates `bytes` of zeroed memory: pinned host memory when `host_mapped`, else
    /// device memory of `kind`.
    pub fn zeroed(
        device: &AnyDevice,
        bytes: usize,
        kind: MemoryKind,
        host_mapped: bool,
    ) -> Result<Backing> {
        if host_mapped {
            let memory = device.alloc_host(bytes)?;
            // Not every backend clears pinned memory (HIP does not).
            // SAFETY: the allocation was just made, is `bytes` long and nothing else uses it.
            unsafe { std::ptr::write_bytes(memory.host_ptr(), 0, bytes) };
            return Ok(Backing::HostMapped(Arc::new(memory)));
        }
        Ok(Backing::Device(zeroed_device(device, bytes, kind)?))
    }

    /// First byte, as the device sees it.
    pub fn ptr(&self) -> DevicePtr {
        match self {
            Backing::Device(m) => m.ptr(),
            Backing::HostMapped(m) => m.ptr(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Backing::Device(m) => m.len(),
            Backing::HostMapped(m) => m.len(),
        }
    }

    /// Whether the allocation is empty (never true for a live one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The backend that made the allocation.
    pub fn backend(&self) -> BackendKind {
        match self {
            Backing::Device(m) => m.backend(),
            Backing::HostMapped(m) => m.backend(),
        }
    }

    /// The host address of the first byte, where the host can address the allocation:
    /// pinned host memory, and the host backend's memory; `None` for GPU device memory.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        match self {
            Backing::Device(m) => match m.as_ref() {
                AnyMemory::Host(h) => Some(h.host_ptr()),
                #[allow(unreachable_patterns)]
                _ => None,
            },
            Backing::HostMapped(m) => Some(m.host_ptr()),
        }
    }

    /// The device memory, when that is what this is (IPC exports only device memory).
    pub fn device_memory(&self) -> Option<&Arc<AnyMemory>> {
        match self {
            Backing::Device(m) => Some(m),
            Backing::HostMapped(_) => None,
        }
    }
}

/// Allocates `bytes` of device memory of `kind` and zeroes it (a GPU allocation starts
/// undefined; the host backend's starts zeroed).
pub(crate) fn zeroed_device(
    device: &AnyDevice,
    bytes: usize,
    kind: MemoryKind,
) -> Result<Arc<AnyMemory>> {
    let memory = device.alloc(bytes, kind)?;
    if Device::backend(device) != BackendKind::Host {
        let stream = device.create_stream()?;
        // SAFETY: the allocation was just made, is `bytes` long and outlives the fill,
        // which is synchronized right below.
        unsafe { stream.fill(memory.ptr(), 0, bytes) }?;
        stream.synchronize()?;
    }
    Ok(Arc::new(memory))
}

impl From<Arc<AnyMemory>> for Backing {
    fn from(memory: Arc<AnyMemory>) -> Backing {
        Backing::Device(memory)
    }
}

impl From<Arc<AnyHostMemory>> for Backing {
    fn from(memory: Arc<AnyHostMemory>) -> Backing {
        Backing::HostMapped(memory)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use oxccl_hal::DeviceId;

    #[test]
    fn both_placements_are_zeroed_and_host_addressable_on_the_host_backend() {
        let device = AnyDevice::open_with(BackendKind::Host, DeviceId(0)).unwrap();
        for host_mapped in [false, true] {
            let b = Backing::zeroed(&device, 4096, MemoryKind::Coherent, host_mapped).unwrap();
            assert_eq!(b.len(), 4096);
            assert_eq!(b.backend(), BackendKind::Host);
            assert_eq!(b.device_memory().is_some(), !host_mapped);
            let p = b.host_ptr().unwrap();
            // SAFETY: 4096 live bytes, nobody else uses them.
            let bytes = unsafe { std::slice::from_raw_parts(p, 4096) };
            assert!(bytes.iter().all(|&x| x == 0));
        }
    }
}
